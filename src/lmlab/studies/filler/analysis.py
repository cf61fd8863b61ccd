"""S3 figure, verdict and the report's key rows, read from the result's tables alone.

The verdict knows its power: a gain is "yes" when its paired 95% interval lies above 0, "no" only when
the interval's upper end is below +1 pp (the run could have seen a gain of 1 pp and did not), and
otherwise "unclear", with the run's minimum detectable effect (80% power, two-sided 5%) printed: at
n = 100 paired problems it is several points, so a small run without a gain is inconclusive, not a
failure to reproduce.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmlab.stats import Z_80, bootstrap, decide_sentence, wilson
from lmlab.studies.base import Verdict, canvas, caption, finish

CLAIM = ("Mless and Mful both raise accuracy over w/o; inserted tokens attenuate peak attention on the original "
         "tokens; ARM recovers a gain without inserting tokens")
CONDITIONS = ("w/o", "Mless", "Mful", "ARM")
LABELS = {"w/o": "w/o", "Mless": "w/ Mless", "Mful": "w/ Mful", "ARM": "ARM (no insertion)"}


NO_GAIN = 0.01  # "no gain": the upper 95% bound of the paired gain is below +1 pp
# The paper's gains on Math-500 (seed 003): +1 to +4 points, median +2 (Qwen2.5-Math-1.5B 64 -> 66 with either)
PAPER_GAIN = 0.02


def accuracy(part: pd.DataFrame):
    """Accuracy with its 95% interval: Wilson over problems when each was answered once (greedy), else the
    bootstrap over problems of each problem's mean over the sampled runs."""
    per_problem = part.groupby("id").correct.mean()
    if len(part) == len(per_problem):
        return wilson(int(part.correct.sum()), len(part))
    return bootstrap(per_problem.to_numpy(dtype=float))


def _paired(test: pd.DataFrame, a: str, b: str = "w/o") -> np.ndarray:
    """Per problem, condition a's correctness minus b's (each a mean over the sampled runs, if several)."""
    pa = test[test.condition == a].groupby("id").correct.mean()
    pb = test[test.condition == b].groupby("id").correct.mean()
    common = pa.index.intersection(pb.index)
    return (pa[common] - pb[common]).to_numpy(dtype=float)


def min_detectable_effect(diffs: np.ndarray) -> float:
    """Smallest paired gain (as a fraction) this run detects with 80% power at two-sided 5%. With no
    discordant pairs observed, the spread is taken as that of a 50% discordance (a conservative guess)."""
    n = len(diffs)
    if n < 2:
        return float("nan")
    sd = float(np.std(diffs, ddof=1)) or np.sqrt(0.5)
    return (1.96 + 0.84) * sd / np.sqrt(n)


def gain_check(diffs) -> tuple[str, dict]:
    """('yes' | 'no' | 'unclear', evidence) for a paired gain over w/o (diffs: +1 wrong->right, -1 right->wrong).
    The bootstrap interval collapses to a point when few pairs disagree, so the upper bound used for "no"
    is also at least Wilson's upper bound on the wrong->right share minus the right->wrong share: with no
    disagreeing pair among 100 problems, a gain of up to 3.7 pp is still possible, and "no" is not said."""
    diffs = np.asarray(diffs, dtype=float)
    iv = bootstrap(diffs)
    n, up, down = len(diffs), int((diffs > 0).sum()), int((diffs < 0).sum())
    high = max(iv.high, wilson(up, n).high - down / n) if n else float("nan")
    check = "yes" if iv.low > 0 else ("no" if high < NO_GAIN else "unclear")
    return check, {**iv.as_dict(), "high_for_no_gain": round(high, 4),
                   "min_detectable_effect": round(min_detectable_effect(diffs), 4)}


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
        evidence["accuracy"][cond] = accuracy(part).as_dict()
        if "sample" in part and part["sample"].nunique() > 1:
            per_run = part.groupby("sample").correct.mean()
            evidence.setdefault("accuracy_runs", {})[cond] = {"mean": float(per_run.mean()), "sd": float(per_run.std()),
                                                              "runs": int(len(per_run))}
        evidence.setdefault("hit_budget", {})[cond] = float(part.hit_budget.mean())
    results = {}
    for cond in ("Mless", "Mful", "ARM"):
        check, evidence["gain_over_w/o"][cond] = gain_check(_paired(test, cond))
        results[f"{cond} raises accuracy"] = check
    peaks = _peaks(result)
    for cond in ("Mless", "Mful"):
        diff = bootstrap((peaks[cond] - peaks["None"]).to_numpy())
        evidence[f"peak_attention_change_{cond}"] = diff.as_dict()
        results[f"{cond} attenuates peak attention"] = "yes" if diff.high < 0 else ("no" if diff.low >= 0 else "unclear")
    mlp = result.table("mlp")
    evidence["near_zero_mlp_share"] = {c: float(mlp[mlp.condition == c].near_zero_share.mean()) for c in ("None", "Mless", "Mful")}
    evidence["by_level"] = {f"{c}": test[test.condition == c].groupby("level").correct.mean().round(3).to_dict() for c in CONDITIONS}
    evidence["checks"] = results
    if "scored_by" in test:
        evidence["scored_by"] = test.groupby("scored_by").size().to_dict()
    evidence["caveat"] = (f"greedy decoding with a budget of {meta.get('max_new_tokens')} new tokens; the share of answers "
                          "that ran into the budget (cut off) is in hit_budget, since shorter answers can score better "
                          "under a budget")
    if all(v == "yes" for v in results.values()):
        status = "reproduced"
    elif any(v == "no" for v in results.values()):
        status = "not reproduced"
    else:
        status = "inconclusive"
    acc = evidence["accuracy"]
    summary = ", ".join(f"{LABELS[c]} {100 * acc[c]['estimate']:.1f}%" for c in CONDITIONS) + "; " + \
        "; ".join(f"{k}: {v}" for k, v in results.items())
    if meta.get("scoring"):
        summary += f"; scored by {meta['scoring']} ({meta.get('samples', 1)} run(s) per problem)"
    summary += "; cut off by the budget: " + ", ".join(f"{c} {100 * evidence['hit_budget'][c]:.0f}%" for c in CONDITIONS)
    mde = {c: g["min_detectable_effect"] for c, g in evidence["gain_over_w/o"].items()}
    open_gains = [c for c in mde if results[f"{c} raises accuracy"] == "unclear"]
    if open_gains:
        n = test.id.nunique()
        summary += ("; undecided gains: the smallest gain this run detects is " +
                    ", ".join(f"{c} {100 * m:.1f} pp" for c, m in mde.items()) + f" at n = {n}")
        # the paired design: n = (z * sd / gain)^2, sd from this run (its MDE is z * sd / sqrt(n))
        needed = max(int(np.ceil(n * (mde[c] / PAPER_GAIN) ** 2)) for c in open_gains if np.isfinite(mde[c]))
        text = decide_sentence("test problems", n, needed, getattr(result, "seconds", 0.0),
                               f"the paper's +{100 * PAPER_GAIN:.0f}-point gain", "the full profile runs 1,000, "
                               "five samples each, with a 2048-token budget: a GPU's work")
        evidence["to_decide"] = {"test_problems": needed, "text": text, "z": Z_80}
        summary += f". {text[0].upper()}{text[1:]}"
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
        iv = accuracy(part)
        ax.bar(i, 100 * iv.estimate, color=colors[cond], label=LABELS[cond],
               yerr=[[100 * (iv.estimate - iv.low)], [100 * (iv.high - iv.estimate)]], capsize=4)
    ax.set_xticks([1.5], [result.models[0]])
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Results on {meta.get('benchmark', 'generated arithmetic')} ({test.id.nunique()} problems)")
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
    caption(fig, f"{result.models[0]}: filler tokens inserted into {meta.get('benchmark', 'arithmetic')} prompts "
                 f"({test.id.nunique()} test problems, {meta.get('max_new_tokens', '?')} new tokens)")
    return finish(fig)


def key_rows(result) -> pd.DataFrame:
    """Accuracy per condition (test split), for the report."""
    a = result.table("answer")
    a = a[(a.split == "test") & (a.sweep.fillna("") == "")]
    out = a.groupby("condition").agg(problems=("correct", "size"), accuracy=("correct", "mean"),
                                     hit_budget=("hit_budget", "mean")).reset_index()
    out["accuracy"] = (100 * out.accuracy).round(1)
    return out
