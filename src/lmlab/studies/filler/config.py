"""S3 configuration: every knob with its default and a sentence; the quick/full sizes (and the quick
scoring DECISION) are in profiles.yaml."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from lmlab.studies.config import StudyConfig


@dataclass(frozen=True)
class Treatment:
    """What a run does with the tokens it inserts and with its ARM arm, chosen once where the run starts
    (`Treatment.of`) and handed on as a value: the paper's (inserted tokens read like any other; ARM redistributes
    attention at its tuned (c, p1)) or the placebo's (every inserted token kept at its position and masked from
    every query; ARM redistributes nothing: the plain model, with nothing to tune)."""
    placebo: bool = False

    @classmethod
    def of(cls, config: "Config") -> "Treatment":
        return cls(placebo=bool(config.placebo))

    @property
    def redistributes(self) -> bool:
        """ARM acts (its (c, p1) tuned and applied)."""
        return not self.placebo

    def hidden(self, built: list) -> list | None:
        """The inserted positions to mask from every query, per prompt (`build_ids`' pairs); None: nothing masked."""
        return [inserted for _, inserted in built] if self.placebo else None

    @property
    def arm(self) -> str:
        """What the ARM arm was, in the run's meta."""
        return "nothing redistributed (placebo): the plain model" if self.placebo else "redistributed"


class Config(StudyConfig):
    device_map_refusal = None  # inference only: the model may be spread over devices and disk
    launch_refusal = None  # its units are shared out by rank (lmlab.parallel)
    placebo_treatment: ClassVar[str] = (
        "the filler tokens stay in every prompt at their positions but are masked from every query (their "
        "attention-mask columns 0 in every layer and head, as padding's are), and ARM redistributes nothing "
        "(the plain model)")
    replicate_refusal = ("the filler study trains nothing and decodes greedily: a rerun draws nothing new (its "
                         "sampled runs are --samples)")
    benchmark: str = Field("arithmetic", description="arithmetic (generated), gsm8k or math500 (the hub), or "
                                                      "gsm8k:PATH / math500:PATH (a jsonl file or saved dataset folder)")
    accuracy: bool | None = Field(None, description="generate and score answers (the accuracy gains); false: the "
                                                     "attention profile and the mechanism check alone, the gains "
                                                     "priced at this machine's decoding pace (the demo)")
    n_test_per_level: int | None = Field(None, ge=1, description="test problems per level")
    n_dev_per_level: int | None = Field(None, ge=1, description="dev problems per level for tuning ARM")
    max_new_tokens: int | None = Field(None, ge=1, description="generation budget in new tokens (full: 2048, as the paper)")
    samples: int | None = Field(None, ge=1, description="runs per problem: 1 = greedy; more = temperature sampling, "
                                                  "one seed each (full: 5, as the paper averages five runs)")
    temperature: float = Field(0.7, description="sampling temperature when samples > 1 (DECISION: the paper "
                                                "names none)")
    top_p: float = Field(0.95, description="nucleus share when samples > 1")
    sweep_problems: int | None = Field(None, ge=1, description="test problems used in the sweeps")
    scoring: Literal["boxed", "boxed_or_last_number"] | None = Field(
        None, description="read the last \\boxed{} only (the paper; full), or fall back to the text's last number "
                          "(quick: the embedded model never writes \\boxed{})")
    insert_count: int = Field(55, ge=0, description="filler tokens inserted (between the instruction and the question) in the Mless/Mful conditions")
    sweep_lengths: list[int] = Field(default_factory=lambda: [10, 25, 40, 70],
                                     description="insertion lengths of the length sweep")
    profile_problems: int = Field(24, ge=1, description="problems whose attention is profiled")
    profile_layer: int = Field(0, ge=0, description="layer whose attention is profiled")
    head: int | None = Field(None, ge=0, description="head for the profile (default: the one whose profile changes "
                                                     "most on half the profiled problems, judged on the other half)")
    arm_layer: int = Field(0, ge=0, description="layer whose attention output ARM edits")
    arm_c: list[float] | None = Field(None, description="ARM's c values tried on dev (the paper: 0.13 for "
                                                        "Qwen2.5-Math-1.5B, 0.32 for Llama-3.1-8B)")
    arm_p1: list[float] | None = Field(None, description="ARM's P1 percentiles tried on dev (the paper: 99.5, 90)")
    arm_scope: Literal["call", "row", "token"] = Field("call", description="ARM statistics over the whole activation "
                                                       "tensor of a call (the authors' code), each sequence, or each token")
    arm_p_min: float = Field(0.02, description="ARM's least edited share (0.02 as we read the paper; the authors' code 0.2)")
    def check_inputs(self, models: bool = True) -> None:
        """The benchmark's name, and a gsm8k:PATH / math500:PATH file read and parsed (the first bad row named)."""
        super().check_inputs(models)
        from lmlab.data.math import read_math_file

        if self.benchmark == "arithmetic":
            return
        kind, _, path = self.benchmark.partition(":")
        if kind not in ("gsm8k", "math500"):
            raise unknown_benchmark(self.benchmark)
        if path:
            read_math_file(kind, path)

    batch_size: int | None = Field(None, ge=1, description="prompts generated together (CPU: 64, a chunk in one batch; "
                                                          "decoding is bound by reading the weights, so larger batches "
                                                          "cost less a row; a GPU: 1024 in quick)")


def unknown_benchmark(name: str):
    from lmlab.errors import LmlabError

    return LmlabError(f"unknown benchmark '{name}'; use arithmetic, gsm8k or math500 (from the hub), or "
                      f"gsm8k:PATH / math500:PATH (a jsonl file or a saved dataset folder)")
