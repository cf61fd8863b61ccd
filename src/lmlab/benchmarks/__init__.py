"""Benchmarks: ratios measured side by side in one run, never pass/fail on time.

Each benchmark is a function returning rows (dicts with at least `benchmark`, `case`, `value`,
`unit`); `lmlab bench` runs the registered ones and prints/writes one table. Study issues add theirs
with `@benchmark("name")`.
"""

from __future__ import annotations

from typing import Callable

BENCHMARKS: dict[str, Callable[..., list[dict]]] = {}


def benchmark(name: str):
    def wrap(fn):
        BENCHMARKS[name] = fn
        return fn
    return wrap


def load_all() -> dict[str, Callable[..., list[dict]]]:
    from lmlab.benchmarks import (circuits, filler, generation, inputs, interventions, knockout,  # noqa: F401
                                  latent, peers, quantize, replicates)  # (they register themselves)

    return BENCHMARKS
