"""S3 generation throughput (problems/s) and ARM's cost, measured side by side.

The same test problems are generated greedily with the same budget, alternating between the plain
model and the model with ARM in layer 0, several rounds; ARM's ratio is its time over the plain time.
"""

from __future__ import annotations

import time

from lmlab.benchmarks import benchmark
from lmlab.data.math import generate_arithmetic
from lmlab.generation import greedy_answers
from lmlab.interventions import intervene
from lmlab.interventions.arm import ActivationRedistribution
from lmlab.models import load_model
from lmlab.studies.filler import FILLERS, build_ids


@benchmark("filler-generation")
def filler_bench(model: str = "smollm2-135m", problems: int = 32, new_tokens: int = 48, rounds: int = 3,
                 **_) -> list[dict]:
    lm = load_model(model)
    items = generate_arithmetic(problems // 4, seed=7, levels=(1, 2, 3, 5))
    plain = [build_ids(lm, i.question)[0] for i in items]
    mless = [build_ids(lm, i.question, FILLERS["Mless"], 55)[0] for i in items]
    cases = {"w/o": (plain, False), "w/ Mless (55 inserted)": (mless, False), "ARM, layer 0": (plain, True)}
    times = {name: 0.0 for name in cases}
    greedy_answers(lm, plain[:4], 4, 4, stop_at_newline=False)  # warm-up
    for _ in range(rounds):
        for name, (prompts, arm) in cases.items():
            t0 = time.perf_counter()
            if arm:
                with intervene(lm, ActivationRedistribution(layers=[0])):
                    greedy_answers(lm, prompts, new_tokens, 32, stop_at_newline=False)
            else:
                greedy_answers(lm, prompts, new_tokens, 32, stop_at_newline=False)
            times[name] += time.perf_counter() - t0
    setup = f"{model}, {len(items)} problems, greedy {new_tokens} new tokens, batch 32, {rounds} alternating rounds"
    base = times["w/o"]
    return [dict(benchmark="filler-generation", case=name, value=round(len(items) * rounds / t, 2), unit="problems/s",
                 ratio=round(t / base, 3), note="time ratio; ARM aim <= 1.05" if name.startswith("ARM") else None,
                 target=None, setup=setup) for name, t in times.items()]
