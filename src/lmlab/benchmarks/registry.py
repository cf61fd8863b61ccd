"""The benchmarks' registry and their shared timing helper (each benchmark module registers itself here;
lmlab.benchmarks.load_all imports them)."""

from __future__ import annotations

from typing import Callable

BENCHMARKS: dict[str, Callable[..., list[dict]]] = {}

def benchmark(name: str):
    def wrap(fn):
        BENCHMARKS[name] = fn
        return fn
    return wrap


def drain(device: str) -> None:
    """Wait until `device` has finished the work queued on it (a GPU runs ahead of the Python that queues; a clock
    read before this times the queueing)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def alternate(cases: dict[str, Callable[[], object]], repeats: int) -> tuple[dict[str, float], dict[str, object]]:
    """Run each case `repeats` times, the order rotating from one repeat to the next (a drift in the machine's
    speed falls on every case alike): each case's best wall time in seconds, and its last result."""
    import time

    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    results: dict[str, object] = {}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            results[name] = cases[name]()
            times[name].append(time.perf_counter() - t0)
    return {n: min(t) for n, t in times.items()}, results
