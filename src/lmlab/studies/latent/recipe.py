"""S0 · Latent compression of reasoning chains, Token Assorted (Su et al., arXiv 2502.03275).

1. Data (data/generated/planning.py): by default a generated turtle walk (turns and steps relative to a heading
   on a walled grid) whose step-by-step trace opens with a plan that restates the prompt and then restates the
   heading or position each step computes, about 75 tokens (the paper's from-scratch setting, a Keys-Finding
   Maze, has traces whose early words "support textual coherence rather than core reasoning"); the answer alone
   needs the whole walk composed in one pass, so the chain is needed (else latents would have nothing to carry); `--data walk` the
   earlier absolute-move grid walk; `--data classes` ProsQA-style class chains;
   `--data arithmetic` the short +/- chains (data/generated/reasoning.py), where every computed value is
   needed later, kept as a stress test; `--data gsm8k:PATH` a GSM8K jsonl file. Splits are disjoint.
2. Models (the paper: "training the model from scratch for the Keys-Finding Maze problem", and fine-tuning
   pretrained LLMs on the mixed data): by default every variant is a small Llama-architecture transformer
   trained from scratch in the run on its own data (prompt -> chain -> answer, the prompt masked in the loss),
   with a word-level vocabulary that already holds the K codes and the two latent markers, for the same number
   of steps from the same initial weights. `--model smollm2-135m` fine-tunes the pretrained SmolLM2-135M
   instead: its tokenizer gets <cot>, <ans>, the markers and the K codes as new special tokens and its
   embeddings are resized. (An earlier version trained a CoT base and fine-tuned every variant from it; the
   from-scratch setting of the paper has no such base.)
3. Per rate r: a VQ-VAE over chunks of at most L tokens (L/r codes each, codebook K; vqvae.py), trained on
   chunks of the whole training sequences (question, chain, answer) and applied to the chain; then the
   model is trained on mixed sequences where the leftmost m chain tokens are replaced by <boLatent> codes
   <eoLatent>. As in the paper, m is drawn per example from a chunk-aligned set: 0 for about 1/7 of
   examples, else a whole number of chunks that leaves the final step as text and covers at most 40% of the
   chain (the paper's set {0, 72, ..., 256} on ~640-token traces: a fifth on average, 40% at most). Chunks
   end at word starts, so a number is never split between latent and text.
4. Baselines in the same run, trained the same way for the same steps: CoT (m = 0 always) and answer-only
   (no chain).
Replicates (lmlab.claims): the whole procedure runs k times (`--seeds`), each replicate from its own seed
(initial weights, batch order, VQ-VAE, the m draws), on the same data and test problems; the k models of a
variant train together as one stacked module (lmlab.train.ensemble) and generate together.
5. Evaluation: greedy generation on the test split; accuracy (Wilson interval), generated tokens per
   problem (latent + text, up to and including <eos>; bootstrap interval), wall time per problem.
   Diagnostics per rate: latent tokens per problem and the share of problems that used any; accuracy
   split by whether the model used latents; the VQ-VAE's reconstruction of computed vs copied chain tokens;
   and accuracy with the true codes forced in for the largest m training allows, which separates "the
   codes lose information" (forced below CoT) from "the model cannot produce the codes" (forced at CoT,
   free generation below); and the same prefixes with one constant code in every latent position, at the same m:
   a model that reads its codes answers better with the true ones than with a constant (the gate "latent models
   read their codes" compares the two; its own codes are not a like comparison, since it writes fewer codes than
   the largest m holds).
6. Placebo (`--placebo`): the same run with every code of the latent models' training sequences and of their
   forced prefixes replaced by one constant code (`codes.carry_nothing`): each sequence keeps its m and its number of
   codes between the markers, so the trace shortens exactly as in the study, but the codes say nothing about the
   chain they stand for. The VQ-VAE is trained and its reconstruction measured as in the study (its codes are thrown
   away); CoT and answer-only are the study's own models. Where the text the codes replace is needed for the answer,
   the placebo's latent models must lose accuracy; where it restates the prompt, they lose nothing, and the accuracy
   claims cannot tell the codes from a constant. Where the study's own run of the same settings sits in the same --out
   folder, the placebo takes over what that run finished and it would only repeat (the CoT and answer-only models,
   the VQ-VAEs and their codes, before the constant replaces them): the same seeds, data and steps give the same
   models, and a placebo beside its study then trains only its latent models.

Compression rate on the figure's x axis: r; CoT and answer-only are reference lines; each replicate is a point.

Under a launch (`torchrun -m lmlab latent ...`, lmlab.parallel) every model trains data-parallel (each process a
slice of every batch; the CE terms are token shares of the global batch's mean, and the VQ-VAE's codebook is set
and restarted from the whole batch's encoder outputs, drawn on rank 0), each process encodes and generates its
share of the problems, and rank 0 records each variant and writes the run folder.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from lmlab import parallel
from lmlab.data.generated.planning import (generate_class_problems, generate_turtle_problems,
                                           generate_walk_problems)
from lmlab.data.generated.reasoning import generate_problems, read_gsm8k_problems, split_problems
from lmlab.errors import LmlabError
from lmlab.files import atomic_write
from lmlab.models import LoadedModel, ScratchSpec, load_model, resize_vocabulary
from lmlab.runs import RunDir
from lmlab.stats import wilson
from lmlab.studies.latent import sequences
from lmlab.studies.latent.config import PRETRAINED, Config, check_config
from lmlab.studies.latent.measure import (chunk_codes_many, collate_for, evaluate, forced_prefixes, lm_loss,
                                         train_cfg, train_vq, vq_quality)
from lmlab.train import train
from lmlab.train.ensemble import stack
from lmlab.train.loop import PerReplicate


def load_problems(config: Config) -> dict:
    n_test = config.size("n_test")
    n_dev = min(n_test, 200)  # the dev split only measures the VQ-VAE's reconstruction
    walk = {}
    if config.task in ("turtle", "walk"):
        moves, grid = config.size("moves"), config.size("grid")
        walk = ({"min_moves": moves, "max_moves": moves} if moves else {}) | ({"size": grid} if grid else {})
    if config.task == "turtle":
        plan = config.size("plan")
        return generate_turtle_problems(config.size("n_train"), n_dev, n_test, seed=config.seed, **walk,
                                        **({"plan": plan} if plan is not None else {}))
    if config.task == "walk":
        return generate_walk_problems(config.size("n_train"), n_dev, n_test, seed=config.seed, **walk)
    if config.task == "classes":
        return generate_class_problems(config.size("n_train"), n_dev, n_test, seed=config.seed)
    if config.task == "arithmetic":
        return generate_problems(config.size("n_train"), n_test, n_test, seed=config.seed,
                                 max_steps=config.max_steps_per_problem)
    splits = split_problems(read_gsm8k_problems(config.data.partition(":")[2] or None), seed=config.seed)
    sizes = {"train": config.size("n_train"), "dev": n_test, "test": n_test}
    out = {k: v[:sizes[k]] for k, v in splits.items()}
    empty = [k for k, v in out.items() if not v]
    if empty:
        raise LmlabError(f"the GSM8K file gives no {empty[0]} problems after splitting; it needs more rows")
    return out


@dataclass
class Prepared:
    initial: list[torch.nn.Module]  # one per replicate: untrained (scratch) or pretrained with resized embeddings
    vocab: object
    train: list
    dev: list
    test: list
    max_new: int


def prepare(config: Config, lm: LoadedModel | None = None) -> Prepared:
    """Data, vocabulary and each replicate's initial model, the same for the same config (the benchmark
    rebuilds a finished run's models from this and the run's checkpoints)."""
    check_config(config)
    problems = load_problems(config)
    seeds = config.replicate_seeds()
    if config.model in PRETRAINED:
        vocab, initial = None, []
        for seed in seeds:  # the new tokens' embeddings are drawn per replicate
            torch.manual_seed(seed)
            model, vocab = _pretrained(config, lm)
            initial.append(model)
    else:
        texts = [p.question + " " + p.chain for split in problems.values() for p in split]
        vocab = sequences.Vocab.from_texts(texts, config.size("codebook"))
    train_ex = [sequences.make_example(vocab, p) for p in problems["train"]]
    test_ex = [sequences.make_example(vocab, p) for p in problems["test"]]
    dev_ex = [sequences.make_example(vocab, p) for p in problems["dev"]]
    max_new = config.max_new or max(len(ex.chain) + len(ex.answer) for ex in train_ex) + 16
    longest = max(len(ex.prompt) for ex in train_ex + test_ex + dev_ex) + max_new
    if config.model not in PRETRAINED:
        initial = [load_model("scratch", dtype=torch.float32, device=config.torch_device(), scratch=ScratchSpec(
            vocab_size=len(vocab), d_model=config.size("d_model"), n_layers=config.size("n_layers"), n_heads=4,
            max_positions=max(256, longest + 64), bos=vocab.bos, eos=vocab.eos, pad=vocab.pad, seed=seed)).model
            for seed in seeds]
    for model in initial:
        model.train()  # as built: the training loop decides the mode
    context = initial[0].config.max_position_embeddings
    if longest > context:
        raise LmlabError(f"a prompt plus {max_new} generated tokens ({longest}) exceeds the model's context of "
                         f"{context}")
    n_chunks = sum(len(sequences.segments(ex, config.chunk)) for ex in train_ex)
    codebook = config.size("codebook")
    if n_chunks < codebook:
        raise LmlabError(f"only {n_chunks} training chunks for a codebook of {codebook}: lower --codebook "
                         "or generate more problems")
    return Prepared(initial, vocab, train_ex, dev_ex, test_ex, max_new)


def _pretrained(config: Config, lm: LoadedModel | None = None):
    """(model, vocab) for the pretrained option: the tokenizer grown by the markers and codes, the
    embeddings resized to match (models.resize_vocabulary)."""
    # the vocabulary grows: a model passed in is copied, never resized in place
    lm = copy.deepcopy(lm) if lm is not None else config.load(train=True)
    vocab = sequences.TokenizerVocab(lm.tokenizer, config.size("codebook"))
    resize_vocabulary(lm.model, len(vocab))
    return lm.model, vocab


def final_weights(run_dir, name: str, replicate: int = 0) -> dict:
    """Replicate `replicate`'s weights of variant `name` in a finished latent run folder (its last checkpoint holds
    every replicate, stacked: lmlab.train.ensemble)."""
    from pathlib import Path

    from safetensors.torch import load_file

    found = sorted((Path(run_dir) / f"train-{name}" / "checkpoints").glob("step-*/model.safetensors"))
    if not found:
        raise LmlabError(f"no trained '{name}' model in {run_dir}; is it a finished `lmlab latent` run?")
    return {key: value[replicate] for key, value in load_file(found[-1]).items()}


def _latent_items(prep: Prepared, config: Config, rate: int, run_dir: RunDir, replicate: int, seed: int):
    """One replicate's VQ-VAE for `rate`, its training items (the leftmost m chain tokens of each replaced by
    codes), the forced prefixes of the test problems, and the numbers that describe them. Under the placebo every
    code of the items and of the forced prefixes is the one constant code (the VQ-VAE is trained as in the study and
    its reconstruction measured, but its codes are thrown away). The codes are encoded once (`_stored_codes`)."""
    vocab, train_ex = prep.vocab, prep.train
    rng = random.Random(f"{seed}|{rate}")
    ms = [sequences.draw_m(rng, ex, config.chunk) for ex in train_ex]
    codes, forced, extra = _stored_codes(prep, config, rate, run_dir, replicate, seed, ms)
    items, shares, ratio = [], [], []
    for ex, m, ex_codes in zip(train_ex, ms, codes):
        n = sequences.codes_needed(ex, m, config.chunk, rate) if m else 0
        items.append((ex.prompt, sequences.replace_with_latents(vocab, ex.chain, ex_codes, m, n) + ex.answer))
        shares.append(m / len(ex.chain))
        if m:
            ratio.append(m / n)
    extra.update(train_m_share=float(np.mean(shares)), train_m0_share=float(np.mean([s == 0 for s in shares])),
                 tokens_per_code=float(np.mean(ratio)) if ratio else float("nan"))
    return items, forced, extra


def _encoded(prep: Prepared, config: Config, rate: int, run_dir: RunDir, replicate: int, seed: int, ms):
    """(each training example's codes, each test problem's forced prefix and its m, the VQ-VAE's reconstruction
    numbers): the VQ-VAE trained (or its checkpoint read back) and the problems encoded, every process its share."""
    vocab, train_ex = prep.vocab, prep.train
    vq, chunks, _ = train_vq(vocab, train_ex, config, rate, run_dir, seed=seed, replicate=replicate)
    extra = vq_quality(vq, vocab, prep.dev, config, chunks)
    codes = parallel.share_out(len(train_ex), lambda idx: _codes_where(vq, vocab, train_ex, ms, idx, config.chunk))
    if config.placebo:  # the same m and number of codes, every code the one constant code
        codes = [sequences.carry_nothing(c) for c in codes]
    forced = parallel.share_out(len(prep.test), lambda idx: forced_prefixes(vq, vocab, [prep.test[i] for i in idx],
                                                                            config, rate))
    return codes, forced, extra


def _stored_codes(prep: Prepared, config: Config, rate: int, run_dir: RunDir, replicate: int, seed: int, ms):
    """`_encoded`, once: the codes and forced prefixes in codes/r{rate}-rep{replicate}.safetensors (ragged lists as
    their values end to end and each one's length) and the reconstruction numbers a unit of `codes`, so a resumed
    run reads them back instead of loading the VQ-VAE and encoding every problem again. Every process decides
    alike: rank 0 records the unit only after the encoding's gathers, which every process reaches after its own
    look here. Beside the study's own run of the same settings, a placebo run takes the study's codes (`_study_run`)
    and makes every one of them its constant code, as `_encoded` would from the same VQ-VAE."""
    from safetensors.numpy import save

    file = run_dir.path / "codes" / f"r{rate}-rep{replicate}.safetensors"
    saved = _read_codes(run_dir, rate, replicate)
    if saved is not None:
        return saved
    study = _study_run(config, run_dir)
    taken = _read_codes(study, rate, replicate) if study is not None else None
    if taken is not None:  # the study's VQ-VAE and codes, every code then the placebo's constant one
        codes, forced, extra = taken
        _copy_folder(study.path / f"vq-r{rate}-rep{replicate}", run_dir)  # (the diagnosis reads it)
        codes = [sequences.carry_nothing(c) for c in codes]
        forced = [(sequences.constant_prefix(prep.vocab, f), m) for f, m in forced]
    else:
        codes, forced, extra = _encoded(prep, config, rate, run_dir, replicate, seed, ms)
    if parallel.is_main():  # the arrays first, then the unit that says they are whole
        arrays = {**_flat("codes", codes), **_flat("forced", [f for f, _ in forced]),
                  "forced_m": np.array([m for _, m in forced], dtype=np.int64)}
        atomic_write(file, save(arrays))
        run_dir.record("codes", f"{rate}|{replicate}", [extra])
    return codes, forced, extra


def _read_codes(run_dir: RunDir, rate: int, replicate: int):
    """(codes, forced prefixes with their m, reconstruction numbers) a run stored for `rate` and `replicate`
    (`_stored_codes`), or None where it has not."""
    from safetensors.numpy import load

    file = run_dir.path / "codes" / f"r{rate}-rep{replicate}.safetensors"
    saved = run_dir.done("codes").get(f"{rate}|{replicate}")
    if saved is None or not file.is_file():
        return None
    arrays = load(file.read_bytes())
    codes = _ragged(arrays["codes"], arrays["codes_lengths"])
    prefixes = _ragged(arrays["forced"], arrays["forced_lengths"])
    return codes, list(zip(prefixes, arrays["forced_m"].tolist())), dict(saved[0])


def _study_run(config: Config, run_dir: RunDir) -> RunDir | None:
    """Beside a placebo run, the study's own finished run of the same settings in the same --out folder (None
    elsewhere). Its
    CoT and answer-only models and its VQ-VAEs are the placebo's by construction (the same seeds, data, steps and
    initial weights; only the latent models' codes differ), so the placebo takes over those the study finished
    instead of training them again."""
    if not config.placebo:
        return None
    study = run_dir.beside(config.model, config.model_copy(update={"placebo": False}).identity())
    # a finished run only: every process of a launch then reads the same units (a run still going could hand one
    # process a unit another does not yet see)
    return study if study is not None and study.complete else None


def _taken_over(config: Config, run_dir: RunDir, name: str) -> bool:
    """A baseline variant (CoT, answer-only) the study's own run finished, recorded as this placebo run's: its rows,
    and its checkpoints copied for the commands that read a run's models (`final_weights`); False where there is
    none to take."""
    study = _study_run(config, run_dir)
    rows = study.done("variants").get(name) if study is not None else None
    if rows is None or not (study.path / f"train-{name}").is_dir():
        return False
    _copy_folder(study.path / f"train-{name}", run_dir)
    if parallel.is_main():
        run_dir.record("variants", name, rows)
        run_dir.log(f"{name}: the study's own models, taken from {study.path.name} (the same seeds, data and steps)")
    run_dir.describe(baselines_taken_from=study.path.name)
    return True


def _copy_folder(source, run_dir: RunDir) -> None:
    """`source` (a folder of the study's run) copied into this run's folder by rank 0, in place of any folder of that
    name this run began itself."""
    import shutil

    if parallel.is_main() and source.is_dir():
        target = run_dir.path / source.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)


def _flat(name: str, lists: list[list[int]]) -> dict:
    """Ragged lists of ints as two arrays: `name` (their values end to end) and `name_lengths`."""
    return {name: np.array([v for x in lists for v in x], dtype=np.int64),
            f"{name}_lengths": np.array([len(x) for x in lists], dtype=np.int64)}


def _ragged(values: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    return [part.tolist() for part in np.split(values, np.cumsum(lengths)[:-1])] if len(lengths) else []


def _codes_where(vq, vocab, examples, ms, idx, chunk) -> list[list[int]]:
    """The chain codes of examples `idx` whose m is not 0 (encoded in batches), [] for the others."""
    need = [i for i in idx if ms[i]]
    got = dict(zip(need, chunk_codes_many(vq, vocab, [examples[i] for i in need], chunk)))
    return [got.get(i, []) for i in idx]


def _fit_stats(losses: list[float]) -> dict:
    """The training loss over the third and the last quarter of steps (the convergence check reads them)."""
    quarter = max(1, len(losses) // 4)
    return {"loss_q3": float(np.mean(losses[-2 * quarter:-quarter] or losses)),
            "loss_q4": float(np.mean(losses[-quarter:]))}


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    prep = prepare(config, lm)
    vocab, train_ex, test_ex = prep.vocab, prep.train, prep.test
    seeds = config.replicate_seeds()
    collate = collate_for(vocab.pad)
    cot_items = [(ex.prompt, ex.chain + ex.answer) for ex in train_ex]
    done = run_dir.done("variants")
    parallel.sync()  # every process has read the same variants as done before rank 0 records one
    variants = [("cot", 1), ("answer-only", 0)] + [(f"r{r}", r) for r in config.size("rates")]
    for name, rate in variants:
        if name in done or name in ("cot", "answer-only") and _taken_over(config, run_dir, name):
            continue
        extras = [{} for _ in seeds]
        forced = None
        if name == "cot":
            data = [cot_items] * len(seeds)
        elif name == "answer-only":
            data = [[(ex.prompt, ex.answer) for ex in train_ex]] * len(seeds)
        else:
            made = [_latent_items(prep, config, rate, run_dir, r, seed) for r, seed in enumerate(seeds)]
            data, forced, extras = [m[0] for m in made], [m[1] for m in made], [m[2] for m in made]
        model = stack([copy.deepcopy(m) for m in prep.initial])  # every variant starts from the same weights
        fit = train(model, PerReplicate(data), collate, lm_loss, train_cfg(config, config.size("steps"),
                                                                          f"{name} ({len(seeds)} replicates)",
                                                                          replicate_seeds=seeds),
                    run_dir.path / f"train-{name}")
        curves = np.array(fit.replicate_losses)  # (steps, replicates)
        result, fres, cres = _evaluated(model, prep, forced, config.placebo)
        if not parallel.is_main():  # it trained its slices and generated its share; rank 0 records the variant
            continue
        rows = []
        for r, seed in enumerate(seeds):
            rows += _variant_rows(name, rate, r, seed, result[r], (fres[r] if fres else None, cres[r] if cres else None),
                                  [m for _, m in forced[r]] if forced else None, test_ex,
                                  {**extras[r], **_fit_stats(curves[:, r].tolist())})
        run_dir.record("variants", name, rows)
        accs = [float(np.mean(result[r]["correct"])) for r in range(len(seeds))]
        run_dir.log(f"{name}: accuracy per replicate " + ", ".join(f"{100 * a:.1f}%" for a in accs))
    parallel.main_only()
    rows = [r for rs in run_dir.done("variants").values() for r in rs]
    order = {name: i for i, (name, _) in enumerate(variants)}
    return pd.DataFrame(sorted(rows, key=lambda r: (order.get(r["variant"], 99), r.get("replicate", 0))))


def _evaluated(model, prep: Prepared, forced, placebo: bool) -> tuple:
    """A variant's greedy generations on the test problems, every replicate's: on its own, with the true codes forced
    (`forced`: each replicate's prefixes and m; None for CoT and answer-only) and with one constant code in every
    latent position of the same prefixes (does the model read its codes? not run under the placebo, whose forced
    prefixes hold that code already). None where not run."""
    vocab, test_ex, max_new = prep.vocab, prep.test, prep.max_new
    result = evaluate(model, vocab, test_ex, max_new=max_new)
    if forced is None:
        return result, None, None
    fres = evaluate(model, vocab, test_ex, max_new=max_new, prefixes=[[f for f, _ in fr] for fr in forced])
    constant = [[sequences.constant_prefix(vocab, f) for f, _ in fr] for fr in forced]
    cres = None if placebo else evaluate(model, vocab, test_ex, max_new=max_new, prefixes=constant)
    return result, fres, cres


def _variant_rows(name, rate, replicate, seed, result, forced_results, forced_m, test_ex, extra) -> list[dict]:
    """One replicate's summary row of a variant and its per-problem rows; `forced_results`: its generations with the
    true codes forced and with one constant code forced at the same m (None where not run)."""
    fres, cres = forced_results
    acc = wilson(sum(result["correct"]), len(result["correct"]))
    tokens = np.array(result["tokens"], dtype=float)
    used = np.array(result["latents"]) > 0
    right = np.array(result["correct"], dtype=float)
    row = {"kind": "variant", "variant": name, "rate": rate, "replicate": replicate, "seed": seed,
           "accuracy": acc.estimate, "acc_lo": acc.low, "acc_hi": acc.high, "tokens": float(tokens.mean()),
           "latents": float(np.mean(result["latents"])), "used_latents": float(used.mean()),
           "acc_with_latents": float(right[used].mean()) if used.any() else float("nan"),
           "acc_without_latents": float(right[~used].mean()) if (~used).any() else float("nan"),
           "seconds_per_problem": result["seconds_per_problem"], "n_test": len(test_ex), **extra}
    forced_correct = [None] * len(test_ex)
    if fres is not None:
        facc = wilson(sum(fres["correct"]), len(fres["correct"]))
        row.update(forced_accuracy=facc.estimate, forced_lo=facc.low, forced_hi=facc.high,
                   forced_tokens=float(np.mean(fres["tokens"])),
                   forced_m_share=float(np.mean([m / len(ex.chain) for m, ex in zip(forced_m, test_ex)])))
        forced_correct = [int(c) for c in fres["correct"]]
    if cres is not None:
        row.update(constant_accuracy=float(np.mean(cres["correct"])))
    return [row] + [{"kind": "problem", "variant": name, "replicate": replicate, "idx": i, "correct": int(c),
                     "tokens": int(t), "latents": int(n), "forced_correct": fc}
                    for i, (c, t, n, fc) in enumerate(zip(result["correct"], result["tokens"], result["latents"],
                                                            forced_correct))]
