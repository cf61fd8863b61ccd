"""A model larger than one device: accelerate's big-model dispatch, as `from_pretrained(device_map=...)` uses it.

`Placement(device_map, max_memory, offload)`:
  device_map  auto | balanced | balanced_low_0 | sequential (accelerate fills the devices in `max_memory`, GPUs
              first, then cpu, then disk), or a JSON file {module name: device} with devices such as 0, "cuda:1",
              "cpu" or "disk"
  max_memory  "0=20GiB,1=20GiB,cpu=64GiB": how much each device may hold (default: what accelerate measures free)
  offload     a folder for the weights placed on "disk" (read back layer by layer as the forward pass reaches them)

Weights read from a folder or the hub stream straight to their devices (transformers' loader); a model built in
memory (the tiny test models, a model passed in) is dispatched with `accelerate.dispatch_model`. Either way
accelerate's hooks move each layer's inputs to the layer's device, and lmlab's interventions meet the tensors
where the layer runs (see docs/scaling.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lmlab.errors import LmlabError
from lmlab.files import writable_folder

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class Placement:
    device_map: str | dict
    max_memory: dict | None = None
    offload: str | None = None

    @classmethod
    def parse(cls, device_map: str | dict | None, max_memory: str | dict | None = None,
              offload: str | Path | None = None) -> "Placement | None":
        """From the command line's strings; None when no device map is asked for."""
        if device_map is None or device_map == "":
            if max_memory or offload:
                raise LmlabError("--max-memory and --offload go with --device-map (auto, balanced, sequential or a "
                                 "JSON file)")
            return None
        if isinstance(device_map, str) and device_map not in STRATEGIES:
            path = Path(device_map).expanduser()
            if path.suffix != ".json" or not path.is_file():
                raise LmlabError(f"--device-map {device_map}: use {', '.join(STRATEGIES)} or a JSON file "
                                 f"{{module: device}}")
            try:
                device_map = json.loads(path.read_text())
            except ValueError as exc:
                raise LmlabError(f"--device-map {path} is not valid JSON ({exc})") from None
            if not isinstance(device_map, dict) or not device_map:
                raise LmlabError(f"--device-map {path} must hold an object {{module name: device}}")
        if offload:
            writable_folder(offload, "--offload")
        return cls(device_map=device_map, max_memory=parse_max_memory(max_memory),
                   offload=str(Path(offload).expanduser()) if offload else None)

    def host_only(self) -> bool:
        """Whether every module goes to the host or to disk: a map that names no accelerator, or a strategy whose
        `max_memory` gives room on the CPU and disk alone. Such a model computes on the CPU, so it loads in the
        CPU's precision (float32) where no dtype is asked for, even on a machine with a GPU."""
        host = {"cpu", "disk"}
        if isinstance(self.device_map, dict):
            return {str(v) for v in self.device_map.values()} <= host
        return bool(self.max_memory) and set(map(str, self.max_memory)) <= host

    def check_resolved(self, resolved: dict) -> None:
        """A resolved map {module: device} must leave something on a device, and a folder for what is on disk."""
        devices = {str(v) for v in resolved.values()}
        if devices == {"disk"}:
            raise LmlabError("the device map puts the whole model on disk: give --max-memory room for at least "
                             "the embeddings and one layer on a device")
        if "disk" in devices and not self.offload:
            raise LmlabError("the device map puts weights on disk: give a folder for them with --offload DIR")

    def from_pretrained_kwargs(self) -> dict:
        kw: dict = {"device_map": self.device_map}
        if self.max_memory:
            kw["max_memory"] = self.max_memory
        if self.offload:
            kw["offload_folder"] = self.offload
        return kw


def parse_max_memory(text: str | dict | None) -> dict | None:
    """"0=20GiB,1=20GiB,cpu=64GiB" -> {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}."""
    if text is None or isinstance(text, dict):
        return text
    out: dict = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        key, sep, amount = part.partition("=")
        key = key.strip()
        if not sep or not amount.strip() or not (key.isdigit() or key in ("cpu", "disk", "mps")):
            raise LmlabError(f"--max-memory: '{part}' is not DEVICE=AMOUNT (e.g. 0=20GiB,cpu=64GiB)")
        out[int(key) if key.isdigit() else key] = _size(part, amount.strip())
    return out or None


_UNITS = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def _size(part: str, amount: str) -> int | str:
    """An amount accelerate takes: bytes (an integer) or a number with GiB, MiB, KiB, GB, MB or KB; checked here,
    before torch loads, so a typo is one sentence and not accelerate's traceback at load time."""
    if amount.isdigit():
        return int(amount)
    unit = next((u for u in _UNITS if amount.upper().endswith(u)), None)
    number = amount[:-len(unit)].strip() if unit else ""
    try:
        ok = unit is not None and float(number) > 0
    except ValueError:
        ok = False
    if not ok:
        raise LmlabError(f"--max-memory: '{part}' is not a size; give bytes or a number with GiB, MiB, GB or MB "
                         "(e.g. cpu=64GiB)")
    return f"{number}{unit}"


def dispatch(model, placement: Placement, dtype=None):
    """Spread a model that is in memory (on the CPU) over the placement's devices with accelerate."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    device_map = placement.device_map
    if isinstance(device_map, str):
        no_split = getattr(model, "_no_split_modules", None) or []
        max_memory = placement.max_memory
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split,
                                             dtype=dtype, low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split,
                                           dtype=dtype)
    placement.check_resolved(device_map)
    skip = getattr(model, "_skip_keys_device_placement", None)
    try:
        return dispatch_model(model, device_map=device_map, offload_dir=placement.offload, skip_keys=skip)
    except ValueError as exc:  # a map that leaves a parameter without a device, say
        raise LmlabError(f"--device-map: {str(exc).splitlines()[0]}") from None
