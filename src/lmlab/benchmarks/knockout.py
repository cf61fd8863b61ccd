"""S1 knockout sweep: prefix reuse + batched layer cut-offs vs one forward per (sample, layer).

Both variants do the same work, E_Q knocked out for every sweep layer of every sample, on real
geo-capital prompts with their gold answer appended, measured in the same run, alternating.
"""

from __future__ import annotations

import time

from lmlab.benchmarks import benchmark
from lmlab.data.generated.geo_qa import generate
from lmlab.models import load_model
from lmlab.studies.knockout.measure import encode_item, naive_sweep, sweep, sweep_layers


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
    sweep(lm, *jobs[0], None, layers)  # warm-up
    naive_sweep(lm, jobs[0][0], jobs[0][1], layers[:2])
    times = {"ours": 0.0, "naive": 0.0}
    for ids, eq in jobs:
        t0 = time.perf_counter()
        sweep(lm, ids, eq, None, layers)
        times["ours"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        naive_sweep(lm, ids, eq, layers)
        times["naive"] += time.perf_counter() - t0
    work = len(jobs) * len(layers)
    setup = f"{model}, {len(jobs)} geo-capital prompts (~{sum(len(j[0]) for j in jobs) // len(jobs)} tokens), " \
            f"{len(layers)} layer cut-offs"
    naive_rate, ours_rate = work / times["naive"], work / times["ours"]
    return [dict(benchmark="knockout-sweep", case="naive: one forward per (sample, layer)", value=round(naive_rate, 2),
                 unit="sample-layers/s", ratio=1.0, target=None, setup=setup),
            dict(benchmark="knockout-sweep", case="prefix KV reuse + layer cut-offs batched", value=round(ours_rate, 2),
                 unit="sample-layers/s", ratio=round(ours_rate / naive_rate, 2), target=None,
                 note="aim >= 3x", setup=setup)]
