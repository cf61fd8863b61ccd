"""S4 measurements that drive the model: text batches, circuit discovery per task (ranking and explained-effect
curve, resumable) and the attribution-vs-activation check."""

from __future__ import annotations

import json

import numpy as np

from lmlab import parallel
from lmlab.data.generated.circuits import make_task
from lmlab.evaluation import causal_lm_ce
from lmlab.runs import RunDir
from lmlab import circuits
from lmlab.studies.sparse_circuits.config import Config
from lmlab.studies.sparse_circuits.resample import draw_rows, measure_draws, prompt_draws


def text_batches(lm, seqs: list[list[int]], batch_size: int):
    for start in range(0, len(seqs), batch_size):
        yield lm_batch(lm, seqs[start:start + batch_size])


def lm_batch(lm, seqs: list[list[int]]) -> dict:
    batch = lm.pad_batch(seqs, padding_side="right")
    labels = batch["input_ids"].clone()
    labels[batch["attention_mask"] == 0] = -100
    batch["labels"] = labels
    return batch


def with_dense_reference(lm, seqs: list[list[int]], batch_size: int) -> tuple[list[dict], float]:
    """Post-training items that carry the dense model's summed next-token NLL, and the dense CE over all of
    them, token-weighted as a causal LM's training loss is (each sequence predicts len - 1 tokens)."""
    per_seq, _ = causal_lm_ce(lm.model, text_batches(lm, seqs, batch_size))
    counts = [len(seq) - 1 for seq in seqs]
    items = [{"ids": seq, "nll": ce * n, "n": n} for seq, ce, n in zip(seqs, per_seq, counts)]
    return items, sum(it["nll"] for it in items) / max(sum(counts), 1)


def reference_batch(lm, items: list[dict]) -> dict:
    """An LM batch of `items` with `dense_ce`: the dense model's CE on exactly this batch."""
    batch = lm_batch(lm, [it["ids"] for it in items])
    batch["dense_ce"] = sum(it["nll"] for it in items) / max(sum(it["n"] for it in items), 1)
    return batch


def discover(lm, variant: str, config: Config, run_dir: RunDir, replicate: int | None = None) -> None:
    """Clean metric, ranking and explained-effect curve per task, and the curve's points on `rank_draws` resamples of
    the prompt pairs with the heads re-ranked on each (resample.py), recorded per task (resumable); `replicate`: the
    post-training replicate a sparse model is (its rows carry it)."""
    done = run_dir.done(f"discovery-{variant}")
    for i, name in enumerate(config.tasks):
        key = name if replicate is None else f"{name}|rep{replicate}"
        if key in done or not parallel.mine(i):  # under a launch each process takes its tasks
            continue
        task = make_task(name, lm.tokenizer, config.size("n_prompts"), config.seed)
        z_corr, corrupted = circuits.corrupted_run(lm, task, config.batch_size, mlps=config.mlps)
        per = circuits.attribution_scores(lm, task, config.batch_size, z_corr=z_corr, per_prompt=True)
        scores = per.mean(0)  # (layers, heads): each head's mean over the prompt pairs
        order = circuits.ranking(scores)
        grid = circuits.heads_grid(len(order), fine=config.size("fine_grid"))
        curve = circuits.effect_curve(lm, task, order, grid=grid, batch_size=config.batch_size, z_corr=z_corr)
        clean = curve.clean  # every head kept: the unpatched run
        rep = {} if replicate is None else {"replicate": replicate}
        # the multiplier's resamples, each ranking the heads on its own draw of the prompt pairs (resample.py)
        draws = prompt_draws(len(task), config.size("rank_draws") or 0, config.seed)
        reranked = measure_draws(per, curve, draws, config.threshold, lambda sets: circuits.patched_metrics(
            lm, task, sets, config.batch_size, z_corr=z_corr))
        rows = [{"kind": "task", "variant": variant, **rep, "task": name, "clean_metric": float(clean.mean()),
                 "accuracy": float((clean > 0).mean()), "corrupted_metric": float(corrupted.mean()),
                 "metric": task.metric, "total_heads": len(order),
                 "components": "heads+mlps" if config.mlps else "heads"}]
        for n, values in zip(curve.grid, curve.values):
            rows.append({"kind": "per_prompt", "variant": variant, **rep, "task": name, "n_heads": n,
                         "values": json.dumps([round(float(v), 6) for v in values])})
        rows += [{"kind": "ranking", "variant": variant, **rep, "task": name, "rank": rank, "layer": l, "index": h,
                  "score": round(float(scores[l, h]), 6)} for rank, (l, h) in enumerate(order[:40], 1)]
        rows += [{"kind": "rerank_draw", "variant": variant, **rep, "task": name, **r} for r in draw_rows(draws)]
        rows += [{"kind": "rerank", "variant": variant, **rep, "task": name, **r} for r in reranked]
        run_dir.record(f"discovery-{variant}", key, rows)
        run_dir.log(f"{variant} {name}: clean {clean.mean():.3f}, corrupted {corrupted.mean():.3f}, "
                    f"N@{config.threshold} = {curve.heads_needed(config.threshold)}")


def verify(lm, config: Config, run_dir: RunDir) -> None:
    """Attribution vs activation patching on `verify_heads` heads (the top half plus random ones)."""
    if run_dir.done("verify") or not parallel.mine(len(config.tasks)):  # the unit after the tasks' discovery
        return
    from scipy.stats import spearmanr

    task = make_task(config.tasks[0], lm.tokenizer, config.size("n_prompts"), config.seed)
    z_corr = circuits.corrupted_z(lm, task, config.batch_size, mlps=config.mlps)
    attr = circuits.attribution_scores(lm, task, config.batch_size, z_corr=z_corr)
    order = circuits.ranking(attr)
    k = min(config.size("verify_heads"), len(order))
    rng = np.random.default_rng(config.seed)
    rest = order[k // 2:]
    picked = order[: k // 2] + [rest[i] for i in rng.choice(len(rest), size=k - k // 2, replace=False)]
    act = circuits.activation_scores(lm, task, config.batch_size, z_corr=z_corr, heads=picked)
    a = np.array([attr[l, h] for l, h in picked])
    b = np.array([act[l, h] for l, h in picked])
    rho = float(spearmanr(a, b)[0])
    run_dir.record("verify", "verify", [{"kind": "verify", "task": task.name, "n_heads": k, "value": rho}] + [
        {"kind": "verify_component", "task": task.name, "layer": l, "index": h, "attribution": float(x),
         "activation": float(y)} for (l, h), x, y in zip(picked, a, b)])
