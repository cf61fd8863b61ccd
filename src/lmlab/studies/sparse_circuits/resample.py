"""The multiplier's interval with the heads re-ranked on every resample of the prompt pairs.

The heads a circuit keeps are chosen on the prompt pairs (ranked by their mean attribution) and the circuit is then
measured on the same pairs: the number of heads needed for 0.9 of the effect is a statistic of a selection made on
the data. Resampling the pairs under the ranking fixed on all of them leaves the selection's own noise out of the
interval (a ranking that fits its pairs' noise looks as good on every resample of them). So each resample here
repeats the whole procedure on its own draw: the heads ranked by their mean attribution over the draw's pairs
(each pair's attribution is measured once: `lmlab.circuits.attribution_scores(per_prompt=True)`), and the circuit
of the top N of that ranking measured by activation patching, its explained effect read over the draw's pairs.

What a draw costs: a forward pass over the prompt pairs for each grid point it needs (the heads a draw keeps at N
differ from the fixed ranking's and from other draws', so every set is patched anew; sets that coincide are
measured once). Heads needed at 0.9 reads the curve from the top (it is the smallest N from which the explained
effect stays at or above 0.9), so a draw is measured from the grid's top down to the first N under 0.9, and no
further: the points below decide nothing. On SmolLM2-135M (270 heads, the coarse grid, 12 pairs) a dense IOI
circuit needs 80 heads, so a draw measures 5 points where the fixed curve measures 18: about a quarter of the
fixed curve's cost per draw.

`measure_draws` runs in the recipe (it drives the model through a `measure` callable that patches sets of
components); `heads_needed_per_draw` reads its rows in the analysis. The draws are recorded with their values, so
the analysis needs nothing but the tables.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from lmlab import circuits


def prompt_draws(n_prompts: int, n_draws: int, seed: int) -> np.ndarray:
    """(n_draws, n_prompts) prompt indices, each row a resample with replacement; the same for the dense model and
    every sparse replicate of a task (the same seed and count), so their draws pair."""
    rng = np.random.default_rng([int(seed), 4004, int(n_prompts)])
    return rng.integers(0, max(int(n_prompts), 1), (int(n_draws), int(n_prompts)))


def measure_draws(per_prompt: np.ndarray, curve: circuits.EffectCurve, draws: np.ndarray, threshold: float,
                  measure: Callable[[list], np.ndarray]) -> list[dict]:
    """For each draw (a row of `draws`): the components ranked by their mean attribution over the draw's prompts
    (`per_prompt`: (n_prompts, layers, width), each prompt pair's attribution), and the mean metric over the draw's
    prompts with the top N of that ranking kept clean, every other component patched, for the curve's grid points
    from the top down to the first whose explained effect on the draw falls below `threshold`.

    `curve`: the curve measured on every prompt (its grid, and the per-prompt clean and all-patched metrics, which no
    ranking changes); `measure(patched_sets)` -> (len(sets), n_prompts): the per-prompt metric with each set patched
    (`lmlab.circuits.patched_metrics`). A draw without an effect to explain (its clean and all-patched means alike)
    is skipped. Rows: {draw, n_heads, value} (value: the draw's mean metric at that N)."""
    grid = list(curve.grid)
    states = {}
    for b, idx in enumerate(draws):
        if not curve.has_effect(idx):
            continue
        order = circuits.ranking(per_prompt[idx].mean(0))
        states[b] = (order, float(curve.clean[idx].mean()), float(curve.none[idx].mean()))
    rows = []
    for n in reversed(grid[1:-1]):  # the top (every head kept) and the bottom (none) are the same for any ranking
        if not states:
            break
        kept = {b: frozenset(order[:n]) for b, (order, _, _) in states.items()}
        unique = list(dict.fromkeys(kept.values()))
        first = {}
        for b, key in kept.items():
            first.setdefault(key, b)
        values = measure([states[first[key]][0][n:] for key in unique])
        where = {key: i for i, key in enumerate(unique)}
        for b in list(states):
            _, top, bottom = states[b]
            m = float(values[where[kept[b]]][draws[b]].mean())
            rows.append({"draw": int(b), "n_heads": int(n), "value": m})
            if not (m - bottom) / (top - bottom) >= threshold:
                del states[b]  # the first point under the threshold from the top: heads needed is decided
    return rows


def draw_rows(draws: np.ndarray) -> list[dict]:
    """The draws as rows {draw, idx} (idx: the prompt indices, as JSON), recorded beside the values they index."""
    import json

    return [{"draw": b, "idx": json.dumps([int(i) for i in idx])} for b, idx in enumerate(draws)]


def draws_of(rows: pd.DataFrame) -> np.ndarray | None:
    """The draws recorded as `draw_rows` (one unit's), as (n_draws, n_prompts); None without any."""
    import json

    if rows is None or not len(rows):
        return None
    rows = rows.sort_values("draw")
    return np.array([json.loads(i) for i in rows["idx"]], dtype=int)


def heads_needed_per_draw(values: pd.DataFrame, draws: np.ndarray, curve: circuits.EffectCurve,
                          threshold: float) -> np.ndarray:
    """(n_draws,) heads needed for `threshold` of the effect on each draw, from `measure_draws`' rows of one unit
    (`values`: draw, n_heads, value) and the unit's curve on every prompt (its clean and all-patched metrics, read
    over the draw's prompts); NaN for a draw without an effect to explain. Grid points a draw did not measure (those
    below its first point under the threshold) count as under it, which is what they would decide."""
    grid = list(curve.grid)
    at = {n: i for i, n in enumerate(grid)}
    out = np.full(len(draws), np.nan)
    by_draw = {int(b): part for b, part in values.groupby("draw")} if len(values) else {}
    for b, idx in enumerate(draws):
        if not curve.has_effect(idx):
            continue
        column = np.full(len(grid), np.nan)
        column[0], column[-1] = curve.none[idx].mean(), curve.clean[idx].mean()
        for n, v in zip(by_draw.get(b, values.iloc[:0])["n_heads"], by_draw.get(b, values.iloc[:0])["value"]):
            if int(n) in at:
                column[at[int(n)]] = float(v)
        one = circuits.EffectCurve(grid, column[:, None], np.array([column[-1]]), np.array([column[0]]))
        with np.errstate(invalid="ignore"):
            needed = one.heads_needed(threshold)
        out[b] = float(grid[-1] if needed is None else needed)
    return out


def needed_per_unit(values: pd.DataFrame, draws: pd.DataFrame, curves: dict, key: Callable[[str, str, int], tuple],
                    threshold: float) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """unit -> (its draws (n_draws, n_prompts), heads needed on each), for every unit (task, variant, replicate: -1
    where the rows carry none) with recorded draws and a curve in `curves` (keyed by `key(task, variant, replicate)`).
    `values` and `draws`: the tables of `measure_draws`' and `draw_rows`' rows (with task, variant and replicate)."""
    out = {}
    if draws is None or not len(draws):
        return out

    def rep(frame):
        return frame["replicate"].fillna(-1).astype(int) if "replicate" in frame else pd.Series(-1, index=frame.index)

    draws = draws.assign(task=draws["task"].fillna("ones") if "task" in draws else "ones", rep=rep(draws))
    if len(values):
        values = values.assign(task=values["task"].fillna("ones") if "task" in values else "ones", rep=rep(values))
    for (task, variant, r), part in draws.groupby(["task", "variant", "rep"]):
        unit = key(str(task), str(variant), int(r))
        if unit not in curves:
            continue
        d = draws_of(part)
        mine = values[(values["task"] == task) & (values["variant"] == variant) & (values["rep"] == r)] \
            if len(values) else pd.DataFrame(columns=["draw", "n_heads", "value"])
        out[unit] = (d, heads_needed_per_draw(mine, d, curves[unit], threshold))
    return out


def paired(units: dict, keys: list[tuple]) -> np.ndarray | None:
    """The draws every unit of `keys` shares (they must be the same draws for the dense model and every sparse
    replicate, else their per-draw multipliers would not pair), or None where one lacks draws or they differ."""
    found = [units.get(k) for k in keys]
    if not found or any(f is None for f in found):
        return None
    first = found[0][0]
    if any(f[0].shape != first.shape or not np.array_equal(f[0], first) for f in found[1:]) or not len(first):
        return None
    return first


def reranked_claim(name: str, per: np.ndarray, draws: np.ndarray, n_items: int, bar, **kwargs):
    """A claim from a statistic per replicate on every item (`per`, (k,)) and per replicate on each re-ranked draw
    (`draws`, (n_draws, k), NaN where a draw has none): the same two-level interval as `Resampler.claim`, its item
    resamples the draws the recipe measured (each draw's statistic is the mean over replicates of the finite ones)."""
    from lmlab.resampling import Resampler

    draws = np.asarray(draws, dtype=float)
    finite = np.isfinite(draws)
    boot = np.where(finite.any(1), np.where(finite, draws, 0.0).sum(1) / np.maximum(finite.sum(1), 1), np.nan)
    claim = Resampler(n_items, len(per), n_boot=0).combine(name, np.asarray(per, dtype=float), boot, bar, **kwargs)
    claim.method += f"; the heads re-ranked on each of {len(draws)} resamples of the {n_items} prompt pairs"
    return claim


def reranked_gate(used: bool, why: str) -> "Gate":
    """Blocks "yes" where the multiplier's interval kept the ranking fixed on every prompt pair (a run recorded before
    the re-ranked draws, or with rank_draws 0): it leaves the selection's own noise out, so it may be too narrow."""
    from lmlab.claims import Gate

    return Gate("heads re-ranked on each resample", used, why=why, blocks="yes",
                remedy="rerun the circuits with rank_draws > 0 (the profiles' default): each resample then ranks "
                       "the heads on its own prompt pairs")
