"""S3 configuration: every knob with its default, and the quick/full sizes."""

from __future__ import annotations

from pydantic import Field

from lmlab.studies.base import StudyConfig

PROFILES = {"quick": dict(n_test_per_level=20, n_dev_per_level=4, max_new_tokens=48, sweep_problems=12),
            "full": dict(n_test_per_level=200, n_dev_per_level=40, max_new_tokens=384, sweep_problems=200)}


class Config(StudyConfig):
    benchmark: str = Field("arithmetic", description="arithmetic, or gsm8k:PATH / math500:PATH")
    n_test_per_level: int | None = Field(None, description="test problems per level (quick 20, full 200)")
    n_dev_per_level: int | None = Field(None, description="dev problems per level for tuning ARM (quick 4)")
    max_new_tokens: int | None = Field(None, description="generation budget (quick 48, full 384)")
    sweep_problems: int | None = Field(None, description="test problems used in the sweeps (quick 12)")
    insert_count: int = 55
    sweep_lengths: list[int] = Field(default_factory=lambda: [10, 25, 40, 70])
    profile_problems: int = 24
    profile_layer: int = 0
    head: int | None = Field(None, description="head for the profile (default: the one that changes most)")
    arm_layer: int = 0
    arm_c: list[float] = Field(default_factory=lambda: [0.13, 0.32])
    arm_p1: list[float] = Field(default_factory=lambda: [90.0, 99.5])
    batch_size: int = Field(64, description="prompts generated together (64: a chunk in one batch; decoding is "
                                           "bound by reading the weights, so 64 rows cost 21% less than 2 x 32)")

    def size(self, name: str):
        value = getattr(self, name)
        return PROFILES[self.profile][name] if value is None else value
