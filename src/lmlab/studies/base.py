"""The shape every study shares, and the registry the CLI reads.

A study module defines
    class Config(StudyConfig)                      every knob with its default; profile quick|full
    def run(config, run: RunDir) -> DataFrame      one row per measurement; resumable via run.done/record
    def figure(table) -> matplotlib Figure         the seed's figure
    def verdict(table) -> Verdict                  the seed's claim as a check that can fail
and registers itself with `register(StudySpec(...))`. `run_study` does the rest: run folder, seeds,
resume, table/figure/verdict files, manifest.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict

from lmlab.errors import LmlabError
from lmlab.runs import RunDir

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
    run: Callable[[StudyConfig, RunDir], pd.DataFrame]
    figure: Callable[[pd.DataFrame], Any]
    verdict: Callable[[pd.DataFrame], Verdict]
    default_model: str
    seed_summary: str = ""  # the paper's figure and numbers, in our words, shown beside ours in the report
    summary: Callable[[pd.DataFrame], pd.DataFrame] | None = None  # the table's key rows for the report


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
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class StudyResult:
    path: Path
    table: pd.DataFrame
    verdict: Verdict
    seconds: float
    resumed: bool


def run_study(spec: StudySpec, config: StudyConfig, out: str | Path = "runs") -> StudyResult:
    """Run (or finish, or just re-read) one study; every artefact lands in its run folder."""
    run = RunDir.open(out, spec.name, config.model, config.model_dump())
    if run.complete:
        table = pd.read_csv(run.path / "table.csv")
        verdict = Verdict.model_validate_json((run.path / "verdict.json").read_text())
        return StudyResult(run.path, table, verdict, 0.0, resumed=True)
    t0 = time.perf_counter()
    run.log(f"start {spec.name} model={config.model} profile={config.profile} seed={config.seed}")
    seed_everything(config.seed)
    table = spec.run(config, run)
    run.write_table(table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = spec.figure(table)
    run.write_figure(fig)
    plt.close(fig)
    verdict = spec.verdict(table)
    run.write_json("verdict.json", verdict.model_dump())
    seconds = time.perf_counter() - t0
    run.log(f"done in {seconds:.1f}s: {verdict.status}")
    # every session of a resumed run counts (the log's timestamps have 1-s resolution)
    total = max(seconds, run.logged_seconds())
    run.finish(model=config.model, verdict=verdict.status, run_seconds=round(total, 1),
               session_seconds=round(seconds, 1))
    return StudyResult(run.path, table, verdict, seconds, resumed=False)
