"""The shape every study shares, and the registry the CLI and the API read.

A study is a package `studies/NAME/` with the same few files:
    config.py     class Config(StudyConfig): every knob with its default; PROFILES (quick|full)
    recipe.py     run(config, run_dir, lm=None) -> DataFrame: the run as a short sequence of named phases
                  (resumable via run_dir.done/record); rows carry a `kind` that names their table
    measure.py    (and similar) the measurements that drive the model, through lmlab.interventions only
    analysis.py   figure(result, fig=None) and verdict(result) on the result's named tables
and `__init__.py` registers a `StudySpec`. `lmlab.studies.runner.run_study` does the rest: run folder,
seeds, resume, tables/figure/verdict files, manifest, several models per result.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict

from lmlab.errors import LmlabError

if TYPE_CHECKING:  # numpy, pandas and torch load on first use, so the CLI starts fast
    import pandas as pd

Status = Literal["reproduced", "not reproduced", "inconclusive"]


class StudyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str
    profile: Literal["quick", "full"] = "quick"
    seed: int = 0


class Verdict(BaseModel):
    """The seed's qualitative claim, checked on the table, with the numbers behind the answer."""

    status: Status
    claim: str
    summary: str
    evidence: dict[str, Any] = {}


@dataclass(frozen=True)
class StudySpec:
    name: str  # registry key and CLI command, e.g. "knockout"
    title: str
    paper: str
    seed_file: str  # the seed figure description in shared/seeds
    config: type[StudyConfig]
    run: Callable[..., pd.DataFrame]  # run(config, run_dir, lm=None)
    figure: Callable[..., Any]  # figure(result, fig=None) -> matplotlib Figure (or the SubFigure it drew on)
    verdict: Callable[[Any], Verdict]  # verdict(result) -> Verdict, on one model's result
    default_model: str
    seed_summary: str = ""  # the paper's figure and numbers, in our words, shown beside ours in the report
    summary: Callable[[Any], pd.DataFrame] | None = None  # one model's key rows for the report
    full_models: tuple[str, ...] = ()  # `lmlab reproduce --profile full` runs these (default: default_model)
    loads_model: bool = True  # False: the study builds its own model in the run (it takes no LoadedModel)


STUDIES: dict[str, StudySpec] = {}


def register(spec: StudySpec) -> StudySpec:
    STUDIES[spec.name] = spec
    return spec


def get_study(name: str) -> StudySpec:
    try:
        return STUDIES[name]
    except KeyError:
        known = ", ".join(sorted(STUDIES)) or "(none yet)"
        raise LmlabError(f"unknown study '{name}'; registered studies: {known}") from None


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def canvas(fig, size: tuple[float, float], *grid, **kwargs):
    """(figure, axes) for a study's figure: a new Figure of `size`, or the SubFigure the caller gave (one
    model's panel row in a several-model figure). `grid` and `kwargs` go to `subplots`."""
    if fig is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=size)
    return fig, fig.subplots(*grid, **kwargs)


def finish(fig):
    """Tight layout on a whole figure (a SubFigure takes its parent's layout)."""
    if hasattr(fig, "tight_layout"):
        fig.tight_layout()
    return fig
