"""The gates both halves of sparse-circuits read (the toy and the model): did a sparse post-training hold its
constraint and settle, is each measured sparse model at unchanged held-out loss, is there an effect to explain; and
the percentile band of bootstrap curves."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmlab.claims import Gate
from lmlab.studies.sparse_circuits.declared import CONSTRAINT_TOLERANCE

STILL_FALLING = 0.10  # edges kept fell by more than this (relative) over the last quarter of the steps


def edges_still_falling(geco: pd.DataFrame) -> tuple[bool, float, float]:
    """(still falling, edges kept at the start of the last quarter, at the end) from the per-step rows."""
    g = geco.dropna(subset=["kept_edges"]).sort_values("step") if "kept_edges" in geco else geco.iloc[:0]
    if len(g) < 4:
        return False, float("nan"), float("nan")
    kept = g["kept_edges"].to_numpy(dtype=float)
    q, w = max(len(kept) // 4, 1), max(len(kept) // 20, 1)  # a short window damps the sampled gate's noise
    start, end = float(kept[len(kept) - q - w:len(kept) - q].mean()), float(kept[-w:].mean())
    return end < (1 - STILL_FALLING) * start, start, end


def constraint_held(geco: pd.DataFrame, slack: float) -> tuple[bool | None, float]:
    """(held, mean violation): the constraint read over the last quarter of the steps, CE minus its bound averaged
    there, held if that is at most CONSTRAINT_TOLERANCE x the slack; (None, NaN) without a per-step trace.

    GECO holds the CE at its bound once it has converged, so the moving average at the last step sits above or
    below 0 by chance: read alone it would call a converged replicate unconverged about half of the time."""
    g = geco.dropna(subset=["ce", "tau"]).sort_values("step") if {"ce", "tau"} <= set(geco) else geco.iloc[:0]
    if len(g) < 4:
        return None, float("nan")
    tail = g.iloc[len(g) - max(len(g) // 4, 1):]
    violation = float((tail["ce"] - tail["tau"]).mean())
    return violation <= CONSTRAINT_TOLERANCE * slack, violation


def post_training_gates(sparse: pd.DataFrame, geco: pd.DataFrame, slack: float, remedy: str) -> list[Gate]:
    """Two gates on every replicate's sparse post-training, read over the last quarter of its steps (`sparse`: one
    row per replicate, with `steps`, `converged` and `final_ema`; `geco`: the per-step trace):

    - its constraint held (`constraint_held`): blocks "not reproduced" only (a GECO still pulling the loss down would
      give edges back). Whether the measured models bought their sparsity with loss, which blocks every decision,
      `held_out_loss_gate` reads on them (the toy's docstring says why the trace's reading does not);
    - its kept edges settled (`edges_still_falling`): blocks "not reproduced" only. With the constraint held, edges
      still falling make the sparse model sparser than it will end: its kept share can only fall further, so a
      "yes" on it stands and a "no" may be the unfinished training's; the same for the circuits it shrinks
      (the paper's effect, understated by a model between dense and sparse). This is quantize's reading of
      students still learning."""
    violated, falling_reps = [], []
    for r, row in sparse.iterrows():
        steps = int(row["steps"]) if "steps" in row and pd.notna(row["steps"]) else 0
        part = geco[geco["replicate"] == r] if "replicate" in geco else geco
        falling, start, end = edges_still_falling(part) if len(part) else (False, np.nan, np.nan)
        held, violation = constraint_held(part, slack) if len(part) else (None, np.nan)
        lam = f", lambda {float(row['lambda']):.3g}" if "lambda" in row and pd.notna(row["lambda"]) else ""
        if held is False:
            violated.append(f"replicate {r}: CE {violation:+.3f} nats over its bound on average over the last quarter "
                            f"of {steps} steps ({CONSTRAINT_TOLERANCE * slack:.3f} allowed{lam})")
        elif held is None and not bool(row["converged"]):
            violated.append(f"replicate {r}: the constraint's moving average still {float(row['final_ema']):+.3f} nats "
                            f"over its bound after {steps} steps{lam}")
        elif falling:
            falling_reps.append(f"replicate {r}: edges kept still fell from {100 * start:.1f}% to {100 * end:.1f}% "
                                "over the last quarter")
    return [Gate("sparse post-training held its constraint", not violated, remedy=remedy, blocks="no",
                 why="; ".join(violated) or "every replicate's CE at its bound over the last quarter"),
            Gate("sparse post-training's edges settled", not falling_reps, remedy=remedy, blocks="no",
                 why="; ".join(falling_reps) or "every replicate's kept edges fell by less than "
                                                 f"{100 * STILL_FALLING:.0f}% over the last quarter")]


def held_out_loss_gate(over: pd.Series, slack: float, remedy: str, what: str = "toy") -> Gate:
    """Every measured sparse model at unchanged loss: `over`, per replicate, its CE on the held-out sequences (the
    deterministic gate whose edges are counted) minus its dense model's on the same sequences, at most the slack, the
    constraint's own bound. `what`: "toy" or "model". Blocks every decision: a sparse model that bought its sparsity
    with loss says nothing about sparsity at unchanged loss."""
    over = over.astype(float)
    dense = "its dense toy" if what == "toy" else "the dense model"
    bad = [f"replicate {r}: {d:+.4f} nats over {dense}" + (" (no CE recorded)" if np.isnan(d) else "")
           for r, d in over.items() if not d <= slack]
    return Gate(f"sparse {what}s at unchanged held-out loss", not bad, remedy=remedy,
                why="; ".join(bad) + f" ({slack:.3f} allowed)" if bad else
                f"held-out CE sparse - dense {over.min():+.4f} to {over.max():+.4f} nats ({slack:.3f} allowed)")


NO_EFFECT = ("no effect to explain: the clean and the corrupted prompts give the same mean metric (a model that "
             "does not do the task)")


def band(boots: np.ndarray, level: float = 95.0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile band of bootstrap curves (resamples, grid), NaN resamples left out; NaN where no resample has a
    value (no effect to explain), without numpy's all-NaN warning."""
    lo, hi = np.full(boots.shape[1], np.nan), np.full(boots.shape[1], np.nan)
    some = ~np.isnan(boots).all(0)
    if some.any():
        tail = (100 - level) / 2
        lo[some], hi[some] = np.nanpercentile(boots[:, some], [tail, 100 - tail], axis=0)
    return lo, hi


def no_effect_gate(lacking: list[str]) -> Gate:
    """Blocks every decision when a curve has no effect to explain (its multiplier is undefined, not 1)."""
    return Gate("an effect to explain", not lacking, why="; ".join(lacking) or "every curve's clean and corrupted "
                "metrics differ", remedy="a model that does the task: its clean prompts must score differently "
                                         "from the corrupted ones")
