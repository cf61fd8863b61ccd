"""The software and hardware a run ran on, recorded in every run's manifest and shown in the report, so a
result can be rerun in the same environment (the pinned set is constraints.txt)."""

from __future__ import annotations

import platform
from importlib import metadata

PACKAGES = ("torch", "transformers", "accelerate", "datasets", "safetensors", "numpy", "scikit-learn", "scipy")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_hardware() -> list[str]:
    """How this CPU computes bf16 matmuls in hardware: "AMX", "AVX512-BF16", both or neither (there torch emulates
    them, several times slower than float32). A cap on oneDNN (ONEDNN_MAX_CPU_ISA) is not read here."""
    import torch

    found = {name: getattr(torch.cpu, f"_is_{name}_supported", lambda: False)() for name in ("amx_tile", "avx512_bf16")}
    return [label for name, label in (("amx_tile", "AMX"), ("avx512_bf16", "AVX512-BF16")) if found[name]]


def environment(device: str | None = None) -> dict:
    """Versions of python and the main packages, the lmlab version, the CPU and its core count, and the GPU(s)
    when the run used one (torch is only asked when it is already loaded)."""
    import os
    import sys

    env = {"python": platform.python_version(), "lmlab": _version("lmlab"),
           **{name: _version(name) for name in PACKAGES}, "cpu": cpu_name(), "cores": os.cpu_count(),
           "platform": platform.platform(terse=True)}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        env["gpu"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    if device:
        env["device"] = device
    return env


def describe(env: dict) -> str:
    """One line for the report: 'torch 2.13.0, transformers 5.24.0, ... on AMD EPYC (2 cores)'."""
    if not env:
        return "not recorded"
    parts = ", ".join(f"{k} {env[k]}" for k in ("torch", "transformers", "accelerate", "datasets") if env.get(k))
    where = env.get("gpu") or f"{env.get('cpu', '?')} ({env.get('cores', '?')} cores)"
    return f"{parts}; python {env.get('python', '?')}; on {where}" + (f", device {env['device']}" if env.get("device") else "")
