"""Mixed precision: the training loop runs its forward passes under bf16 (or fp16) autocast, on a GPU by default
and on the CPU with `--dtype bfloat16`; parameters stay float32 (the master weights)."""

from __future__ import annotations

import contextlib

import torch

# the device types torch.autocast knows (a backend of another name, e.g. an out-of-tree device, has none)
AUTOCAST_DEVICES = ("cuda", "cpu", "mps", "xpu", "hpu")


def full_precision(device: torch.device | str):
    """A block that computes in the tensors' own dtypes even inside an autocast region (e.g. a nearest-neighbour
    search whose distances tie in bf16); a no-op where autocast is off."""
    kind = torch.device(device).type
    if kind in AUTOCAST_DEVICES and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()
