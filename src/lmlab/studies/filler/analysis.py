"""S3 figure, verdict and the report's key rows, read from the result's tables alone."""

from __future__ import annotations

import pandas as pd

from lmlab.stats import bootstrap, wilson
from lmlab.studies.base import Verdict, canvas, finish

CLAIM = ("Mless and Mful both raise accuracy over w/o; inserted tokens attenuate peak attention on the original "
         "tokens; ARM recovers a gain without inserting tokens")
CONDITIONS = ("w/o", "Mless", "Mful", "ARM")
LABELS = {"w/o": "w/o", "Mless": "w/ Mless", "Mful": "w/ Mful", "ARM": "ARM (no insertion)"}


def _paired_diff(test: pd.DataFrame, a: str, b: str = "w/o"):
    pa = test[test.condition == a].set_index("id").correct
    pb = test[test.condition == b].set_index("id").correct
    common = pa.index.intersection(pb.index)
    return bootstrap((pa[common] - pb[common]).to_numpy(dtype=float))


def _peaks(result) -> pd.DataFrame:
    prof = result.table("profile")
    prof = prof[prof.view == "aligned"]
    return prof.groupby(["condition", "problem"]).attention.max().unstack(0)


def verdict(result) -> Verdict:

    answers = result.table("answer")
    test = answers[(answers.split == "test") & (answers.sweep.fillna("") == "")]
    meta = result.info
    evidence: dict = {"counts": meta, "accuracy": {}, "gain_over_w/o": {}}
    for cond in CONDITIONS:
        part = test[test.condition == cond]
        evidence["accuracy"][cond] = wilson(int(part.correct.sum()), len(part)).as_dict()
        evidence.setdefault("hit_budget", {})[cond] = float(part.hit_budget.mean())
    results = {}
    for cond in ("Mless", "Mful", "ARM"):
        diff = _paired_diff(test, cond)
        evidence["gain_over_w/o"][cond] = diff.as_dict()
        results[f"{cond} raises accuracy"] = "yes" if diff.low > 0 else ("no" if diff.estimate <= 0 else "unclear")
    peaks = _peaks(result)
    for cond in ("Mless", "Mful"):
        diff = bootstrap((peaks[cond] - peaks["None"]).to_numpy())
        evidence[f"peak_attention_change_{cond}"] = diff.as_dict()
        results[f"{cond} attenuates peak attention"] = "yes" if diff.high < 0 else ("no" if diff.estimate >= 0 else "unclear")
    mlp = result.table("mlp")
    evidence["near_zero_mlp_share"] = {c: float(mlp[mlp.condition == c].near_zero_share.mean()) for c in ("None", "Mless", "Mful")}
    evidence["by_level"] = {f"{c}": test[test.condition == c].groupby("level").correct.mean().round(3).to_dict() for c in CONDITIONS}
    evidence["checks"] = results
    evidence["caveat"] = (f"greedy decoding with a budget of {meta.get('max_new_tokens')} new tokens; the share of answers "
                          "that ran into the budget is in hit_budget, since shorter answers can score better under a budget")
    if all(v == "yes" for v in results.values()):
        status = "reproduced"
    elif any(v == "no" for v in results.values()):
        status = "not reproduced"
    else:
        status = "inconclusive"
    acc = evidence["accuracy"]
    summary = ", ".join(f"{LABELS[c]} {100 * acc[c]['estimate']:.1f}%" for c in CONDITIONS) + "; " + \
        "; ".join(f"{k}: {v}" for k, v in results.items())
    return Verdict(status=status, claim=CLAIM, summary=summary, evidence=evidence)


def figure(result, fig=None):
    meta = result.info
    answers = result.table("answer")
    test = answers[(answers.split == "test") & (answers.sweep.fillna("") == "")]
    fig, axes = canvas(fig, (12, 8), 2, 2)
    ax = axes[0, 0]
    colors = {"w/o": "#6a3d9a", "Mless": "#1b9e77", "Mful": "#a6cee3", "ARM": "#fdbf6f"}
    for i, cond in enumerate(CONDITIONS):
        part = test[test.condition == cond]
        iv = wilson(int(part.correct.sum()), len(part))
        ax.bar(i, 100 * iv.estimate, color=colors[cond], label=LABELS[cond],
               yerr=[[100 * (iv.estimate - iv.low)], [100 * (iv.high - iv.estimate)]], capsize=4)
    ax.set_xticks([1.5], [str(meta.get("model", ""))])
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Results on generated arithmetic ({len(test) // len(CONDITIONS)} problems)")
    ax.legend(fontsize=8)
    prof = result.table("profile")
    head = int(prof["head"].iloc[0]) if len(prof) else 0
    for ax, view, conds in ((axes[0, 1], "aligned", ("None", "Mless", "Mful")), (axes[1, 0], "long", ("Mless", "Mful"))):
        for cond in conds:
            part = prof[(prof.view == view) & (prof.condition == cond)].groupby("position").attention.mean()
            ax.plot(part.index, part.values, label=cond, lw=1.2)
            ax.fill_between(part.index, 0, part.values, alpha=0.15)
        ax.set_title(f"Average attention on head {head} (layer {int(prof.layer.iloc[0]) if len(prof) else 0}, "
                     f"{'inserted tokens removed' if view == 'aligned' else 'all positions'})")
        ax.set_xlabel("token position")
        ax.legend(fontsize=8)
    ax = axes[1, 1]
    sweep = answers[answers.sweep.fillna("").str.startswith("length=")]
    ids = set(sweep.id)
    base = test[test.id.isin(ids)]
    points = [(0, base[base.condition == "w/o"].correct.mean()),
              (int(meta.get("insert_count", 55)), base[base.condition == "Mless"].correct.mean())]
    points += [(int(s.split("=")[1]), g.correct.mean()) for s, g in sweep.groupby("sweep")]
    points.sort()
    ax.plot([p[0] for p in points], [100 * p[1] for p in points], "o-", color=colors["Mless"], label="Mless, between")
    for cond, marker in (("Mless", "s"), ("Mful", "^")):
        for pos in ("before", "after"):
            part = answers[(answers.sweep == f"position={pos}") & (answers.condition == cond)]
            if len(part):
                ax.scatter([int(meta.get("insert_count", 55))], [100 * part.correct.mean()], marker=marker,
                           label=f"{cond}, {pos}")
    ax.set_xlabel("inserted tokens")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Length and position sweeps ({len(ids)} problems)")
    ax.legend(fontsize=7)
    return finish(fig)


def key_rows(result) -> pd.DataFrame:
    """Accuracy per condition (test split), for the report."""
    a = result.table("answer")
    a = a[(a.split == "test") & (a.sweep.fillna("") == "")]
    out = a.groupby("condition").agg(problems=("correct", "size"), accuracy=("correct", "mean"),
                                     hit_budget=("hit_budget", "mean")).reset_index()
    out["accuracy"] = (100 * out.accuracy).round(1)
    return out
