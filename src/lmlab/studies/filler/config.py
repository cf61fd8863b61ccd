"""S3 configuration: every knob with its default, and the quick/full sizes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lmlab.studies.base import StudyConfig

# quick: 256 new tokens let 98% of SmolLM2-135M's answers end by themselves (49 of 50 generated arithmetic
# problems, w/o; 62% at 128, 14% at the earlier 48). DECISION: quick scores with the last-number fallback, as
# SmolLM2-135M wrote \boxed{} in none of those 50 answers (boxed-only accuracy 0%, with the fallback 14%);
# full scores as the paper, the last \boxed{} only. Every answer row says which one scored it (`scored_by`).
PROFILES = {"quick": dict(n_test_per_level=20, n_dev_per_level=4, max_new_tokens=256, sweep_problems=12, samples=1,
                          scoring="boxed_or_last_number"),
            "full": dict(n_test_per_level=200, n_dev_per_level=40, max_new_tokens=2048, sweep_problems=200,
                         samples=5, scoring="boxed")}


class Config(StudyConfig):
    benchmark: str = Field("arithmetic", description="arithmetic, or gsm8k:PATH / math500:PATH")
    n_test_per_level: int | None = Field(None, description="test problems per level (quick 20, full 200)")
    n_dev_per_level: int | None = Field(None, description="dev problems per level for tuning ARM (quick 4)")
    max_new_tokens: int | None = Field(None, description="generation budget (quick 256, full 2048 as the paper)")
    samples: int | None = Field(None, description="runs per problem: 1 = greedy (quick); more = temperature "
                                                  "sampling, one seed each (full 5, as the paper averages five runs)")
    temperature: float = Field(0.7, description="sampling temperature when samples > 1 (DECISION: the paper "
                                                "names none)")
    top_p: float = Field(0.95, description="nucleus share when samples > 1")
    sweep_problems: int | None = Field(None, description="test problems used in the sweeps (quick 12)")
    scoring: Literal["boxed", "boxed_or_last_number"] | None = Field(
        None, description="read the last \\boxed{} only (the paper; full), or fall back to the text's last number "
                          "(quick: the embedded model never writes \\boxed{})")
    insert_count: int = 55
    sweep_lengths: list[int] = Field(default_factory=lambda: [10, 25, 40, 70])
    profile_problems: int = 24
    profile_layer: int = 0
    head: int | None = Field(None, description="head for the profile (default: the one that changes most)")
    arm_layer: int = 0
    arm_c: list[float] = Field(default_factory=lambda: [0.13, 0.32])
    arm_p1: list[float] = Field(default_factory=lambda: [90.0, 99.5])
    arm_scope: Literal["call", "row", "token"] = Field("call", description="ARM statistics over the whole activation "
                                                       "tensor of a call (the authors' code), each sequence, or each token")
    arm_p_min: float = Field(0.02, description="ARM's least edited share (METHODS.md 0.02; the authors' code 0.2)")
    batch_size: int = Field(64, description="prompts generated together (64: a chunk in one batch; decoding is "
                                           "bound by reading the weights, so 64 rows cost 21% less than 2 x 32)")

    def size(self, name: str):
        value = getattr(self, name)
        return PROFILES[self.profile][name] if value is None else value
