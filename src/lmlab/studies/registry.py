"""The registry the CLI and the API read, and the shape every study shares.

A study is a package `studies/NAME/` with the same few files:
    config.py     class Config(StudyConfig): every knob with its default and a sentence
    profiles.yaml the demo, quick and full sizes (and variants, e.g. latent's pretrained model): a field left unset
                  (None) takes its value there, through the one resolver `StudyConfig.size`
    recipe.py     run(config, run_dir, lm=None) -> DataFrame: the run as a short sequence of named phases
                  (resumable via run_dir.done/record); rows carry a `kind` that names their table; it returns
                  measurements only, never what is derived from them
    measure.py    (and similar) the measurements that drive the model, through lmlab.interventions only
    analysis.py   CLAIMS (the declared claims), COLUMNS (each table the analysis reads, with its columns),
                  verdict(result), figure(result, fig=None) and report_rows(result) on the result's named tables;
                  where a study derives tables from its measurements, derive(frame, config) -> frame (the runner
                  calls it when a run finishes and `lmlab verdict` calls it again, so a re-judged run is whole), and
                  figures(result) -> {name: figure} for figures beside the main one
and `__init__.py` registers its `StudySpec` with `define(__name__, Config, ...)`, which finds all of the above
by those names. `lmlab.studies.runner.run_study` does the rest: run folder, seeds, resume, tables/figure/verdict
files, manifest, several models per result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from lmlab.errors import LmlabError
from lmlab.lazy import Lazy, LazyValue, lazy_exports
from lmlab.studies.config import StudyConfig
from lmlab.studies.verdict import Verdict

if TYPE_CHECKING:  # numpy, pandas and torch load on first use, so the CLI starts fast
    import pandas as pd


def _no_claims() -> list:
    return []


def _no_tables() -> dict:
    return {}


@dataclass(frozen=True)
class StudySpec:
    """A study's contract with the runner, the CLI, the report and the tests: what it is (name, title, paper), how it
    runs (config, run) and how it is read (claims, tables, derive, verdict, figure, report rows). A study package
    builds its own with `define`; the callables load their modules on first use."""

    name: str  # registry key and CLI command, e.g. "knockout"
    title: str
    paper: str
    citation: str  # the paper: authors, title and arXiv id
    config: type[StudyConfig]
    run: Callable[..., pd.DataFrame]  # run(config, run_dir, lm=None): the measurements, one row per record
    figure: Callable[..., Any]  # figure(result, fig=None) -> matplotlib Figure (or the SubFigure it drew on)
    verdict: Callable[[Any], Verdict]  # verdict(result) -> Verdict, on one model's result
    default_model: str
    paper_figure: str = ""  # the paper's figure and numbers, in our words, shown beside ours in the report
    report_rows: Callable[[Any], pd.DataFrame] | None = None  # one model's key rows for the report
    claims: Callable[[], list] = _no_claims  # () -> the declared claims (lmlab.claims.Declared), one per name
    tables: Callable[[], dict] = _no_tables  # () -> {table: its columns}: every table the analysis reads
    # derive(frame, config) -> frame: the measurements with every table derived from them added (rows of a derived
    # kind already in the frame replaced); called when a run finishes and again when it is re-judged
    derive: Callable[[pd.DataFrame, Any], pd.DataFrame] | None = None
    figures: Callable[[Any], dict] | None = None  # figures(result) -> {name: Figure} drawn beside the main one
    full_models: tuple[str, ...] = ()  # `lmlab reproduce --profile full` runs these (default: default_model)
    loads_model: bool = True  # False: the study builds its own model in the run (it takes no LoadedModel)
    # False: `lmlab reproduce` leaves it out (a study that needs inputs of its own, e.g. the variants compare takes)
    in_reproduce: bool = True
    # profile -> what a run at that size gives on a CPU, in a few words: "answers", or that it shows its figure and
    # prices its answer (and where the answer is had); `lmlab reproduce` prints it beside each verdict
    answers: dict[str, str] = field(default_factory=dict)


def define(package: str, config: type[StudyConfig], *, derives: bool = False, more_figures: bool = False,
           **fields) -> StudySpec:
    """Register the StudySpec of the study package `package` (its `__name__`): `run` from its recipe.py; `verdict`,
    `figure`, `report_rows`, CLAIMS and COLUMNS from its analysis.py (and `derive` where `derives`, `figures` where
    `more_figures`), each imported on first use; `fields` the rest (name, title, paper, citation, default_model,
    ...)."""
    analysis = f"{package}.analysis"
    return register(StudySpec(
        config=config, run=Lazy(f"{package}.recipe:run"), figure=Lazy(f"{analysis}:figure"),
        verdict=Lazy(f"{analysis}:verdict"), report_rows=Lazy(f"{analysis}:report_rows"),
        claims=LazyValue(f"{analysis}:CLAIMS"), tables=LazyValue(f"{analysis}:COLUMNS"),
        derive=Lazy(f"{analysis}:derive") if derives else None,
        figures=Lazy(f"{analysis}:figures") if more_figures else None, **fields))


def study_exports(package: str, *recipe_names: str):
    """A study package's module `__getattr__`: `run` (and `recipe_names`) from its recipe, `verdict`, `figure` and
    `report_rows` from its analysis, imported when first read (torch and transformers stay out of `lmlab --help`)."""
    return lazy_exports(package, {"figure": "analysis", "report_rows": "analysis", "verdict": "analysis",
                                  "run": "recipe", **{name: "recipe" for name in recipe_names}})


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


def read_config_file(path, spec: StudySpec) -> dict:
    """The settings of a --config YAML file (a run's config.yaml, or one written by hand); a bad file or an
    unknown key is one sentence."""
    from pathlib import Path

    import yaml

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise LmlabError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LmlabError(f"{path}{f':{mark.line + 1}' if mark else ''}: not valid YAML "
                         f"({getattr(exc, 'problem', None) or exc})") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise LmlabError(f"{path}: expected a mapping of setting: value, found {type(data).__name__}")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = [k for k in data if k not in spec.config.model_fields]
    if unknown:
        raise LmlabError(f"{path}: unknown key '{unknown[0]}' for {spec.name}; known: "
                         f"{', '.join(spec.config.model_fields)}")
    return data
