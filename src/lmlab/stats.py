"""95% intervals: Wilson for proportions, percentile bootstrap for anything else, both from scipy.

Every verdict carries intervals from here. The bootstrap is seeded, so the same table gives the same
interval. `percentile_interval` is for the studies that resample several statistics with shared
indices (a paired comparison across configurations, a curve and the heads it needs): scipy's
`bootstrap` draws its own indices per call, so those studies draw theirs once and take the percentile
interval of each statistic here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.estimate:.3g} [{self.low:.3g}, {self.high:.3g}] (n={self.n})"


def wilson(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a proportion (scipy's binomtest); defined (0 to 1) even for n = 0."""
    if n == 0:
        return Interval(float("nan"), 0.0, 1.0, 0)
    from scipy import stats as _st  # on first use: scipy.stats is slow to import

    ci = _st.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(successes / n, float(ci.low), float(ci.high), n)


def _percentile_bootstrap(samples: tuple, stat, n_resamples: int, confidence: float, seed: int) -> tuple[float, float]:
    """scipy's percentile bootstrap, each sample resampled on its own; `stat(*xs, axis)` is vectorised."""
    from scipy import stats as _st

    res = _st.bootstrap(samples, stat, n_resamples=n_resamples, confidence_level=confidence, method="percentile",
                        rng=np.random.default_rng(seed), vectorized=True, paired=False)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap(values: Sequence[float] | np.ndarray, statistic: Callable[[np.ndarray], float] = np.mean,
              n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """Percentile bootstrap interval of `statistic` over the rows of `values` (scipy.stats.bootstrap)."""
    data = np.asarray(values, dtype=float)
    n = len(data)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    estimate = float(statistic(data))
    if n == 1 or np.all(data == data[0]):
        return Interval(estimate, estimate, estimate, n)
    low, high = _percentile_bootstrap((data,), lambda x, axis=-1: np.apply_along_axis(statistic, axis, x),
                                      n_resamples, confidence, seed)
    return Interval(estimate, low, high, n)


def bootstrap_diff(a: Sequence[float], b: Sequence[float], statistic: Callable[[np.ndarray], float] = np.mean,
                   n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """Interval of statistic(a) - statistic(b), resampling the two groups independently."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) == 0 or len(b) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    estimate = float(statistic(a) - statistic(b))
    if len(a) == 1 and len(b) == 1:
        return Interval(estimate, estimate, estimate, 2)

    def diff(x, y, axis=-1):
        return np.apply_along_axis(statistic, axis, x) - np.apply_along_axis(statistic, axis, y)
    low, high = _percentile_bootstrap((a, b), diff, n_resamples, confidence, seed)
    return Interval(estimate, low, high, len(a) + len(b))


def percentile_interval(estimate: float, samples: np.ndarray, confidence: float = 0.95) -> Interval:
    """The percentile interval of bootstrap `samples` drawn by the caller (NaN samples are left out)."""
    samples = np.asarray(samples, dtype=float)
    alpha = 100 * (1 - confidence) / 2
    if not np.isfinite(samples).any():
        return Interval(float(estimate), float("nan"), float("nan"), len(samples))
    low, high = np.nanpercentile(samples, [alpha, 100 - alpha], axis=0)
    return Interval(float(estimate), float(low), float(high), len(samples))


# --- what would decide an undecided check: sample size at 80% power, and its time at the run's own pace
Z_80 = 1.96 + 0.84  # two-sided 5%, 80% power


def n_to_decide(n: int, half_width: float, effect: float) -> int | None:
    """The sample size at which an effect of `effect` (same units as the interval) is detected with 80% power,
    two-sided 5%, from a run of `n` whose 95% interval had `half_width`: the standard error shrinks as 1/sqrt(n).
    None when the run gives no spread to scale."""
    if not n or not np.isfinite(half_width) or half_width <= 0 or not effect:
        return None
    se = half_width / 1.96
    return int(np.ceil(n * (Z_80 * se / abs(effect)) ** 2))


def duration(seconds: float) -> str:
    """3 h 10 min, 12 min, 40 s."""
    if not np.isfinite(seconds):
        return "unknown"
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def decide_sentence(unit: str, n: int, needed: int | None, seconds: float | None, effect: str,
                    closest: str = "") -> str:
    """'to decide ... needs about N units (this run: n), about T here at this run's pace ...'."""
    if needed is None:
        return f"this run gives no spread to size a larger one ({effect})"
    text = f"to detect {effect} at 80% power needs about {needed:,} {unit} (this run: {n:,})"
    if seconds and n:
        text += (f", about {duration(seconds * needed / n)} on this machine at this run's pace ({duration(seconds)} for "
                 f"{n:,}, fixed costs included)")
    return text + (f"; {closest}" if closest else "")
