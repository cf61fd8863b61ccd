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


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo's first "flags" line on Linux; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_hardware() -> list[str]:
    """How this CPU computes bf16 matmuls in hardware: "AMX", "AVX512-BF16", both or neither (there torch emulates
    them, several times slower than float32). A cap on oneDNN (ONEDNN_MAX_CPU_ISA) is not read here."""
    import torch

    found = {name: getattr(torch.cpu, f"_is_{name}_supported", lambda: False)() for name in ("amx_tile", "avx512_bf16")}
    return [label for name, label in (("amx_tile", "AMX"), ("avx512_bf16", "AVX512-BF16")) if found[name]]


def environment(device: str | None = None) -> dict:
    """Versions of python and the main packages, the lmlab version, the CPU (its name, whether it has AVX-512, its
    core count, the threads torch used and the 1-minute load average when asked: a load above the threads means
    the cores were shared, so the run's time is not a timing), and the GPU(s) when the run used one (torch is only
    asked when it is already loaded)."""
    import os
    import sys

    env = {"python": platform.python_version(), "lmlab": _version("lmlab"),
           **{name: _version(name) for name in PACKAGES}, "cpu": cpu_name(), "avx512f": "avx512f" in cpu_flags(),
           "cores": os.cpu_count(), "platform": platform.platform(terse=True)}
    if hasattr(os, "getloadavg"):
        env["load"] = round(os.getloadavg()[0], 2)
    torch = sys.modules.get("torch")
    if torch is not None:
        env["threads"] = torch.get_num_threads()
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
    where = env.get("gpu") or machine(env)
    return f"{parts}; python {env.get('python', '?')}; on {where}" + (f", device {env['device']}" if env.get("device") else "")


def machine(env: dict) -> str:
    """The CPU in one phrase: 'AMD EPYC with AVX-512, 2 cores (1 thread, load 2.1)'."""
    avx = {True: " with AVX-512", False: " without AVX-512"}.get(env.get("avx512f"), "")
    use = [f"{env['threads']} thread{'s' if env['threads'] != 1 else ''}"] if env.get("threads") else []
    use += [f"load {env['load']:.1f}"] if env.get("load") is not None else []
    return (f"{env.get('cpu', '?')}{avx}, {env.get('cores', '?')} cores"
            + (f" ({', '.join(use)})" if use else ""))
