"""Compare configuration: every knob with its default and a sentence; the demo/quick/full sizes are in profiles.yaml."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, PrivateAttr

from lmlab.data.generated.circuits import ALL_TASKS, pairs_file, read_pair_rows
from lmlab.studies.compare.methods import Made, check_packages, make_help, parse_make
from lmlab.studies.config import StudyConfig

# variants that name no model: the original itself (the positive control), the original with its top heads zeroed
# ("ablate:N"), and the original with its top heads moved to other heads of their layers ("swap", "swap:half": the
# placebo, a working model whose circuit is known to sit elsewhere)
SAME = "same"
ABLATE = "ablate"
SWAP = "swap"
SWAP_HALF = "swap:half"
PLACEBO_VARIANTS = (SWAP, SWAP_HALF)


class Config(StudyConfig):
    _made: tuple | None = PrivateAttr(default=None)  # (--make's values, what they read as)
    device_map_refusal = ("compare holds the original and one variant at a time on one device (a packed student is "
                          "rebuilt from the original's weights)")
    replicate_refusal = None  # --seeds: the prompt draws every cell is read on, and the students --make trains a cell
    placebo_treatment: ClassVar[str] = (
        "the variants (and any students --make would train) replaced by the original with each task's top-k heads, "
        "ranked on other prompt pairs, exchanged in the weights with other heads of the same layers: 'swap' moves "
        "all of them, 'swap:half' every other one, so the model computes exactly what it did with its circuit "
        "moved, and 'swap' must come out 'does not keep', 'swap:half' never 'keeps'")

    profile: Literal["demo", "quick", "full"] = Field(
        "quick", description="demo (IOI and Greater-Than at 32 prompt pairs: about 20 minutes on 2 CPU cores with the "
                             "variants of make compare-demo), quick (the four tasks and induction at 64 prompt pairs: "
                             "hours on a CPU, each unit timed in the run's log) or full (the paper's sizes, a GPU)")
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
    make: list[str] | None = Field(None, description=make_help(), json_schema_extra={"repeatable": True})
    tasks: list[str] | None = Field(None, description=f"circuit tasks ({', '.join(ALL_TASKS)}), or file:PATH: prompt "
                                                       "pairs of your own, one JSON object a line with the texts clean, "
                                                       "corrupted, answer and distractor (one token each; a pair's "
                                                       "prompts the same length in tokens)")
    n_prompts: int | None = Field(None, ge=4, description="prompt pairs per task (the same pairs for every model)")
    calibration_chunks: int | None = Field(None, ge=1, description="--make gptq and awq: chunks of 256 tokens of "
                                                                   "calibration text (standard-library docstrings "
                                                                   "the perplexity is not read on)")
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
        check_packages(self.made())  # (every method's widths read, its package there)
        if self.pathway_datasets:
            from lmlab.studies.registry import get_study  # S1's own check, through the registry

            get_study("knockout").config(model=self.model, datasets=self.pathway_datasets).check_inputs(models=False)

    def made(self) -> Made:
        """--make read (methods.parse_make), once per value of the option."""
        key = tuple(self.make or [])
        if self._made is None or self._made[0] != key:
            self._made = (key, parse_make(list(key)))
        return self._made[1]


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
