"""S1 configuration: every knob with its default and a sentence; the quick/full sizes are in profiles.yaml."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from lmlab.data.generated import geo_qa
from lmlab.studies.config import StudyConfig

MIN_GROUP = 5  # fewest samples of a pathway group that count (a probe of its own, a verdict on the set)


class Config(StudyConfig):
    placebo_treatment: ClassVar[str] = (
        "the exact question tokens (E_Q) replaced, in the knockout and in token patching, by as many random question "
        "tokens outside E_Q: a draw of the random-token control's kind, independent of the control's own draws")
    device_map_refusal = None  # inference only: the model may be spread over devices and disk
    launch_refusal = None  # its units are shared out by rank (lmlab.parallel)
    datasets: list[str] | None = Field(None, description="generated sets (" + ", ".join(geo_qa.SETS) + "), hub "
                                       "ids (popqa, triviaqa, nq, hotpotqa), or FORMAT:PATH for a real file or saved "
                                       "dataset folder")
    per_dataset: int | None = Field(None, ge=1, description="questions per dataset")
    sweep_every: int | None = Field(None, ge=1, description="knock out every n-th layer (plus the best probe layers)")
    scope: Literal["each", "span"] = Field("each", description="knock out each E_Q token from every later "
                                          "position (the paper), or only the positions after the span")
    probes: Literal["per_dataset", "pooled"] = Field("per_dataset", description="one probe per dataset and layer, "
                                                     "or one pooled over the datasets")
    max_new_tokens: int = Field(8, ge=1, description="greedy answer length in tokens")
    batch_size: int = Field(16, ge=1, description="prompts per forward pass")
    test_fraction: float = Field(0.3, gt=0, lt=1, description="share of questions held out to score the probes")
    min_per_class: int = Field(10, ge=1, description="fewest right and wrong answers a probe is trained on")

    def check_inputs(self, models: bool = True) -> None:
        """Known dataset names, and every FORMAT:PATH file read and parsed (the first bad row named)."""
        super().check_inputs(models)
        from lmlab.data.formats import READERS, read_qa

        for entry in self.size("datasets"):
            kind, _, path = entry.partition(":")
            if entry in geo_qa.SETS or entry in READERS:
                continue
            if path and kind in READERS:
                read_qa(kind, path)
                continue
            raise unknown_dataset(entry)


def unknown_dataset(entry: str):
    from lmlab.data.formats import READERS
    from lmlab.errors import LmlabError

    return LmlabError(f"unknown dataset '{entry}'; generated: {', '.join(geo_qa.SETS)}; from the hub: "
                      f"{', '.join(READERS)}; or a file or saved dataset folder as FORMAT:PATH")
