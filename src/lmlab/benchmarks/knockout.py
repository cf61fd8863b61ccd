"""The knockout sweep as the knockout study runs it vs one forward per (sample, layer cut-off).

Both variants compute the same hidden states, E_Q knocked out in layers 0..k and read at layer k for every
sweep layer k of every sample, on real geo-capital prompts with their gold answer appended, measured in the
same run, alternating sample by sample. The study's way: the few-shot prompt every question starts with runs
once (its KV cache shared; its time is counted), each sample's tokens before its first blocked query once, and
one row per condition over the rest, read at every cut-off. The benchmark also checks that both give the same
hidden states (the largest difference is printed).
"""

from __future__ import annotations

import time

from lmlab.benchmarks.registry import benchmark
from lmlab.data.generated.geo_qa import generate
from lmlab.models import load_model
from lmlab.generation import prefix_cache
from lmlab.studies.knockout.measure import encode_item, naive_sweep, sweep, sweep_layers, sweep_prefix


@benchmark("knockout-sweep")
def knockout_sweep_bench(model: str = "smollm2-135m", samples: int = 8, every: int = 3, **_) -> list[dict]:
    lm = load_model(model)
    items = generate("geo-capital", samples, seed=0)
    jobs = []
    for item in items:
        enc = encode_item(lm, item)
        answer = lm.tokenizer(" " + item.aliases[0], add_special_tokens=False)["input_ids"]
        jobs.append((enc["ids"] + answer, enc["eq"]))
    layers = sweep_layers(lm.layout.n_layers, every, lm.layout.n_layers // 2)
    limit = min(sweep_prefix(len(ids), eq, None) for ids, eq in jobs)
    sweep(lm, *jobs[0], None, layers)  # warm-up
    naive_sweep(lm, jobs[0][0], jobs[0][1], layers[:2])
    times = {"ours": 0.0, "naive": 0.0}
    t0 = time.perf_counter()
    shared = prefix_cache(lm, [ids[:limit + 1] for ids, _ in jobs])  # once per run, as the study does
    times["ours"] += time.perf_counter() - t0
    worst = 0.0
    for ids, eq in jobs:
        t0 = time.perf_counter()
        fast = sweep(lm, ids, eq, None, layers, shared=shared)
        times["ours"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        slow = naive_sweep(lm, ids, eq, layers)
        times["naive"] += time.perf_counter() - t0
        scale = max(float(slow[k].abs().max()) for k in layers)
        worst = max(worst, max(float((fast.eq[k] - slow[k]).abs().max()) for k in layers) / scale)
    work = len(jobs) * len(layers)
    setup = f"{model}, {len(jobs)} geo-capital prompts (~{sum(len(j[0]) for j in jobs) // len(jobs)} tokens, " \
            f"{shared[0]} shared), {len(layers)} layer cut-offs; hidden states agree to {worst:.1e} of their scale"
    naive_rate, ours_rate = work / times["naive"], work / times["ours"]
    return [dict(benchmark="knockout-sweep", case="naive: one forward per (sample, layer)", value=round(naive_rate, 2),
                 unit="sample-layers/s", ratio=1.0, target=None, setup=setup),
            dict(benchmark="knockout-sweep", case="shared prefix + one row per condition, read at every cut-off",
                 value=round(ours_rate, 2), unit="sample-layers/s", ratio=round(ours_rate / naive_rate, 2),
                 target=None, note="aim >= 8x", setup=setup)]
