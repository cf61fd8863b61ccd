"""S3 figure, verdict and the report's key rows, read from the result's tables alone.

The verdict knows its power: a gain is "yes" when its paired 95% interval lies above 0, "no" only when
the interval's upper end is below +1 pp (the run could have seen a gain of 1 pp and did not), and
otherwise "unclear", with the run's minimum detectable effect (80% power, two-sided 5%) printed: at
n = 100 paired problems it is several points, so a small run without a gain is inconclusive, not a
failure to reproduce.

The attention claims. The paper's figure shows one first-layer head's average attention on each original token
(the mean over later queries) lowered by the insertion, and its account of the drop is the share of each query's
attention the inserted tokens take (the scale lambda in its affine form of the attention output). Read as the raw
peak over the original tokens, the claim holds whenever the filler gets any attention at all: a softmax gives every
key some. So each query's attention is renormalised over the original keys before the average, and the mass the
filler takes cannot by itself lower the peak. In the first layer nothing else is left: the scores between original
tokens are computed from their embeddings and positions alone, so the renormalised profile with the filler is the
profile with the filler masked from every query (the placebo) to the float, and it differs from the plain prompt's
only by the positions the insertion shifts. A claim that reads the same on the treatment and on its placebo cannot
tell the filler from its absence: both peak claims are reported, never decisive (the accuracy claims decide). Read
as the paper reads it (the drop is the share the inserted tokens take) the claim holds by construction; read as a
change in the shape of the attention over the original tokens, which the paper does not claim, in the first layer it
is only the shift of positions. Neither reading can decide, and the paper's own account is why. (A deeper
`--profile-layer` also carries what the filler did to the original tokens below it, still mixed with the shift of
positions; the claims stay reported there too.)
The head: `--head`, or the head whose renormalised aligned profile changes most between None and Mless, summed over
the even-numbered profiled problems; the claims are then read on the odd-numbered ones only (a head chosen for its
change on the problems it is judged on is selected, not measured). The choice and the split are in the verdict's
evidence (`profile_head`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmlab.claims import Z_80, Claim, Declared, Gate, declared, evidence, judge
from lmlab.render.summary import judgement_part, part_text
from lmlab.resampling import Resampler
from lmlab.stats import bootstrap, duration, wilson
from lmlab.studies.figures import canvas, caption, finish
from lmlab.studies.verdict import Verdict

CLAIM = ("Mless and Mful both raise accuracy over w/o; inserted tokens attenuate peak attention on the original "
         "tokens; ARM recovers a gain without inserting tokens")
CONDITIONS = ("w/o", "Mless", "Mful", "ARM")
LABELS = {"w/o": "w/o", "Mless": "w/ Mless", "Mful": "w/ Mful", "ARM": "ARM (no insertion)"}


NO_GAIN = 0.01  # "no gain": the upper 95% bound of the paired gain is below +1 pp
PAPER_GAIN = 0.02  # the paper's gains on MATH-500: +1 to +4 points, about +2 typically
PAPER_ACCURACY = ("the paper's MATH-500 accuracy table: inserting 55 meaningless tokens (or meaningful ones) raises "
                  "accuracy by about +1 to +4 points (Qwen2.5-Math-1.5B about 64% -> 66%)")
OURS_GAIN = ("ours: 'yes' needs a gain of at least +1 point with its interval above 0, 'no' an interval below +1 "
             "point: the paper's smallest gain, so a 'no' excludes every gain it reports")
PEAK_REPORTED = ("reported only: the raw peak falls whenever the filler gets any attention (a softmax gives every "
                 "key some), so it is read renormalised over the original tokens; in the first layer that profile is "
                 "the placebo's (filler masked) to the float, so the claim cannot tell the filler from its absence")
CLAIMS = [
    Declared("Mless - w/o accuracy", "paired per problem: correct with 55 ' /' inserted minus without", ">=",
             NO_GAIN, "paper", PAPER_ACCURACY, null=0.0, unit=" pp", scale=100, bar_note=OURS_GAIN),
    Declared("Mful - w/o accuracy", "paired per problem: correct with 55 ' he' inserted minus without", ">=",
             NO_GAIN, "paper", PAPER_ACCURACY, null=0.0, unit=" pp", scale=100, bar_note=OURS_GAIN),
    Declared("ARM - w/o accuracy", "paired per problem: correct with the Activation Redistribution Module in the "
             "first layer's MLP (no insertion) minus without", ">=", NO_GAIN, "paper",
             "the paper's ARM results: redistributing the first layer's near-zero MLP activations recovers a gain "
             "without inserting tokens", null=0.0, unit=" pp", scale=100, bar_note=OURS_GAIN),
    Declared("Mless - None peak attention", "per profiled problem of the judging half, the peak over the original "
             "tokens (sink excluded) of the head's average attention from later queries, each query's attention "
             "renormalised over the original tokens, with 55 ' /' inserted minus without; the head chosen on the "
             "other half", "<=", 0.0, "paper",
             "the paper's attention figure (average attention on one head of the first layer): inserted tokens "
             "attenuate the peaks on the original tokens, by the share of attention they take (its scale lambda)",
             null=0.0, decisive=False, bar_note=PEAK_REPORTED),
    Declared("Mful - None peak attention", "as above, with 55 ' he' inserted", "<=", 0.0, "paper",
             "the paper's attention figure, as above", null=0.0, decisive=False, bar_note=PEAK_REPORTED),
]

COLUMNS = {
    "answer": ("split", "condition", "sweep", "id", "sample", "level", "correct", "pred", "scored_by", "gold",
               "new_tokens", "hit_budget"),
    "tuning": ("c", "p1", "dev_accuracy", "chosen"),
    "mlp": ("condition", "problem", "near_zero_share", "mean_abs"),
    "pace": ("seconds_per_answer", "max_new_tokens", "tokens"),
    "profile": ("view", "condition", "problem", "position", "head", "layer", "attention", "renormalised"),
}
CAPABLE = 0.20  # the w/o accuracy below which the model cannot show the paper's gain (a gate of ours)
PAPER_RANGE = "1.5B-8B math and instruct models (Qwen2.5-Math-1.5B to Llama-3.1-8B) on MATH-500, up to 2,048 new tokens"


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


def profile_head(result) -> dict:
    """The profiled head and the problems its claims are read on: `--head` (read on every profiled problem), or
    the head whose renormalised aligned profile changes most between None and Mless (the sum over problems and
    positions of |Mless - None|) on the even-numbered profiled problems, read on the odd-numbered ones."""
    prof = result.table("profile")
    fixed = result.config.head
    if not len(prof):
        return dict(head=int(fixed or 0), rule="no profile recorded", chosen_on=[], judged_on=[])
    problems = sorted(int(p) for p in prof.problem.unique())
    if fixed is not None:
        return dict(head=int(fixed), rule="--head", chosen_on=[], judged_on=problems)
    choose, judge = problems[0::2], problems[1::2]
    part = prof[(prof.view == "aligned") & prof.problem.isin(choose) & prof.condition.isin(["None", "Mless"])]
    value = "renormalised" if "renormalised" in part.columns else "attention"
    wide = part.pivot_table(index=["problem", "head", "position"], columns="condition", values=value)
    change = (wide["Mless"] - wide["None"]).abs().groupby(level="head").sum() if len(wide) else pd.Series(dtype=float)
    head = int(change.idxmax()) if len(change) and change.notna().any() else int(prof["head"].min())
    return dict(head=head, rule="the most change between None and Mless (renormalised profile) on the even-numbered "
                               "profiled problems, judged on the odd-numbered ones",
                chosen_on=choose, judged_on=judge, change={int(h): float(v) for h, v in change.items()})


def _peaks(result, choice: dict | None = None) -> pd.DataFrame:
    """Per judged problem (rows) and condition (columns): the chosen head's peak over the original tokens of its
    aligned profile renormalised over the original keys (NaN in a table recorded before that column existed)."""
    choice = choice or profile_head(result)
    prof = result.table("profile")
    if not len(prof):
        return pd.DataFrame(columns=["None", "Mless", "Mful"], dtype=float)
    prof = prof[(prof.view == "aligned") & (prof["head"] == choice["head"]) & prof.problem.isin(choice["judged_on"])]
    value = prof["renormalised"] if "renormalised" in prof.columns else pd.Series(np.nan, index=prof.index)
    return value.groupby([prof.condition, prof.problem]).max().unstack(0).reindex(columns=["None", "Mless", "Mful"])


ASSUMED_DISCORDANCE = 0.15  # share of problems two conditions disagree on, for pricing a run not made (the 20-
# problem demo that generated answers: MDEs of 19-25 points at n = 20, a paired sd of about 0.39)


def _gain_claim(test: pd.DataFrame, cond: str) -> Claim:
    """'cond raises accuracy over w/o': the paired gain per problem (a mean over sampled runs, if several); "yes"
    needs a gain of at least a point with the interval above 0, "no" an interval below +1 point. Few disagreeing
    pairs make a bootstrap interval collapse to a point, so its standard error is held at least at a rule-of-three
    bound on the disagreeing share (no disagreement among n problems leaves a gain of about 3/n possible)."""
    diffs = _paired(test, cond)
    n = len(diffs)
    claim = declared(CLAIMS, f"{cond} - w/o accuracy").measure(Resampler(n, 1).mean_claim, diffs[None, :], unit=" pp",
                                                               scale=100, n_unit="test problems", effect=PAPER_GAIN)
    disagree = max(float(np.mean(diffs != 0)) if n else 0.0, 3.0 / max(n, 1))
    claim.se = max(claim.se if np.isfinite(claim.se) else 0.0, float(np.sqrt(disagree / max(n, 1))))
    claim.se_item = claim.se
    return claim


def claims_and_gates(result):
    answers = result.table("answer")
    meta = result.info
    claims = []
    if len(answers):
        test = answers[(answers.split == "test") & (answers.sweep.fillna("") == "")]
        claims += [_gain_claim(test, cond) for cond in ("Mless", "Mful", "ARM")]
    peaks = _peaks(result)
    sampler = Resampler(len(peaks), 1)
    for cond in ("Mless", "Mful"):
        spec = declared(CLAIMS, f"{cond} - None peak attention")
        claim = spec.measure(sampler.mean_claim, (peaks[cond] - peaks["None"]).to_numpy()[None, :],
                             n_unit="judged profiled problems")
        if not len(peaks):  # no problem left to judge (a single profiled problem chose the head)
            claim.estimate, claim.reason = float("nan"), "no profiled problem left to judge the head on"
        claims.append(claim)
    gates = []
    if len(answers):
        base = test[test.condition == "w/o"]
        acc = float(base.correct.mean()) if len(base) else float("nan")
        gates.append(Gate("the model can do the task", np.isfinite(acc) and acc >= CAPABLE, blocks="no",
                          why=f"w/o accuracy {100 * acc:.1f}% (needs {100 * CAPABLE:.0f}%: the paper's models answer "
                              "about 40-80% of MATH-500, where a gain of a few points can show)",
                          remedy="a model that answers more of these problems, or easier ones: below this the "
                                 "run cannot say the paper's gain is absent"))
    if not len(answers):
        pace = result.table("pace")
        per = float(pace.seconds_per_answer.iloc[0]) if len(pace) else float("nan")
        batch = int(pace.batch.iloc[0]) if len(pace) and "batch" in pace and pd.notna(pace.batch.iloc[0]) else 0
        sd = np.sqrt(ASSUMED_DISCORDANCE)
        needed = int(np.ceil((Z_80 * sd / PAPER_GAIN) ** 2))
        cost = needed * 4 * per  # w/o, Mless, Mful and ARM on every problem
        gates.append(Gate("every paper claim measured", False, blocks="all",
                          why="the accuracy gains are not generated in this profile",
                          remedy=f"the paper's +{100 * PAPER_GAIN:.0f}-point gain at 80% power needs about {needed:,} "
                                 f"paired problems (if {100 * ASSUMED_DISCORDANCE:.0f}% of pairs disagree), about "
                                 f"{duration(cost)} here at {per:.2f} s an answer of "
                                 f"{int(meta.get('max_new_tokens', 0) or 0)} tokens"
                                 + (f" in batches of {batch}" if batch else "") + " (--accuracy true)"))
    return claims, gates


def verdict(result) -> Verdict:
    claims, gates = claims_and_gates(result)
    judgement = judge(claims, gates, seconds=float(getattr(result, "seconds", 0.0) or 0.0))
    meta = result.info
    answers = result.table("answer")
    scope = scope_part(result)
    evidence_ = {**evidence(claims, gates, scope=part_text(scope), judgement=judgement), "counts": meta}
    mlp = result.table("mlp")
    evidence_["near_zero_mlp_share"] = {c: float(mlp[mlp.condition == c].near_zero_share.mean())
                                        for c in ("None", "Mless", "Mful")} if len(mlp) else {}
    evidence_["profile_head"] = profile_head(result)
    parts = []
    if len(answers):
        test = answers[(answers.split == "test") & (answers.sweep.fillna("") == "")]
        acc = {c: accuracy(test[test.condition == c]) for c in CONDITIONS}
        evidence_["accuracy"] = {c: iv.as_dict() for c, iv in acc.items()}
        evidence_["hit_budget"] = {c: float(test[test.condition == c].hit_budget.mean()) for c in CONDITIONS}
        parts.append({"kind": "filler_accuracy", "accuracy": [[LABELS[c], float(acc[c].estimate)] for c in CONDITIONS],
                      "problems": int(test.id.nunique()), "scoring": str(meta.get("scoring")),
                      "hit_budget": [[c, evidence_["hit_budget"][c]] for c in CONDITIONS]})
        evidence_["caveat"] = (f"greedy decoding with a budget of {meta.get('max_new_tokens')} new tokens; shorter "
                               "answers can score better under a budget (hit_budget)")
    return Verdict(status=judgement.status, claim=CLAIM, parts=parts + [judgement_part(judgement), scope],
                   evidence=evidence_)


def scope_part(result) -> dict:
    """Where this run stands against the paper's tested range: model, data, generation budget."""
    config, meta = result.config, result.info
    bench = config.benchmark
    data = {"arithmetic": "generated arithmetic", "gsm8k": "GSM8K", "math500": "MATH-500"}.get(bench, bench)
    budget = meta.get("max_new_tokens") or config.max_new_tokens
    return {"kind": "filler_scope", "model": result.models[0] if result.models else "the model", "data": data,
            "budget": int(budget) if budget else None,
            "outside": bool(bench != "math500" or (budget and int(budget) < 2048)), "paper": PAPER_RANGE}


def _not_generated(ax, title: str, result) -> None:
    pace = result.table("pace")
    per = f" ({float(pace.seconds_per_answer.iloc[0]):.1f} s an answer here)" if len(pace) else ""
    ax.text(0.5, 0.5, f"not generated in this profile{per}:\nthe gains are priced in the verdict\n(--accuracy true)",
            ha="center", va="center", transform=ax.transAxes, fontsize=9)
    ax.set_title(title)
    ax.set_xticks([])
    ax.set_yticks([])


def figure(result, fig=None):
    meta = result.info
    answers = result.table("answer")
    fig, axes = canvas(fig, (12, 8), 2, 2)
    colors = {"w/o": "#6a3d9a", "Mless": "#1b9e77", "Mful": "#a6cee3", "ARM": "#fdbf6f"}
    _profile_panels(result, axes)
    if not len(answers):
        _not_generated(axes[0, 0], f"Results on {meta.get('benchmark', 'generated arithmetic')}", result)
        _not_generated(axes[1, 1], "Length and position sweeps", result)
        caption(fig, f"{result.models[0]}: filler tokens inserted into {meta.get('benchmark', 'arithmetic')} prompts "
                     "(attention profile and mechanism check; answers not generated)")
        return finish(fig)
    test = answers[(answers.split == "test") & (answers.sweep.fillna("") == "")]
    ax = axes[0, 0]
    for i, cond in enumerate(CONDITIONS):
        part = test[test.condition == cond]
        iv = accuracy(part)
        ax.bar(i, 100 * iv.estimate, color=colors[cond], label=LABELS[cond],
               yerr=[[100 * (iv.estimate - iv.low)], [100 * (iv.high - iv.estimate)]], capsize=4)
    ax.set_xticks([1.5], [result.models[0]])
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Results on {meta.get('benchmark', 'generated arithmetic')} ({test.id.nunique()} problems)")
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


def _profile_panels(result, axes) -> None:
    """The chosen head's average attention (as read, the paper's figure) over every profiled problem."""
    prof = result.table("profile")
    head = profile_head(result)["head"]
    prof = prof[prof["head"] == head] if len(prof) else prof
    for ax, view, conds in ((axes[0, 1], "aligned", ("None", "Mless", "Mful")), (axes[1, 0], "long", ("Mless", "Mful"))):
        for cond in conds:
            part = prof[(prof.view == view) & (prof.condition == cond)].groupby("position").attention.mean()
            ax.plot(part.index, part.values, label=cond, lw=1.2)
            ax.fill_between(part.index, 0, part.values, alpha=0.15)
        ax.set_title(f"Average attention on head {head} (layer {int(prof.layer.iloc[0]) if len(prof) else 0}, "
                     f"{'inserted tokens removed' if view == 'aligned' else 'all positions'})")
        ax.set_xlabel("token position")
        ax.legend(fontsize=8)


def report_rows(result) -> pd.DataFrame:
    """Accuracy per condition (test split), for the report (the renormalised peak attention when no answers were
    made)."""
    a = result.table("answer")
    if not len(a):
        peaks = _peaks(result)
        return pd.DataFrame([{"condition": c, "mean peak attention (renormalised)": round(float(peaks[c].mean()), 4)}
                             for c in ("None", "Mless", "Mful") if c in peaks])
    a = a[(a.split == "test") & (a.sweep.fillna("") == "")]
    out = a.groupby("condition").agg(problems=("correct", "size"), accuracy=("correct", "mean"),
                                     hit_budget=("hit_budget", "mean")).reset_index()
    out["accuracy"] = (100 * out.accuracy).round(1)
    return out
