"""S4 figures, verdict and the report's key rows, read from the result's tables alone; `derive` turns the
per-prompt curves into explained effect with intervals, heads needed and the multiplier."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from lmlab.stats import percentile_interval
from lmlab.studies.base import Verdict, canvas, finish
from lmlab.studies.sparse_circuits import circuits
from lmlab.studies.sparse_circuits.toy import POSITION_NAMES

PANEL_TITLES = {"greater-than": "Greater Than", "ioi": "IOI", "docstring": "Docstring", "ioi-long": "IOI Long"}
EDGES_LIMIT = 0.05  # "a few per cent of edges or fewer"


def figure(result, fig=None):
    curves = result.table("curve")
    tasks = list(dict.fromkeys(curves["task"]))
    fig, axes = canvas(fig, (4.2 * max(len(tasks), 1), 3.6), 1, max(len(tasks), 1), squeeze=False)
    mult = result.table("multiplier").set_index("task")
    task_rows = result.table("task")
    mixed = "components" in task_rows and (task_rows["components"] == "heads+mlps").any()
    for ax, name in zip(axes[0], tasks):
        for variant, color, label in (("dense", "tab:blue", "Dense"), ("sparse", "tab:orange", "Sparse")):
            sub = curves[(curves["task"] == name) & (curves["variant"] == variant)].sort_values("n_heads")
            if sub.empty:
                continue
            ax.plot(sub["n_heads"], sub["value"], color=color, label=f"{label} model")
            ax.fill_between(sub["n_heads"], sub["lo"], sub["hi"], color=color, alpha=0.15, linewidth=0)
        ax.axhline(0.9, color="grey", linestyle=":", linewidth=1)
        ax.set_title(PANEL_TITLES.get(name, name))
        ax.set_xlabel("Number of Components Kept (heads + MLPs)" if mixed else "Number of Heads Kept")
        ax.set_ylabel("Explained Effect")
        ax.set_ylim(-0.1, 1.1)
        if name in mult.index:
            m = mult.loc[name]
            ax.text(0.97, 0.05, f"{m['value']:.1f}x\n[{m['lo']:.1f}, {m['hi']:.1f}]", transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=11, fontweight="bold")
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("Explained effect vs heads kept (multiplier = dense heads / sparse heads at 0.9; "
                 "> 1: the sparse model needs fewer)", fontsize=10)
    return finish(fig)


def toy_figure(dense: np.ndarray, sparse: np.ndarray):
    """Attention edges per layer of the addition toy: dense above, sparse below (widths = mean weight)."""
    import matplotlib.pyplot as plt


    n_layers = dense.shape[0]
    fig, axes = plt.subplots(2, n_layers, figsize=(3.2 * n_layers, 5.6), squeeze=False)
    for row, (usage, name) in enumerate(((dense, "dense"), (sparse, "sparse"))):
        for layer in range(n_layers):
            ax = axes[row][layer]
            weights = usage[layer].sum(0)  # summed over heads: (query, key)
            n = weights.shape[0]
            kept = int((usage[layer] > 1e-6).sum())
            total = usage.shape[1] * n * (n + 1) // 2
            for q in range(n):
                for k in range(q + 1):
                    w = float(weights[q, k]) / usage.shape[1]
                    if w > 1e-3:
                        ax.plot([k, q], [0, 1], color="tab:blue" if row == 0 else "tab:orange",
                                alpha=min(1.0, 0.15 + w), linewidth=0.3 + 3 * w)
            ax.scatter(range(n), [0] * n, s=12, color="black", zorder=3)
            ax.scatter(range(n), [1] * n, s=12, color="black", zorder=3)
            ax.set_xticks(range(n), POSITION_NAMES[:n], fontsize=7)
            ax.set_yticks([])
            ax.set_ylim(-0.15, 1.15)
            ax.set_title(f"{name}, layer {layer}: {kept}/{total} edges used", fontsize=9)
    fig.suptitle("2-digit addition toy: attention edges used on 200 test problems (key below, query above; "
                 "width = mean weight), dense vs sparse", fontsize=10)
    fig.tight_layout()
    return fig


def verdict(result) -> Verdict:
    claim = ("At equal explained effect the sparse model needs fewer heads (multiplier > 1) on most tasks, and "
             "its attention keeps a few per cent of edges or fewer at unchanged loss.")
    mult = result.table("multiplier")
    sparsity = result.table("sparsity")
    sparse = sparsity[sparsity["variant"] == "sparse"]
    if mult.empty or sparse.empty:
        return Verdict(status="inconclusive", claim=claim, summary="the table has no multiplier or sparsity rows")
    s = sparse.iloc[0]
    kept, ce_hi, slack = float(s["value"]), float(s["hi"]), float(s["tau_slack"])
    edges_ok = kept <= EDGES_LIMIT
    loss_ok = ce_hi <= slack  # the CE increase on held-out text, upper 95% bound, within the allowed slack
    fewer = int((mult["lo"] > 1).sum())
    more = int((mult["hi"] < 1).sum())
    n = len(mult)
    per_task = "; ".join(f"{r.task} {r.value:.2f}x [{r.lo:.2f}, {r.hi:.2f}] (dense {r.dense_heads}, sparse "
                         f"{r.sparse_heads} heads)" for r in mult.itertuples())
    text = (f"multiplier per task: {per_task}. Edges kept {100 * kept:.2f}% (claim: a few per cent or fewer, "
            f"limit {100 * EDGES_LIMIT:.0f}%); held-out CE change {s['ce_diff']:+.3f} nats [{s['lo']:+.3f}, "
            f"{ce_hi:+.3f}] (allowed +{slack}).")
    if edges_ok and loss_ok and fewer > n / 2:
        status = "reproduced"
    elif (not edges_ok) or (not loss_ok) or more >= n / 2:
        status = "not reproduced"
    else:
        status = "inconclusive"
    evidence = {"kept_edges": kept, "ce_diff": float(s["ce_diff"]), "ce_diff_ci": [float(s["lo"]), ce_hi],
                "tasks_fewer": fewer, "tasks_more": more,
                "multipliers": {r.task: [float(r.value), float(r.lo), float(r.hi)] for r in mult.itertuples()}}
    return Verdict(status=status, claim=claim, summary=text, evidence=evidence)


def summary(result) -> pd.DataFrame:
    rows = []
    tasks = result.table("task")
    needed = result.table("heads_needed")
    mult = result.table("multiplier").set_index("task")
    for name in dict.fromkeys(tasks["task"]):
        row = {"task": name}
        for variant in ("dense", "sparse"):
            t = tasks[(tasks["task"] == name) & (tasks["variant"] == variant)]
            h = needed[(needed["task"] == name) & (needed["variant"] == variant)]
            if not t.empty:
                row[f"{variant} metric"] = round(float(t["clean_metric"].iloc[0]), 3)
                row[f"{variant} acc"] = round(float(t["accuracy"].iloc[0]), 3)
            if not h.empty:
                row[f"{variant} heads@0.9"] = h["value"].iloc[0]
        if name in mult.index:
            m = mult.loc[name]
            row["multiplier"] = f"{m['value']:.2f}x [{m['lo']:.2f}, {m['hi']:.2f}]"
        rows.append(row)
    for r in result.table("sparsity").itertuples():
        rows.append({"task": f"held-out text ({r.variant})", "dense metric": None,
                     "multiplier": f"edges kept {100 * r.value:.2f}%, CE {r.ce:.3f}"})
    for r in result.table("toy").itertuples():
        rows.append({"task": f"addition toy ({r.variant})",
                     "multiplier": f"exact match {100 * r.value:.1f}%, edges kept {100 * r.kept:.1f}%"})
    return pd.DataFrame(rows)


def derive(table: pd.DataFrame, threshold: float, seed: int, n_boot: int = 1000) -> pd.DataFrame:
    """Add curve rows (EE with intervals), heads needed, and the multiplier per task with its interval."""
    rows = []
    per = table[table["kind"] == "per_prompt"]
    rng = np.random.default_rng(seed)
    for name in per["task"].unique():
        curves = {}
        for variant in ("dense", "sparse"):
            sub = per[(per["task"] == name) & (per["variant"] == variant)].sort_values("n_heads")
            if sub.empty:
                continue
            values = np.array([json.loads(v) for v in sub["values"]])
            curves[variant] = circuits.EffectCurve([int(n) for n in sub["n_heads"]], values, values[-1], values[0])
        n_prompts = next(iter(curves.values())).values.shape[1]
        boots = [rng.integers(0, n_prompts, n_prompts) for _ in range(n_boot)]
        needed = {}
        for variant, curve in curves.items():
            ee = curve.explained()
            ee_boot = np.array([curve.explained(idx) for idx in boots])
            lo, hi = np.nanpercentile(ee_boot, [2.5, 97.5], axis=0)  # a curve: one interval per point
            for n, e, l, h in zip(curve.grid, ee, lo, hi):
                rows.append({"kind": "curve", "variant": variant, "task": name, "n_heads": n, "value": e,
                             "lo": l, "hi": h})
            total = curve.grid[-1]
            n90 = curve.heads_needed(threshold)
            boot = np.array([_or(curve.heads_needed(threshold, idx), total) for idx in boots], dtype=float)
            needed[variant] = (n90, boot)
            iv = percentile_interval(n90 if n90 else np.nan, boot)
            rows.append({"kind": "heads_needed", "variant": variant, "task": name, "value": iv.estimate,
                         "lo": iv.low, "hi": iv.high, "total_heads": total})
        if len(needed) == 2:
            (nd, bd), (ns, bs) = needed["dense"], needed["sparse"]
            total = curves["dense"].grid[-1]
            ratio = bd.clip(min=1) / bs.clip(min=1)
            value = max(_or(nd, total), 1) / max(_or(ns, total), 1)
            iv = percentile_interval(value, ratio)
            rows.append({"kind": "multiplier", "task": name, "value": value, "lo": iv.low, "hi": iv.high,
                         "dense_heads": nd, "sparse_heads": ns})
    keep = table[table["kind"] != "per_prompt"]
    return pd.concat([keep, pd.DataFrame(rows)], ignore_index=True)


def _or(value, default):
    return default if value is None else value
