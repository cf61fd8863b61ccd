"""What compare measures on one model and one task, recorded as one unit (resumable): each prompt pair's attribution
score of every head, the explained-effect curve along the model's own ranking, and activation patching on its top
heads (the attribution checked).

Prompt pairs come in draws: draw p is the task's pairs generated at the p-th replicate seed of the run's --seed
(`prompt_seed`), one draw per replicate (`draws`), so the prompt pairs, and with them the original's circuit size k and
its self-overlap R, vary between the replicates inside a run as they vary between run seeds. The original is measured
on every draw; replicate r of a variant on draw r, so the analysis pairs a variant with the original prompt by prompt
within a draw. A file of prompt pairs is one draw (its first n pairs): its replicates are the same pairs.
"""

from __future__ import annotations

import json

import numpy as np

from lmlab import circuits
from lmlab.data.generated.circuits import CircuitTask, make_task, pairs_file
from lmlab.errors import LmlabError
from lmlab.runs import RunDir
from lmlab.studies.compare.config import circuit_k


def _round(values) -> list[float]:
    return [float(f"{float(v):.6g}") for v in np.asarray(values).ravel()]


def unit_key(model_key: str, task: str, draw: int) -> str:
    """A recorded measurement's key: the model, the task and the prompt draw (a unit recorded before draws, keyed
    without one, is measured again rather than read as a draw it may not be)."""
    return f"{model_key}|{task}|draw{draw}"


def prompt_seed(config, draw: int) -> int:
    """The seed prompt-pair draw `draw` is generated at: the run's replicate seed of that index."""
    return config.replicate_seed(draw)


def draws(config, task_name: str) -> list[int]:
    """The prompt-pair draws a task is measured on: one per replicate (--seeds, the profile's `seeds`); a file of
    prompt pairs is one draw."""
    return [0] if pairs_file(task_name) is not None else list(range(config.n_seeds))


def judged_task(task_name: str, tokenizer, config, draw: int) -> CircuitTask:
    """Draw `draw` of a task's judged prompt pairs (a file's first n whatever the draw)."""
    return make_task(task_name, tokenizer, config.size("n_prompts"), prompt_seed(config, draw))


def original_key(draw: int) -> str:
    """The original's model key on prompt draw `draw` ("original" on the first, as a run of one draw has it)."""
    return "original" if draw == 0 else f"original#{draw}"


def _verified(lm, task, batch: int, z_corr, scores, top: list, model_key: str, task_name: str) -> tuple[float, list]:
    """Attribution checked against activation patching on the `top` heads (three at least): their Spearman
    correlation (NaN where either side is constant, or fewer heads) and a `verify_component` row per head."""
    if len(top) < 3:
        return float("nan"), []
    from scipy.stats import spearmanr

    act = circuits.activation_scores(lm, task, batch, z_corr=z_corr, heads=top)
    a = np.array([scores[l, h] for l, h in top])
    b = np.array([act[l, h] for l, h in top])
    rho = float(spearmanr(a, b)[0]) if np.ptp(a) > 0 and np.ptp(b) > 0 else float("nan")
    return rho, [{"kind": "verify_component", "model_key": model_key, "task": task_name, "layer": l, "index": h,
                  "attribution": float(x), "activation": float(y)} for (l, h), x, y in zip(top, a, b)]


def measure(lm, model_key: str, cell: str, replicate: int, task_name: str, config, run_dir: RunDir,
            draw: int = 0) -> list[dict]:
    """One model on one task's prompt draw `draw`: rows of kinds `model` (its clean and corrupted metric, circuit size,
    the check of attribution against activation patching, and the draw), `attribution` (one row per prompt pair: every
    head's score, layer-major), `per_prompt` (the explained-effect curve's per-prompt metric at each N) and
    `verify_component`. On the induction task the model row carries `induction_score`: the mean induction score of
    the heads patching verified."""
    done = run_dir.done("models")
    key = unit_key(model_key, task_name, draw)
    if key in done:
        return done[key]
    batch = config.batch_size
    task = judged_task(task_name, lm.tokenizer, config, draw)
    z_corr, corrupted = circuits.corrupted_run(lm, task, batch)
    per = circuits.attribution_scores(lm, task, batch, z_corr=z_corr, per_prompt=True)  # (prompts, layers, heads)
    scores = per.mean(0)
    order = circuits.ranking(scores)
    grid = circuits.heads_grid(len(order), fine=bool(config.size("fine_grid")))
    curve = circuits.effect_curve(lm, task, order, grid=grid, batch_size=batch, z_corr=z_corr)
    needed = curve.heads_needed(config.threshold)
    top = order[:min(int(config.size("verify_heads") or 0), len(order))]
    rho, checked = _verified(lm, task, batch, z_corr, scores, top, model_key, task_name)
    # the induction task: the mean induction score of the heads patching verified (its induction heads, where they
    # are the circuit), each head's on the clean prompts (circuits.induction_scores)
    induction = float("nan")
    if task_name == "induction" and top:
        per_head = circuits.induction_scores(lm, task, batch)
        induction = float(np.nanmean([per_head[l, h] for l, h in top]))
    ident = {"model_key": model_key, "cell": cell, "replicate": replicate, "task": task_name}
    rows = [{"kind": "model", **ident, "draw": draw, "model_name": lm.name, "clean_metric": float(curve.clean.mean()),
             "corrupted_metric": float(corrupted.mean()), "metric": task.metric, "n_prompts": len(task),
             "heads_needed": float(needed) if needed is not None else float("nan"), "total_heads": len(order),
             "has_effect": bool(curve.has_effect()), "verify_rho": rho, "verify_heads": len(top),
             "n_layers": lm.layout.n_layers, "n_heads": lm.layout.n_heads, "induction_score": induction}]
    rows += [{"kind": "attribution", **ident, "idx": i, "scores": json.dumps(_round(p))} for i, p in enumerate(per)]
    rows += [{"kind": "per_prompt", **ident, "n_heads": n, "values": json.dumps(_round(v))}
             for n, v in zip(curve.grid, curve.values)]
    rows += checked
    run_dir.record("models", key, rows)
    run_dir.log(f"{model_key} {task_name}: clean {curve.clean.mean():.3f}, corrupted {corrupted.mean():.3f}, "
                f"N@{config.threshold} = {needed}, attribution vs activation on {len(top)} top heads: rho {rho:.2f}")
    return rows


def copied(run_dir: RunDir, source_key: str, unit: tuple[str, str, int], cell: str, replicate: int,
           model_name: str) -> list[dict]:
    """The unit `source_key` recorded again as model `unit` = (its model key, task, draw), with its cell, replicate
    and name: the positive control `same` is the original itself, so its measurement on a prompt draw is the
    original's on that draw (a second pass over the same model and prompts gives the same numbers) and is not made
    twice."""
    done = run_dir.done("models")
    model_key = unit[0]
    key = unit_key(*unit)
    if key in done:
        return done[key]
    rows = [{**r, "model_key": model_key, **({"cell": cell, "replicate": replicate} if "cell" in r else {}),
             **({"model_name": model_name} if "model_name" in r else {})} for r in done[source_key]]
    run_dir.record("models", key, rows)
    return rows


def top_heads(rows: list[dict], n: int | None, min_k: int, chosen: list[dict] | None = None) -> list[tuple[int, int]]:
    """The n heads of largest |mean attribution| (the controls' heads): ranked on `chosen`'s rows (the original on
    other prompt pairs, `select`) where given, else on the unit's own; n None: the circuit's size, as the overlap is
    read (the original's heads for the threshold's effect, at least min_k, at most half)."""
    per = np.array([json.loads(r["scores"]) for r in (chosen if chosen is not None else rows)
                    if r["kind"] in ("attribution", "selection")])
    model = next(r for r in rows if r["kind"] == "model")
    if n is None:
        n = circuit_k(model["heads_needed"], model["total_heads"], min_k)
    scores = per.mean(0).reshape(model["n_layers"], model["n_heads"])
    return circuits.ranking(scores)[:n]


def selection_task(name: str, tokenizer, n: int, judged_seeds: list[int], seed: int) -> tuple[CircuitTask, bool]:
    """Up to `n` prompt pairs of the task other than the judged ones of every draw (generated at `seed`, a draw none
    judges, or a file's pairs after its first `n`; pairs whose clean text is a judged one's left out), and whether
    they are other pairs: a file that holds fewer than 4 others gives the judged pairs back (False)."""
    judged = [make_task(name, tokenizer, n, s) for s in judged_seeds]
    seen = {p.clean_text for task in judged for p in task.prompts}
    from_file = pairs_file(name) is not None
    try:
        pool = make_task(name, tokenizer, 3 * n, seed)
    except LmlabError:  # a file's later pairs that this tokenizer cannot take: none of them is used
        return judged[0], False
    others = []
    for p in pool.prompts[n:] if from_file else pool.prompts:
        if p.clean_text not in seen:
            seen.add(p.clean_text)
            others.append(p)
    if len(others) < min(4, n):
        return judged[0], False
    return CircuitTask(judged[0].name, judged[0].metric, others[:n]), True


def select(lm, task_name: str, config, run_dir: RunDir, judged: list[int] | None = None) -> list[dict]:
    """The original's attribution of every head on prompt pairs other than the judged ones of every draw
    (`selection_task`): where
    the controls `ablate` and `swap` choose the heads they zero or move, so that a control does not act on exactly the
    heads its overlap is then read at. One recorded unit per task (kind `selection`, one row per prompt pair)."""
    done = run_dir.done("selection")
    if task_name in done:
        return done[task_name]
    judged = judged if judged is not None else draws(config, task_name)  # every draw a model is read on
    task, other = selection_task(task_name, lm.tokenizer, config.size("n_prompts"),
                                 [prompt_seed(config, d) for d in judged], prompt_seed(config, max(judged) + 1))
    per = circuits.attribution_scores(lm, task, config.batch_size, per_prompt=True)
    rows = [{"kind": "selection", "task": task_name, "idx": i, "other_pairs": other, "scores": json.dumps(_round(p))}
            for i, p in enumerate(per)]
    run_dir.record("selection", task_name, rows)
    run_dir.log(f"original {task_name}: heads ranked for the controls on {len(task)} "
                + ("other prompt pairs" if other else "of the judged prompt pairs (the file holds no others)"))
    return rows
