"""The filler study's generation throughput (problems/s) and ARM's cost, measured side by side.

The same test problems are generated greedily with the same budget, several alternating rounds: the plain
model with every prompt run whole, with the batch's shared prefix run once (generation.py), with 55 inserted
tokens, and with ARM in layer 0 (run whole, as the study runs it). Ratios are times over the plain whole run.
"""

from __future__ import annotations

import time

from lmlab.benchmarks.registry import benchmark
from lmlab.data.math import generate_arithmetic
from lmlab.generation import greedy_answers
from lmlab.interventions import intervene
from lmlab.interventions.arm import ActivationRedistribution
from lmlab.models import load_model
from lmlab.studies.filler.measure import FILLERS, build_ids


@benchmark("filler-generation")
def filler_bench(model: str = "smollm2-135m", problems: int = 32, new_tokens: int = 48, rounds: int = 3,
                 **_) -> list[dict]:
    lm = load_model(model)
    items = generate_arithmetic(problems // 4, seed=7, levels=(1, 2, 3, 5))
    plain = [build_ids(lm, i.question)[0] for i in items]
    mless = [build_ids(lm, i.question, FILLERS["Mless"], 55)[0] for i in items]
    base = "w/o, every prompt whole"  # every ratio is a time over this one's
    cases = {base: (plain, False, False, None),  # name: (prompts, ARM, shared prefix, note)
             "w/o, shared prefix run once": (plain, False, True, "time ratio: prefix sharing's saving"),
             "w/ Mless (55 inserted), shared prefix": (mless, False, True, None),
             "ARM, layer 0 (every prompt whole, as the study runs it)": (plain, True, False,
                                                                         "time ratio; ARM aim <= 1.05")}
    times = {name: 0.0 for name in cases}
    greedy_answers(lm, plain[:4], 4, 4, stop_at_newline=False)  # warm-up
    for _ in range(rounds):
        for name, (prompts, arm, share, _note) in cases.items():
            t0 = time.perf_counter()
            if arm:
                with intervene(lm, ActivationRedistribution(layers=[0])):
                    greedy_answers(lm, prompts, new_tokens, 32, stop_at_newline=False, share_prefix=share)
            else:
                greedy_answers(lm, prompts, new_tokens, 32, stop_at_newline=False, share_prefix=share)
            times[name] += time.perf_counter() - t0
    setup = f"{model}, {len(items)} problems, greedy {new_tokens} new tokens, batch 32, {rounds} alternating rounds"
    return [dict(benchmark="filler-generation", case=name, value=round(len(items) * rounds / t, 2), unit="problems/s",
                 ratio=round(t / times[base], 3), note=cases[name][3], target=None, setup=setup)
            for name, t in times.items()]
