"""S4: attribution patching (three passes) vs activation patching (one pass per head), same IOI prompts.

Both score every head of the model; the benchmark prints the wall-time ratio and the Spearman
correlation between the two rankings (signed scores). Targets from the issue: >= 20x faster and
Spearman >= 0.8 on the embedded model.
"""

from __future__ import annotations

import time

from lmlab.studies.sparse_circuits import circuits
from lmlab.benchmarks import benchmark
from lmlab.data.generated.circuits import make_task
from lmlab.models import load_model


@benchmark("attribution-patching")
def attribution_bench(model: str = "smollm2-135m", prompts: int = 16, **_) -> list[dict]:
    from scipy.stats import spearmanr

    lm = load_model(model)
    task = make_task("ioi", lm.tokenizer, prompts, seed=0)
    t0 = time.perf_counter()
    attr = circuits.attribution_scores(lm, task)  # includes its own corrupted pass
    t_attr = time.perf_counter() - t0
    t0 = time.perf_counter()
    act = circuits.activation_scores(lm, task)
    t_act = time.perf_counter() - t0
    rho = float(spearmanr(attr.ravel(), act.ravel())[0])
    setup = f"{model}, IOI, {prompts} prompt pairs, {attr.size} heads"
    return [dict(benchmark="attribution-patching", case="activation patching (one pass per head)",
                 value=round(t_act, 2), unit="s", ratio=1.0, target=None, setup=setup),
            dict(benchmark="attribution-patching", case="attribution patching (3 passes)", value=round(t_attr, 2),
                 unit="s", ratio=round(t_act / t_attr, 1), target=None, note="speed-up, aim >= 20x", setup=setup),
            dict(benchmark="attribution-patching", case="Spearman(attribution, activation) over heads",
                 value=round(rho, 3), unit="rho", ratio=None, target=None, note="aim >= 0.8", setup=setup)]
