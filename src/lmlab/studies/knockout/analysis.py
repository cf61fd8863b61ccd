"""S1 figure, verdict and the report's key rows, read from the result's tables alone.

The claims, whose they are, and why (CLAIMS below is the one list the verdict, the report and verdict.json read).
Every split and interval is made here, from the recorded flips and scores, so `lmlab verdict RUN` re-judges a run
from its tables.

The Q/A split is per probe layer: at layer k, a sample is Q-Anchored when knocking E_Q out in layers 0..k flips that
layer's probe (each condition's own rows are split by their own flips for the figure). A flipped sample has
ΔP < 50 - 100 p_clean <= 0 and an unflipped one ΔP >= -50, so "Q-Anchored below A-Anchored" holds by construction
once anything flips: it is drawn and reported, and decides nothing. What can fail, and decides, is what the paper
sets against its own controls, each a direction (the paper gives no size, so each bar is "the interval excludes 0"):

- knocking E_Q out moves and flips the probe more than knocking out exactly as many random question tokens outside
  E_Q (the paper: random tokens have no significant effect), over all samples rather than within the split groups.
  A question whose tokens outside E_Q are fewer than E_Q's has no control of E_Q's size: it is left out of these two
  claims, and a gate names such questions (a smaller control would knock out less and flatter E_Q);
- token patching (the subject swapped for another question's) flips more than patching as many random question
  tokens, per question;
- that excess is larger for the Q-Anchored samples than for the A-Anchored ones. The paper's token-patching figure
  has four bars per dataset: Q- and A-Anchored samples, each under exact-question and random-token patching. The
  plain Q - A of E_Q patching's flip rate (the first two bars' gap, reported) cannot decide here: the split is the E_Q
  knockout's flip of the same best-layer probe, and any intervention flips a probe that sits near its margin, so
  the Q-Anchored group (the knockout's flips) is the near-margin group and flips more under any patch at all. The
  decisive reading is the difference of differences, Q minus A of (E_Q patching's flip - random patching's flip) on
  the same question: under the pipeline's own null (the placebo, both patches random) the two arms are
  exchangeable on every question, so it centres on 0 whatever the split selects.

  What it does not rule out: a subject swap that is only a larger perturbation than the random patch flips
  near-margin probes more than the random patch does, so its excess also gathers in the near-margin (Q) group. A
  claim of ours, decisive beside it, takes the same difference within strata of the best-layer probe's clean
  margin (Q- and A-Anchored questions of like margin), so "reproduced" holds only where the excess survives at
  like margins. Being ours, it can hold the verdict at inconclusive and never make it "not reproduced". On the
  embedded SmolLM2 with the mixed fact set both read alike (+50.1 and +50.6 points at 420 questions, 8 replicates).

The paper's figure puts the A-Anchored lines' level nowhere in a number we could cite, so that level is reported,
not claimed. The patching claims follow the paper's figure (each group under both kinds of patching), not a reading
that sets the groups' flip rates under exact-question patching against each other alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from lmlab.claims import Declared, Gate, declared, evidence, judge, replicates_gate
from lmlab.render.summary import judgement_part, part_text
from lmlab.resampling import Resampler
from lmlab.stats import bootstrap, wilson
from lmlab.studies.figures import canvas, caption, finish
from lmlab.studies.verdict import Verdict
from lmlab.studies.knockout.config import MIN_GROUP

CLAIM = ("Knocking out the question's exact tokens (E_Q) moves and flips the truthfulness probe far more than "
         "knocking out random question tokens, and patching E_Q flips the probe more than patching random tokens, "
         "the more so for Q-Anchored samples than for A-Anchored ones; Q-Anchored ΔP falls below A-Anchored ΔP")
PAPER_KNOCKOUT = ("the paper's attention-knockout experiment: blocking attention from the exact question tokens "
                  "lowers the probe's probability sharply, and blocking random non-exact question tokens has no "
                  "significant effect (a direction; no size is given)")
PAPER_PATCHING = ("the paper's token-patching experiment (its figure: Q- and A-Anchored samples under exact-question "
                  "and random-token patching): replacing the exact question tokens flips the probe's prediction far "
                  "more often for Q-Anchored samples than for A-Anchored ones, and far more than replacing random "
                  "tokens (a direction; no size is given)")
FAR = -10.0  # the reported Q-A gap's bar: "far below" as 10 pp (ours; the gap decides nothing)
STRATA = 3  # strata of the clean probe margin the reported like-margin check compares within (terciles)
CLAIMS = [
    Declared("E_Q ΔP - control ΔP", "per question, mean over the middle-to-last layers of the E_Q knockout's ΔP "
             "minus the random-token control's (exactly as many tokens as E_Q); mean over the questions that have "
             "such a control", "<=", 0.0, "paper", PAPER_KNOCKOUT, null=0.0, unit=" pp"),
    Declared("E_Q flips - control flips", "per question, the share of middle-to-last layers whose probe the E_Q "
             "knockout flips minus the control's (exactly as many tokens as E_Q); mean over the questions that have "
             "such a control", ">=", 0.0, "paper", PAPER_KNOCKOUT, null=0.0, unit=" pts", scale=100),
    Declared("patching flips beyond random, Q - A", "per patched question, E_Q patching's flip of the best-layer "
             "probe minus random-token patching's; mean over the Q-Anchored questions minus mean over the A-Anchored "
             "ones (split by the E_Q knockout's flip of that probe)", ">=", 0.0, "paper", PAPER_PATCHING, null=0.0,
             unit=" pts", scale=100),
    Declared("patching flips, E_Q - random", "per question, E_Q patching's flip minus random-token patching's",
             ">=", 0.0, "paper", PAPER_PATCHING, null=0.0, unit=" pts", scale=100),
    Declared("patching flips, Q - A", "the best-layer probe's flip rate under E_Q patching, Q-Anchored minus "
             "A-Anchored samples (split at the best layer)", ">=", 0.0, "paper", PAPER_PATCHING, null=0.0,
             unit=" pts", scale=100, decisive=False,
             bar_note="reported only: the split is the E_Q knockout's flip of the same probe, and any patch flips "
                      "near-margin probes, so it holds with no anchoring at all (the placebo shows it); "
                      "'patching flips beyond random, Q - A' decides in its place"),
    Declared("patching beyond random, Q - A, like margins", "as 'patching flips beyond random, Q - A', within "
             f"{STRATA} strata of the best-layer probe's clean margin (quantiles over the patched questions), each "
             "weighted n_Q n_A / (n_Q + n_A)", ">=", 0.0, "lmlab",
             "a check of ours that a subject swap which is only a larger perturbation than the random patch (and "
             "so flips near-margin probes more) is not read as anchoring: Q- and A-Anchored questions compared at "
             "like clean margins; decisive as ours (it can hold the verdict at inconclusive, never make it 'not "
             "reproduced')", null=0.0, unit=" pts", scale=100),
    Declared("Q-A gap", "mean ΔP of the Q-Anchored minus the A-Anchored samples, per layer, mean over the "
             "middle-to-last layers", "<=", FAR, "lmlab",
             "the figure's Q-vs-A lines as a number; reported only: under the per-layer flip split it holds by "
             "construction once anything flips", null=0.0, unit=" pp", decisive=False),
    Declared("Q-A gap beyond the control's", "the Q-A gap minus the control's own gap (split by its own flips)",
             "<=", FAR, "lmlab", "a check of ours on the split; reported only: both gaps are "
             "built in by the split", null=0.0, unit=" pp", decisive=False),
]

# The tables the recipe hands to this analysis, and the columns each always carries (a test checks them on a run;
# a column renamed on one side fails there, not in a verdict; a column that may be empty throughout is left out).
# They hold measurements only: the Q/A split, the detection AUROCs and every interval are made here.
COLUMNS = {
    "probe_skipped": ("replicate", "probe_set", "correct_train", "incorrect_train", "needed"),
    "answer": ("id", "dataset", "subject", "popularity", "answer", "correct", "eq_tokens", "pool_tokens",
               "eq_source", "split"),
    "detection": ("replicate", "probe_set", "layer", "n_test", "method"),
    "detection_score": ("replicate", "probe_set", "layer", "method", "id", "correct", "score"),
    "knockout": ("id", "dataset", "replicate", "probe_set", "layer", "condition", "p_clean", "p_knock", "delta_p",
                 "rel_change", "y_hat", "flipped", "eq_tokens", "control_tokens"),
    "patching": ("id", "dataset", "replicate", "condition", "flipped"),
    "probe": ("replicate", "probe_set", "layer", "cv_auroc", "test_auroc", "best", "n_train", "n_test"),
}
N_BOOT = 2000
COLORS = ["tab:blue", "tab:orange", "tab:purple", "tab:green", "tab:red", "tab:brown"]


def figure(result, fig=None):
    ko = grouped(matched_control(result.table("knockout")))
    fig, (left, right) = canvas(fig, (12, 5), 1, 2)
    if ko.empty:
        left.text(0.5, 0.5, "no knockout results (see verdict)", ha="center", transform=left.transAxes)
        right.axis("off")
        return fig
    for color, (dataset, part) in zip(COLORS, ko.groupby("dataset", sort=True)):
        eq, ctrl = part[part.condition == "eq"], part[part.condition == "control"]
        for grp, style in (("Q", "-"), ("A", "--")):
            _line(left, eq[eq.group == grp], "delta_p", f"{grp}-Anchored ({dataset})", color, style)
        _line(right, eq, "flipped", f"E_Q knockout ({dataset})", color, "-", scale=100)
        if len(ctrl):
            _line(right, ctrl, "flipped", f"control ({dataset})", color, ":", scale=100)
    control = ko[ko.condition == "control"]
    if len(control):
        _line(left, control, "delta_p", "random tokens (control, all sets)", "grey", ":")
    left.axhline(0, color="black", lw=0.5)
    k = ko.replicate.nunique()
    left.set(xlabel="Layer (probe trained on; E_Q knocked out in layers 0..k)", ylabel="ΔP (pp)",
             title="ΔP, split per probe layer (Q- vs A-Anchored)" + (f"; thin: each of {k} replicates" if k > 1 else ""))
    right.set(xlabel="Layer", ylabel="probe predictions flipped (%)", title="flip rate: E_Q vs control", ylim=(0, 100))
    for ax in (left, right):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7, frameon=False)
    placebo = " (PLACEBO: E_Q replaced by random question tokens)" if result.config.placebo else ""
    caption(fig, f"{result.models[0]}: attention knockout of the question's key tokens{placebo}, "
                 f"{', '.join(sorted(ko.dataset.unique()))} ({ko.id.nunique()} answered questions with probes)")
    return finish(fig)


def _line(ax, rows, column, label, color, style, scale=1.0):
    """The mean over every replicate's rows per layer (bold, with a bootstrap band over the rows) and each
    replicate's own mean (thin)."""
    layers = sorted(rows.layer.unique())
    if not layers:
        return
    stats = [bootstrap(scale * rows[rows.layer == layer][column].to_numpy(dtype=float), n_resamples=500)
             for layer in layers]
    ax.plot(layers, [s.estimate for s in stats], style, color=color, label=label, lw=1.6)
    ax.fill_between(layers, [s.low for s in stats], [s.high for s in stats], color=color, alpha=0.12)
    if "replicate" in rows and rows.replicate.nunique() > 1:
        for _, part in rows.groupby("replicate"):
            per = part.groupby("layer")[column].mean().reindex(layers)
            ax.plot(layers, scale * per.to_numpy(dtype=float), style, color=color, lw=0.6, alpha=0.45)


def late_layers(layers: list[int], n_layers: int) -> list[int]:
    """The middle-to-last sweep layers."""
    late = [l for l in layers if l >= n_layers // 2]
    return late or [max(layers)]


def _matrix(rows: pd.DataFrame, ids: list[str], layers: list[int], column: str) -> np.ndarray:
    return rows.pivot_table(index="id", columns="layer", values=column).reindex(index=ids, columns=layers).to_numpy(float)


def _gap(dp: np.ndarray, flip: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Mean over layers of (mean ΔP of the flipped - of the others), samples weighted by each row of w (m, samples:
    a resample's counts) -> (m,); NaN where no layer has both groups."""
    ok = ~np.isnan(dp)
    q, a = ((flip == 1) & ok).astype(float), ((flip == 0) & ok).astype(float)
    x = np.nan_to_num(dp)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_layer = (w @ (q * x)) / (w @ q) - (w @ (a * x)) / (w @ a)  # (m, layers)
    finite = np.isfinite(per_layer)
    return np.where(finite.any(1), np.where(finite, per_layer, 0.0).sum(1) / np.maximum(finite.sum(1), 1), np.nan)


def _paired(d: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per question the mean over its layers of a paired difference d (questions, layers; NaN where a layer or the
    control is missing), then the mean over the questions weighted by each row of w (m, questions) -> (m,); a
    question with no value is left out, and a resample with none is NaN."""
    kept = ~np.isnan(d)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.where(kept.any(1), np.nansum(d, 1) / np.maximum(kept.sum(1), 1), np.nan)
        den = w @ (~np.isnan(diff)).astype(float)
        return np.where(den > 0, (w @ np.nan_to_num(diff)) / den, np.nan)


def best_layers(probes: pd.DataFrame) -> pd.DataFrame:
    """Each replicate's and probe set's best layer (chosen in the recipe by cross-validated AUROC on the training
    split): replicate, probe_set, best_layer."""
    if probes.empty or "best" not in probes:
        return pd.DataFrame(columns=["replicate", "probe_set", "best_layer"])
    probes = _replicate(probes)
    best = probes[probes.best == 1]
    return pd.DataFrame({"replicate": best.replicate.astype(int).to_numpy(), "probe_set": best.probe_set.to_numpy(),
                         "best_layer": best.layer.astype(int).to_numpy()})


def split_at_best(ko: pd.DataFrame, probes: pd.DataFrame) -> pd.DataFrame:
    """The pathway split token patching and detection read, made here from the recorded flips: per replicate and
    question, Q-Anchored when E_Q's knockout (in layers 0..best) flips its set's best-layer probe, else A-Anchored;
    with that probe's clean margin (its confidence in its own prediction, 0.5-1). Columns: replicate, id, group,
    margin."""
    cols = ["replicate", "id", "group", "margin"]
    if ko.empty:
        return pd.DataFrame(columns=cols)
    eq = _replicate(ko)
    eq = eq[eq.condition == "eq"]
    at = eq.merge(best_layers(probes), on=["replicate", "probe_set"])
    at = at[at.layer == at.best_layer].drop_duplicates(["replicate", "id"])
    return pd.DataFrame({"replicate": at.replicate.astype(int).to_numpy(), "id": at.id.to_numpy(),
                         "group": np.where(at.flipped.to_numpy() == 1, "Q", "A"),
                         "margin": at.p_clean.to_numpy(float)})


def grouped(ko: pd.DataFrame, probes: pd.DataFrame | None = None) -> pd.DataFrame:
    """The knockout rows with the figure's split: `group` (each row's own flip at its layer: Q or A) and `group_eq`
    (E_Q's flip at that layer), and with `probes`, `group_best` (E_Q's flip at its set's best layer)."""
    ko = _replicate(ko)
    if ko.empty:
        return ko
    ko = ko.drop(columns=[c for c in ("group", "group_eq", "group_best") if c in ko])
    ko = ko.assign(group=np.where(ko.flipped.to_numpy() == 1, "Q", "A"))
    eq = ko[ko.condition == "eq"][["replicate", "id", "layer", "group"]].drop_duplicates(["replicate", "id", "layer"])
    ko = ko.merge(eq.rename(columns={"group": "group_eq"}), on=["replicate", "id", "layer"], how="left")
    if probes is not None:
        at = split_at_best(ko, probes)[["replicate", "id", "group"]].rename(columns={"group": "group_best"})
        ko = ko.merge(at, on=["replicate", "id"], how="left")
    return ko


def matched_control(ko: pd.DataFrame) -> pd.DataFrame:
    """The knockout rows with every control row that knocks out other than exactly E_Q's number of tokens left out
    (the recipe draws none such; a run recorded before the counts were kept has nothing to check: a gate says so)."""
    if ko.empty or "control_tokens" not in ko:
        return ko
    return ko[(ko.condition != "control") | (ko.control_tokens == ko.eq_tokens)]


def control_gate(answers: pd.DataFrame, ko: pd.DataFrame, dataset: str, n_control: int, n_samples: int) -> Gate:
    """The E_Q-vs-control claims compare E_Q with exactly as many random question tokens outside E_Q. A question
    whose tokens outside E_Q are fewer than E_Q's has no such control and is left out of them (never a smaller
    control, which would knock out less and flatter E_Q); the gate names those questions, and fails where fewer than
    MIN_GROUP questions are left with a control, or where the run records no token counts to check (it was recorded
    before they were kept, when a control could be smaller than E_Q)."""
    name = f"{dataset}: random-token control drawn"
    remedy = ("questions with tokens outside their exact tokens (a subject/property span, or the extracted one); "
              "without a control nothing here can be told from chance")
    if "control_tokens" not in ko or "pool_tokens" not in answers:
        return Gate(name, False, why="this run records no token counts per row (it was recorded before they were "
                                     "kept), so a control smaller than E_Q cannot be told from one of its size",
                    remedy="run it again: every control is now exactly as many tokens as E_Q, and both counts are "
                           "recorded on every row")
    ans = answers[answers.dataset == dataset]
    rows = ko[(ko.dataset == dataset) & (ko.condition == "control")]
    left = sorted(set(ans[ans.pool_tokens < ans.eq_tokens].id) | set(rows[rows.control_tokens != rows.eq_tokens].id))
    shown = ", ".join(map(str, left[:5])) + (", ..." if len(left) > 5 else "")
    why = (f"{n_control} of {n_samples} questions have a control of E_Q's size (as many question tokens outside E_Q "
           f"as E_Q has; needs {MIN_GROUP})")
    if left:
        why += (f"; {len(left)} of the {len(ans)} answered have fewer tokens outside E_Q than E_Q has ({shown}) and "
                "are left out of the E_Q-vs-control claims")
    return Gate(name, n_control >= MIN_GROUP, why=why, remedy=remedy)


def _strata(margin: np.ndarray, ok: np.ndarray, k: int | None = None) -> np.ndarray:
    """Each question's stratum of the clean margin (`k` quantile bins, STRATA unless given, over the questions with
    a value, so each holds about as many), -1 where it has none."""
    k = STRATA if k is None else k
    out = np.full(len(margin), -1)
    if ok.any():
        edges = np.quantile(margin[ok], np.linspace(0, 1, k + 1))[1:-1]
        out[ok] = np.searchsorted(edges, margin[ok], side="right")
    return out


def _within_strata(d: np.ndarray, q: np.ndarray, a: np.ndarray, strata: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Q - A of the per-question values d within each stratum, weighted n_Q n_A / (n_Q + n_A) (the weight of a
    difference of two means), under each row of item weights w (m, items) -> (m,); NaN where no stratum holds both
    groups."""
    ok = np.isfinite(d)
    x = np.nan_to_num(d)
    num, den = np.zeros(len(w)), np.zeros(len(w))
    for s in range(int(strata.max()) + 1 if len(strata) else 0):
        inq = q * ok * (strata == s)
        ina = a * ok * (strata == s)
        nq, na = w @ inq, w @ ina
        both = (nq > 0) & (na > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            diff = (w @ (inq * x)) / nq - (w @ (ina * x)) / na
            h = np.where(both, nq * na / (nq + na), 0.0)
        num += np.where(both, h * diff, 0.0)
        den += h
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def patching_claims(patch: pd.DataFrame, split: pd.DataFrame, dataset: str, seed: int = 0, pool: int = 0):
    """The token-patching claims of one dataset, over the replicates (each its own best-layer probe, split and
    margins) and the patched questions: Q - A of (E_Q patching's flip - random patching's) (decisive), E_Q patching
    minus random-token patching (decisive), the plain Q - A of E_Q patching (reported) and the like-margin check
    (decisive, ours). A replicate whose split leaves a Q - A undefined is counted as failed for it (claims.py's rule).
    Returns (claims, (replicates whose questions patched both ways lack a Q- or an A-Anchored one, replicates)), or
    ([], None) when the set was not patched."""
    if patch.empty or "flipped" not in patch:
        return [], None
    patch = _replicate(patch[patch.dataset == dataset])
    if patch.empty:
        return [], None
    patch = patch.assign(condition=patch["condition"] if "condition" in patch else "eq")
    ids = sorted(patch[patch.condition == "eq"].id.unique())
    reps = sorted(int(r) for r in patch.replicate.unique())
    split = _replicate(split)
    sampler = Resampler(len(ids), len(reps), n_boot=N_BOOT, seed=seed + 7)
    per = [_patched_replicate(patch[patch.replicate == r], split[split.replicate == r], ids) for r in reps]
    thin = sum(int(not np.isfinite(_within_strata(x["d"], x["q"], x["a"], x["one"], np.ones((1, len(ids)))))[0])
               for x in per)

    def q_minus_a(i, w):
        f = np.nan_to_num(per[i]["flip"])
        q, a = per[i]["q"] * np.isfinite(per[i]["flip"]), per[i]["a"] * np.isfinite(per[i]["flip"])
        with np.errstate(invalid="ignore", divide="ignore"):
            return (w @ (q * f)) / (w @ q) - (w @ (a * f)) / (w @ a)

    common = dict(group=dataset, n_unit="patched questions", unit=" pts", scale=100, pool=pool)
    spec = lambda name: declared(CLAIMS, name)  # noqa: E731
    split_claims = dict(bounds=(-2.0, 2.0))  # Q - A of flip differences lies in [-2, 2]
    claims = [
        spec("patching flips beyond random, Q - A").measure(
            sampler.weighted_claim, lambda i, w: _within_strata(per[i]["d"], per[i]["q"], per[i]["a"], per[i]["one"], w),
            **split_claims, **common),
        spec("patching flips, E_Q - random").measure(
            sampler.weighted_claim, lambda i, w: _paired(per[i]["d"][:, None], w), **common),
        spec("patching flips, Q - A").measure(sampler.weighted_claim, q_minus_a, **common),
        spec("patching beyond random, Q - A, like margins").measure(
            sampler.weighted_claim,
            lambda i, w: _within_strata(per[i]["d"], per[i]["q"], per[i]["a"], per[i]["strata"], w),
            **split_claims, **common)]
    for c in claims:  # a replicate without both groups (in a stratum) has no Q - A: counted, at its worst
        if c.bounds is not None:
            c.failed = int(sum(not np.isfinite(x) for x in c.replicate_estimates))
    return claims, (thin, len(reps))


def _replicate(ko: pd.DataFrame) -> pd.DataFrame:
    return ko.assign(replicate=ko["replicate"] if "replicate" in ko else 0)


def set_claims(ko: pd.DataFrame, late: list[int], dataset: str, seed: int = 0, pool: int = 0):
    """One dataset's claims over the late layers, each over the replicates (probe splits and control draws) and
    the questions they share; and its counts."""
    ids, mats = _replicate_matrices(_replicate(ko), late)
    n = len(ids)
    sampler = Resampler(n, len(mats), n_boot=N_BOOT, seed=seed)

    # each statistic for all resamples at once: W (m, questions) holds each resample's counts of the questions
    def gap(i, w):
        return _gap(mats[i]["dp_e"], mats[i]["fl_e"], w)

    def control_gap(i, w):
        return _gap(mats[i]["dp_c"], mats[i]["fl_c"], w)

    def dp(i, w):  # per question: E_Q's ΔP - the control's, over its layers; mean over the questions
        return _paired(mats[i]["dp_e"] - mats[i]["dp_c"], w)

    def flips(i, w):
        return _paired(mats[i]["fl_e"] - mats[i]["fl_c"], w)

    common = dict(group=dataset, n_unit="questions", pool=pool)
    spec = lambda name: declared(CLAIMS, name)
    claims = [spec("E_Q ΔP - control ΔP").measure(sampler.weighted_claim, dp, unit=" pp", **common),
              spec("E_Q flips - control flips").measure(sampler.weighted_claim, flips, unit=" pts", scale=100, **common),
              spec("Q-A gap").measure(sampler.weighted_claim, gap, unit=" pp", **common)]
    counts = _set_counts(mats, n)
    if counts["control_q_mean_count"] >= MIN_GROUP:  # the control flips often enough to be split: its gap, beside
        claims.append(spec("Q-A gap beyond the control's").measure(
            sampler.weighted_claim, lambda i, w: gap(i, w) - control_gap(i, w), unit=" pp", **common))
    return claims, counts


def _replicate_matrices(ko: pd.DataFrame, late: list[int]) -> tuple[list, list[dict]]:
    """The questions (sorted ids) and, per replicate (sorted), E_Q's and the control's ΔP and flips as
    (layers, questions) matrices over the late layers."""
    ids = sorted(ko.id.unique())
    mats = []
    for r in sorted(int(r) for r in ko.replicate.unique()):
        part = ko[ko.replicate == r]
        eq, ctrl = part[part.condition == "eq"], part[part.condition == "control"]
        mats.append({name: _matrix(rows, ids, late, col) for name, rows, col in
                     (("dp_e", eq, "delta_p"), ("fl_e", eq, "flipped"), ("dp_c", ctrl, "delta_p"),
                      ("fl_c", ctrl, "flipped"))})
    return ids, mats


def _set_counts(mats: list[dict], n: int) -> dict:
    """One dataset's counts over its replicates: questions, mean Q- and A-Anchored counts over the layers (the
    control's Q count too), flip rates, and questions with a control."""
    n_q = np.mean([np.nansum(m["fl_e"], axis=0).mean() for m in mats])
    n_a = np.mean([(np.sum(~np.isnan(m["fl_e"]), axis=0) - np.nansum(m["fl_e"], axis=0)).mean() for m in mats])
    n_ctrl_q = np.mean([np.nansum(m["fl_c"], axis=0).mean() for m in mats])
    n_control = int(np.mean([np.isfinite(m["dp_c"]).any(1).sum() for m in mats]))
    return {"n_samples": n, "replicates": len(mats), "q_mean_count": float(n_q), "a_mean_count": float(n_a),
            "control_q_mean_count": float(n_ctrl_q),
            "eq_flip_rate": float(np.nanmean([np.nanmean(m["fl_e"]) for m in mats])),
            "control_flip_rate": float(np.nanmean([np.nanmean(m["fl_c"]) for m in mats]))
            if n_control else float("nan"), "n_control": n_control}


def verdict(result) -> Verdict:
    """Per dataset, the claims of CLAIMS over the middle-to-last sweep layers (patching at the best layer). A set
    with too few Q- or A-Anchored samples, no probes, too few questions with a control of E_Q's size, or patched
    questions that the split leaves on one side is a failed gate (no decision)."""
    meta = result.info
    ko_all = result.table("knockout")
    skipped = result.table("probe_skipped")
    if ko_all.empty:
        n_c, n_i = int(meta.get("correct", 0)), int(meta.get("incorrect", 0))
        return Verdict(status="inconclusive", claim=CLAIM, evidence={"counts": meta},
                       parts=[{"kind": "knockout_too_few", "correct": n_c, "incorrect": n_i}])
    layers = sorted(int(l) for l in ko_all.layer.unique())
    n_layers = int(meta.get("n_layers", max(layers) + 1))
    late = late_layers(layers, n_layers)
    seed = result.config.seed
    claims, gates, notes, sets = [], [], [], {}
    patch = result.table("patching")
    split = split_at_best(ko_all, result.table("probe"))
    ko = matched_control(ko_all)
    answers = result.table("answer")
    for dataset in sorted(ko.dataset.unique()):
        pool, patched_pool = pools(meta, answers, patch, dataset)
        set_c, counts = set_claims(ko[ko.dataset == dataset], late, dataset, seed, pool)
        sets[dataset] = counts
        patch_c, thin = patching_claims(patch, split, dataset, seed, patched_pool)
        claims += set_c + patch_c
        notes.append({"dataset": str(dataset), "eq_flip_rate": counts["eq_flip_rate"],
                      "control_flip_rate": counts["control_flip_rate"]})
        gates += set_gates(dataset, counts, thin, answers, ko_all)
    gates += _coverage_gates(answers, ko, result.table("probe"), skipped)
    k = _replicate(ko).replicate.nunique()
    gates.append(replicates_gate(k, trains=False))
    seconds = float(getattr(result, "seconds", 0.0) or 0.0)
    judgement = judge(claims, gates, seconds=seconds)
    scope = scope_part(result, meta)
    head = {"kind": "knockout_sets", "layers": [int(late[0]), int(late[-1])], "replicates": int(k), "sets": notes}
    detection = detection_table(result)
    ev = {**evidence(claims, gates, scope=part_text(scope), judgement=judgement), "layers_compared": late,
          "counts": meta, "datasets": sets}
    _add_side_evidence(result, ev, split, detection)
    return Verdict(status=judgement.status, claim=CLAIM, evidence=ev,
                   parts=[head, judgement_part(judgement), scope, *_untrained_mixtures(detection)])


def _coverage_gates(answers: pd.DataFrame, ko: pd.DataFrame, probe: pd.DataFrame,
                    skipped: pd.DataFrame) -> list[Gate]:
    """Failed gates for what a set could not read: a set with probes yet no question swept (never silently left
    out), and a probe set skipped for too few correct or incorrect training answers."""
    gates = []
    probe_sets = set(probe.probe_set) if len(probe) else set()
    for dataset in sorted(set(answers.dataset) - set(ko.dataset)) if len(answers) else ():
        if dataset in probe_sets or "pooled" in probe_sets:
            gates.append(Gate(f"{dataset}: knockout rows", False,
                              why="none of its questions was swept (the placebo sweeps a question only where it has "
                                  "as many question tokens outside E_Q as E_Q has, to draw E_Q's stand-in from)",
                              remedy="questions whose exact tokens are a smaller part of the question",
                              group=dataset))
    for row in skipped.drop_duplicates("probe_set").itertuples() if len(skipped) else ():
        gates.append(Gate(f"{row.probe_set}: probes", False, why=f"{int(row.correct_train)} correct / "
                          f"{int(row.incorrect_train)} incorrect training answers (need {int(row.needed)} of each)",
                          remedy="more questions, or an easier set",
                          group="" if row.probe_set == "pooled" else row.probe_set))
    return gates


def _patched_replicate(part: pd.DataFrame, sp: pd.DataFrame, ids: list) -> dict:
    """One replicate's patched questions, aligned on `ids`: E_Q's and random's flips, their difference, the Q and A
    groups of its split, one stratum for the decisive claim and the clean-margin strata for the like-margin one."""
    eq, rnd = (part[part.condition == c].drop_duplicates("id").set_index("id").flipped.reindex(ids)
               .to_numpy(float) for c in ("eq", "random"))
    sp = sp.drop_duplicates("id").set_index("id").reindex(ids)
    q, a = (sp.group == "Q").to_numpy(float), (sp.group == "A").to_numpy(float)
    d = eq - rnd
    margin = sp.margin.to_numpy(float)
    one = np.where(np.isfinite(d) & (q + a > 0), 0, -1)  # the decisive claim: every question in one stratum
    return dict(flip=eq, random=rnd, q=q, a=a, d=d, one=one,
                strata=_strata(margin, np.isfinite(d) & np.isfinite(margin) & (q + a > 0)))


SPLIT_CLAIMS = ("patching flips beyond random, Q - A", "patching flips, Q - A",
                "patching beyond random, Q - A, like margins")  # the claims that need patched questions in both groups
CONTROL_CLAIMS = ("E_Q ΔP - control ΔP", "E_Q flips - control flips")
GAP_CLAIMS = ("Q-A gap", "Q-A gap beyond the control's")


def pools(meta: dict, answers: pd.DataFrame, patch: pd.DataFrame, dataset: str) -> tuple[int, int]:
    """The most questions the dataset could give a run (the run's record, or a generated set's size), and the most
    patched questions at this run's share of patched to asked ones: what "what would decide" may ask for (0:
    not known)."""
    from lmlab.data.generated import geo_qa

    pool = int((meta.get("available") or {}).get(dataset) or (geo_qa.available(dataset) if dataset in geo_qa.SETS
                                                               else 0))
    asked = int((answers.dataset == dataset).sum()) if len(answers) else 0
    patched = patch[(patch.dataset == dataset)].id.nunique() if len(patch) and "id" in patch else 0
    return pool, int(pool * patched / asked) if asked else 0


def set_gates(dataset: str, counts: dict, thin, answers: pd.DataFrame, ko: pd.DataFrame) -> list[Gate]:
    """One dataset's gates, each scoped to the claims it is about: patched questions on both sides of the split (the
    Q - A patching claims; a replicate whose split leaves one side empty is counted at its worst, and the gate fails
    only where fewer than two replicates have both), a control of E_Q's size (the E_Q-vs-control claims), and enough
    Q- and A-Anchored samples per layer (the Q-A gaps)."""
    gates = []
    if thin is not None:
        have = thin[1] - thin[0]
        gates.append(Gate(f"{dataset}: patched Q- and A-Anchored samples", have >= 2,
                          why=(f"in {thin[0]} of {thin[1]} replicates the questions patched both ways hold no Q- "
                               "or no A-Anchored sample, so Q - A is undefined there: each is counted at the worst "
                               "case for the claim's answer") if thin[0] else
                              f"in each of the {thin[1]} replicates the questions patched both ways hold both "
                              "Q- and A-Anchored samples",
                          remedy="more questions (--per-dataset), so that each replicate's split puts patched "
                                 "questions on both sides", group=dataset, claims=SPLIT_CLAIMS))
    gate = control_gate(answers, ko, dataset, counts["n_control"], counts["n_samples"])
    gates.append(dataclasses.replace(gate, group=dataset, claims=CONTROL_CLAIMS))
    gates.append(Gate(f"{dataset}: Q- and A-Anchored samples", min(counts["q_mean_count"], counts["a_mean_count"])
                      >= MIN_GROUP, why=f"{counts['q_mean_count']:.1f} Q / {counts['a_mean_count']:.1f} A per layer "
                                       f"on average (needs {MIN_GROUP} each)",
                      remedy="more questions (--per-dataset)", group=dataset, claims=GAP_CLAIMS))
    return gates


def detection_table(result) -> pd.DataFrame:
    """The detection rows with each method's test AUROC and its interval, computed from the recorded scores."""
    det = result.table("detection")
    if det.empty:
        return det
    from lmlab.studies.knockout.probes import detection_summary  # scikit-learn loads only where a run has detection

    return detection_summary(det, result.table("detection_score"), result.config.seed)


PAPER_RANGE = "Llama-3.2-1B/3B and Llama-3-8B (1B-8B), PopQA, TriviaQA, HotpotQA and NQ"


def scope_part(result, meta: dict) -> dict:
    """Where this run stands against the paper's tested range: the model and the data."""
    sets = sorted(result.table("answer").dataset.unique()) if len(result.table("answer")) else []
    generated = all(s.startswith("geo-") for s in sets) if sets else False
    return {"kind": "knockout_scope", "model": result.models[0] if result.models else "the model",
            "sets": [str(s) for s in sets], "generated": bool(generated), "paper": PAPER_RANGE,
            "hybrid": meta.get("knockout_on_hybrid") or ""}


def _untrained_mixtures(det) -> list[dict]:
    """One clause per probe set whose mixture of probes was not trained: in how many replicates, and the first
    replicate's reason (each replicate's split gives its own counts, so the reasons differ only in them)."""
    if "note" not in det or not det.note.notna().any():
        return []
    det = det.assign(probe_set=det["probe_set"] if "probe_set" in det else "all",
                     replicate=det["replicate"] if "replicate" in det else 0)
    mix = det[det.method == "mixture of probes"]
    out = []
    for name, rows in mix.groupby("probe_set", sort=True):
        noted = rows[rows.note.notna()]
        if len(noted):
            out.append({"kind": "knockout_mixture", "probe_set": str(name), "note": str(noted.note.iloc[0]),
                        "replicate": int(noted.replicate.iloc[0]), "untrained": int(noted.replicate.nunique()),
                        "replicates": int(rows.replicate.nunique())})
    return out


def _add_side_evidence(result, evidence: dict, split: pd.DataFrame, detection: pd.DataFrame) -> None:
    probes = result.table("probe")
    if len(probes) and "best" in probes:
        evidence["probe_best"] = {f"{r.probe_set} replicate {int(getattr(r, 'replicate', 0))}":
                                  {"layer": int(r.layer), "test_auroc": r.test_auroc}
                                  for r in probes[probes.best == 1].itertuples()}
    patch = result.table("patching")
    if "flipped" in patch and len(split):
        patch = _replicate(patch).merge(split, on=["replicate", "id"])
        for grp in ("Q", "A"):
            for cond in ("eq", "random"):
                flips = patch[(patch.group == grp) & (patch.condition == cond)].flipped
                evidence[f"patching_flip_rate_{grp}" + ("" if cond == "eq" else "_random")] = \
                    wilson(int(flips.sum()), len(flips)).as_dict()
    for row in detection.itertuples():
        key = (f"detection_auroc_{getattr(row, 'probe_set', '')}_{row.method.replace(' ', '_')}"
               f"_replicate{int(getattr(row, 'replicate', 0))}")
        evidence[key] = {"auroc": getattr(row, "auroc", None), "low": getattr(row, "low", None),
                         "high": getattr(row, "high", None), "note": getattr(row, "note", None)}


def report_rows(result) -> pd.DataFrame:
    """Mean ΔP (pp) per set and per-layer group, and the flip rates (%), at the sweep layers, for the report."""
    ko = grouped(matched_control(result.table("knockout")))
    if ko.empty:
        return pd.DataFrame([result.info])
    eq = ko[ko.condition == "eq"]
    dp = eq.assign(line=eq.dataset + " ΔP " + eq.group).pivot_table(index="line", columns="layer", values="delta_p")
    flips = ko.assign(line=ko.dataset + " flips % " + ko.condition.replace({"eq": "E_Q"}))
    fr = 100 * flips.pivot_table(index="line", columns="layer", values="flipped")
    return pd.concat([dp, fr]).round(1).reset_index()
