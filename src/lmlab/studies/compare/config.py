"""Compare configuration: every knob with its default and a sentence; the demo/quick/full sizes are in profiles.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from lmlab.data.generated.circuits import ALL_TASKS, pairs_file, read_pair_rows
from lmlab.studies.base import StudyConfig

# variants that name no model: the original itself (the positive control), the original with its top heads zeroed
# ("ablate:N"), and the original with its top heads moved to other heads of their layers ("swap", "swap:half": the
# placebo, a working model whose circuit is known to sit elsewhere)
SAME = "same"
ABLATE = "ablate"
SWAP = "swap"
SWAP_HALF = "swap:half"
PLACEBO_VARIANTS = (SWAP, SWAP_HALF)
# what --make builds in the run: XTC students trained by lmlab quantize, or the original rounded to nearest (no
# training: the post-training baseline), each kind's bits
MAKE_KINDS = {"quantized": (8, 4, 2, 1), "rtn": (8, 7, 6, 5, 4, 3, 2), "hqq": (8, 4, 3, 2, 1), "bnb": (8, 4)}
# a variant at one bit width of a method: made in the run (`rtn-4bit`), or a folder so named (`.../gptq-4bit`, made
# elsewhere); the method is its name without the width
WIDTH = r"(?:.*[/\\])?([^/\\]+)-(\d+)bit[/\\]?"
SPARSE = "sparse"  # --make sparse: S4's model half through the registry, its sparse models the variants
POST_TRAINING = ("rtn", "hqq", "bnb")  # the kinds made from the original without training, a model folder each
# kinds a user may ask for that lmlab cannot make in its own environment: why, and the way round
_LLM_COMPRESSOR = ("llm-compressor, which makes them, requires transformers <= 5.17 and compressed-tensors 0.19 "
                   "(lmlab needs transformers 5.24)")
NOT_MADE = {"gptq": _LLM_COMPRESSOR, "awq": _LLM_COMPRESSOR}


class Config(StudyConfig):
    device_map_refusal = ("compare holds the original and one variant at a time on one device (a packed student is "
                          "rebuilt from the original's weights)")
    replicate_refusal = None  # --seeds: the students --make trains per cell
    placebo_treatment: ClassVar[str] = (
        "the variants (and any students --make would train) replaced by the original with each task's top-k heads, "
        "ranked on other prompt pairs, exchanged in the weights with other heads of the same layers: 'swap' moves "
        "all of them, 'swap:half' every other one, so the model computes exactly what it did with its circuit "
        "moved, and 'swap' must come out 'does not keep', 'swap:half' never 'keeps'")

    variant: list[str] | None = Field(
        None, description="a model to compare with the original (repeatable): a folder or hub id of the same "
                          "architecture and tokenizer (a fine-tune; a compressed-tensors checkpoint, as "
                          "llm-compressor's GPTQ and AWQ write them, or a bitsandbytes one, NF4 or LLM.int8: read "
                          "de-quantized); a packed student (.safetensors) of lmlab quantize; a quantize or "
                          "sparse-circuits run folder (each of its students or sparse models, their replicates "
                          "pooled per cell); 'same' (the original itself: the positive control); 'ablate' (the "
                          "original with every task's circuit zeroed, its top-k heads ranked on other prompt pairs) or "
                          "'ablate:N' (its N top heads of every task zeroed); 'swap' (the original with each task's "
                          "top-k heads, ranked on other prompt pairs, exchanged in the weights with other heads of "
                          "their layers: a working model whose circuit sits elsewhere, the negative control and the "
                          "placebo) or 'swap:half' (every other one of them moved: half the circuit kept)",
        json_schema_extra={"repeatable": True})
    make: list[str] | None = Field(
        None, description="variants made in the run: quantized:2,1 (students trained by lmlab quantize's recipe, its "
                          "decoder option at this profile's sizes, each 8, 4, 2 or 1 bits; --seeds replicates each); "
                          "rtn:8,4,3,2 (the original rounded to nearest, each row of every linear layer on its own "
                          "grid of 2 to 8 bits, no training: the post-training baseline); hqq:4,2 (the original "
                          "quantized by Half-Quadratic Quantization, groups of 64 weights, 8, 4, 3, 2 or 1 bits: the "
                          "hqq extra); bnb:8,4 (bitsandbytes' quantizers: NF4 in blocks of 64 at 4 bits, "
                          "LLM.int8()'s int8 rows at 8: the bnb extra), each saved as a model folder with its "
                          "recipe and its perplexity on held-out text; sparse (lmlab sparse-circuits' model half at "
                          "this profile's --circuits sizes, without its toy: the original post-trained with sparse "
                          "attention, --seeds replicates). GPTQ and AWQ are made with llm-compressor "
                          "in an environment of its own and compared as --variant DIR",
        json_schema_extra={"repeatable": True})
    tasks: list[str] | None = Field(None, description=f"circuit tasks ({', '.join(ALL_TASKS)}), or file:PATH: prompt "
                                                       "pairs of your own, one JSON object a line with the texts clean, "
                                                       "corrupted, answer and distractor (one token each; a pair's "
                                                       "prompts the same length in tokens)")
    n_prompts: int | None = Field(None, ge=4, description="prompt pairs per task (the same pairs for every model)")
    threshold: float = Field(0.9, gt=0, le=1, description="explained effect that defines a circuit's size")
    min_k: int = Field(5, ge=1, description="the fewest heads the overlap is read at (the circuit's size, else this)")
    verify_heads: int | None = Field(None, ge=0, description="each model's top heads checked by activation patching "
                                                             "on every task")
    min_verify: float = Field(0.5, ge=-1, le=1, description="the Spearman correlation of attribution with activation "
                                                            "patching on those heads below which a model's ranking is "
                                                            "not compared")
    fine_grid: bool | None = Field(None, description="explained-effect grid: every N to 8, then +2, then x1.15 "
                                                     "(false: x1.4 steps)")
    batch_size: int = Field(16, ge=1, description="prompt pairs per forward pass")
    pathways: bool | None = Field(None, description="also run lmlab knockout (S1) on the original and every variant, "
                                                    "probes trained per model: does the variant keep the question-"
                                                    "anchored pathway where the original has it?")
    pathway_datasets: list[str] | None = Field(None, description="with --pathways: S1's datasets (default: its "
                                                                 "profile's)")
    pathway_questions: int | None = Field(None, ge=1, description="with --pathways: S1's questions per dataset "
                                                                  "(default: its profile's)")

    def check_inputs(self, models: bool = True) -> None:
        super().check_inputs(models)
        from lmlab.errors import LmlabError

        for name in self.size("tasks") or []:
            if pairs_file(name) is not None:
                read_pair_rows(pairs_file(name))  # the file is read and each row checked now; its tokens when loaded
            elif name not in ALL_TASKS:
                raise LmlabError(f"unknown circuit task '{name}'; registered tasks: {', '.join(ALL_TASKS)}, or "
                                 "file:PATH for prompt pairs of your own")
        if not (self.variant or self.make or self.placebo):
            raise LmlabError("give a variant to compare with the original: --variant DIR_OR_ID (repeatable), "
                             "--variant same, --variant ablate:N, --variant swap, or --make quantized:2,1 (or "
                             "--placebo)")
        for spec in self.variant or []:
            check_variant(spec)
            if models:
                check_same_architecture(self.model, spec)
        self.made_bits()  # (every kind's bits checked)
        if self.made_bits("hqq"):
            import importlib.util

            from lmlab.extras import HQQ

            if importlib.util.find_spec("hqq") is None:
                raise LmlabError(HQQ)
        if self.made_bits("bnb"):
            from lmlab.models.quantized import bnb_functional

            bnb_functional()  # (one sentence where the bnb extra is missing)
        if self.pathway_datasets:
            from lmlab.studies.base import get_study  # S1's own check, through the registry

            get_study("knockout").config(model=self.model, datasets=self.pathway_datasets).check_inputs(models=False)

    def made_bits(self, kind: str = "quantized") -> list[int]:
        """The bits --make asks of one kind (quantized:B[,B...], rtn:B[,B...], hqq:B[,B...], bnb:B[,B...]); one sentence
        for anything else."""
        from lmlab.errors import LmlabError

        made: dict[str, list[int]] = {k: [] for k in MAKE_KINDS}
        for item in self.make or []:
            name, _, rest = item.partition(":")
            if item == SPARSE:
                continue
            if name in NOT_MADE:
                raise LmlabError(f"--make {item}: lmlab cannot make {name.upper()} variants here: {NOT_MADE[name]}; "
                                 f"make the checkpoint with llm-compressor in an environment of its own and pass its "
                                 f"folder as --variant DIR (it is read de-quantized)")
            if name not in MAKE_KINDS:
                raise LmlabError(f"--make {item}: unknown kind '{name}'; use quantized:BITS (students, e.g. "
                                 f"quantized:2,1), rtn:BITS (rounded to nearest, e.g. rtn:8,4,3,2), hqq:BITS "
                                 f"(Half-Quadratic Quantization, e.g. hqq:4,2), bnb:BITS (bitsandbytes: NF4 at 4, "
                                 f"LLM.int8 at 8) or sparse (lmlab sparse-circuits' sparse-attention models)")
            try:
                parts = [int(b) for b in rest.split(",") if b.strip()]
            except ValueError:
                parts = []
            allowed = MAKE_KINDS[name]
            if not parts or any(b not in allowed for b in parts):
                raise LmlabError(f"--make {item}: give the bits, each one of {', '.join(map(str, allowed))} (e.g. "
                                 f"{name}:{allowed[0]},{allowed[-1]})")
            made[name] += [b for b in parts if b not in made[name]]
        return made[kind]

    def made_sparse(self) -> bool:
        """--make sparse: lmlab sparse-circuits' post-trained sparse-attention models, one per replicate."""
        return SPARSE in (self.make or [])


def circuit_k(heads_needed: float, total: int, min_k: int) -> int:
    """The k the overlap is read at: the heads the original needs for the threshold's effect, at least `min_k` and at
    most half the heads (DECISION: beyond half, two random k-sets already share a third of their union, and the top-k
    is mostly heads that do nothing; a curve that only stays above 0.9 near every head says no circuit is small)."""
    k = int(heads_needed) if heads_needed == heads_needed else min_k  # NaN: the curve never stays there
    return int(max(1, min(max(k, min_k), total // 2)))


def check_variant(spec: str) -> None:
    """One sentence for a variant that cannot be one (no model is loaded; hub ids are checked when loaded)."""
    from pathlib import Path

    from lmlab.errors import LmlabError
    from lmlab.models.catalog import check_model_available
    from lmlab.runs import holds_packed_students, holds_sparse_models

    if spec == SAME:
        return
    if spec in (ABLATE,) + PLACEBO_VARIANTS:
        return
    if spec.startswith(SWAP + ":"):
        raise LmlabError(f"--variant {spec}: the swap variants are 'swap' (every top head moved) and 'swap:half'")
    if spec.startswith(ABLATE + ":"):
        n = spec.partition(":")[2]
        if not n.isdigit() or int(n) < 1:
            raise LmlabError(f"--variant {spec}: give how many top heads to zero, e.g. ablate:5")
        return
    path = Path(spec).expanduser()
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise LmlabError(f"--variant {spec}: no such file")
        return
    if path.is_dir() and (holds_packed_students(path) or holds_sparse_models(path)):
        return  # a quantize or sparse-circuits run folder
    check_model_available(spec)
    from lmlab.models.quantized import of_folder

    of_folder(spec)  # a library's checkpoint lmlab cannot read (its method, or its package missing): one sentence


def check_same_architecture(original: str, spec: str) -> None:
    """A variant model (a folder or hub id) of another architecture than the original, refused from the two configs
    before any weights load; where either config cannot be read without loading (a GGUF file, an embedded model not
    prepared), the run checks once both are loaded."""
    from pathlib import Path

    from lmlab.errors import LmlabError
    from lmlab.models.catalog import shape_without_weights
    from lmlab.runs import holds_packed_students, holds_sparse_models

    path = Path(spec).expanduser()
    if spec in (SAME, ABLATE, *PLACEBO_VARIANTS) or spec.startswith(ABLATE + ":") or path.suffix == ".safetensors" \
            or (path.is_dir() and (holds_packed_students(path) or holds_sparse_models(path))):
        return  # built on the original's weights, or checked when the run folder's models load
    ours, theirs = shape_without_weights(original), shape_without_weights(spec)
    if ours is None or theirs is None:
        return
    if ours["family"] != theirs["family"]:
        raise LmlabError(f"--variant {spec} is a {theirs['family']} model, the original a {ours['family']}: compare "
                         "needs the same architecture")
    if (theirs["layers"], theirs["heads"]) != (ours["layers"], ours["heads"]):
        raise LmlabError(f"--variant {spec} has {theirs['layers']} layers of {theirs['heads']} heads; the original "
                         f"{ours['layers']} of {ours['heads']}: compare needs the same architecture")
