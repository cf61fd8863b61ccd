"""S1 configuration: every knob with its default, and the quick/full sizes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lmlab.data.generated import geo_qa
from lmlab.studies.base import StudyConfig

PROFILES = {"quick": dict(per_dataset=128, sweep_every=4), "full": dict(per_dataset=1000, sweep_every=1)}


class Config(StudyConfig):
    datasets: list[str] = Field(default_factory=lambda: list(geo_qa.RELATIONS),
                                description="generated set names, or FORMAT:PATH for real files")
    per_dataset: int | None = Field(None, ge=1, description="questions per dataset (quick 128, full 1000)")
    sweep_every: int | None = Field(None, ge=1, description="knock out every n-th layer (quick 4, full 1)")
    scope: Literal["each", "span"] = Field("each", description="knock out each E_Q token from every later "
                                          "position (the paper), or only the positions after the span")
    probes: Literal["per_dataset", "pooled"] = Field("per_dataset", description="one probe per dataset and layer, "
                                                     "or one pooled over the datasets")
    max_new_tokens: int = 8
    batch_size: int = 16
    test_fraction: float = 0.3
    min_per_class: int = 10

    def sizes(self) -> dict:
        base = dict(PROFILES[self.profile])
        base.update({k: v for k, v in (("per_dataset", self.per_dataset), ("sweep_every", self.sweep_every)) if v})
        return base
