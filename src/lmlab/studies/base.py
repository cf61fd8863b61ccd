"""The shape every study shares, and the registry the CLI and the API read.

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

import functools
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from lmlab.errors import LmlabError
from lmlab.lazy import Lazy, LazyValue, lazy_exports

if TYPE_CHECKING:  # numpy, pandas and torch load on first use, so the CLI starts fast
    import pandas as pd

# "answered": a run of lmlab's own question, which no paper claims (compare), that answered at least one of its
# comparisons; it never stands for a paper's claim, so it is neither "reproduced" nor "not reproduced"
Status = Literal["reproduced", "not reproduced", "inconclusive", "answered"]


DEVICE_HELP = "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps"
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"


@functools.lru_cache(maxsize=None)
def load_profiles(package: str) -> dict:
    """The `profiles.yaml` of a study package: {demo: {...}, quick: {...}, full: {...}, variants: {NAME: {...}}}."""
    from importlib import resources

    import yaml

    return yaml.safe_load(resources.files(package).joinpath("profiles.yaml").read_text(encoding="utf-8"))


class StudyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    _placed: dict = PrivateAttr(default_factory=dict)  # model -> the device map it was loaded with (load)

    model: str = Field(description="embedded name, hub id, local directory or .gguf file")
    profile: Literal["demo", "quick", "full"] = Field(
        "quick", description="demo (a first run: minutes on a CPU, where the embedded model can show the effect), "
                             "quick (what a CPU decides in about an hour) or full (the paper's sizes, a GPU)")
    seed: int = Field(0, description="the same seed gives the same table")
    seeds: int | None = Field(None, ge=1, description="independent replicates of every training run or random draw "
                                                       "(their seeds derived from --seed); each claim is judged over "
                                                       "them and their items")
    device: str = Field("auto", description=DEVICE_HELP)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights for inference (auto: float32 on cpu, bfloat16 on a GPU); a study that trains "
                            "keeps float32 master weights and trains under autocast in this dtype")

    device_map: str | None = Field(
        None, description="spread the model over devices with accelerate: auto, balanced, balanced_low_0, "
                          "sequential or a JSON file {module: device} (studies that only run the model)")
    max_memory: str | None = Field(None, description="with --device-map: what each device may hold, e.g. "
                                                        "0=20GiB,1=20GiB,cpu=64GiB")
    offload: str | None = Field(None, description="with --device-map: a folder for the weights it puts on disk")
    placebo: bool = Field(False, description="run the study's placebo instead: the same run on the same model and "
                                             "data with the treatment replaced by one that cannot have the paper's "
                                             "effect, judged by the same claims (how often would this verdict appear "
                                             "on this model if the effect were absent?)")
    log_with: list[str] | None = Field(None, description="log every training's curves (loss, learning rate per step) "
                                                         "through accelerate's trackers: tensorboard, wandb, mlflow, "
                                                         "comet_ml, aim, clearml, dvclive, swanlab, trackio (each "
                                                         "needs its package); written under the run's logs/ folder; "
                                                         "not part of the run's identity")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        import re

        if not re.fullmatch(DEVICE_PATTERN, value):
            raise ValueError(f"'{value}' is not a device; use {DEVICE_HELP}")
        return value

    # --- inputs that need no model, checked before torch and transformers load (the CLI calls this first)
    def check_inputs(self, models: bool = True) -> None:
        """Every input that can be checked without a model: each model name or path (unless `models` is False:
        models passed in as LoadedModels), then the study's own (files exist and parse, names and values known).
        Each failure is the sentence the run itself would give."""
        from lmlab.models.catalog import check_model_available

        for name in (m.strip() for m in str(self.model).split(",") if m.strip() and models):
            check_model_available(name, scratch_ok=self.trains_own_model)
        self.check_placement()
        self.check_launch()
        self.check_replicates()
        if self.placebo and not self.placebo_treatment:
            raise LmlabError(f"--placebo: {type(self).__module__.split('.')[-2]} has no placebo yet")
        check_trackers(self.log_with or [])

    # what the placebo replaces the treatment with, in one sentence (every study declares one; its recipe applies it)
    placebo_treatment: ClassVar[str] = ""

    trains_own_model: ClassVar[bool] = False  # --model scratch: a model built and trained in the run
    # why the study cannot run a model spread over devices (None: it can); see docs/scaling.md
    device_map_refusal: ClassVar[str | None] = "this study trains the model: run it on one device per process"

    # why the study cannot run as a whole over several processes yet (None: it shares its units out by rank)
    launch_refusal: ClassVar[str | None] = ("this study does not share its work out over processes yet; run it in one "
                                            "process (its training loop, lmlab.train.train, runs data-parallel)")

    # why the study has nothing to replicate (None: --seeds applies)
    replicate_refusal: ClassVar[str | None] = None

    @property
    def n_seeds(self) -> int:
        """Replicates per cell: --seeds, else the profile's (1 where a profile names none)."""
        return int(self.size("seeds") or 1)

    def replicate_seeds(self) -> list[int]:
        """The seed of each replicate, derived from --seed (lmlab.resampling.replicate_seed)."""
        from lmlab.resampling import replicate_seed

        return [replicate_seed(self.seed, r) for r in range(self.n_seeds)]

    def check_replicates(self) -> None:
        if self.replicate_refusal and self.seeds and self.seeds > 1:
            raise LmlabError(f"--seeds {self.seeds}: {self.replicate_refusal}")

    def check_launch(self) -> None:
        """One sentence when the study is launched over several processes and cannot share its work out."""
        from lmlab.parallel import is_distributed

        if is_distributed() and self.launch_refusal:
            raise LmlabError(f"several processes (WORLD_SIZE > 1): {self.launch_refusal}")

    def check_placement(self) -> None:
        """The device map's options parse (models/placement.py); one sentence where the study cannot take one."""
        from lmlab.models.placement import Placement

        refusal = self.placement_refusal()
        if Placement.parse(self.device_map, self.max_memory, self.offload) is not None and refusal:
            raise LmlabError(f"--device-map: {refusal}")

    def placement_refusal(self) -> str | None:
        """Why this config cannot run a spread model (`device_map_refusal`; a study whose options decide it
        overrides this)."""
        return self.device_map_refusal

    # --- where and in what precision the study runs
    def torch_device(self) -> str:
        """The device to run on (auto resolved); a device this machine lacks is one sentence."""
        return resolve_device(self.device)

    def load(self, spec: str | None = None, *, train: bool = False, **kwargs):
        """`load_model(spec or self.model)` on this config's device. `train`: float32 master weights (the
        training loop runs the forward pass under autocast in `dtype`, see `train_settings`); otherwise the
        weights are in `dtype` (auto: float32 on cpu, bfloat16 on a GPU)."""
        import torch

        from lmlab.models import load_model

        dtype = torch.float32 if train else (None if self.dtype == "auto" else getattr(torch, self.dtype))
        if not train:
            self.check_placement()
            kwargs.update(device_map=self.device_map, max_memory=self.max_memory, offload=self.offload)
        lm = load_model(spec or self.model, device=self.torch_device(), dtype=dtype, **kwargs)
        if lm.meta.get("device_map"):  # the run's meta.json records where each module went
            self._placed[spec or self.model] = lm.meta["device_map"]
        return lm

    def identity(self) -> dict:
        """The settings that name the run folder (and its config.yaml): all but where curves are logged (and the
        placebo flag where it is off, so that a run's folder is the one it had before the placebo existed)."""
        return self.model_dump(exclude={"log_with"} | (set() if self.placebo else {"placebo"}))

    def train_settings(self) -> dict:
        """TrainConfig fields for this config: autocast precision (auto: bf16 on a GPU, none on cpu; float32:
        none) and whether the loop runs on the CPU."""
        device = self.torch_device()
        precision = {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}.get(self.dtype)
        if precision is None:  # auto
            precision = "bf16" if device.startswith("cuda") else "no"
        return {"mixed_precision": precision, "cpu": device == "cpu", "log_with": list(self.log_with or [])}

    # --- sizes: one resolver for every study
    def variants(self) -> list[str]:
        """Names of the profiles.yaml variants that apply to this config, most specific first: `gpu` on a CUDA device
        where the study's profiles.yaml has that table (the sizes a GPU decides at), else none."""
        tables = load_profiles(type(self).__module__.rpartition(".")[0]).get("variants") or {}
        return ["gpu"] if "gpu" in tables and self.torch_device().startswith("cuda") else []

    def size(self, name: str, variant: str | None = None):
        """The field's value; if unset (None), the first of: `variant`'s table, this config's variants' tables,
        the profile's table; the field's own None if no table names it."""
        value = getattr(self, name)
        if value is not None:
            return value
        profiles = load_profiles(type(self).__module__.rpartition(".")[0])
        names = ([variant] if variant else []) + self.variants()
        # a variant without a demo table takes its quick one (its model or data differs from the defaults')
        variant_tables = [profiles["variants"][v].get(self.profile) or
                          (profiles["variants"][v].get("quick", {}) if self.profile == "demo" else {}) for v in names]
        for table in variant_tables + [profiles[self.profile]]:
            if name in table:
                return table[name]
        return None


class Verdict(BaseModel):
    """The paper's qualitative claim, checked on the table, with the numbers behind the answer."""

    status: Status
    claim: str
    summary: str
    evidence: dict[str, Any] = {}

    def _repr_html_(self) -> str:
        from lmlab.render import verdict_html

        return verdict_html(self.status, self.claim, self.summary, self.evidence)


def placebo_verdict(verdict: Verdict, treatment: str) -> Verdict:
    """A placebo run's verdict, as its claims judged it (never overridden: a placebo that comes out "reproduced" is a
    finding about the claims), said to be the placebo's: the summary opens with what replaced the treatment and the
    evidence carries it, so the report sets it beside the study's own verdict."""
    return verdict.model_copy(update={
        "summary": f"PLACEBO ({treatment}): a verdict here is what the claims say where the paper's effect cannot be; "
                   f"'reproduced' would mean a claim holds by construction. {verdict.summary}",
        "evidence": {**verdict.evidence, "placebo": treatment}})


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


def resolve_device(spec: str) -> str:
    """auto -> cuda, then mps, then cpu; a misspelt device or one this machine does not have is one sentence."""
    import re

    import torch

    if not re.fullmatch(DEVICE_PATTERN, spec):
        raise LmlabError(f"--device {spec}: not a device; use {DEVICE_HELP}")

    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if spec == "auto":
        from lmlab.parallel import local_device

        return local_device() or ("cuda" if torch.cuda.is_available() else "mps" if mps else "cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise LmlabError(f"--device {spec}: this machine has no CUDA device that torch can use; use --device cpu "
                             f"or auto")
        index = int(spec.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise LmlabError(f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"numbered from 0")
    if spec == "mps" and not mps:
        raise LmlabError("--device mps: this machine has no MPS device; use --device cpu or auto")
    return spec


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


def caption(fig, text: str) -> None:
    """Name the figure's model(s) and data in its title: a figure a reader can cite (a SubFigure of a several-model
    figure is titled by its model instead, by the runner)."""
    if hasattr(fig, "tight_layout"):
        old = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
        fig.suptitle(text + (f"\n{old}" if old else ""), fontsize=10)


def finish(fig):
    """Tight layout on a whole figure (a SubFigure takes its parent's layout)."""
    if hasattr(fig, "tight_layout"):
        fig.tight_layout()
    return fig


# accelerate's trackers and the package each needs (`--log-with`); checked before torch loads
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet_ml", "aim": "aim",
            "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab", "trackio": "trackio"}


def check_trackers(names: list[str]) -> None:
    import importlib.util

    from lmlab.errors import LmlabError

    for name in names:
        if name not in TRACKERS:
            raise LmlabError(f"unknown tracker '{name}' for --log-with; use {', '.join(TRACKERS)}")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            hint = "pip install 'lmlab[trackers]'" if name == "tensorboard" else f"pip install {TRACKERS[name]}"
            raise LmlabError(f"--log-with {name} needs the {TRACKERS[name]} package: {hint}")
