"""Intervals over two levels of replication: a run's replicates (independent training runs or random draws, each
seeded by `replicate_seed` from the run's --seed) and its items (test problems, questions, prompt pairs), as the
claims of lmlab.claims.

Interval (`Resampler.claim`): with k replicates and n items,
    se^2 = se_seed^2 + se_item^2
    se_seed^2 = var_r(stat_r) / k                            (between replicates, k - 1 degrees of freedom)
    se_item^2 = var_b(mean_r stat_r(items drawn b)) over item resamples, the same draws for every statistic
and a t interval with Welch-Satterthwaite degrees of freedom combining k - 1 and n - 1. With k = 3 a bootstrap
over replicates has 10 distinct draws and under-covers; the t quantile at 2 degrees of freedom
(4.30) is what makes three replicates honest. Where items are shared by every replicate (the same test set), the
item variance is the shared part and the between-replicate variance adds the rest; the sum slightly
double-counts the replicate-by-item interaction (conservative). One replicate: the item level alone, said in the
claim's method, and a study that trains adds a gate (one training run cannot decide a claim about a method).
"""

from __future__ import annotations

import zlib
from typing import Callable, Sequence

import numpy as np

from lmlab.claims import Bar, Claim, interval_parts


def replicate_seed(seed: int, replicate: int) -> int:
    """The seed of replicate r of a run seeded `seed`: a hash, so runs at --seed 0 and --seed 1 share no replicate."""
    return zlib.crc32(f"lmlab|{int(seed)}|replicate|{int(replicate)}".encode()) & 0x7FFFFFFF


class Resampler:
    """Item resamples drawn once per verdict (every statistic sees the same draws, so paired comparisons stay
    paired), and the two-level interval of a statistic computed per replicate.

    `n_items`: the items every replicate shares (the same test set); `stat(r, idx)` returns replicate r's statistic
    on the items `idx` (an index array into 0..n_items-1, with repeats)."""

    def __init__(self, n_items: int, replicates: int, n_boot: int = 1000, seed: int = 0,
                 strata: Sequence[int] | None = None, shared: bool = True):
        """`strata`: sizes of consecutive groups of items (tasks) each resampled within itself, so every draw keeps
        each group's size (their sum is n_items). `shared`: every replicate reads the same items; False where each
        draws its own n_items (item i of one replicate unrelated to item i of another: the same resample indices are
        then independent draws of each; `claims.interval_parts` says how the interval reads them)."""
        self.n, self.k, self.n_boot, self.shared = int(n_items), max(int(replicates), 1), n_boot, shared
        rng = np.random.default_rng(seed)
        sizes = list(strata) if strata else [self.n]
        if sum(sizes) != self.n:
            raise ValueError(f"strata {sizes} do not add up to {self.n} items")
        offsets = np.concatenate([[0], np.cumsum(sizes)])[:-1]
        parts = [o + rng.integers(0, max(size, 1), (n_boot, size)) for o, size in zip(offsets, sizes) if size]
        self.draws = np.concatenate(parts, axis=1) if parts else np.zeros((n_boot, 0), int)
        self.everything = np.arange(self.n)
        self._counts: np.ndarray | None = None

    def claim(self, name: str, stat: Callable[[int, np.ndarray], float], bar: Bar, **kwargs) -> Claim:
        per = np.array([stat(r, self.everything) for r in range(self.k)], dtype=float)
        boot = np.array([_mean_of_finite([stat(r, idx) for r in range(self.k)]) for idx in self.draws], dtype=float)
        return self.combine(name, per, boot, bar, **kwargs)

    def counts(self) -> np.ndarray:
        """Each resample as item counts: (n_boot, n_items), row b = how often draw b took each item."""
        if self._counts is None:
            self._counts = np.stack([np.bincount(d, minlength=self.n) for d in self.draws]).astype(float) \
                if len(self.draws) else np.zeros((0, self.n))
        return self._counts

    def weighted_claim(self, name: str, stat: Callable[[int, np.ndarray], np.ndarray], bar: Bar, **kwargs) -> Claim:
        """`claim` for a statistic computed for many resamples at once: `stat(r, W)` is replicate r's statistic under
        each row of item weights W (m, n_items) -> (m,), where a resample's weights are its items' counts and the
        whole test set is a row of ones. The same draws and the same result as `claim` with the loop."""
        per = np.array([np.asarray(stat(r, np.ones((1, self.n))), dtype=float)[0] for r in range(self.k)])
        vals = np.stack([np.asarray(stat(r, self.counts()), dtype=float) for r in range(self.k)], axis=1)
        finite = np.isfinite(vals)
        boot = np.where(finite.any(1), np.where(finite, vals, 0.0).sum(1) / np.maximum(finite.sum(1), 1), np.nan)
        return self.combine(name, per, boot, bar, **kwargs)

    def mean_claim(self, name: str, values: np.ndarray, bar: Bar, **kwargs) -> Claim:
        """A per-item mean: `values` (replicates, items), NaN for an item a replicate lacks; vectorised."""
        values = np.atleast_2d(np.asarray(values, dtype=float))
        ok = np.isfinite(values)
        x = np.where(ok, values, 0.0)
        per = np.where(ok.any(1), x.sum(1) / np.maximum(ok.sum(1), 1), np.nan)  # NaN: a replicate without items
        counts = self.counts()  # (boot, items)
        num = counts @ x.T  # (boot, replicates)
        den = counts @ ok.T.astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = num / den
        finite = np.isfinite(ratio)
        boot = np.where(finite.any(1), np.where(finite, ratio, 0.0).sum(1) / np.maximum(finite.sum(1), 1), np.nan)
        return self.combine(name, per, boot, bar, **kwargs)

    def combine(self, name: str, per: np.ndarray, boot: np.ndarray, bar: Bar, **kwargs) -> Claim:
        boot = boot[np.isfinite(boot)]
        se_item = float(np.std(boot, ddof=1)) if len(boot) > 1 else float("nan")
        parts = interval_parts(per, se_item, self.n, self.shared)
        method = kwargs.pop("method", parts.pop("method"))
        return Claim(name=name, bar=bar, method=method, n=self.n, **parts, **kwargs)


def _mean_of_finite(values) -> float:
    """The mean of the finite values (NaN when none is: a resample without a defined statistic)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else float("nan")
