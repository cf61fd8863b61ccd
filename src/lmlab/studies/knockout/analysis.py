"""S1 figure, verdict and the report's key rows, read from the result's tables alone.

The Q/A split is per probe layer (see recipe.py): at layer k, Q-Anchored = knocking E_Q out in layers
0..k flips that layer's probe. That makes the Q - A gap partly built in, so the verdict also needs the
E_Q knockout to flip the probes more often than the control knockout (as many random question tokens,
split the same way by its own flips), and, where the control flips often enough to be split, a larger
gap than the control's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmlab.claims import Bar, Gate, Resampler, evidence, judge, replicates_gate
from lmlab.stats import bootstrap, wilson
from lmlab.studies.base import Verdict, canvas, caption, finish
from lmlab.studies.knockout.config import MIN_GROUP

CLAIM = ("Q-Anchored ΔP falls far below A-Anchored ΔP in middle and late layers, on every dataset, and "
         "knocking out E_Q flips the probe far more often than knocking out random question tokens")
FAR = -10.0  # "far below": a Q - A gap of at least 10 pp whose 95% interval lies below 0
# DECISION: "flips far more often than the control" = E_Q's flip rate at least 10 points above the
# control's with the interval's low end above 0; "no" when the interval's high end is below 10 points.
FLIP_MARGIN = 0.10
N_BOOT = 2000
COLORS = ["tab:blue", "tab:orange", "tab:purple", "tab:green", "tab:red", "tab:brown"]


def figure(result, fig=None):
    ko = result.table("knockout")
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
    k = ko.replicate.nunique() if "replicate" in ko else 1
    left.set(xlabel="Layer (probe trained on; E_Q knocked out in layers 0..k)", ylabel="ΔP (pp)",
             title="ΔP, split per probe layer (Q- vs A-Anchored)" + (f"; thin: each of {k} replicates" if k > 1 else ""))
    right.set(xlabel="Layer", ylabel="probe predictions flipped (%)", title="flip rate: E_Q vs control", ylim=(0, 100))
    for ax in (left, right):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7, frameon=False)
    caption(fig, f"{result.models[0]}: attention knockout of the question's key tokens, "
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


def _replicate(ko: pd.DataFrame) -> pd.DataFrame:
    return ko.assign(replicate=ko["replicate"] if "replicate" in ko else 0)


def set_claims(ko: pd.DataFrame, late: list[int], dataset: str, seed: int = 0):
    """One dataset's claims over the late layers, each over the replicates (probe splits and control draws) and
    the questions they share; and its counts."""
    ko = _replicate(ko)
    ids = sorted(ko.id.unique())
    reps = sorted(int(r) for r in ko.replicate.unique())
    mats = []
    for r in reps:
        part = ko[ko.replicate == r]
        eq, ctrl = part[part.condition == "eq"], part[part.condition == "control"]
        mats.append({name: _matrix(rows, ids, late, col) for name, rows, col in
                     (("dp_e", eq, "delta_p"), ("fl_e", eq, "flipped"), ("dp_c", ctrl, "delta_p"),
                      ("fl_c", ctrl, "flipped"))})
    n = len(ids)
    sampler = Resampler(n, len(reps), n_boot=N_BOOT, seed=seed)

    # each statistic for all resamples at once: W (m, questions) holds each resample's counts of the questions
    def gap(i, w):
        return _gap(mats[i]["dp_e"], mats[i]["fl_e"], w)

    def control_gap(i, w):
        return _gap(mats[i]["dp_c"], mats[i]["fl_c"], w)

    def flips(i, w):
        d = mats[i]["fl_e"] - mats[i]["fl_c"]  # per question: E_Q flips - control flips, over its layers
        kept = ~np.isnan(d)
        with np.errstate(invalid="ignore", divide="ignore"):  # a question no layer kept is NaN and left out
            diff = np.where(kept.any(1), np.nansum(d, 1) / kept.sum(1), np.nan)
            den = w @ (~np.isnan(diff)).astype(float)
            return np.where(den > 0, (w @ np.nan_to_num(diff)) / den, np.nan)

    common = dict(group=dataset, n_unit="questions")
    claims = [sampler.weighted_claim("Q-A gap", gap, Bar("<=", FAR, null=0.0), unit=" pp", **common),
              sampler.weighted_claim("E_Q flips - control flips", flips, Bar(">=", FLIP_MARGIN, null=0.0),
                                     unit=" pts", scale=100, **common)]
    n_q = np.mean([np.nansum(m["fl_e"], axis=0).mean() for m in mats])
    n_a = np.mean([(np.sum(~np.isnan(m["fl_e"]), axis=0) - np.nansum(m["fl_e"], axis=0)).mean() for m in mats])
    n_ctrl_q = np.mean([np.nansum(m["fl_c"], axis=0).mean() for m in mats])
    if n_ctrl_q >= MIN_GROUP:  # the control flips often enough to be split: its gap must be smaller
        claims.append(sampler.weighted_claim("Q-A gap beyond the control's", lambda i, w: gap(i, w) - control_gap(i, w),
                                             Bar("<=", FAR, null=0.0), unit=" pp", **common))
    counts = {"n_samples": n, "replicates": len(reps), "q_mean_count": float(n_q), "a_mean_count": float(n_a),
              "control_q_mean_count": float(n_ctrl_q), "eq_flip_rate": float(np.nanmean([np.nanmean(m["fl_e"]) for m in mats])),
              "control_flip_rate": float(np.nanmean([np.nanmean(m["fl_c"]) for m in mats]))}
    return claims, counts


def verdict(result) -> Verdict:
    """Per dataset, over the middle-to-last sweep layers: the Q - A gap (per-layer split) at most -10 pp with its
    interval below 0, E_Q flipping the probes at least 10 points more often than the control with its interval
    above 0, and, where the control flips often enough to be split, a gap at least 10 pp beyond the control's.
    A set with too few Q- or A-Anchored samples, or no probes, is a failed gate (no decision)."""
    meta = result.info
    ko = result.table("knockout")
    skipped = result.table("probe_skipped")
    if ko.empty:
        n_c, n_i = int(meta.get("correct", 0)), int(meta.get("incorrect", 0))
        return Verdict(status="inconclusive", claim=CLAIM, evidence={"counts": meta},
                       summary=f"inconclusive: only {n_c} correct and {n_i} incorrect answers; too few to train probes")
    layers = sorted(int(l) for l in ko.layer.unique())
    n_layers = int(meta.get("n_layers", max(layers) + 1))
    late = late_layers(layers, n_layers)
    seed = int(result.config.get("seed", 0) or 0)
    claims, gates, notes, sets = [], [], [], {}
    for dataset in sorted(ko.dataset.unique()):
        set_c, counts = set_claims(ko[ko.dataset == dataset], late, dataset, seed)
        sets[dataset] = counts
        claims += set_c
        notes.append(f"{dataset}: E_Q flips {100 * counts['eq_flip_rate']:.0f}% vs control "
                     f"{100 * counts['control_flip_rate']:.0f}%")
        gates.append(Gate(f"{dataset}: Q- and A-Anchored samples", min(counts["q_mean_count"], counts["a_mean_count"])
                          >= MIN_GROUP, why=f"{counts['q_mean_count']:.1f} Q / {counts['a_mean_count']:.1f} A per layer "
                                           f"on average (needs {MIN_GROUP} each)",
                          remedy="more questions (--per-dataset)"))
    for row in skipped.drop_duplicates("probe_set").itertuples() if len(skipped) else ():
        gates.append(Gate(f"{row.probe_set}: probes", False, why=f"{int(row.correct_train)} correct / "
                          f"{int(row.incorrect_train)} incorrect training answers (need {int(row.needed)} of each)",
                          remedy="more questions, or an easier set"))
    k = _replicate(ko).replicate.nunique()
    gates.append(replicates_gate(k, trains=False))
    seconds = float(getattr(result, "seconds", 0.0) or 0.0)
    status, text = judge(claims, gates, seconds=seconds)
    summary = f"over layers {late[0]}-{late[-1]}, {k} replicates (probe split and control draw): " + "; ".join(notes) \
        + ". " + text
    summary += _untrained_mixtures(result.table("detection"))
    ev = {**evidence(claims, gates), "layers_compared": late, "counts": meta, "datasets": sets}
    _add_side_evidence(result, ev)
    return Verdict(status=status, claim=CLAIM, summary=summary, evidence=ev)


def _untrained_mixtures(det) -> str:
    """One clause per probe set whose mixture of probes was not trained: in how many replicates, and the first
    replicate's reason (each replicate's split gives its own counts, so the reasons differ only in them)."""
    if "note" not in det or not det.note.notna().any():
        return ""
    det = det.assign(probe_set=det["probe_set"] if "probe_set" in det else "all",
                     replicate=det["replicate"] if "replicate" in det else 0)
    mix = det[det.method == "mixture of probes"]
    out = ""
    for name, rows in mix.groupby("probe_set", sort=True):
        noted = rows[rows.note.notna()]
        if len(noted):
            out += (f"; mixture of probes for {name}: {noted.note.iloc[0]} (replicate {int(noted.replicate.iloc[0])}; "
                    f"not trained in {noted.replicate.nunique()} of {rows.replicate.nunique()} replicates)")
    return out


def _add_side_evidence(result, evidence: dict) -> None:
    probes = result.table("probe")
    if len(probes) and "best" in probes:
        evidence["probe_best"] = {f"{r.probe_set} replicate {int(getattr(r, 'replicate', 0))}":
                                  {"layer": int(r.layer), "test_auroc": r.test_auroc}
                                  for r in probes[probes.best == 1].itertuples()}
    patch = result.table("patching")
    for grp in ("Q", "A") if "flipped" in patch else ():
        flips = patch[patch.group == grp].flipped
        evidence[f"patching_flip_rate_{grp}"] = wilson(int(flips.sum()), len(flips)).as_dict()
    for row in result.table("detection").itertuples():
        key = (f"detection_auroc_{getattr(row, 'probe_set', '')}_{row.method.replace(' ', '_')}"
               f"_replicate{int(getattr(row, 'replicate', 0))}")
        evidence[key] = {"auroc": row.auroc, "low": getattr(row, "low", None), "high": getattr(row, "high", None),
                         "note": getattr(row, "note", None)}


def key_rows(result) -> pd.DataFrame:
    """Mean ΔP (pp) per set and per-layer group, and the flip rates (%), at the sweep layers, for the report."""
    ko = result.table("knockout")
    if ko.empty:
        return pd.DataFrame([result.info])
    eq = ko[ko.condition == "eq"]
    dp = eq.assign(line=eq.dataset + " ΔP " + eq.group).pivot_table(index="line", columns="layer", values="delta_p")
    flips = ko.assign(line=ko.dataset + " flips % " + ko.condition.replace({"eq": "E_Q"}))
    fr = 100 * flips.pivot_table(index="line", columns="layer", values="flipped")
    return pd.concat([dp, fr]).round(1).reset_index()
