"""The settings every study shares (`StudyConfig`, which a study's own Config extends) and its profiles' sizes
(`profiles.yaml`, read through the one resolver `StudyConfig.size`)."""

from __future__ import annotations

import functools
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from lmlab.errors import LmlabError
from lmlab.studies import runtime


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
                             "quick (what a CPU can decide: one to several hours a study on 2 cores) or full (the "
                             "paper's sizes, a GPU)")
    seed: int = Field(0, description="the same seed gives the same table")
    seeds: int | None = Field(None, ge=1, description="independent replicates of every training run or random draw "
                                                       "(their seeds derived from --seed); each claim is judged over "
                                                       "them and their items")
    device: str = Field("auto", description=runtime.DEVICE_HELP)
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

        if not re.fullmatch(runtime.DEVICE_PATTERN, value):
            raise ValueError(f"'{value}' is not a device; use {runtime.DEVICE_HELP}")
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
        runtime.check_trackers(self.log_with or [])

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
        return [self.replicate_seed(r) for r in range(self.n_seeds)]

    def replicate_seed(self, replicate: int) -> int:
        """The seed of replicate `replicate` (any index, past the run's replicates too), derived from --seed."""
        from lmlab.resampling import replicate_seed

        return replicate_seed(self.seed, replicate)

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
        return runtime.resolve_device(self.device)

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
