"""Forward-time cost of the intervention layer, and the embedded model's load times.

Cases are measured interleaved (round-robin, rotating order) on the same inputs, so drift in machine
load hits every case alike; the value is the median over repeats and the ratio is against the plain
Hugging Face sdpa forward measured in the same loop.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from contextlib import nullcontext

import torch

from lmlab.benchmarks.registry import benchmark
from lmlab.interventions import AblateHeads, Capture, Knockout, intervene
from lmlab.models import load_model

TARGETS = {"lmlab, nothing active": 1.02, "capture all attention patterns": 1.10}


def _cases(lm, seq: int):
    keys = torch.zeros(1, seq, dtype=torch.bool)
    keys[:, 10:13] = True
    mid = lm.layout.n_layers // 2
    return {
        "plain HF sdpa": ("sdpa", lambda b: nullcontext()),
        "lmlab, nothing active": ("lmlab", lambda b: nullcontext()),
        "capture all attention patterns": ("lmlab", lambda b: intervene(lm, Capture("pattern"))),
        "knockout 3 keys -> later, all layers": ("lmlab", lambda b: intervene(lm, Knockout(keys.expand(b, -1)))),
        f"head ablation (layer {mid}, head 0)": ("lmlab", lambda b: intervene(lm, AblateHeads({mid: [0]}))),
    }


@benchmark("interventions")
def interventions_bench(model: str = "smollm2-135m", batch: int = 8, seq: int = 64, repeats: int = 15,
                        warmup: int = 2, **_) -> list[dict]:
    lm = load_model(model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, len(lm.tokenizer) - 100, (batch, seq), generator=gen, device="cpu").to(lm.device)
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    cases = _cases(lm, seq)
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    with torch.no_grad():
        for r in range(warmup + repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                impl, ctx = cases[name]
                lm.model.set_attn_implementation(impl)
                with ctx(batch):
                    t0 = time.perf_counter()
                    lm.model(**inputs)
                    dt = time.perf_counter() - t0
                if r >= warmup:
                    times[name].append(dt)
    lm.model.set_attn_implementation("lmlab")
    base = statistics.median(times["plain HF sdpa"])
    rows = []
    for name in names:
        med = statistics.median(times[name])
        rows.append(dict(benchmark="interventions", case=name, value=round(med * 1000, 1), unit="ms/forward",
                         ratio=round(med / base, 3), target=TARGETS.get(name),
                         setup=f"{model}, batch {batch}x{seq}, fp32 CPU, {torch.get_num_threads()} threads, "
                               f"median of {repeats}"))
    return rows


@benchmark("load")
def load_bench(model: str = "smollm2-135m", **_) -> list[dict]:
    """Cold load (de-quantize the GGUF, write the cache) vs cached load, in a throwaway cache folder."""
    old = os.environ.get("LMLAB_CACHE")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LMLAB_CACHE"] = tmp
        try:
            t0 = time.perf_counter()
            load_model(model)
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            load_model(model)
            warm = time.perf_counter() - t0
        finally:
            if old is None:
                os.environ.pop("LMLAB_CACHE", None)
            else:
                os.environ["LMLAB_CACHE"] = old
    for case, value in (("cold load (GGUF de-quantize + cache write)", cold), ("cached load (safetensors)", warm)):
        rows.append(dict(benchmark="load", case=case, value=round(value, 2), unit="s", ratio=round(value / warm, 1),
                         target=None, setup=model))
    return rows
