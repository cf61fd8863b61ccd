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

from lmlab.stats import bootstrap, decide_sentence, n_to_decide, percentile_interval, wilson
from lmlab.studies.base import Verdict, canvas, caption, finish
from lmlab.studies.knockout.config import MIN_GROUP

CLAIM = ("Q-Anchored ΔP falls far below A-Anchored ΔP in middle and late layers, on every dataset, and "
         "knocking out E_Q flips the probe far more often than knocking out random question tokens")
FAR = -10.0  # "far below": a Q - A gap of at least 10 pp whose 95% interval lies below 0
# DECISION: "flips far more often than the control" = E_Q's flip rate at least 10 points above the
# control's with the interval's low end above 0; "no" when the interval's high end is below 10 points.
FLIP_MARGIN = 0.10
N_BOOT = 2000
Z_POWER = (1.96 + 0.84) / 1.96  # minimum detectable effect (80% power, two-sided 5%) / the interval's half-width
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
    left.set(xlabel="Layer (probe trained on; E_Q knocked out in layers 0..k)", ylabel="ΔP (pp)",
             title="ΔP, split per probe layer (Q- vs A-Anchored)")
    right.set(xlabel="Layer", ylabel="probe predictions flipped (%)", title="flip rate: E_Q vs control", ylim=(0, 100))
    for ax in (left, right):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7, frameon=False)
    caption(fig, f"{result.models[0]}: attention knockout of the question's key tokens, "
                 f"{', '.join(sorted(ko.dataset.unique()))} ({ko.id.nunique()} answered questions with probes)")
    return finish(fig)


def _line(ax, rows, column, label, color, style, scale=1.0):
    layers = sorted(rows.layer.unique())
    if not layers:
        return
    stats = [bootstrap(scale * rows[rows.layer == layer][column].to_numpy(dtype=float), n_resamples=500)
             for layer in layers]
    ax.plot(layers, [s.estimate for s in stats], style, color=color, label=label, lw=1.6)
    ax.fill_between(layers, [s.low for s in stats], [s.high for s in stats], color=color, alpha=0.12)


def late_layers(layers: list[int], n_layers: int) -> list[int]:
    """The middle-to-last sweep layers."""
    late = [l for l in layers if l >= n_layers // 2]
    return late or [max(layers)]


def _matrix(rows: pd.DataFrame, ids: list[str], layers: list[int], column: str) -> np.ndarray:
    return rows.pivot_table(index="id", columns="layer", values=column).reindex(index=ids, columns=layers).to_numpy(float)


def _gap(dp: np.ndarray, flip: np.ndarray, w: np.ndarray) -> float:
    """Mean over layers of (mean ΔP of the flipped - of the others), samples weighted by w (a resample)."""
    ok = ~np.isnan(dp)
    wq, wa = w[:, None] * (flip == 1) * ok, w[:, None] * (flip == 0) * ok
    with np.errstate(invalid="ignore", divide="ignore"):
        per_layer = (wq * np.nan_to_num(dp)).sum(0) / wq.sum(0) - (wa * np.nan_to_num(dp)).sum(0) / wa.sum(0)
    return float(np.nanmean(per_layer)) if np.isfinite(per_layer).any() else float("nan")


def _check(estimate: float, iv, yes, no) -> str:
    return "yes" if yes(estimate, iv) else ("no" if no(estimate, iv) else "unclear")


def set_evidence(ko: pd.DataFrame, late: list[int], seed: int = 0) -> dict:
    """One dataset's numbers over the late layers, with sample-clustered bootstrap intervals."""
    ids = sorted(ko.id.unique())
    eq, ctrl = ko[ko.condition == "eq"], ko[ko.condition == "control"]
    dp_e, fl_e = _matrix(eq, ids, late, "delta_p"), _matrix(eq, ids, late, "flipped")
    dp_c, fl_c = _matrix(ctrl, ids, late, "delta_p"), _matrix(ctrl, ids, late, "flipped")
    n = len(ids)
    rng = np.random.default_rng(seed)
    weights = [np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(N_BOOT)]
    ones = np.ones(n)
    flip_diff = np.nanmean(fl_e - fl_c, axis=1)  # per sample: E_Q flips minus control flips over the late layers

    def stat(f):
        return f(ones), np.array([f(w) for w in weights])

    gap, gap_b = stat(lambda w: _gap(dp_e, fl_e, w))
    cgap, cgap_b = stat(lambda w: _gap(dp_c, fl_c, w))
    has = ~np.isnan(flip_diff)
    fd, fd_b = stat(lambda w: float(np.average(flip_diff[has], weights=w[has])) if (w[has] > 0).any() else np.nan)
    n_q = np.nansum(fl_e, axis=0)
    n_ctrl_q = np.nansum(fl_c, axis=0)
    entry = {"n_samples": n, "n_q_per_layer": dict(zip(late, n_q.astype(int).tolist())),
             "n_a_per_layer": dict(zip(late, (np.sum(~np.isnan(fl_e), axis=0) - n_q).astype(int).tolist())),
             "q_minus_a": percentile_interval(gap, gap_b).as_dict(),
             "eq_flip_rate": float(np.nanmean(fl_e)), "control_flip_rate": float(np.nanmean(fl_c)),
             "eq_minus_control_flip_rate": percentile_interval(fd, fd_b).as_dict(),
             "control_q_per_layer": dict(zip(late, n_ctrl_q.astype(int).tolist()))}
    entry["q_mean_count"] = float(np.mean(n_q))
    entry["a_mean_count"] = float(np.mean(np.sum(~np.isnan(fl_e), axis=0) - n_q))
    g, f = entry["q_minus_a"], entry["eq_minus_control_flip_rate"]
    checks = {"Q-A gap <= -10 pp": _check(g["estimate"], g, lambda e, i: e <= FAR and i["high"] < 0,
                                           lambda e, i: i["low"] > FAR),
              "E_Q flips more than control": _check(f["estimate"], f, lambda e, i: e >= FLIP_MARGIN and i["low"] > 0,
                                                    lambda e, i: i["high"] < FLIP_MARGIN)}
    if np.mean(n_ctrl_q) >= MIN_GROUP:  # the control flips often enough to be split: its gap must be smaller
        d = percentile_interval(gap - cgap, gap_b - cgap_b).as_dict()
        entry["control_q_minus_a"] = percentile_interval(cgap, cgap_b).as_dict()
        entry["gap_minus_control_gap"] = d
        checks["Q-A gap beyond the control's"] = _check(d["estimate"], d, lambda e, i: e <= FAR and i["high"] < 0,
                                                        lambda e, i: i["low"] > FAR)
    entry["checks"] = checks
    half = (g["high"] - g["low"]) / 2 if np.isfinite(g["high"]) else float("nan")
    entry["min_detectable_gap_pp"] = round(Z_POWER * half, 1)
    return entry


def verdict(result) -> Verdict:
    """Per dataset, over the middle-to-last sweep layers: the Q - A gap (per-layer split) must be at most
    -10 pp with its interval below 0, and the E_Q flip rate must exceed the control's (interval above 0).
    "Not reproduced" needs an interval that excludes the claim on some set; a set with too few Q or A
    samples, or no probes, leaves the verdict inconclusive for it, with the counts."""
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
    evidence: dict = {"layers_compared": late, "counts": meta, "datasets": {}}
    status_of, notes = {}, []
    for dataset in sorted(ko.dataset.unique()):
        entry = set_evidence(ko[ko.dataset == dataset], late)
        evidence["datasets"][dataset] = entry
        g = entry["q_minus_a"]
        short = (f"{dataset}: Q-A {g['estimate']:+.1f} pp [{g['low']:+.1f}, {g['high']:+.1f}], E_Q flips "
                 f"{100 * entry['eq_flip_rate']:.0f}% vs control {100 * entry['control_flip_rate']:.0f}%")
        if entry["q_mean_count"] < MIN_GROUP or entry["a_mean_count"] < MIN_GROUP:
            status_of[dataset] = "inconclusive"
            notes.append(f"{dataset}: too few samples per layer ({entry['q_mean_count']:.1f} Q / "
                         f"{entry['a_mean_count']:.1f} A on average; need {MIN_GROUP})")
            continue
        checks = entry["checks"].values()
        status_of[dataset] = ("not reproduced" if "no" in checks else
                              "reproduced" if all(c == "yes" for c in checks) else "inconclusive")
        if status_of[dataset] == "inconclusive":
            open_checks = ", ".join(k for k, v in entry["checks"].items() if v == "unclear")
            short += (f" (undecided: {open_checks}; the interval is too wide at n = {entry['n_samples']}; minimum "
                      f"detectable Q-A gap about {entry['min_detectable_gap_pp']:.0f} pp)")
        notes.append(short)
    for row in skipped.itertuples():
        status_of[row.probe_set] = "inconclusive"
        notes.append(f"{row.probe_set}: no probes ({int(row.correct_train)} correct / {int(row.incorrect_train)} incorrect "
                     f"training answers, need {int(row.needed)} of each)")
    evidence["set_status"] = status_of
    det = result.table("detection")
    if "note" in det:
        for row in det[det.note.notna()].itertuples():
            notes.append(f"mixture of probes for {getattr(row, 'probe_set', 'all')}: {row.note}")
    _add_side_evidence(result, evidence)
    statuses = set(status_of.values())
    status = ("not reproduced" if "not reproduced" in statuses else
              "reproduced" if statuses == {"reproduced"} else "inconclusive")
    summary = f"over layers {late[0]}-{late[-1]}: " + "; ".join(notes)
    if status == "inconclusive":
        evidence["to_decide"] = to_decide(evidence, status_of, meta, getattr(result, "seconds", 0.0))
        summary += f". {evidence['to_decide']['text'].capitalize()}"
    return Verdict(status=status, claim=CLAIM, summary=summary, evidence=evidence)


def _gap_distance(iv: dict) -> float:
    """A gap check says yes when the estimate is <= -10 with the interval below 0, no when the interval lies above
    -10: the distance its interval has to clear from the estimate."""
    return abs(iv["estimate"]) if iv["estimate"] <= FAR else iv["estimate"] - FAR


def to_decide(evidence: dict, status_of: dict, meta: dict, seconds: float) -> dict:
    """Questions a set that would decide every undecided set at 80% power: for an open check, the size at which
    the interval would clear its bar (10 pp of gap, 10 points of flips) at the estimated effect, which is the
    effect's distance to the bar (an estimate on the bar needs a size no run can reach); for a set short of Q-
    or A-Anchored samples, the size that gives MIN_GROUP of each. Its time is this run's pace."""
    per_set: dict[str, int] = {}
    sets = evidence["datasets"]
    n_sets = max(len(status_of), 1)
    asked = int(meta.get("questions", 0)) // n_sets or 1  # questions a set
    for name, status in status_of.items():
        if status != "inconclusive" or name not in sets:
            continue
        entry = sets[name]
        n = entry["n_samples"]
        scale = asked / max(n, 1)  # questions asked per sample that has probes
        needs = []
        if min(entry["q_mean_count"], entry["a_mean_count"]) < MIN_GROUP:
            fewest = max(min(entry["q_mean_count"], entry["a_mean_count"]), 0.5)
            needs.append(int(np.ceil(n * MIN_GROUP / fewest)))
        # the distance from each estimate to the bar its interval has to clear, either way
        flips = entry["eq_minus_control_flip_rate"]
        checks = [("Q-A gap <= -10 pp", entry["q_minus_a"], _gap_distance(entry["q_minus_a"])),
                  ("E_Q flips more than control", flips, flips["estimate"] if flips["estimate"] >= FLIP_MARGIN
                   else FLIP_MARGIN - flips["estimate"])]
        if "gap_minus_control_gap" in entry:
            beyond = entry["gap_minus_control_gap"]
            checks.append(("Q-A gap beyond the control's", beyond, _gap_distance(beyond)))
        for check, iv, distance in checks:
            if entry["checks"].get(check) == "unclear":
                needs.append(n_to_decide(n, (iv["high"] - iv["low"]) / 2, max(distance, 1e-9)) or 0)
        if needs:
            per_set[name] = int(np.ceil(max(needs) * scale))
    if not per_set:
        return {"per_set": {}, "text": "a set without probes needs more answers of each kind (more questions, or an "
                                       "easier set)"}
    most = max(per_set.values())
    text = decide_sentence("questions", asked * n_sets, most * n_sets, seconds,
                           "the estimated effects against the 10-point bars on "
                           + ", ".join(f"{k} ({v:,} a set)" for k, v in per_set.items()),
                           "the full profile asks 1,000 a set")
    return {"per_set": per_set, "questions_per_set": most, "text": text}


def _add_side_evidence(result, evidence: dict) -> None:
    probes = result.table("probe")
    if len(probes) and "best" in probes:
        evidence["probe_best"] = {r.probe_set: {"layer": int(r.layer), "test_auroc": r.test_auroc}
                                  for r in probes[probes.best == 1].itertuples()}
    patch = result.table("patching")
    for grp in ("Q", "A") if "flipped" in patch else ():
        flips = patch[patch.group == grp].flipped
        evidence[f"patching_flip_rate_{grp}"] = wilson(int(flips.sum()), len(flips)).as_dict()
    for row in result.table("detection").itertuples():
        key = f"detection_auroc_{getattr(row, 'probe_set', '')}_{row.method.replace(' ', '_')}"
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
