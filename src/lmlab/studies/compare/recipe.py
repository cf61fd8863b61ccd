"""Compare · does a compressed or sparse model keep its original's circuits? (lmlab's own study: no paper claims this)

1. The original: on each circuit task (data/generated/circuits.py: IOI, Greater-Than, Docstring, IOI-Long) every
   head's attribution score per prompt pair (attribution patching, lmlab.circuits: the same scorer S4 uses), the
   explained-effect curve along its ranking and the heads it needs for 0.9 of the effect, and activation patching on
   its top heads (the attribution checked against the exact intervention on the heads that matter); on every draw of
   prompt pairs, one draw per replicate (`--seeds`, the profile's `seeds`; measure.py), so the prompt pairs, k and R
   vary between the replicates inside a run as they do between run seeds.
2. Each variant, the same measurements on the same prompt pairs: a variant that is one model on every draw (its
   replicate r on draw r), a cell of trained students student r on draw r. A variant is any model of the original's
   architecture and tokenizer: a folder or hub id; a packed student of `lmlab quantize` (rebuilt on the original's
   weights); a quantize run folder (each of its students: a cell per bits and budget, its replicates pooled) or a
   sparse-circuits run folder (each post-trained replicate); students trained here (`--make quantized:2,1`: lmlab
   quantize's own run, through the registry, at this profile's sizes, `--seeds` replicates a cell); the original
   itself (`same`, the positive control); the original with every task's circuit zeroed (`ablate`; `ablate:N`: the
   N top heads of each task) through the installed AblateHeads intervention; the original with each task's top-k
   heads exchanged in the weights with other heads of the same layers (`swap`; `swap:half`: every other one), a
   working model whose circuit sits elsewhere (placebo.py; interventions.permute). The controls' heads are the
   original's top heads ranked on prompt pairs other than the judged ones (measure.select), so no control acts on
   exactly the heads its overlap is then read at. `--placebo` replaces the variants (and --make) by `swap` and
   `swap:half`: the same run, whose circuits are known to have moved.
3. With `--pathways` (quick and full), S1's knockout on the original and on each variant, through the registry, probes
   trained per model (pathways.py): does the variant keep the question-anchored pathway where the original has it?
4. Analysis (analysis.py): the top-k overlap with the original like for like (each model's top-k on one half of the
   prompt pairs against the original's on the other, beside the original's own half against half), with intervals
   over prompt pairs and replicates; the rank correlation over the union; the heads that survive, the new ones, the
   task metric's change; the pathway's effect per variant beside the original's.

One variant is in memory at a time beside the original. Every model's measurements of a task are one recorded unit,
so an interrupted run resumes at the next unit.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd

from lmlab.data.generated.circuits import TASKS as CIRCUIT_TASKS
from lmlab.data.generated.circuits import make_task, pairs_file
from lmlab.errors import LmlabError
from lmlab.interventions import AblateHeads, install
from lmlab.interventions.permute import permute_heads
from lmlab.data.generated.selftext import stdlib_docstrings
from lmlab.evaluation import causal_lm_ce
from lmlab.files import atomic_write
from lmlab.interventions.awq import AWQ_GROUP, autoround_version, awq_model
from lmlab.interventions.gptq import GPTQ_GROUP, gptq_model
from lmlab.interventions.quant import load_packed, round_to_nearest
from lmlab.models import LoadedModel, layout_of, save_model
from lmlab.models.layout import layer_kinds_text, layer_ranges
from lmlab.models.quantized import of_folder
from lmlab.runs import (RunDir, holds_packed_students, holds_sparse_models, packed_students,
                        sparse_model_folders)
from lmlab.studies.compare.config import ABLATE, PLACEBO_VARIANTS, SAME, Config
from lmlab.studies.compare.methods import METHODS, width_of_name
from lmlab.studies.compare.measure import copied, draws, measure, original_key, select, top_heads, unit_key
from lmlab.studies.compare.pathways import measure_pathway
from lmlab.studies.compare.placebo import HALF, moved_heads, moves

ORIGINAL = "original"


@dataclasses.dataclass
class Variant:
    cell: str  # the comparison it belongs to (replicates of one recipe share a cell)
    replicate: int
    spec: str  # what the user gave (or the file found in a run folder)
    kind: str  # same, ablate, swap, packed, sparse, model
    method: str | None = None  # a variant at a bit width: its method and width (made in the run, or a folder so
    bits: int | None = None  # named, read once in `expand`)
    replicated: bool = False  # one model per replicate (a calibrated width made in the run: each its own calibration)

    @property
    def key(self) -> str:
        return f"{self.cell}#{self.replicate}"

    def units(self, config: Config, task: str) -> list[tuple[str, int, int]]:
        """(model key, replicate, prompt draw) of each measurement on `task`. One model (same, ablate, swap, a model
        folder or hub id, a width made in the run) is measured on every draw, its replicate r on draw r: the draws are
        its replicates. A model that is one replicate of a cell (a student, a sparse model) is measured on its own
        replicate's draw (a file's one draw for a file of prompt pairs), as is a width of a calibrated method made in
        the run (gptq, awq: one model per replicate, each calibrated on its own draw of text)."""
        if self.kind in SINGLE and not self.replicated:
            return [(f"{self.cell}#{d}", d, d) for d in draws(config, task)]
        return [(self.key, self.replicate, 0 if pairs_file(task) is not None else self.replicate)]


SINGLE = ("same", "ablate", "swap", "model")  # the variant kinds that are one model (its replicates are prompt draws)


def _rep_of(name: str) -> tuple[str, int]:
    match = re.fullmatch(r"(.*)-rep(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else (name, 0)


def expand(spec: str) -> list[Variant]:
    """The variants one --variant names (a run folder names several)."""
    if spec == SAME:
        return [Variant("same", 0, spec, "same")]
    if spec == ABLATE or spec.startswith(ABLATE + ":"):
        return [Variant(spec, 0, spec, "ablate")]
    if spec in PLACEBO_VARIANTS:
        return [Variant(spec, 0, spec, "swap")]
    path = Path(spec).expanduser()
    if path.suffix == ".safetensors":
        cell, rep = _rep_of(path.stem)
        return [Variant(cell, rep, str(path), "packed")]
    if path.is_dir() and holds_packed_students(path):
        files = packed_students(path)
        if not files:
            raise LmlabError(f"--variant {spec}: its packed/ folder holds no student yet (an unfinished run?)")
        return [v for f in files for v in expand(str(f))]
    if path.is_dir() and holds_sparse_models(path):
        folders = sparse_model_folders(path)
        if not folders:
            raise LmlabError(f"--variant {spec}: no post-trained sparse model in it (an unfinished run, or one "
                             "without --circuits?)")
        return [Variant("sparse", rep, str(f), "sparse") for rep, f in folders]
    # a model folder is named by its folder's name, so the run's tables, verdict and docs carry no path of the
    # machine that ran it (a hub id stays as given); one named at a width (`gptq-4bit`) carries its method and bits
    name = path.name if path.is_dir() and path.name else spec
    width = width_of_name(name)
    return [Variant(name, 0, spec, "model", *(width or (None, None)))]


def _once(variants: list[Variant]) -> list[Variant]:
    """`variants`, refused in one sentence where two share a name and replicate (two folders of one name)."""
    seen: dict[str, str] = {}
    for v in variants:
        if v.key in seen and seen[v.key] != v.spec:
            raise LmlabError(f"--variant {seen[v.key]} and {v.spec} are both named '{v.cell}' (a variant is named by "
                             "its folder): rename one folder")
        if v.key in seen:
            raise LmlabError(f"--variant {v.spec} is given twice; give each once")
        seen[v.key] = v.spec
    return variants


def _load(variant: Variant, lm: LoadedModel, config: Config, ablated: list, perms: dict | None = None) -> LoadedModel:
    if variant.kind in ("same", "ablate", "packed", "swap"):
        model = copy.deepcopy(lm.model)
        # the copy's own layout: the original's points at the original's modules
        loaded = dataclasses.replace(lm, model=model, layout=layout_of(model), name=f"{lm.name} ({variant.cell})",
                                     meta=dict(lm.meta))
        if variant.kind == "packed":
            load_packed(model, variant.spec)
            loaded.name = f"{lm.name} ({Path(variant.spec).stem})"
        elif variant.kind == "ablate":
            install(loaded, AblateHeads(ablated, mode="zero"))
        elif variant.kind == "swap" and perms:
            permute_heads(loaded, perms)
        return loaded
    loaded = config.load(variant.spec)
    if loaded.layout.n_layers != lm.layout.n_layers or loaded.layout.n_heads != lm.layout.n_heads:
        raise LmlabError(f"--variant {variant.spec} has {loaded.layout.n_layers} layers of {loaded.layout.n_heads} "
                         f"heads; the original {lm.layout.n_layers} of {lm.layout.n_heads}: compare needs the same "
                         "architecture")
    if loaded.tokenizer.get_vocab() != lm.tokenizer.get_vocab():
        raise LmlabError(f"--variant {variant.spec} has another tokenizer than the original: the same prompt pairs "
                         "would not be the same tokens")
    return loaded


def _made(config: Config, run_dir: RunDir, lm: LoadedModel | None) -> list[str]:
    """--make quantized:B: lmlab quantize's own run (its decoder option) through the registry, and --make sparse:
    lmlab sparse-circuits' model half, into this run's made/ folder; each run folder is then a variant like any
    other (the students a cell per bits, the sparse models the cell `sparse`, a replicate each)."""
    from lmlab.studies.registry import get_study
    from lmlab.studies.runner import run_study

    generated = [t for t in config.size("tasks") if t in CIRCUIT_TASKS]  # the made run measures these
    runs = []
    if config.made().sparse:  # S4's model half (its toy left out): post-trained on a copy, never on `lm` itself
        spec = get_study("sparse-circuits")
        sparse = spec.config(model=config.model, profile=config.profile, seed=config.seed, seeds=config.n_seeds,
                             circuits=True, toy=False, device=config.device, dtype=config.dtype,
                             **({"tasks": generated} if generated else {}))
        run_dir.log(f"making sparse-attention models with lmlab sparse-circuits ({config.profile}, "
                    f"{config.n_seeds} replicates)")
        runs.append(str(run_study(spec, sparse, run_dir.path / "made", lm=lm).path))
    bits = list(config.made().bits("quantized"))
    if not bits:
        return runs
    spec = get_study("quantize")
    made = spec.config(model=config.model, profile=config.profile, seed=config.seed, seeds=config.n_seeds,
                       bits=bits, n_prompts=config.size("n_prompts"), device=config.device, dtype=config.dtype,
                       **({"tasks": generated} if generated else {}))
    run_dir.log(f"making {', '.join(f'{b}-bit' for b in bits)} students with lmlab quantize ({config.profile}, "
                f"{config.n_seeds} replicates a cell)")
    # a model passed in is copied: quantize turns its teacher to float32 for training
    result = run_study(spec, made, run_dir.path / "made", lm=copy.deepcopy(lm) if lm is not None else None)
    return runs + [str(result.path)]


RECIPE = "lmlab-recipe.json"  # written last into a made variant's folder: the folder is whole once it is there
PERPLEXITY_TEXTS = 64  # standard-library docstrings (up to 64 tokens each) a made variant's perplexity is read on
PERPLEXITY_TOKENS = 64  # their cut (stdlib_docstrings' default), which the calibration draw is checked against


def _rounded_variants(config: Config, run_dir: RunDir) -> list[Variant]:
    """--make rtn:B, hqq:B, bnb:B, torchao:B, gptq:B and awq:B: the original quantized after training at each B, a
    model folder each in this run's made/ folder (made by `_round` once the original is loaded), compared as any
    folder is. A calibrated method (gptq, awq) makes one model per replicate, each calibrated on its own draw of text,
    so the calibration text varies between the replicates inside a run as it varies between run seeds."""
    return [Variant(f"{m.name}-{b}bit", r, str(_rounded_folder(run_dir, m.name, b, r)), "model", m.name, b,
                    replicated=m.calibrated)
            for m, b in config.made().post_training() for r in _made_replicates(config, m.name)]


def _made_replicates(config: Config, method: str) -> range:
    """The replicates a width of `method` is made for: one per replicate where it is calibrated, else one model."""
    return range(config.n_seeds) if METHODS[method].calibrated else range(1)


def _rounded_folder(run_dir: RunDir, method: str, bits: int, replicate: int = 0) -> Path:
    return run_dir.path / "made" / (f"{method}-{bits}bit" + (f"-rep{replicate}" if replicate else ""))


def _perplexity(lm: LoadedModel, texts: list[list[int]]) -> float:
    import torch

    batches = ({"input_ids": torch.tensor([ids], device=lm.device), "labels": torch.tensor([ids], device=lm.device)}
               for ids in texts if len(ids) > 1)
    per_seq, _ = causal_lm_ce(lm.model, batches)
    return float(math.exp(sum(per_seq) / len(per_seq)))


CALIBRATION_DRAW = 512  # standard-library docstrings drawn for GPTQ's and AWQ's calibration (some 250 chunks' worth)
CALIBRATION_LENGTH = 256  # tokens a chunk (the papers' 2048 would take more docstrings than the standard library has)


def _calibration(lm: LoadedModel, config: Config, held_out: list[list[int]], replicate: int = 0) -> tuple[list, str]:
    """GPTQ's and AWQ's calibration text for replicate `replicate`: standard-library docstrings (up to 256 tokens each)
    drawn at the replicate's own seed (another than the perplexity texts'), any whose opening is one of those left
    out, concatenated and cut into chunks of CALIBRATION_LENGTH tokens (the profile's `calibration_chunks`, or as
    many as the draw fills), on the model's device; and the sentence the made folder's recipe records."""
    import torch

    seed = config.replicate_seed(replicate) + 1
    draw = stdlib_docstrings(lm.tokenizer, CALIBRATION_DRAW, max_tokens=256, seed=seed)
    kept = [ids for ids in draw if ids[:PERPLEXITY_TOKENS] not in held_out]
    flat = [t for ids in kept for t in ids]
    n = min(config.size("calibration_chunks"), len(flat) // CALIBRATION_LENGTH)
    if not n:
        raise LmlabError(f"the standard library's docstrings give {len(flat)} tokens of calibration text with this "
                         f"tokenizer; GPTQ and AWQ need at least {CALIBRATION_LENGTH}")
    chunks = [torch.tensor(flat[i * CALIBRATION_LENGTH:(i + 1) * CALIBRATION_LENGTH], device=lm.device)
              for i in range(n)]
    return chunks, (f"{n} chunks of {CALIBRATION_LENGTH} tokens cut from {len(kept)} standard-library docstrings "
                    f"(replicate {replicate}'s draw, at seed {seed}; none of the {len(held_out)} the perplexity is "
                    "read on)")


def _quantized(lm: LoadedModel, method: str, bits: int, calibration: tuple[list, str] | None,
               seed: int) -> tuple[object, dict]:
    """A copy of the original's model quantized by `method` at `bits`, and what its recipe records of how."""
    model = copy.deepcopy(lm.model)
    if not METHODS[method].calibrated:
        return model, {"layers": len(round_to_nearest(model, bits, method))}
    texts, said = calibration
    facts = {"calibration": said, "calibration_texts": len(texts), "calibration_tokens": sum(len(t) for t in texts)}
    if method == "gptq":
        return model, {"layers": len(gptq_model(model, bits, texts)), "group_size": GPTQ_GROUP, **facts,
                       "library": "none: lmlab's own GPTQ (lmlab.interventions.gptq)"}
    layers, kept = awq_model(model, lm.tokenizer, bits, texts, seed=seed)
    return model, {"layers": len(layers), "left_full_precision": kept, "group_size": AWQ_GROUP, **facts,
                   "library": f"auto-round {autoround_version()} (AWQConfig, then its RTN)"}


def _round(config: Config, run_dir: RunDir, lm: LoadedModel) -> list[dict]:
    """Each --make rtn:B, hqq:B, bnb:B, torchao:B, gptq:B and awq:B variant's folder (made where it is not whole yet:
    an interrupted run makes it again; a calibrated method's one per replicate) and its `made` row: the recipe, and the
    perplexity of the variant and the original on held-out text."""
    jobs = [(m.name, b, r) for m, b in config.made().post_training() for r in _made_replicates(config, m.name)]
    if not jobs:
        return []
    texts = stdlib_docstrings(lm.tokenizer, PERPLEXITY_TEXTS, PERPLEXITY_TOKENS, seed=config.seed)
    state: dict = {}
    rows = []
    for method, b, r in jobs:
        folder, cell = _rounded_folder(run_dir, method, b, r), f"{method}-{b}bit"
        if not (folder / RECIPE).is_file():
            _make_width(config, run_dir, lm, method, b, r, texts, state)
        recipe = json.loads((folder / RECIPE).read_text())
        rows.append({"kind": "made", "cell": cell, "replicate": r, "method": method, "bits": b, "folder": str(folder),
                     "perplexity": recipe["perplexity"], "original_perplexity": recipe["original_perplexity"],
                     "n_text": len(texts), "origin": "made"})
    return rows


def _make_width(config: Config, run_dir: RunDir, lm: LoadedModel, method: str, b: int, r: int,
                texts: list[list[int]], state: dict) -> None:
    """One made width's folder (replicate `r`'s, for a calibrated method), its recipe written last. `state` keeps
    the original's perplexity and each replicate's calibration text across the widths."""
    folder, cell = _rounded_folder(run_dir, method, b, r), f"{method}-{b}bit"
    if "original" not in state:
        state["original"] = _perplexity(lm, texts)
    calibration = None
    if METHODS[method].calibrated:
        calibration = state.get(r) or state.setdefault(r, _calibration(lm, config, texts, r))
    run_dir.log(f"making {cell}" + (f" (replicate {r})" if METHODS[method].calibrated else "")
                + f": every linear layer of the blocks quantized by {method} at {b} bits"
                + (f", calibrated on {calibration[1]}" if calibration else ""))
    model, facts = _quantized(lm, method, b, calibration, config.replicate_seed(r))
    made = dataclasses.replace(lm, model=model, layout=layout_of(model), name=f"{lm.name}-{cell}")
    shutil.rmtree(folder, ignore_errors=True)
    save_model(made, folder)
    recipe = {"method": method, "bits": b, "grid": METHODS[method].grid, **facts,
              "embeddings": "full precision", "source": str(config.model),
              "perplexity": _perplexity(made, texts), "original_perplexity": state["original"],
              "perplexity_text": f"{len(texts)} standard-library docstrings, up to {PERPLEXITY_TOKENS} tokens each"}
    del model, made
    atomic_write(folder / RECIPE, json.dumps(recipe, indent=1))


def _width_perplexity(variant: Variant, model: LoadedModel, lm: LoadedModel, config: Config,
                      run_dir: RunDir) -> None:
    """A variant folder named at a bit width (`.../gptq-4bit`, made elsewhere): its perplexity and the original's on
    the held-out text the made variants are read on, recorded as a `made` row (origin "folder"; "made" for those
    made in the run), so the curve against bits draws it beside theirs."""
    if variant.kind != "model" or variant.bits is None or variant.key in run_dir.done("width-perplexity"):
        return
    texts = stdlib_docstrings(lm.tokenizer, PERPLEXITY_TEXTS, seed=config.seed)
    if "original" not in run_dir.done("width-perplexity"):
        run_dir.record("width-perplexity", "original", [{"kind": "original_perplexity",
                                                         "perplexity": _perplexity(lm, texts)}])
    original = run_dir.done("width-perplexity")["original"][0]["perplexity"]
    run_dir.record("width-perplexity", variant.key, [{
        "kind": "made", "cell": variant.cell, "method": variant.method, "bits": variant.bits,
        "folder": variant.spec, "perplexity": _perplexity(model, texts), "original_perplexity": original,
        "n_text": len(texts), "origin": "folder"}])


def _swap_rows(variant: Variant, task: str, top: list, moved: list, perms: dict, stuck: list, other: bool,
               lm) -> dict:
    """What a swap variant moved on one task (the `placebo` table)."""
    name = lambda h: f"L{h[0]}.H{h[1]}"  # noqa: E731
    return {"kind": "placebo", "cell": variant.cell, "task": task, "k": len(top), "moved": len(moved),
            "stuck": len(stuck), "heads": ", ".join(name(h) for h in moved),
            "stuck_heads": ", ".join(name(h) for h in stuck),
            "layers_permuted": len(perms), "kv_groups": lm.layout.n_kv_heads, "chosen_on_other_pairs": other}


def _swapped(variant: Variant, lm: LoadedModel, config: Config, run_dir: RunDir, original: dict,
             chosen: dict) -> list[dict]:
    """A swap variant, one model per task (that task's top-k heads, ranked on other prompt pairs, moved to other
    heads of their layers), each measured as any variant; the `placebo` rows saying what moved. `original`: each task's
    measurement rows on the first prompt draw (the circuit's size k read there)."""
    rows = []
    for t in original:
        top = top_heads(original[t], None, config.min_k, chosen[t])
        how = HALF if variant.spec.endswith(":" + HALF) else ""
        moved = moved_heads(top, how, lm.layout.n_heads, lm.layout.n_kv_heads)
        perms, stuck = moves(top, moved, lm.layout.n_heads, lm.layout.n_kv_heads)
        rows.append(_swap_rows(variant, t, top, moved, perms, stuck, bool(chosen[t][0]["other_pairs"]), lm))
        units = [u for u in variant.units(config, t) if unit_key(u[0], t, u[2]) not in run_dir.done("models")]
        if units:
            model = _load(variant, lm, config, [], perms)
            for key, replicate, draw in units:
                measure(model, key, variant.cell, replicate, t, config, run_dir, draw)
            del model
    return rows


def _checked(config: Config, lm: LoadedModel | None, tasks: list[str]) -> LoadedModel:
    """The original, loaded, with everything the inputs can tell checked before any variant is made: the model kind,
    its heads, and each task's answers against the tokenizer (a prompt-pair file whose answer the tokenizer splits
    fails here). A hybrid is compared on the heads of its softmax-attention layers (`hybrid_layers` names the
    others)."""
    lm = lm if lm is not None else config.load()
    if not lm.layout.causal:
        raise LmlabError(f"{config.model} is not a causal language model; compare's circuit tasks need one")
    if not lm.layout.attention_layers:
        raise LmlabError(f"{config.model} has no softmax-attention layer ({layer_kinds_text(lm.layout.kinds)}): "
                         "compare ranks attention heads")
    for name in tasks:
        make_task(name, lm.tokenizer, 2, config.seed)
    return lm


def hybrid_layers(layout) -> str:
    """A hybrid's layers without softmax attention, by kind ("" for a model whose every layer holds it): its heads
    are ranked and compared in its attention layers; these are named, not compared."""
    others = [i for i in range(layout.n_layers) if i not in layout.attention_layers]
    if not others:
        return ""
    kinds = ", ".join(sorted({layout.kinds[i] for i in others}))
    return (f"no softmax attention in layers {layer_ranges(others)} ({kinds}): the circuits are ranked and compared "
            f"over the heads of layers {layer_ranges(layout.attention_layers)}")


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    tasks = list(config.size("tasks"))
    lm = _checked(config, lm, tasks)
    hybrid = hybrid_layers(lm.layout)
    if hybrid:
        run_dir.log(f"{config.model}: {hybrid}")
        run_dir.describe(hybrid=hybrid)
    variants, made = _variants(config, run_dir, lm)
    made_rows = [] if config.placebo else _round(config, run_dir, lm)
    needed, original = _originals(lm, variants, tasks, config, run_dir)
    # the controls' heads: the original's ranking on other prompt pairs of each task
    chosen = ({t: select(lm, t, config, run_dir, needed[t]) for t in tasks}
              if any(v.kind in ("ablate", "swap") for v in variants) else {})
    # DECISION: a head permutation leaves S1's knockout (every head's attention blocked alike) exactly as it was, so the
    # swaps say nothing about the pathway: they, and a placebo run, skip it
    pathways = bool(config.size("pathways")) and not config.placebo
    if pathways:
        measure_pathway(lm, ORIGINAL, ORIGINAL, 0, config, run_dir)
    placebo_rows = []
    for variant in variants:
        if variant.kind == "swap":
            placebo_rows += _swapped(variant, lm, config, run_dir, original, chosen)
        else:
            _measure_variant(variant, lm, config, run_dir, tasks, (original, chosen), made, pathways)
    rows = _rows(config, run_dir, tasks, needed, variants, made, pathways)
    rows += [r for rs in chosen.values() for r in rs] + placebo_rows + made_rows
    rows += [r for key, rs in run_dir.done("width-perplexity").items() if key != "original" for r in rs]
    return pd.DataFrame(rows)  # the measurements; the analysis derives the curves, overlaps and comparison


def _variants(config: Config, run_dir: RunDir, lm: LoadedModel) -> tuple[list[Variant], list[str]]:
    """The run's variants, each once (those given, then the students --make trains, then the widths it rounds; a
    placebo run's are the swaps, the treatment replaced), and the specs of those made in the run."""
    if config.placebo:  # the treatment (the variants given, the students --make trains) replaced by the swaps
        run_dir.log("placebo: the variants are the original with its circuit's heads moved (swap, swap:half)")
        return _once([v for spec in PLACEBO_VARIANTS for v in expand(spec)]), []
    variants = _once([v for spec in (config.variant or []) for v in expand(spec)])  # before any variant is made
    made = _made(config, run_dir, lm)
    variants += [v for folder in made for v in expand(folder)]
    rounded = _rounded_variants(config, run_dir)
    return _once(variants + rounded), made + [v.spec for v in rounded]


def _measure_variant(variant: Variant, lm: LoadedModel, config: Config, run_dir: RunDir, tasks: list[str],
                     controls: tuple[dict, dict], made: list[str], pathways: bool) -> None:
    """One variant (not a swap) loaded and measured on every task and draw it is read on (and its pathway), unless
    every unit of it is recorded already; `controls`: the original's attributions and the controls' heads per task."""
    original, chosen = controls
    if (all(unit_key(key, t, d) in run_dir.done("models") for t in tasks for key, _, d in variant.units(config, t))
            and (not pathways or variant.key in run_dir.done("pathways"))):
        return
    if variant.kind == "same":  # the original itself: its units and pathway are the original's (measure.copied)
        for t in tasks:
            for key, replicate, draw in variant.units(config, t):
                copied(run_dir, unit_key(original_key(draw), t, draw), (key, t, draw), variant.cell, replicate,
                       f"{lm.name} ({variant.cell})")
        if pathways and variant.key not in run_dir.done("pathways"):
            run_dir.record("pathways", variant.key, [{**r, "model_key": variant.key, "cell": variant.cell,
                                                      "replicate": variant.replicate}
                                                     for r in run_dir.done("pathways")[ORIGINAL]])
        return
    ablated = []
    if variant.kind == "ablate":
        n = int(variant.spec.partition(":")[2] or 0) or None  # None: each task's circuit (the claim's k)
        ablated = sorted({h for t in tasks for h in top_heads(original[t], n, config.min_k, chosen[t])})
    model = _load(variant, lm, config, ablated)
    if not any(variant.spec.startswith(f) for f in made):
        _width_perplexity(variant, model, lm, config, run_dir)
    for t in tasks:
        for key, replicate, draw in variant.units(config, t):
            measure(model, key, variant.cell, replicate, t, config, run_dir, draw)
    if pathways:
        measure_pathway(model, variant.key, variant.cell, variant.replicate, config, run_dir)
    del model


def _rows(config: Config, run_dir: RunDir, tasks: list[str], needed: dict[str, list[int]], variants: list[Variant],
          made: list[str], pathways: bool) -> list[dict]:
    """The run's recorded measurements in order (the originals on their draws, then each variant's units; a unit
    recorded under another key is not this run's), its pathways and a `variant` row each."""
    order = [unit_key(original_key(d), t, d) for t in tasks for d in needed[t]]
    order += [unit_key(key, t, d) for v in variants for t in tasks for key, _, d in v.units(config, t)]
    done = run_dir.done("models")
    rows = [r for key in order for r in done[key]]
    rows += [r for _, rs in run_dir.done("pathways").items() for r in rs] if pathways else []
    rows += [{"kind": "variant", "cell": v.cell, "replicate": v.replicate, "model_key": v.key, "source": v.spec,
              "variant_kind": v.kind, "made": any(v.spec.startswith(f) for f in made),
              "quantized": (of_folder(v.spec) or "") if v.kind == "model" else "",
              "method": v.method, "bits": v.bits} for v in variants]
    return rows


def _originals(lm: LoadedModel, variants: list[Variant], tasks: list[str], config: Config,
               run_dir: RunDir) -> tuple[dict[str, list[int]], dict[str, list[dict]]]:
    """The original measured on every prompt draw a variant is read on (each replicate's own draw; measure.py): per
    task the draws, and the rows of the first (where the controls read the circuit's size k)."""
    needed = {t: sorted(set(draws(config, t)) | {d for v in variants for _, _, d in v.units(config, t)}) for t in tasks}
    for t in tasks:
        for d in needed[t]:
            measure(lm, original_key(d), ORIGINAL, d, t, config, run_dir, d)
    first = {t: needed[t][0] for t in tasks}
    return needed, {t: run_dir.done("models")[unit_key(original_key(first[t]), t, first[t])] for t in tasks}
