"""Where and how a run executes: the device (auto resolved, a device this machine lacks one sentence), the seeds,
the trackers that log training curves."""

from __future__ import annotations

import random

from lmlab.errors import LmlabError

DEVICE_HELP = "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps"
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"


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


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# accelerate's trackers and the package each needs (`--log-with`); checked before torch loads
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet_ml", "aim": "aim",
            "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab", "trackio": "trackio"}


def check_trackers(names: list[str]) -> None:
    import importlib.util

    for name in names:
        if name not in TRACKERS:
            raise LmlabError(f"unknown tracker '{name}' for --log-with; use {', '.join(TRACKERS)}")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            hint = "pip install 'lmlab[trackers]'" if name == "tensorboard" else f"pip install {TRACKERS[name]}"
            raise LmlabError(f"--log-with {name} needs the {TRACKERS[name]} package: {hint}")
