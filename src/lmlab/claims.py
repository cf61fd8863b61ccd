"""Verdicts as claims: one representation of a checked claim (declared once, then judged), validity gates, and one
rule that judges them. Their intervals are lmlab.resampling's; their text and HTML, lmlab.render's.

A study's claim is about a *method*; a model we train is one draw of its training procedure. So every
measurement carries its replicate (an independent training run or random draw, its seed derived from the run's
`--seed`, `replicate_seed`) and its item (a test problem, a question, a prompt pair), and a claim's estimate is
the mean over replicates of each replicate's statistic.

Intervals: lmlab.resampling (`Resampler`: two levels, replicates and items, one set of item draws per verdict).

Decision (`Claim.decide`): the claim holds when the quantity is on the bar's side. "yes" when the interval lies on
that side (or, for a claim with a `null`, when the estimate is past the bar and the interval excludes the null);
"no" when the interval lies on the other side at the family-wise level (Bonferroni over the claims of one
verdict that can say "no", `judge`); "open" otherwise, and also when the replicates disagree (a quarter or more of
them on the bar's other side from the rest; with 2-4 replicates any one): then no interval is trusted to decide.
Not any one at every k: the chance that some replicate lands across a bar its method's mean clears grows with k, so
that rule made more replication decide less (at 10 replicates, one replicate across the bar would hold open a
claim whose interval lies wholly on the bar's side).

Whose claim (`Claim.source`): "paper" (the paper states it; `where` says where, with the paper's number where it
gives one) or "lmlab" (our reading, a stricter margin, a validity check; `where` gives the reason). A bar of ours on
a paper's claim is labelled in `bar_note`; it may be more lenient than the paper's own size (then its "no" is the
paper's "no" too), never stricter (a stricter margin makes the claim ours).

Gates are scoped like claims (`Gate.group`, `Gate.claims`): a failed scoped gate acts on the claims it covers only
(`Gate.apply`: "all" sets them aside, unread; "no"/"yes" turn that answer open), and "reproduced" needs each decisive
paper claim read in at least one group (`unread_claims`). A replicate that failed (`Claim.failed`, left out of the
estimate) is counted: an answer stands only if it also stands with each failed replicate at its worst
(`Claim._worst_case`, at the statistic's `bounds`), so more replicates never decide less.

`judge(claims, gates)`: a failed unscoped gate that blocks everything -> inconclusive; any decisive *paper* claim "no" (and
no failed gate blocking "no") -> not reproduced; every decisive claim "yes", at least one of them the paper's (and
no failed gate blocking "yes") -> reproduced; else inconclusive. A decisive claim of ours at "no" holds the verdict
at inconclusive and never makes it "not reproduced". A claim marked `reported` is shown and never decides; a claim
whose arms sit at a ceiling or floor (`ceiling`, see `at_bound`) is open whatever its interval says.
`deciding(...)` names the claim (or gate) that decided, with its source and bar, for the report's headline.

What would decide an open claim (`Claim.sizing`): the seeds and items at which a claim at this estimate would
clear its bar with 80% power (two-sided 5%): the distance to clear is the estimate's distance to the bar, or the
paper's effect where the claim names one; the time is this run's pace.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Literal, Sequence

import numpy as np

Decision = Literal["yes", "no", "open"]
DISAGREE = 0.25  # the share of replicates across the bar (the smaller side) that keeps a claim open
Z_80 = 1.96 + 0.84  # two-sided 5% at 80% power: the one power convention of every verdict
SCHEMA = 4  # verdict.json's layout: claims (with their source) and gates as lists of dicts, what decided (as data:
# its words are lmlab.render's) and the judgement's notes


def number(x: float, unit: str = "", scale: float = 1.0, bar_value: float | None = None) -> str:
    """A claim's quantity as its lines write it: scaled, signed, two decimals for a ratio, a unitless quantity or a
    small bar, else one ("nan" where there is none). The one formatter of Claim.fmt and lmlab.render."""
    if x is None or not np.isfinite(x):
        return "nan"
    digits = 2 if unit in ("x", "") or scale * abs(bar_value or 1) < 1 else 1
    return f"{scale * x:+.{digits}f}"


def t_quantile(df: float, confidence: float = 0.95) -> float:
    if not np.isfinite(df) or df > 1e6:
        from statistics import NormalDist

        return NormalDist().inv_cdf(0.5 + confidence / 2)
    from scipy import stats as _st

    return float(_st.t.ppf(0.5 + confidence / 2, max(df, 1.0)))


def interval_parts(per, se_item: float, n: int, shared: bool = True) -> dict:
    """A claim's estimate and interval from its replicates' statistics `per` (NaN: a replicate without one, left out)
    and the items' part of the standard error: estimate, se, df, replicates, replicate_estimates, se_seed, se_item,
    method (see lmlab.claims: the between-replicate part on k - 1 degrees of freedom, the items' from their
    resamples, combined by Welch-Satterthwaite).

    `shared`: every replicate reads the same items (a test set): the spread between replicates is what the items do
    not explain, and the two parts add. `shared=False`: each replicate draws items of its own (compare's prompt
    draws): the spread between replicates then holds the items' noise too, and the two parts still add, which counts
    the items' part twice. DECISION: that is conservative, and kept: the spread beyond the items' alone, max(0, s^2/k -
    se_item^2), would need the k - 1 degrees of freedom of s^2 for the whole variance (Satterthwaite credits the items'
    part with n - 1 it does not have there), and at three replicates its t quantile at a Bonferroni level (about 20)
    would hold open even a control whose replicates agree; the sum's standard error is never below either part's.
    """
    per = np.asarray(per, dtype=float)
    good = per[np.isfinite(per)]
    k = len(good)
    estimate = float(good.mean()) if k else float("nan")
    if k > 1:
        se_seed = float(np.std(good, ddof=1) / np.sqrt(k))
        a, b = se_seed ** 2, se_item ** 2 if np.isfinite(se_item) else 0.0
        denom = (a * a / (k - 1) if a else 0.0) + (b * b / max(n - 1, 1) if b else 0.0)
        df = (a + b) ** 2 / denom if denom > 0 else float(k - 1)
        method = (f"t over {k} replicates and {n} items (Satterthwaite df {df:.1f}; "
                  + ("item resamples shared)" if shared else "items drawn per replicate: their part counted in "
                     "both, conservative)"))
    else:
        se_seed, df = 0.0, float(max(n - 1, 1))
        method = f"one replicate: items only ({n} items, bootstrap SE, normal t)"
    se = math.sqrt(se_seed ** 2 + (se_item if np.isfinite(se_item) else 0.0) ** 2) if k else float("nan")
    if k and not np.isfinite(se_item) and k < 2:
        se = float("nan")
    return dict(estimate=estimate, se=se, df=df, replicates=k, replicate_estimates=[float(x) for x in per],
                se_seed=se_seed, se_item=se_item if np.isfinite(se_item) else 0.0, method=method)


@dataclass(frozen=True)
class Bar:
    """What a claim is checked against; built only from the claim's declaration (`Declared.bar`), never by hand.

    The claim holds when the quantity is `direction` `value` (">=" or "<="). With `null`, "yes" needs the estimate
    past the bar and the interval clear of `null` (a large effect that is surely not zero: the knockout study's
    "far below"); without, the whole interval past the bar. "no" needs the whole interval (at the level "no" is
    read at) on the wrong side of `margin` where one is set, else of the bar. `margin` is a margin of ours on a
    paper's claim: it lies on the lenient side of the bar, so it can only make "no" harder to reach, never "yes"
    easier (the quantize study's Budget-C >= Budget-A: "yes" needs C above A; "no" needs C a point below A)."""
    direction: Literal[">=", "<="]
    value: float
    null: float | None = None
    margin: float | None = None

    def __post_init__(self):
        if self.direction not in (">=", "<="):
            raise ValueError(f"a bar's direction is '>=' or '<=', not {self.direction!r}")
        if self.margin is not None and not (self.margin <= self.value if self.direction == ">=" else
                                            self.margin >= self.value):
            raise ValueError(f"a margin of ours ({self.margin:+g}) must lie on the lenient side of the bar "
                             f"({self.direction} {self.value:+g}): it may widen 'no', never 'yes'")

    def holds(self, x: float) -> bool:
        return x >= self.value if self.direction == ">=" else x <= self.value

    @property
    def no_line(self) -> float:
        """Where "no" starts: our margin, else the bar."""
        return self.value if self.margin is None else self.margin

    @classmethod
    def stored(cls, bar: dict) -> "Bar":
        """The bar a verdict.json stored (its dict), to be written in words again (KeyError or ValueError where a
        verdict stored before margins existed lacks a field)."""
        return cls(bar["direction"], float(bar["value"]), bar.get("null"), bar.get("margin"))

    def text(self, unit: str = "", scale: float = 1.0) -> str:
        num = lambda x: f"{scale * x:+g}" if x else "0"  # noqa: E731
        out = f"{self.direction} {num(self.value)}{unit}"
        if self.null is not None:
            out += f", interval {'above' if self.direction == '>=' else 'below'} {num(self.null)}"
        if self.margin is not None:
            out += f"; 'no' only {'below' if self.direction == '>=' else 'above'} {num(self.margin)}{unit}"
        return out


@dataclass
class Claim:
    name: str
    estimate: float
    se: float  # the combined standard error
    df: float  # its degrees of freedom (inf: normal)
    bar: Bar
    unit: str = ""
    group: str = ""  # the dataset, task or rate it is about
    method: str = ""
    n: int = 0  # items
    n_unit: str = "items"
    replicates: int = 1
    replicate_estimates: list[float] = field(default_factory=list)
    se_seed: float = 0.0
    se_item: float = 0.0
    effect: float | None = None  # the paper's effect on this scale (sizing), where the claim names one
    reported: bool = False  # shown, never decisive
    source: Literal["paper", "lmlab"] = "lmlab"  # whose claim: the paper's, or ours
    where: str = ""  # paper: where the paper states it (and its number); lmlab: why we check it
    bar_note: str = ""  # a bar of ours on a paper's claim: which, and why (beside the paper's number)
    ceiling: str = ""  # non-empty: every arm at a ceiling or floor; the claim cannot decide (the reason)
    scale: float = 1.0  # a multiplier for display (e.g. 100 for percentage points)
    decision: Decision = "open"
    reason: str = ""
    no_confidence: float = 0.95
    yes_confidence: float = 0.95
    guard_yes: bool = False  # "yes" read at the level "no" is (each claim an answer of its own: compare's cells)
    decides_at: dict = field(default_factory=dict)
    failed: int = 0  # replicates that failed their recipe or could not compute the statistic: not in the estimate
    bounds: tuple[float, float] | None = None  # the statistic's range: where a failed replicate counts at its worst
    set_aside: str = ""  # the failed gate, scoped to this claim, that kept it from being read (it decides nothing)
    pool: int = 0  # the most items the run's data could give (0: not known); "what would decide" stays within it

    # --- intervals
    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        if not np.isfinite(self.se):
            return float("nan"), float("nan")
        half = t_quantile(self.df, confidence) * self.se
        return self.estimate - half, self.estimate + half

    @property
    def low(self) -> float:
        return self.interval()[0]

    @property
    def high(self) -> float:
        return self.interval()[1]

    # --- the decision
    def decide(self, no_confidence: float = 0.95) -> Decision:
        """Set and return yes / no / open (see the module's docstring). "no" is read at `no_confidence` (a verdict's
        family-wise level), "yes" at 95%, or at `no_confidence` too where the claim guards its "yes" as its "no"
        (`guard_yes`: compare, whose every comparison is an answer of its own)."""
        yes_confidence = no_confidence if self.guard_yes else 0.95
        self.no_confidence, self.yes_confidence = no_confidence, yes_confidence
        bar = self.bar
        if self.ceiling:
            self.decision, self.reason = "open", self.ceiling
            return self.decision
        if not np.isfinite(self.estimate) or not np.isfinite(self.se):
            self.decision, self.reason = "open", self.reason or "no estimate or no spread"
            return self.decision
        low, high = self.interval(yes_confidence)
        nlow, nhigh = self.interval(no_confidence)
        past = (lambda lo, hi: lo >= bar.value) if bar.direction == ">=" else (lambda lo, hi: hi <= bar.value)
        short = ((lambda lo, hi: hi < bar.no_line) if bar.direction == ">=" else
                 (lambda lo, hi: lo > bar.no_line))
        if bar.null is None:
            yes = past(low, high)
        else:
            clear = low > bar.null if bar.direction == ">=" else high < bar.null
            yes = bar.holds(self.estimate) and clear
        no = short(nlow, nhigh)
        if self.across():  # a quarter or more of the replicates on the other side: no interval is trusted to decide
            self.decision = "open"
            self.reason = (f"the replicates disagree: {self.fmt_list(self.replicate_estimates)} on both sides of the "
                           f"bar ({self.across()} of {self.replicates} across)")
        else:
            self.decision = "yes" if yes else ("no" if no else "open")
            if self.decision != "open" and self.failed:
                self._worst_case(no_confidence)
            if self.decision == "open" and not self.reason:
                self.reason = self._open_reason(short, past)
        return self.decision

    def _open_reason(self, short, past) -> str:
        """Why an interval decided neither way, read at 95%: across the bar, or past it (or short of it) at 95% but
        not at the level "yes" (or "no") is read at."""
        low, high = self.interval()
        bar = self.bar
        if short(low, high):
            return f"short of the bar at 95% but not at the {100 * self.no_confidence:.4g}% that 'no' is read at"
        clear = past(low, high) if bar.null is None else (low > bar.null if bar.direction == ">=" else high < bar.null)
        if clear and self.yes_confidence > 0.95:
            return f"past the bar at 95% but not at the {100 * self.yes_confidence:.4g}% that 'yes' is read at"
        return ("the interval includes the bar" if bar.margin is None else
                "the interval is not clear of the bar, nor past our margin for 'no'")

    def _worst_case(self, no_confidence: float) -> None:
        """The rule for replicates that failed (`failed`, left out of the estimate): an answer stands only if it also
        stands with each failed replicate counted at the worst case for it, the bound of the statistic's range
        (`bounds`) on the other side of the bar; else the claim is open. Without bounds no worst case exists and
        the answer is open. One failure among many replicates moves the mean by 1/k of the range, so more
        replicates never decide less."""
        answer = self.decision
        if self.bounds is None:
            self.decision, self.reason = "open", (f"{self.failed} replicate(s) failed and the statistic has no bound "
                                                  "to count them at")
            return
        low, high = self.bounds
        worst = (low if self.bar.direction == ">=" else high) if answer == "yes" else \
            (high if self.bar.direction == ">=" else low)
        kept = [x for x in self.replicate_estimates if np.isfinite(x)]
        parts = interval_parts(kept + [worst] * self.failed, self.se_item, self.n)
        parts.pop("method")
        other = Claim(name=self.name, bar=self.bar, n=self.n, **parts)
        other.guard_yes = self.guard_yes
        if other.decide(no_confidence) != answer:
            self.decision = "open"
            self.reason = (f"'{answer}' without the {self.failed} failed replicate(s), but not with them counted at "
                           f"their worst ({self.fmt(worst)}{self.unit} each: {self.fmt(other.estimate)}{self.unit} "
                           f"[{self.fmt(other.low)}, {self.fmt(other.high)}])")

    def across(self) -> int:
        """How many replicates lie on the bar's other side from the rest (the smaller side), counted only when they
        are at least DISAGREE of the replicates (with 2-4 replicates: any one); else 0."""
        sides = [self.bar.holds(x) for x in self.replicate_estimates if np.isfinite(x)]
        fewer = min(sum(sides), len(sides) - sum(sides))
        return fewer if fewer and fewer >= DISAGREE * len(sides) else 0

    # --- what would decide it
    def sizing(self, seconds: float = 0.0, seconds_per_replicate: float | None = None) -> dict:
        """Seeds and items at which this claim, at its estimate, clears its bar with 80% power; its time at this
        run's pace (`seconds` for the whole run; `seconds_per_replicate`: what one more replicate costs)."""
        self.decides_at = self._sized(seconds, seconds_per_replicate)
        return self.decides_at

    def _sized(self, seconds: float, seconds_per_replicate: float | None) -> dict:
        if self.ceiling:
            return {"seeds": self.replicates, "items": self.n,
                    "text": "a run whose arms leave the ceiling or floor (a harder task, or a smaller budget): there "
                            "no number of seeds or items decides it"}
        if not np.isfinite(self.estimate):
            return {"seeds": self.replicates, "items": self.n,
                    "text": "a run that gives an estimate to size it (this one gives none)"}
        distance = abs(self.estimate - self.bar.value)
        if self.effect is not None:
            distance = max(distance, abs(self.effect))
        distance = max(distance, 1e-9)
        a, b = self.se_seed ** 2, self.se_item ** 2
        target = (distance / Z_80) ** 2
        out: dict = {"distance": distance, "seeds": max(self.replicates, 1), "items": max(self.n, 1)}
        unpriced = self._unpriced(a, b, distance, target)
        if unpriced:
            return {**out, **unpriced}
        seeds, items = self._size(a, b, target)
        capped = ""
        if self.pool and items > self.pool:  # more items than the data hold: the rest from seeds, or not at all
            seeds, items = self._within_pool(seeds, a, b, target)
            if seeds is None:
                return {**out, "items": items, "text": (
                    f"more {self.n_unit} than the data hold: at most {self.pool:,} here, and at that size "
                    + ("more seeds would not decide it either" if self.replicates > 1 else
                       "one replicate cannot decide it")
                    + "; a larger source of items (another data set, or a model that answers more of them)")}
            capped = f"; the data hold at most {self.pool:,} {self.n_unit}"
        return self._priced(out, seeds, items, capped, seconds, seconds_per_replicate)

    def _unpriced(self, a: float, b: float, distance: float, target: float) -> dict | None:
        """What would decide, where no size at this estimate can be priced: no spread, an estimate on the bar, or
        a spread that would decide at this size but for the replicates across the bar or the t quantile."""
        k = max(self.replicates, 1)
        if not np.isfinite(a + b) or a + b <= 0:
            return {"text": "a run with a spread to size it (this one gives none)"}
        if distance < 0.25 * math.sqrt(a + b):  # a size "at this estimate" would be astronomical and mean nothing
            return {"text": "more seeds to tell which side of its bar it falls; it sits on the bar (within a quarter "
                            "of its standard error), so no size can be priced at this estimate"}
        if a + b <= target:
            why = (f"{self.across()} of {k} replicates lie across the bar; fewer than a quarter would let the interval "
                   "decide" if self.across() else f"the t quantile at {k} replicates holds the interval open")
            return {"seeds": max(k + 2, 5),
                    "text": f"more seeds, about {max(k + 2, 5)} (its spread would decide at this size, but {why})"}
        return None

    def _priced(self, out: dict, seeds: int, items: int, capped: str, seconds: float,
                seconds_per_replicate: float | None) -> dict:
        """The size that decides, in words, with its time at this run's pace."""
        k, n = max(self.replicates, 1), max(self.n, 1)
        seeds = max(seeds, 3) if k > 1 and seeds != k else seeds
        factor = max(seeds / k, items / n)
        cost = (seconds_per_replicate * max(seeds - k, 0) if seconds_per_replicate and items == n
                else seconds * factor)
        text = (f"about {seeds} seeds x {items:,} {self.n_unit}" if seeds != k or k > 1 else
                f"about {items:,} {self.n_unit}")
        text += (f" (this run: {k} x {n:,}" if k > 1 else f" (this run: {n:,}") + capped + ")"
        if cost:
            from lmlab.stats import duration

            text += f", about {duration(cost)} here at this run's pace"
        return {**out, "seeds": seeds, "items": items, "seconds": cost, "text": text}

    def _size(self, a: float, b: float, target: float) -> tuple[int, int]:
        """(seeds, items) that bring the variance's seed part `a` and item part `b` under `target`."""
        k, n = max(self.replicates, 1), max(self.n, 1)
        if a < 0.5 * target and (k == 1 or b >= a):  # the seed part fits: more items alone
            return k, int(math.ceil(b * n / (target - a)))
        if k > 1 and b < 0.5 * target:  # the item part fits: more seeds alone
            return int(math.ceil(a * k / (target - b))), n
        scale = (a + b) / target  # both levels: scale seeds and items together
        return (int(math.ceil(k * scale)) if k > 1 else max(3, int(math.ceil(3 * scale ** 0.5))),
                int(math.ceil(n * scale)))

    def _within_pool(self, seeds: int, a: float, b: float, target: float) -> tuple[int | None, int]:
        """(seeds, items) at the most items the data hold (`pool`): the seeds that then bring the seed part of the
        variance `a` under what is left of `target` (None: no number of seeds does)."""
        k, n = max(self.replicates, 1), max(self.n, 1)
        items = max(self.pool, n)
        room = target - b * n / items
        if k < 2 or room <= 0 or a <= 0:
            return None, items
        return max(seeds, int(math.ceil(a * k / room))), items

    # --- numbers in its reasons (the claim's line is lmlab.render's claim_line)
    def fmt(self, x: float) -> str:
        return number(x, self.unit, self.scale, self.bar.value)

    def fmt_list(self, xs: Sequence[float]) -> str:
        return "[" + ", ".join(self.fmt(x) for x in xs) + "]"

    @property
    def label(self) -> str:
        """Its name, with the group it reads."""
        return f"{self.name}{f' ({self.group})' if self.group else ''}"

    def as_dict(self) -> dict:
        low, high = self.interval()
        d = asdict(self)
        d.update(low=low, high=high, bar=asdict(self.bar), confidence=0.95)
        return d


@dataclass
class Gate:
    """A validity check (training converged, the method was exercised, the toy learned). A failed gate that
    `blocks` "no" keeps the verdict from "not reproduced", one that blocks "yes" from "reproduced" (a test too weak
    to show the effect), one that blocks "all" from any decision."""
    name: str
    passed: bool
    why: str = ""
    remedy: str = ""
    blocks: Literal["no", "yes", "all"] = "all"
    group: str = ""  # the dataset, task or arm it is about ("" every group)
    claims: tuple[str, ...] = ()  # the claims it is about (() every claim)

    @property
    def scoped(self) -> bool:
        """A gate about some claims (a group, named claims) rather than the whole run."""
        return bool(self.group or self.claims)

    def covers(self, c: "Claim") -> bool:
        return (not self.group or c.group == self.group) and (not self.claims or c.name in self.claims)

    def apply(self, c: "Claim") -> None:
        """A failed scoped gate on a claim it covers: "all" sets the claim aside (not read: it decides nothing),
        "no" turns its "no" open, "yes" its "yes"."""
        if self.passed or not self.covers(c):
            return
        if self.blocks == "all":
            c.decision, c.set_aside = "open", self.name
            c.reason = f"not read: {self.name}" + (f" ({self.why})" if self.why else "")
        elif c.decision == self.blocks:
            c.decision, c.reason = "open", f"a gate keeps its '{self.blocks}' from deciding: {self.name}"

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Declared:
    """One claim a study checks, declared once at the top of its analysis: the one place a reader looks, and the one
    place its bar comes from. The text `lmlab claims` and the docs show (`bar`), the `Bar` the claim is judged
    against (`make_bar`) and whose claim it is all come from these fields; `attach` refuses a claim whose bar is not
    the declared one, so what is shown is what decides.

    `statistic`: what is computed, in words; `direction` and `value`: the claim holds when the quantity is
    `direction` `value` (`value` None: a bar computed per run, `rule` says how); `null`: "yes" also needs the
    interval clear of it (a direction claim: "interval above 0"); `margin`: a margin of ours, on the lenient side of
    the bar, past which "no" is read (it widens "no", never "yes"); `unit` and `scale`: how the bar is written
    (scale 100: a share shown in points); `source`: "paper" or "lmlab"; `where`: for a paper claim, where the paper
    states it (section, figure or table, and its number where it gives one, in our words); for ours, why we check
    it, in one line; `bar_note`: a bar of ours on a paper claim (which, and why it differs from the paper's
    number); `decisive`: False for a claim that is reported only (one that holds by construction, or whose size no
    run of this kind resolves)."""
    name: str
    statistic: str
    direction: Literal[">=", "<="]
    value: float | None
    source: Literal["paper", "lmlab"]
    where: str
    null: float | None = None
    margin: float | None = None
    unit: str = ""
    scale: float = 1.0
    rule: str = ""  # a bar computed per run (value None): how, in words
    decisive: bool = True
    bar_note: str = ""

    def __post_init__(self):
        if self.value is None and not self.rule:
            raise ValueError(f"claim {self.name!r}: a bar computed per run says how (rule)")
        if self.value is not None:
            self.make_bar()  # a margin on the wrong side fails here, at import

    @property
    def bar(self) -> str:
        """The bar in words, from the fields (what `lmlab claims` and the docs show)."""
        if self.value is None:
            head = f"{self.direction} {self.rule}"
            if self.null is not None:
                head += f", interval {'above' if self.direction == '>=' else 'below'} " + (
                f"{self.scale * self.null:+g}" if self.null else "0")
            return head
        return Bar(self.direction, self.value, self.null, self.margin).text(self.unit, self.scale)

    def make_bar(self, value: float | None = None) -> Bar:
        """The Bar this claim is judged against: the declared one, or, for a bar computed per run, at `value`."""
        if (value is None) == (self.value is None):
            raise ValueError(f"claim {self.name!r}: " + ("its bar is declared; a value of the run's may not replace it"
                                                         if value is not None else "its bar is computed per run: "
                                                         "give the run's value"))
        return Bar(self.direction, float(self.value if value is None else value), self.null, self.margin)

    def attach(self, claim: "Claim") -> "Claim":
        """`claim` with this declaration's source, reason and role; a claim whose bar is not the declared one is
        refused (a bar built apart from its declaration would decide other than what is shown)."""
        b = claim.bar
        if (b.direction, b.null, b.margin) != (self.direction, self.null, self.margin) or (
                self.value is not None and b.value != self.value):
            raise ValueError(f"claim {self.name!r} is judged against {b} but declared {self.bar}")
        claim.source, claim.where, claim.bar_note = self.source, self.where, self.bar_note
        claim.reported = claim.reported or not self.decisive
        return claim

    def measure(self, how: Callable[..., "Claim"], *data, label: str | None = None, bar_value: float | None = None,
                **kwargs) -> "Claim":
        """The claim measured and attached in one call: `how(label, *data, bar, **kwargs)` (a resampler's `claim`,
        `mean_claim`, `weighted_claim` or `combine`, or any function of that shape) with this declaration's bar
        (`make_bar(bar_value)`), named `label` (default: the declared name; a label names the group or arm it reads,
        e.g. "accuracy r=16 - CoT")."""
        return self.attach(how(self.name if label is None else label, *data, self.make_bar(bar_value), **kwargs))

    def as_dict(self) -> dict:
        return {**asdict(self), "bar": self.bar}


def declared(specs: Sequence[Declared], name: str) -> Declared:
    """The declaration called `name` (a study asking for one it did not declare is a bug: KeyError)."""
    for spec in specs:
        if spec.name == name:
            return spec
    raise KeyError(f"claim {name!r} is not declared (declared: {', '.join(s.name for s in specs)})")


def at_bound(*arms, low: float = 0.0, high: float = 1.0) -> str:
    """Why a comparison of these arms cannot decide, or "": every value of every arm (per replicate, or per item) at
    the same ceiling (`high`) or the same floor (`low`). Two arms at 100% in every replicate differ by 0 whatever the
    method does: such a claim is reported, never decisive."""
    values = [np.asarray(a, dtype=float).ravel() for a in arms]
    values = [v[np.isfinite(v)] for v in values]
    if not values or any(len(v) == 0 for v in values):
        return ""
    for bound, word in ((high, "ceiling"), (low, "floor")):
        if all(np.all(np.isclose(v, bound)) for v in values):
            return (f"every arm at the {word} ({100 * bound:.0f}%) in every replicate: a difference of 0 that no "
                    "method could change, so this claim decides nothing")
    return ""


def blocks_gain(higher, lower, low: float = 0.0, high: float = 1.0) -> str:
    """Why a gain claim (`higher` above `lower`) cannot say "yes", or "": the arm it must beat sits at the ceiling
    (`high`) in every replicate and item, or the arm that must rise sits at the floor. One arm is enough: such a
    claim could only say "no" or stay open, whatever the method does, so it decides nothing."""
    for arm, bound, word, which in ((lower, high, "ceiling", "the arm it must beat"),
                                    (higher, low, "floor", "the arm that must rise")):
        v = np.asarray(arm, dtype=float).ravel()
        v = v[np.isfinite(v)]
        if len(v) and np.all(np.isclose(v, bound)):
            return (f"{which} sits at the {word} ({100 * bound:.0f}%) in every replicate: no gain can show, so this "
                    "claim decides nothing")
    return ""


def _status(claims: Sequence[Claim], gates: Sequence[Gate]) -> str:
    """The one rule, on claims already decided (see the module's docstring). Scoped gates acted on their claims
    when they were decided (`Gate.apply`); the claims they set aside decide nothing."""
    decisive = [c for c in claims if not c.reported and not c.set_aside]
    failed = [g for g in gates if not g.passed and not g.scoped]
    if not decisive or any(g.blocks == "all" for g in failed):
        return "inconclusive"
    paper_no = any(c.decision == "no" and c.source == "paper" for c in decisive)
    if paper_no and not any(g.blocks == "no" for g in failed):
        return "not reproduced"
    unread = unread_claims(claims)
    if (all(c.decision == "yes" for c in decisive) and any(c.source == "paper" for c in decisive)
            and not any(g.blocks == "yes" for g in failed) and not unread):
        return "reproduced"
    return "inconclusive"


def unread_claims(claims: Sequence[Claim]) -> list[str]:
    """The decisive paper claims that a scoped gate set aside in every group: "reproduced" needs each of the paper's
    claims read somewhere (a set the run cannot read leaves the others to decide; a claim read nowhere does not)."""
    decisive = [c for c in claims if not c.reported and c.source == "paper"]
    read = {c.name for c in decisive if not c.set_aside}
    return list(dict.fromkeys(c.name for c in decisive if c.name not in read))


@dataclass
class Judgement:
    """What `judge` decided, as data: the status, the claims and gates it read (each claim decided, each scoped gate
    applied) and the notes a summary adds after them, each a dict whose `kind` names it. lmlab.render writes it in
    words (`judgement_text`); verdict.json keeps the notes (`evidence`)."""
    status: str
    claims: list
    gates: list
    notes: list


def judge(claims: Sequence[Claim], gates: Sequence[Gate] = (), seconds: float = 0.0,
          seconds_per_replicate: float | None = None) -> Judgement:
    """Decide each claim (Bonferroni over the decisive ones for "no", and for "yes" where a claim guards it), apply
    the gates and the rule of whose claim decides what, and size what would decide the open ones. The notes, in
    order: "ours_fail" (a decisive claim of ours at "no" holds the verdict open; `claims`), "paper_silent" (no paper
    claim decides), "unread" (paper claims a gate set aside everywhere; `claims`), then one of "to_decide" (`needs`:
    each open claim's label and size), "gate_keeps_no", "gate_keeps_yes"; and "bonferroni" (`m` claims, `level`)."""
    m = max(len([c for c in claims if not c.reported]), 1)
    for c in claims:
        c.set_aside = ""
        c.decide(1 - 0.05 / m if not c.reported else 0.95)
        for g in gates:
            if g.scoped:
                g.apply(c)
    decisive = [c for c in claims if not c.reported and not c.set_aside]
    failed = [g for g in gates if not g.passed and not g.scoped]
    blocks = {kind: [g for g in failed if g.blocks == kind] for kind in ("all", "no", "yes")}
    status = _status(claims, gates)
    notes: list[dict] = []
    paper_no = [c for c in decisive if c.decision == "no" and c.source == "paper"]
    if status == "inconclusive":
        notes = _open_notes(claims, decisive, paper_no, blocks, seconds, seconds_per_replicate)
    if m > 1:
        notes.append({"kind": "bonferroni", "m": m, "level": 1 - 0.05 / m})
    return Judgement(status, list(claims), list(gates), notes)


def _open_notes(claims, decisive, paper_no, blocks, seconds, seconds_per_replicate) -> list[dict]:
    """An inconclusive verdict's notes (see `judge`), each open decisive claim sized first."""
    notes: list[dict] = []
    for c in decisive:
        if c.decision == "open":
            c.sizing(seconds, seconds_per_replicate)
    sized = [c for c in decisive if c.decision == "open" and c.decides_at.get("text")]
    ours_no = [c for c in decisive if c.decision == "no" and c.source == "lmlab"]
    if ours_no and not paper_no and not blocks["all"]:
        notes.append({"kind": "ours_fail", "claims": [c.label for c in ours_no]})
    if decisive and not any(c.source == "paper" for c in decisive):
        notes.append({"kind": "paper_silent"})
    unread = unread_claims(claims)
    if unread and not paper_no:
        notes.append({"kind": "unread", "claims": unread})
    decisions = [c.decision for c in decisive]
    if sized and not blocks["all"]:
        notes.append({"kind": "to_decide", "needs": [{"claim": c.label, "size": c.decides_at["text"]}
                                                     for c in sized]})
    elif paper_no and blocks["no"]:
        notes.append({"kind": "gate_keeps_no"})
    elif blocks["yes"] and decisions and all(d == "yes" for d in decisions):
        notes.append({"kind": "gate_keeps_yes"})
    return notes


def deciding(claims: Sequence[Claim], gates: Sequence[Gate] = ()) -> dict:
    """What decided the verdict, on claims already decided: for "not reproduced" the first decisive paper claim at
    "no"; for "reproduced" the first decisive paper claim; for "inconclusive" the first failed unscoped gate that
    blocks everything, else the scoped gate that left nothing (or a paper claim nowhere) read, else the first
    decisive claim of ours at "no", else the gate that kept a paper claim's "no" (or every claim's "yes") from
    deciding, else the first open decisive claim (the paper's first, one that more data could decide before one
    held open at a ceiling). A dict with `kind` ("claim", "gate" or "none") and, for a claim, its name, source,
    where, bar (as data), bar note, decision and numbers; for a gate, its name, why and remedy. lmlab.render's
    `headline` writes it in words."""
    status = _status(claims, gates)
    pick = _pick(claims, gates, status)
    if pick is None:
        return {"status": status, "kind": "none"}
    if isinstance(pick, Gate):
        return {"status": status, "kind": "gate", "name": pick.name, "source": "lmlab",
                "where": "a validity check of ours", "why": pick.why, "remedy": pick.remedy}
    low, high = pick.interval()
    return {"status": status, "kind": "claim", "name": pick.label, "source": pick.source, "where": pick.where,
            "bar": asdict(pick.bar), "bar_note": pick.bar_note, "decision": pick.decision,
            "estimate": pick.estimate, "low": low, "high": high, "unit": pick.unit, "scale": pick.scale}


def _pick(claims: Sequence[Claim], gates: Sequence[Gate], status: str) -> "Claim | Gate | None":
    """The claim or gate that decided (see `deciding`)."""
    decisive = [c for c in claims if not c.reported and not c.set_aside]
    failed = [g for g in gates if not g.passed and not g.scoped]
    if status == "not reproduced":
        return next(c for c in decisive if c.decision == "no" and c.source == "paper")
    if status == "reproduced":
        return next(c for c in decisive if c.source == "paper")
    paper_no = any(c.decision == "no" and c.source == "paper" for c in decisive)
    all_yes = bool(decisive) and all(c.decision == "yes" for c in decisive)
    unread = unread_claims(claims)
    aside = next((c.set_aside for c in claims if unread and c.name == unread[0] and c.set_aside), "")
    return (next((g for g in failed if g.blocks == "all"), None)
            or (next((g for g in gates if not g.passed and g.scoped), None) if not decisive else None)
            or next((g for g in gates if g.name == aside), None)
            or next((c for c in decisive if c.decision == "no" and c.source == "lmlab"), None)
            or (next((g for g in failed if g.blocks == "no"), None) if paper_no else None)
            or (next((g for g in failed if g.blocks == "yes"), None) if all_yes else None)
            or next((c for c in decisive if c.decision == "open" and c.source == "paper" and not c.ceiling), None)
            or next((c for c in decisive if c.decision == "open" and c.source == "paper"), None)
            or next((c for c in decisive if c.decision == "open"), None)
            or (decisive[0] if decisive else None))


def evidence(claims: Sequence[Claim], gates: Sequence[Gate] = (), scope: str = "",
             judgement: Judgement | None = None) -> dict:
    """What verdict.json stores: the schema number, every claim (with its source) and gate as plain data, what
    decided the verdict, the judgement's notes (where the verdict was judged here) and where the run stands against
    the paper's tested range (`scope`)."""
    out = {"schema": SCHEMA, "claims": [c.as_dict() for c in claims], "gates": [g.as_dict() for g in gates],
           "deciding": deciding(claims, gates)}
    if judgement is not None:
        out["notes"] = judgement.notes
    if scope:
        out["scope"] = scope
    return out


def replicates_gate(k: int, trains: bool = True) -> Gate:
    """A claim about a training method needs more than one training run."""
    return Gate("replicates", k >= 2 or not trains, why=f"{k} training run(s)",
                remedy="one training run cannot decide a claim about the method: run --seeds 3 or more",
                blocks="all")
