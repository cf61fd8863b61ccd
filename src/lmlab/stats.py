"""95% intervals: Wilson for proportions, percentile bootstrap for anything else.

Every verdict carries intervals from here. The bootstrap is seeded, so the same table gives the same
interval.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats as _st


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
    """Wilson score interval for a proportion; defined (0 to 1) even for n = 0."""
    if n == 0:
        return Interval(float("nan"), 0.0, 1.0, 0)
    z = _st.norm.ppf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), n)


def bootstrap(values: Sequence[float] | np.ndarray, statistic: Callable[[np.ndarray], float] = np.mean,
              n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """Percentile bootstrap interval of `statistic` over the rows of `values`."""
    data = np.asarray(values, dtype=float)
    n = len(data)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    estimate = float(statistic(data))
    if n == 1:
        return Interval(estimate, estimate, estimate, 1)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    resampled = np.array([statistic(data[i]) for i in idx])
    alpha = (1 - confidence) / 2
    low, high = np.quantile(resampled, [alpha, 1 - alpha])
    return Interval(estimate, float(low), float(high), n)


def bootstrap_diff(a: Sequence[float], b: Sequence[float], statistic: Callable[[np.ndarray], float] = np.mean,
                   n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """Interval of statistic(a) - statistic(b), resampling the two groups independently."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) == 0 or len(b) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    rng = np.random.default_rng(seed)
    diffs = np.array([statistic(a[rng.integers(0, len(a), len(a))]) - statistic(b[rng.integers(0, len(b), len(b))])
                      for _ in range(n_resamples)])
    alpha = (1 - confidence) / 2
    low, high = np.quantile(diffs, [alpha, 1 - alpha])
    return Interval(float(statistic(a) - statistic(b)), float(low), float(high), len(a) + len(b))
