"""S0 figure, verdict and the report's key rows, read from the result's tables alone.

Verdict (the paper's claim: tokens fall steadily as r rises while accuracy stays at or above CoT, within
about one point, one-sided):
- "inconclusive" when a rate's model wrote fewer than 0.1 latent tokens per problem (the method was not
  exercised), or when an accuracy interval is too wide to decide; the minimum detectable difference is
  printed (one-sided 5%, 80% power) with the test size that one point would take;
- "inconclusive (fine-tuning did not converge)" instead of "not reproduced" when a rate that falls short was
  still learning at the end: its training loss fell over the last quarter of steps by more than 10% of the
  third quarter's and by more than 0.01 nats per token, although the cosine schedule had nearly stopped
  it (a heuristic; the quick profile's 150 steps fail it, 450 pass);
- "not reproduced" only when accuracy is clearly worse than CoT (the paired 95% interval of latent − CoT lies
  below −1 point) or the tokens do not fall, with the fine-tuning converged;
- "reproduced" when tokens fall steadily, the top rate uses clearly fewer tokens than CoT and every rate's
  one-sided 95% lower bound of latent − CoT is at or above −1 point.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmlab.stats import duration, bootstrap
from lmlab.studies.base import Verdict, canvas, caption, finish

POINT = 0.01  # "within about one point" of accuracy
MIN_LATENTS = 0.1  # latent tokens per problem below which the method was not exercised
STILL_LEARNING = (0.10, 0.01)  # last-quarter loss drop (relative, nats/token) that means training had not converged
Z_ONE_SIDED, Z_POWER = 1.645, 0.842  # one-sided 5%, 80% power


def still_learning(row) -> tuple[float, float] | None:
    """(third-quarter loss, last-quarter loss) when the fine-tuning was still learning at its end, else None."""
    q3, q4 = row.get("ft_loss_q3", np.nan), row.get("ft_loss_q4", np.nan)
    if pd.isna(q3) or pd.isna(q4):
        return None
    drop = float(q3) - float(q4)
    return (float(q3), float(q4)) if drop > STILL_LEARNING[0] * float(q3) and drop > STILL_LEARNING[1] else None


def _variants(result) -> pd.DataFrame:
    return result.table("variant")


def _rates(result) -> pd.DataFrame:
    v = _variants(result)
    return v[v["variant"].str.startswith("r")].sort_values("rate")


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series(np.nan, index=frame.index)


def figure(result, fig=None):
    v = _variants(result)
    cot = v[v["variant"] == "cot"]
    points = _rates(result)
    fig, ax = canvas(fig, (6.4, 5.0))
    acc = 100 * points["accuracy"]
    ax.errorbar(points["rate"], acc, yerr=[(acc - 100 * points["acc_lo"]).clip(lower=0),
                                           (100 * points["acc_hi"] - acc).clip(lower=0)],
                color="tab:blue", marker="o", capsize=3, label="accuracy (latent + text)")
    forced = 100 * _col(points, "forced_accuracy")
    if forced.notna().any():
        ax.plot(points["rate"], forced, color="tab:blue", marker="o", markerfacecolor="none", linestyle="none",
                label="accuracy, true codes forced")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(points["rate"]))
    ax.set_xticklabels([str(int(r)) for r in points["rate"]])
    ax.set_xlabel("Latent compression rate r")
    ax.set_ylabel("Accuracy (%)", color="tab:blue")
    if not cot.empty:
        c = cot.iloc[0]
        ax.axhline(100 * c["accuracy"], color="tab:blue", linestyle="--", linewidth=1, label="CoT accuracy")
        ax.axhspan(100 * c["acc_lo"], 100 * c["acc_hi"], color="tab:blue", alpha=0.08)
    answer_only = v[v["variant"] == "answer-only"]
    if not answer_only.empty:
        ax.axhline(100 * answer_only["accuracy"].iloc[0], color="tab:blue", linestyle=":", linewidth=1,
                   label="answer-only accuracy")
    ax2 = ax.twinx()
    ax2.errorbar(points["rate"], points["tokens"], yerr=[(points["tokens"] - points["tok_lo"]).clip(lower=0),
                                                         (points["tok_hi"] - points["tokens"]).clip(lower=0)],
                 color="tab:red", marker="s", capsize=3, label="generated tokens")
    if not cot.empty:
        ax2.axhline(cot["tokens"].iloc[0], color="tab:red", linestyle="--", linewidth=1, label="CoT tokens")
    ax2.set_ylabel("Generated tokens per problem", color="tab:red")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper center", bbox_to_anchor=(0.5, -0.14),
              ncol=3, fontsize=7, frameon=False)
    ax.set_title("Accuracy and tokens vs latent compression rate")
    data = result.config.get("data", "walk")
    caption(fig, f"{result.models[0]} on the {data} task: latent compression of reasoning chains "
                 f"({len(_correct(result, 'cot'))} test problems)")
    return finish(fig)


def _correct(result, variant: str, column: str = "correct") -> np.ndarray:
    """0/1 per test problem, in test order (the same problems for every variant: paired)."""
    rows = result.table("problem")
    return rows[rows["variant"] == variant].sort_values("idx")[column].to_numpy(dtype=float)


def compare(latent: np.ndarray, cot: np.ndarray, seed: int = 0) -> dict:
    """Paired latent − CoT accuracy: estimate, 95% interval, one-sided 95% lower bound, the minimum
    detectable difference (one-sided 5%, 80% power) and the test size one point would need."""
    d = latent - cot
    two = bootstrap(d, seed=seed)
    one = bootstrap(d, confidence=0.90, seed=seed)
    n = len(d)
    se = float(np.std(d, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    mde = (Z_ONE_SIDED + Z_POWER) * se
    need = int(np.ceil(n * (mde / POINT) ** 2)) if np.isfinite(mde) and mde > 0 else n
    return {"estimate": two.estimate, "low": two.low, "high": two.high, "one_sided_low": one.low, "mde": mde,
            "n": n, "n_for_one_point": need}


def verdict(result) -> Verdict:
    claim = ("Token count falls steadily as r rises, while accuracy stays at or above CoT's, within about one "
             "point.")
    v = _variants(result)
    cot = v[v["variant"] == "cot"]
    rates = _rates(result)
    if cot.empty or rates.empty:
        return Verdict(status="inconclusive", claim=claim, summary="the table has no CoT or latent rows")
    c = cot.iloc[0]
    diffs = {int(r["rate"]): compare(_correct(result, r["variant"]), _correct(result, "cot"))
             for _, r in rates.iterrows()}
    top = rates.iloc[-1]
    fewer = float(top["tok_hi"]) < float(c["tok_lo"])  # the highest rate uses clearly fewer tokens than CoT
    seq = [float(c["tokens"])] + [float(t) for t in rates["tokens"]]
    steady = all(b <= a + 0.5 for a, b in zip(seq, seq[1:]))  # never rises by more than half a token
    idle = [int(r["rate"]) for _, r in rates.iterrows() if float(r["latents"]) < MIN_LATENTS]
    worse = [r for r, d in diffs.items() if d["high"] < -POINT]
    holds = [r for r, d in diffs.items() if d["one_sided_low"] >= -POINT]
    reduction = 1 - float(top["tokens"]) / float(c["tokens"])
    parts = []
    for _, r in rates.iterrows():
        d = diffs[int(r["rate"])]
        forced = r.get("forced_accuracy", np.nan)
        parts.append(f"r={int(r['rate'])}: {100 * r['accuracy']:.1f}%, {r['tokens']:.1f} tokens, "
                     f"{r['latents']:.2f} latents/problem, vs CoT {100 * d['estimate']:+.1f} pp "
                     f"[{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"
                     + (f", true codes forced {100 * forced:.1f}%" if pd.notna(forced) else ""))
    text = (f"CoT: accuracy {100 * c['accuracy']:.1f}% [{100 * c['acc_lo']:.1f}, {100 * c['acc_hi']:.1f}], "
            f"{c['tokens']:.1f} tokens. " + "; ".join(parts)
            + f". Tokens at r={int(top['rate'])}: {100 * reduction:.0f}% fewer than CoT.")
    if idle:
        status = "inconclusive"
        text += (f" The method was not exercised at r={', '.join(map(str, idle))}: fewer than {MIN_LATENTS} latent "
                 "tokens per problem.")
    elif worse and any(still_learning(r) for _, r in rates.iterrows() if int(r["rate"]) in worse):
        status = "inconclusive"
        learning = {int(r["rate"]): still_learning(r) for _, r in rates.iterrows() if int(r["rate"]) in worse}
        text += (" Accuracy is below CoT's, but the fine-tuning had not converged: its training loss still fell "
                 "over the last quarter of steps (" + "; ".join(f"r={k}: {v[0]:.3f} → {v[1]:.3f} nats/token"
                                                              for k, v in learning.items() if v)
                 + "). It needs more fine-tuning steps (--finetune-steps) before it can say 'not reproduced'.")
    elif worse or not fewer:
        status = "not reproduced"
        if worse:
            text += f" Accuracy is clearly below CoT's (interval below −1 point) at r={', '.join(map(str, worse))}."
        if not fewer:
            text += " The top rate does not use clearly fewer tokens than CoT."
    elif steady and len(holds) == len(diffs):
        status = "reproduced"
    else:
        status = "inconclusive"
        open_rates = [r for r in diffs if r not in holds]
        if open_rates:
            text += (" Not decided within one point at r=" + ", ".join(map(str, open_rates)) + ": minimum detectable "
                     "difference " + ", ".join(f"{100 * diffs[r]['mde']:.1f} pp" for r in open_rates)
                     + f" at n = {diffs[open_rates[0]]['n']} (one-sided 5%, 80% power); one point needs about "
                     + ", ".join(f"{diffs[r]['n_for_one_point']}" for r in open_rates) + " test problems: a rerun with "
                     f"--n-test {max(diffs[r]['n_for_one_point'] for r in open_rates)} (only the evaluation grows; "
                     f"this whole run took {duration(getattr(result, 'seconds', 0.0))} on this machine).")
        if not steady:
            text += " Tokens do not fall steadily with r."
    evidence = {"token_reduction_at_max_rate": reduction, "tokens_fall": fewer, "tokens_steady": steady,
                "rates_not_exercised": idle, "rates_clearly_worse": worse, "rates_within_one_point": holds,
                "rates_still_learning": [int(r["rate"]) for _, r in rates.iterrows() if still_learning(r)],
                "accuracy_diff_vs_cot": {r: [d["estimate"], d["low"], d["high"]] for r, d in diffs.items()},
                "one_sided_lower_bound": {r: d["one_sided_low"] for r, d in diffs.items()},
                "min_detectable_difference": {r: d["mde"] for r, d in diffs.items()}}
    return Verdict(status=status, claim=claim, summary=text, evidence=evidence)


def _pct(x) -> str:
    return "" if x is None or pd.isna(x) else f"{100 * float(x):.1f}%"


def summary(result) -> pd.DataFrame:
    v = _variants(result)
    rows = []
    for _, r in v.iterrows():
        row = {"variant": r["variant"], "rate": r["rate"],
               "accuracy": f"{100 * r['accuracy']:.1f}% [{100 * r['acc_lo']:.1f}, {100 * r['acc_hi']:.1f}]",
               "tokens": f"{r['tokens']:.1f} [{r['tok_lo']:.1f}, {r['tok_hi']:.1f}]",
               "latents": round(float(r["latents"]), 2), "ms/problem": round(1000 * r["seconds_per_problem"], 1)}
        if str(r["variant"]).startswith("r"):
            row.update({"used latents": _pct(r.get("used_latents")),
                        "acc with / without latents": f"{_pct(r.get('acc_with_latents')) or '-'} / "
                                                      f"{_pct(r.get('acc_without_latents')) or '-'}",
                        "acc, true codes forced": _pct(r.get("forced_accuracy")),
                        "VQ rec computed / copied": f"{_pct(r.get('vq_dev_computed_acc')) or '-'} / "
                                                   f"{_pct(r.get('vq_dev_copied_acc')) or '-'}",
                        "train m share": _pct(r.get("train_m_share")),
                        "codes used": r.get("codebook_used")})
        rows.append(row)
    return pd.DataFrame(rows)
