"""S1 figure, verdict and the report's key rows, read from the result's tables alone."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmlab.stats import bootstrap, bootstrap_diff, wilson
from lmlab.studies.base import Verdict, canvas, finish
from lmlab.studies.knockout.probes import MIN_GROUP

CLAIM = ("Q-Anchored ΔP falls far below A-Anchored ΔP in middle and late layers, on every dataset; "
         "random-token knockout stays near 0")
FAR = -10.0  # "far below": a Q - A gap of at least 10 pp (point estimate) whose 95% interval excludes 0
NEAR = 5.0  # "near 0": the control's mean within ±5 pp, its interval within ±10 pp


def figure(result, fig=None):
    meta = result.info
    ko = result.table("knockout")
    fig, ax = canvas(fig, (7.5, 5))
    if ko.empty:
        ax.text(0.5, 0.5, "no knockout results (see verdict)", ha="center", transform=ax.transAxes)
        return fig
    colors = ["tab:blue", "tab:orange", "tab:purple", "tab:green", "tab:red", "tab:brown"]
    for color, (dataset, part) in zip(colors, ko[ko.condition == "eq"].groupby("dataset", sort=True)):
        for grp, style in (("Q", "-"), ("A", "--")):
            sub = part[part.group == grp]
            if sub.empty:
                continue
            _line(ax, sub, f"{grp}-Anchored ({dataset})", color, style)
    control = ko[ko.condition == "control"]
    if len(control):
        _line(ax, control, "random tokens (control, all sets)", "grey", ":")
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xlabel("Layer")
    ax.set_ylabel("ΔP")
    ax.set_title(str(meta.get("model", "")))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False)
    return finish(fig)


def _line(ax, rows, label, color, style):
    layers = sorted(rows.layer.unique())
    stats = [bootstrap(rows[rows.layer == layer].delta_p.to_numpy(), n_resamples=500) for layer in layers]
    ax.plot(layers, [s.estimate for s in stats], style, color=color, label=label, lw=1.6)
    ax.fill_between(layers, [s.low for s in stats], [s.high for s in stats], color=color, alpha=0.12)


def late_layers(layers: list[int], n_layers: int, best: int | None) -> list[int]:
    """Middle-to-last sweep layers, minus the best probe layer (where the Q/A split is defined)."""
    late = [l for l in layers if l >= n_layers // 2 and l != best]
    return late or [max(layers)]


def verdict(result) -> Verdict:
    """Per dataset: each sample's mean ΔP over the middle-to-last sweep layers except the best layer;
    the Q - A gap of those means must be at least 10 pp, with its 95% interval below 0. The control's mean
    over the same layers must stay within ±5 pp (interval within ±10 pp)."""
    meta = result.info
    ko = result.table("knockout")
    if ko.empty:
        n_c, n_i = int(meta.get("correct", 0)), int(meta.get("incorrect", 0))
        return Verdict(status="inconclusive", claim=CLAIM, evidence=meta,
                       summary=f"inconclusive: only {n_c} correct and {n_i} incorrect answers; too few to train probes")
    layers = sorted(int(l) for l in ko.layer.unique())
    n_layers = int(meta.get("n_layers", max(layers) + 1))
    best = int(meta["best_layer"]) if "best_layer" in meta else None
    late = late_layers(layers, n_layers, best)
    evidence: dict = {"layers_compared": late, "best_layer": best, "counts": meta, "datasets": {}}
    per_sample = ko[ko.layer.isin(late)].groupby(["condition", "dataset", "group", "id"]).delta_p.mean().reset_index()
    ok, thin = True, []
    for dataset in sorted(ko.dataset.unique()):
        rows = per_sample[(per_sample.condition == "eq") & (per_sample.dataset == dataset)]
        q, a = rows[rows.group == "Q"].delta_p, rows[rows.group == "A"].delta_p
        entry = {"n_q": len(q), "n_a": len(a)}
        for name, layer in (("middle", min(layers, key=lambda l: abs(l - n_layers // 2))), ("last", max(layers))):
            at = ko[(ko.condition == "eq") & (ko.dataset == dataset) & (ko.layer == layer)]
            entry[f"{name}_layer_{layer}"] = {"q_mean": float(at[at.group == "Q"].delta_p.mean()),
                                              "a_mean": float(at[at.group == "A"].delta_p.mean())}
        if len(q) < MIN_GROUP or len(a) < MIN_GROUP:
            thin.append(f"{dataset} ({len(q)} Q / {len(a)} A)")
        else:
            diff = bootstrap_diff(q, a)
            entry.update(q_mean=float(q.mean()), a_mean=float(a.mean()), q_minus_a=diff.as_dict())
            ok &= diff.estimate <= FAR and diff.high < 0
        evidence["datasets"][dataset] = entry
    control = per_sample[per_sample.condition == "control"].delta_p
    iv = bootstrap(control)
    evidence["control"] = iv.as_dict()
    control_ok = abs(iv.estimate) < NEAR and iv.low > -2 * NEAR and iv.high < 2 * NEAR
    ok &= control_ok
    probes = result.table("probe")
    if len(probes) and "best" in probes:
        evidence["probe_auroc_best_layer"] = float(probes[probes.best == 1].test_auroc.iloc[0])
    patch = result.table("patching")
    for grp in ("Q", "A") if "flipped" in patch else ():
        flips = patch[patch.group == grp].flipped
        evidence[f"patching_flip_rate_{grp}"] = wilson(int(flips.sum()), len(flips)).as_dict()
    for row in result.table("detection").itertuples():
        evidence[f"detection_auroc_{row.method.replace(' ', '_')}"] = {
            "auroc": row.auroc, "low": getattr(row, "low", None), "high": getattr(row, "high", None)}
    evidence["caveat"] = ("Q/A-Anchored is defined by the knockout flipping the best-layer probe, so the gap at that "
                          "layer is built in; it is left out of the comparison, and the control shows what knocking "
                          "out as many other question tokens does.")
    span = f"layers {late[0]}-{late[-1]} (best layer {best} left out)"
    if thin:
        status, summary = "inconclusive", f"too few samples in a group: {', '.join(thin)}"
    elif ok:
        status, summary = "reproduced", (f"over {span}, Q-Anchored ΔP is at least {-FAR:.0f} pp below A-Anchored on "
                                         f"every set; control {iv.estimate:+.1f} pp")
    else:
        status, summary = "not reproduced", f"over {span}: " + _why_not(evidence, control_ok)
    return Verdict(status=status, claim=CLAIM, summary=summary, evidence=evidence)


def _why_not(evidence: dict, control_ok: bool) -> str:
    parts = []
    for dataset, entry in evidence["datasets"].items():
        d = entry.get("q_minus_a")
        if d and not (d["estimate"] <= FAR and d["high"] < 0):
            parts.append(f"{dataset}: Q-A = {d['estimate']:.1f} pp [{d['low']:.1f}, {d['high']:.1f}]")
    if not control_ok:
        c = evidence["control"]
        parts.append(f"control: {c['estimate']:.1f} pp [{c['low']:.1f}, {c['high']:.1f}]")
    return "; ".join(parts) or "criteria not met"


def key_rows(result) -> pd.DataFrame:
    """Mean ΔP (pp) per set and group at the sweep layers, for the report."""
    ko = result.table("knockout")
    if ko.empty:
        return pd.DataFrame([result.info])
    ko = ko.assign(line=np.where(ko.condition == "control", "control", ko.dataset + " " + ko.group.fillna("")))
    return ko.pivot_table(index="line", columns="layer", values="delta_p", aggfunc="mean").round(1).reset_index()
