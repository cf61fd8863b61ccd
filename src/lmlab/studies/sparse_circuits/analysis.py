"""S4 figures, verdict and the report's key rows, read from the result's tables alone; `derive` turns the
per-prompt curves into explained effect with intervals, heads needed and the multiplier."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from lmlab.stats import percentile_interval
from lmlab.studies.base import Verdict, canvas, finish
from lmlab.studies.sparse_circuits import circuits
from lmlab.studies.sparse_circuits.config import MIN_PROMPTS
from lmlab.studies.sparse_circuits.toy import POSITION_NAMES

PANEL_TITLES = {"greater-than": "Greater Than", "ioi": "IOI", "docstring": "Docstring", "ioi-long": "IOI Long"}
EDGES_LIMIT = 0.05  # "a few per cent of edges or fewer"


def figure(result, fig=None):
    curves = result.table("curve")
    if curves.empty and len(result.table("toy")):
        return _toy_bars(result, fig)
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
    fig.suptitle(f"{result.models[0]}, dense vs sparse attention: explained effect vs heads kept (multiplier = dense heads / sparse heads at 0.9; "
                 "> 1: the sparse model needs fewer)", fontsize=10)
    return finish(fig)


def _toy_bars(result, fig=None):
    """The toy alone (no circuits run): edges kept and exact match, dense vs sparse."""
    toy = result.table("toy").set_index("variant")
    fig, (left, right) = canvas(fig, (9, 3.6), 1, 2)
    colors = ["tab:blue", "tab:orange"]
    names = ["Dense", "Sparse"]
    left.bar(names, [100 * toy.loc["dense", "kept"], 100 * toy.loc["sparse", "kept"]], color=colors)
    left.axhline(100 * EDGES_LIMIT, color="grey", linestyle=":", label=f"{100 * EDGES_LIMIT:.0f}% (a few per cent)")
    left.axhline(100 * toy.loc["sparse", "floor"], color="black", linestyle="--", lw=0.8, label="one edge per query")
    left.set(yscale="log", ylabel="attention edges kept (%)", title="Edges kept (2-digit addition toy)")
    left.legend(fontsize=8)
    right.bar(names, [100 * toy.loc["dense", "value"], 100 * toy.loc["sparse", "value"]], color=colors)
    right.set(ylim=(0, 100), ylabel="exact match (%)", title="Answers right (1000 test problems)")
    fig.suptitle("Sparse attention post-training on a 4-layer transformer trained in the run on 2-digit addition "
                 "(the paper's Figure 1 setting)",
                 fontsize=10)
    return finish(fig)


def toy_figure(dense: np.ndarray, sparse: np.ndarray, window: int = len(POSITION_NAMES)):
    """Attention edges per layer of the addition toy, on the first problem's window (bos + 9 tokens) of each
    sequence: dense above, sparse below (widths = mean weight); titles count edges over whole sequences."""
    import matplotlib.pyplot as plt

    n_layers = dense.shape[0]
    fig, axes = plt.subplots(2, n_layers, figsize=(3.2 * n_layers, 5.6), squeeze=False)
    for row, (usage, name) in enumerate(((dense, "dense"), (sparse, "sparse"))):
        for layer in range(n_layers):
            ax = axes[row][layer]
            full = usage.shape[-1]
            n = min(window, full)
            weights = usage[layer].sum(0)[:n, :n]  # summed over heads: (query, key)
            kept = int((usage[layer] > 1e-6).sum())
            total = usage.shape[1] * full * (full + 1) // 2
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
            ax.set_title(f"{name}, layer {layer}: {100 * kept / total:.1f}% of edges used", fontsize=9)
    fig.suptitle("2-digit addition toy: attention edges of the first problem in each sequence, 200 test sequences "
                 "(key below, query above; width = mean weight), dense vs sparse", fontsize=10)
    fig.tight_layout()
    return fig


PAPER_FRACTION = 0.004  # "reducing attention connectivity to about 0.4% of its edges" (arXiv 2512.05865 v2-v5)
NOT_CONVERGED = "post-training did not converge"
STILL_FALLING = 0.10  # edges kept fell by more than this (relative) over the last quarter of the steps


def paper_edges_per_query(tokens: int) -> float:
    """The paper's 0.4% as edges per query on `tokens`-token text: a query has (tokens + 1) / 2 causal keys
    on average, so 0.4% of them is 0.002 (tokens + 1)."""
    return PAPER_FRACTION * (tokens + 1) / 2


def edges_still_falling(geco: pd.DataFrame) -> tuple[bool, float, float]:
    """(still falling, edges kept at the start of the last quarter, at the end) from the per-step rows."""
    g = geco.dropna(subset=["kept_edges"]).sort_values("step") if "kept_edges" in geco else geco.iloc[:0]
    if len(g) < 4:
        return False, float("nan"), float("nan")
    kept = g["kept_edges"].to_numpy(dtype=float)
    q, w = max(len(kept) // 4, 1), max(len(kept) // 20, 1)  # a short window damps the sampled gate's noise
    start, end = float(kept[len(kept) - q - w:len(kept) - q].mean()), float(kept[-w:].mean())
    return end < (1 - STILL_FALLING) * start, start, end


def verdict(result) -> Verdict:
    claim = ("At equal explained effect the sparse model needs fewer heads (multiplier > 1) on most tasks, and "
             "its attention keeps a few per cent of edges or fewer at unchanged loss.")
    mult = result.table("multiplier")
    sparsity = result.table("sparsity")
    sparse = sparsity[sparsity["variant"] == "sparse"] if "variant" in sparsity else sparsity.iloc[:0]
    if mult.empty and sparse.empty and len(result.table("toy")):
        return toy_verdict(result.table("toy"), claim, result.table("toy_geco"))
    if mult.empty or sparse.empty:
        return Verdict(status="inconclusive", claim=claim, summary="the table has no multiplier or sparsity rows")
    s = sparse.iloc[0]
    kept, ce_hi, slack = float(s["value"]), float(s["hi"]), float(s["tau_slack"])
    tokens = int(s.get("tokens", 0) or 0)
    epq = float(s.get("edges_per_query", np.nan))
    paper_epq = paper_edges_per_query(tokens) if tokens else np.nan
    edges_ok = kept <= EDGES_LIMIT
    loss_ok = ce_hi <= slack  # the CE increase on held-out text, upper 95% bound, within the allowed slack
    fewer = int((mult["lo"] > 1).sum())
    more = int((mult["hi"] < 1).sum())
    n = len(mult)
    n_prompts = int(s.get("n_prompts", 0) or 0) if "n_prompts" in s else 0
    underpowered = bool(n_prompts) and n_prompts < MIN_PROMPTS
    per_task = "; ".join(f"{r.task} {r.value:.2f}x [{r.lo:.2f}, {r.hi:.2f}] (dense {r.dense_heads}, sparse "
                         f"{r.sparse_heads} heads)" for r in mult.itertuples())
    text = (f"multiplier per task: {per_task}"
            + (f" (underpowered: {n_prompts} prompt pairs per task, the bar is {MIN_PROMPTS})" if underpowered else "")
            + f". Edges kept {100 * kept:.2f}% (claim: a few per cent or fewer, limit {100 * EDGES_LIMIT:.0f}%)")
    if tokens:
        text += (f", {epq:.2f} edges per query on {tokens}-token held-out text (the paper's 0.4% is "
                 f"{paper_epq:.2f} per query at this length; self-edge fallback not counted, "
                 f"{100 * float(s.get('fallback', 0)):.1f}% of queries fell back)")
    text += f"; held-out CE change {s['ce_diff']:+.3f} nats [{s['lo']:+.3f}, {ce_hi:+.3f}] (allowed +{slack})."
    geco = result.table("geco")
    converged = bool(s["converged"]) if "converged" in s and not pd.isna(s["converged"]) else True
    falling, q_start, q_end = edges_still_falling(geco) if len(geco) else (False, np.nan, np.nan)
    evidence = {"kept_edges": kept, "edges_per_query": epq, "paper_edges_per_query": paper_epq, "tokens": tokens,
                "ce_diff": float(s["ce_diff"]), "ce_diff_ci": [float(s["lo"]), ce_hi],
                "tasks_fewer": fewer, "tasks_more": more, "multiplier_underpowered": underpowered,
                "multipliers": {r.task: [float(r.value), float(r.lo), float(r.hi)] for r in mult.itertuples()}}
    if "final_ema" in s:
        evidence.update(converged=converged, final_constraint_ema=float(s["final_ema"]),
                        final_multiplier=float(s["multiplier"]), edges_still_falling=falling)
    if not converged:
        status, evidence["reason"] = "inconclusive", NOT_CONVERGED
        text = f"{NOT_CONVERGED.capitalize()}. " + text + (
            f" The CE constraint's moving average is still {float(s['final_ema']):+.3f} nats over tau after "
            f"{int(s['steps'])} steps (lambda {float(s['multiplier']):.3g}): more steps, or a calmer start, "
            f"before the sparsity can be judged.")
    elif falling and not edges_ok:
        status, evidence["reason"] = "inconclusive", NOT_CONVERGED
        text = f"{NOT_CONVERGED.capitalize()}. " + text + (
            f" The training constraint holds, but edges kept still fell from {100 * q_start:.1f}% to "
            f"{100 * q_end:.1f}% over the last quarter of {int(s['steps'])} steps: the sparsity has not settled.")
    elif edges_ok and loss_ok and fewer > n / 2 and not underpowered:
        status = "reproduced"
    elif (not edges_ok) or (not loss_ok) or more >= n / 2:
        status = "not reproduced"
    else:
        status = "inconclusive"
    if converged and not loss_ok and "final_ema" in s:  # held on training batches, not on held-out text
        text += (" The held-out CE is over the allowed slack although the training constraint held: the "
                 "post-training text was fitted, or the held-out text differs from it (fresh text of the same kind, "
                 "and more of it, is the remedy).")
    return Verdict(status=status, claim=claim, summary=text, evidence=evidence)


TOY_MATCH_DROP = 0.02  # "unchanged loss" on the toy: exact match no more than 2 points below the dense model's
TOY_PROBLEMS = 1000  # test problems of the toy (toy.addition_data's n_test)
TOY_LEARNED = 0.90  # the dense toy must have learned addition before its sparse version can say anything
FULL_SPARSE_STEPS = 2000  # the full profile's post-training of the model (profiles.yaml)


def toy_verdict(toy: pd.DataFrame, claim: str, geco: pd.DataFrame | None = None) -> Verdict:
    """The sparsity half of the claim on the addition toy alone (`circuits: false`, the demo): post-training
    converged (the answer-CE constraint's moving average within its bound), edges kept at most EDGES_LIMIT, and
    exact match at most TOY_MATCH_DROP below the dense model's. Inconclusive while the dense toy has not learned
    the task (exact match below TOY_LEARNED), the constraint is still violated, or edges kept still fell by more
    than 10% over the last quarter while above the limit. The multiplier half needs the model's circuits."""
    from lmlab.stats import wilson

    dense = toy[toy["variant"] == "dense"].iloc[0]
    sparse = toy[toy["variant"] == "sparse"].iloc[0]
    kept, em_d, em_s = float(sparse["kept"]), float(dense["value"]), float(sparse["value"])
    converged = bool(sparse["converged"])
    n = TOY_PROBLEMS
    iv_d, iv_s = wilson(round(em_d * n), n), wilson(round(em_s * n), n)
    edges_ok, loss_ok = kept <= EDGES_LIMIT, em_s >= em_d - TOY_MATCH_DROP
    evidence = {"part": "toy", "kept_edges": kept, "edges_per_query": float(sparse["edges_per_query"]),
                "floor": float(sparse["floor"]), "exact_match_dense": iv_d.as_dict(),
                "exact_match_sparse": iv_s.as_dict(), "converged": converged,
                "final_constraint_ema": float(sparse["final_ema"]), "steps": int(sparse["steps"])}
    text = (f"addition toy (the model's circuits not run): edges kept {100 * kept:.1f}% ({float(sparse['edges_per_query']):.2f} "
            f"per query; one edge per query is {100 * float(sparse['floor']):.1f}%; limit {100 * EDGES_LIMIT:.0f}%), "
            f"exact match {100 * em_s:.1f}% [{100 * iv_s.low:.1f}, {100 * iv_s.high:.1f}] sparse vs {100 * em_d:.1f}% "
            f"[{100 * iv_d.low:.1f}, {100 * iv_d.high:.1f}] dense (allowed drop {100 * TOY_MATCH_DROP:.0f} points), "
            f"constraint moving average {float(sparse['final_ema']):+.3f} nats after {int(sparse['steps'])} steps")
    falling, q_start, q_end = edges_still_falling(geco) if geco is not None and len(geco) else (False, 0.0, 0.0)
    evidence["edges_still_falling"] = falling
    if em_d < TOY_LEARNED:
        status = "inconclusive"
        text = (f"The dense toy did not learn addition ({100 * em_d:.1f}% exact match, needs "
                f"{100 * TOY_LEARNED:.0f}%): more toy_steps (the demo and quick toys have 600) before its sparse "
                f"version can be judged; " + text)
    elif not converged or (falling and not edges_ok):
        status = "inconclusive"
        why = ("the constraint is still violated" if not converged else
               f"edges kept still fell from {100 * q_start:.1f}% to {100 * q_end:.1f}% over the last quarter")
        text = (f"{NOT_CONVERGED.capitalize()} on the toy ({why}): " + text + "; more toy_sparse_steps (the demo "
                "and quick toys have 300) before the sparsity can be judged")
    elif edges_ok and loss_ok:
        status = "reproduced"
    else:
        status = "not reproduced"
    text += (f". To decide the multiplier half on the model: --circuits with 64 prompt pairs a task and sparse "
             f"post-training to convergence (the full profile, {FULL_SPARSE_STEPS} steps of 16 sequences; about 16 s a "
             f"step for SmolLM2-135M on 2 CPU cores, 9 hours: a GPU's work)")
    return Verdict(status=status, claim="On the addition toy: " + claim.split(", and ")[-1].rstrip("."),
                   summary=text, evidence=evidence)


def geco_figure(tables: dict[str, pd.DataFrame]):
    """Post-training trajectories from the run's tables (name -> table): the constraint (CE over its bound) and its
    moving average, lambda, edges kept."""
    import matplotlib.pyplot as plt

    parts = [(k, tables[k]) for k in ("geco", "toy_geco") if len(tables.get(k, ()))]
    fig, axes = plt.subplots(len(parts) or 1, 3, figsize=(12, 3.2 * max(len(parts), 1)), squeeze=False)
    for row, (kind, t) in zip(axes, parts):
        t = t.sort_values("step")
        name = "SmolLM2 / model" if kind == "geco" else "addition toy"
        row[0].plot(t["step"], t["ce"] - t["tau"], label="CE - tau (batch)")
        row[0].plot(t["step"], t["ema"], label="moving average")
        row[0].axhline(0.0, color="grey", linestyle=":", label="bound")
        row[0].set_title(f"{name}: constraint (nats over tau)", fontsize=9)
        row[0].legend(fontsize=7)
        row[1].semilogy(t["step"], t["multiplier"])
        row[1].set_title("GECO multiplier lambda", fontsize=9)
        if t["kept_edges"].notna().any():
            row[2].plot(t["step"], 100 * t["kept_edges"])
        row[2].set_title("edges kept in training (%, sampled gate)", fontsize=9)
        for ax in row:
            ax.set_xlabel("step")
    fig.tight_layout()
    return fig


def summary(result) -> pd.DataFrame:
    rows = []
    tasks = result.table("task")
    needed = result.table("heads_needed")
    mult = result.table("multiplier")
    mult = mult.set_index("task") if "task" in mult else mult
    for name in dict.fromkeys(tasks["task"] if "task" in tasks else []):
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
        epq = getattr(r, "edges_per_query", np.nan)
        rows.append({"task": f"held-out text ({r.variant})", "dense metric": None,
                     "multiplier": f"edges kept {100 * r.value:.2f}%"
                                   + (f" ({epq:.2f} per query)" if not pd.isna(epq) else "") + f", CE {r.ce:.3f}"})
    for r in result.table("toy").itertuples():
        epq = getattr(r, "edges_per_query", np.nan)
        rows.append({"task": f"addition toy ({r.variant})",
                     "multiplier": f"exact match {100 * r.value:.1f}%, edges kept {100 * r.kept:.1f}%"
                                   + (f" ({epq:.2f} per query)" if not pd.isna(epq) else "")})
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
