"""The sparse-circuits study's attribution patching (three passes) vs activation patching (one pass per head),
same IOI prompts.

Both score every head of the model; the benchmark prints the wall-time ratio and the Spearman
correlation between the two rankings (signed scores). Targets: >= 20x faster and
Spearman >= 0.8 on the embedded model.
"""

from __future__ import annotations

import time

import numpy as np

from lmlab import circuits
from lmlab.benchmarks.registry import alternate, benchmark
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


def forward_equivalents(n_layers: int, n_heads: int) -> tuple[float, float]:
    """(every head patched by one full forward each, from its layer's cached residual), in full forwards over the
    prompts, counting the blocks run (the embedding and the one-position unembedding are small beside them)."""
    naive = n_layers * n_heads
    fast = n_heads * sum(n_layers - l for l in range(n_layers)) / n_layers
    return float(naive), float(fast)


@benchmark("patching")
def patching_bench(model: str = "smollm2-135m", prompts: int = 8, repeats: int = 1, **_) -> list[dict]:
    """Activation patching of every head on IOI pairs: lmlab's fast path (each patch from its layer's cached
    residual, a layer's heads as blocks of one batch, logits at the metric's position) vs one full forward per
    head (lmlab's earlier way, kept as the reference), interleaved, with the agreement of the scores."""
    from scipy.stats import spearmanr

    lm = load_model(model)
    task = make_task("ioi", lm.tokenizer, prompts, seed=0)
    z_corr = circuits.corrupted_z(lm, task, prompts)
    clean = float(abs(circuits.metric_values(lm, task, prompts).mean()))
    cases = {"one full forward per head": circuits.activation_scores_naive,
             "from the cached residual, a layer's heads batched": circuits.activation_scores}
    times, scores = alternate({name: (lambda f=f: f(lm, task, prompts, z_corr=z_corr)) for name, f in cases.items()},
                              repeats)
    slow, fast = (scores[n] for n in cases)
    rho = float(spearmanr(slow.ravel(), fast.ravel())[0])
    worst = float(np.abs(slow - fast).max()) / clean
    naive_f, fast_f = forward_equivalents(lm.layout.n_layers, lm.layout.n_heads)
    base = times["one full forward per head"]
    setup = (f"{model}, IOI, {prompts} prompt pairs, all {slow.size} heads, best of {repeats}; "
             f"Spearman {rho:.6f}, largest difference {worst:.1e} of the clean metric")
    rows = []
    for name, f_eq in zip(cases, (naive_f, fast_f)):
        t = times[name]
        rows.append(dict(benchmark="patching", case=f"{name} ({f_eq:.0f} forward-equivalents)", value=round(t, 2),
                         unit="s", ratio=round(base / t, 2), target=None,
                         note="aim >= 2x" if t != base else None, setup=setup))
    # the explained-effect curve over the heads ranked by these scores: its grid points as blocks of one batch
    order = circuits.ranking(fast)
    grid = circuits.heads_grid(len(order))
    curves = {"effect curve, one forward per grid point": circuits.effect_curve_naive,
              "effect curve, grid points batched from the first layer each keeps clean": circuits.effect_curve}
    ctimes, values = alternate({name: (lambda f=f: f(lm, task, order, grid=grid, batch_size=prompts,
                                                      z_corr=z_corr).values) for name, f in curves.items()}, repeats)
    a, b = (values[n] for n in curves)
    csetup = (f"{model}, IOI, {prompts} prompt pairs, {len(grid)} grid points over {len(order)} heads, best of "
              f"{repeats}; largest difference {float(np.abs(a - b).max()) / clean:.1e} of the clean metric")
    cbase = ctimes["effect curve, one forward per grid point"]
    for name in curves:
        t = ctimes[name]
        rows.append(dict(benchmark="patching", case=name, value=round(t, 2), unit="s", ratio=round(cbase / t, 2),
                         target=None, setup=csetup))
    return rows
