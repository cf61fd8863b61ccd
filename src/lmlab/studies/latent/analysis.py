"""S0 figure, verdict and the report's key rows, read from the result's tables alone."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmlab.stats import bootstrap
from lmlab.studies.base import Verdict, canvas, finish

POINT = 0.01  # "within about one point" of accuracy


def _variants(result) -> pd.DataFrame:
    return result.table("variant")


def _rates(result) -> pd.DataFrame:
    v = _variants(result)
    return v[v["variant"].str.startswith("r")].sort_values("rate")


def figure(result, fig=None):
    v = _variants(result)
    cot = v[v["variant"] == "cot"]
    points = pd.concat([cot, _rates(result)]).sort_values("rate")
    fig, ax = canvas(fig, (6.4, 4.2))
    acc = 100 * points["accuracy"]
    ax.errorbar(points["rate"], acc, yerr=[(acc - 100 * points["acc_lo"]).clip(lower=0),
                                           (100 * points["acc_hi"] - acc).clip(lower=0)],
                color="tab:blue", marker="o", capsize=3, label="Average Math Accuracy")
    ax.set_xlabel("Latent Compression-Rate (r; CoT = 1)")
    ax.set_ylabel("Averaged Math Accuracy (%)", color="tab:blue")
    answer_only = v[v["variant"] == "answer-only"]
    if not answer_only.empty:
        ax.axhline(100 * answer_only["accuracy"].iloc[0], color="tab:blue", linestyle=":", linewidth=1,
                   label="answer-only accuracy")
    ax2 = ax.twinx()
    ax2.errorbar(points["rate"], points["tokens"], yerr=[(points["tokens"] - points["tok_lo"]).clip(lower=0),
                                                         (points["tok_hi"] - points["tokens"]).clip(lower=0)],
                 color="tab:red", marker="s", capsize=3, label="Tokens")
    ax2.set_ylabel("Token Counts (generated per problem)", color="tab:red")
    if not cot.empty:
        ax.annotate("CoT", (1, 100 * cot["accuracy"].iloc[0]), textcoords="offset points", xytext=(6, 6))
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower left", fontsize=8)
    ax.set_title("Accuracy and tokens vs latent compression rate")
    return finish(fig)


def _correct(result, variant: str) -> np.ndarray:
    """0/1 per test problem, in test order (the same problems for every variant: paired)."""
    rows = result.table("problem")
    return rows[rows["variant"] == variant].sort_values("idx")["correct"].to_numpy(dtype=float)


def verdict(result) -> Verdict:
    claim = "Token count falls steadily as r rises, while accuracy stays within about one point of CoT."
    v = _variants(result)
    cot = v[v["variant"] == "cot"]
    rates = _rates(result)
    if cot.empty or rates.empty:
        return Verdict(status="inconclusive", claim=claim, summary="the table has no CoT or latent rows")
    c = cot.iloc[0]
    diffs = {}
    for _, r in rates.iterrows():
        d = bootstrap(_correct(result, r["variant"]) - _correct(result, c["variant"]))  # paired: the same test problems
        diffs[int(r["rate"])] = d
    top = rates.iloc[-1]
    fewer = float(top["tok_hi"]) < float(c["tok_lo"])  # the highest rate uses clearly fewer tokens than CoT
    seq = [float(c["tokens"])] + [float(t) for t in rates["tokens"]]
    steady = all(b <= a + 0.5 for a, b in zip(seq, seq[1:]))  # never rises by more than half a token
    clearly_worse = [r for r, d in diffs.items() if d.high < -POINT]
    within = [r for r, d in diffs.items() if d.low >= -2 * POINT]
    reduction = 1 - float(top["tokens"]) / float(c["tokens"])
    text = (f"CoT: accuracy {100 * c['accuracy']:.1f}% [{100 * c['acc_lo']:.1f}, {100 * c['acc_hi']:.1f}], "
            f"{c['tokens']:.1f} tokens. " + "; ".join(
                f"r={int(r['rate'])}: {100 * r['accuracy']:.1f}%, {r['tokens']:.1f} tokens, "
                f"vs CoT {100 * diffs[int(r['rate'])].estimate:+.1f} pp [{100 * diffs[int(r['rate'])].low:+.1f}, "
                f"{100 * diffs[int(r['rate'])].high:+.1f}]" for _, r in rates.iterrows())
            + f". Tokens at r={int(top['rate'])}: {100 * reduction:.0f}% fewer than CoT.")
    if fewer and steady and not clearly_worse and len(within) == len(diffs):
        status = "reproduced"
    elif not fewer or clearly_worse:
        status = "not reproduced"
    else:
        status = "inconclusive"
    evidence = {"token_reduction_at_max_rate": reduction, "tokens_fall": fewer, "tokens_steady": steady,
                "rates_clearly_worse": clearly_worse,
                "accuracy_diff_vs_cot": {r: [d.estimate, d.low, d.high] for r, d in diffs.items()}}
    return Verdict(status=status, claim=claim, summary=text, evidence=evidence)


def summary(result) -> pd.DataFrame:
    v = _variants(result)
    rows = []
    for _, r in v.iterrows():
        row = {"variant": r["variant"], "rate": r["rate"],
               "accuracy": f"{100 * r['accuracy']:.1f}% [{100 * r['acc_lo']:.1f}, {100 * r['acc_hi']:.1f}]",
               "tokens": f"{r['tokens']:.1f} [{r['tok_lo']:.1f}, {r['tok_hi']:.1f}]",
               "latents": round(float(r["latents"]), 2), "ms/problem": round(1000 * r["seconds_per_problem"], 1)}
        if "vq_dev_token_acc" in r and pd.notna(r.get("vq_dev_token_acc")):
            row["VQ dev token acc"] = round(float(r["vq_dev_token_acc"]), 3)
            row["codes used"] = r.get("codebook_used")
        rows.append(row)
    return pd.DataFrame(rows)
