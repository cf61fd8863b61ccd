"""How far two circuits agree: the top-k heads of per-prompt attribution scores (lmlab.circuits) under weights on the
prompt pairs, their Jaccard overlap, the overlap of one model's halves of the prompt pairs (split-half), a variant's
against its original's like for like on the same half-splits, the rank correlation over the union of top-k, and the
overlap two random k-sets reach by chance."""

from __future__ import annotations

import numpy as np

SPLITS = 200  # random half-splits for a point estimate (R, V, the curves over k)


def top_masks(per: np.ndarray, weights: np.ndarray, k: int) -> np.ndarray:
    """(draws, heads) bool: each draw's top-k heads by |weighted mean score| (`weights`: (draws, prompts)); a head
    without scores (NaN: a hybrid's layer without softmax attention) is never among them."""
    scored = ~np.isnan(per).any(0)
    if scored.all():
        means = np.abs(weights @ per)
    else:
        means = np.where(scored, np.abs(weights @ np.where(scored, per, 0.0)), -np.inf)
    k = max(1, min(k, int(scored.sum()) or per.shape[1]))
    idx = np.argpartition(-means, k - 1, axis=1)[:, :k]
    mask = np.zeros(means.shape, dtype=bool)
    np.put_along_axis(mask, idx, True, axis=1)
    return mask


def scored_heads(per: np.ndarray) -> int:
    """The heads per-prompt scores (prompts, heads) rank: all but a hybrid's heads without scores (NaN: its layers
    that hold no softmax attention), the N of chance's k / (2N - k)."""
    return int((~np.isnan(per).any(0)).sum())


def jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    inter, union = (a & b).sum(-1), (a | b).sum(-1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def spearman_union(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Spearman's rho of two mean-score vectors over the union of their top-k heads (by |score|)."""
    from scipy.stats import spearmanr

    ones = np.ones((1, 1))
    union = top_masks(x[None], ones, k)[0] | top_masks(y[None], ones, k)[0]
    a, b = x[union], y[union]
    if union.sum() < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b)[0])


def half_splits(n: int, splits: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(splits, n) 0/1 weights of two disjoint halves of the prompt pairs per random split (n odd: one pair is left
    out of each split); the same seed, the same splits."""
    rng = np.random.default_rng(seed)
    half = n // 2
    w_a, w_b = np.zeros((splits, n)), np.zeros((splits, n))
    for s in range(splits):
        perm = rng.permutation(n)
        w_a[s, perm[:half]], w_b[s, perm[half:2 * half]] = 1.0, 1.0
    return w_a, w_b


def self_overlap(per: np.ndarray, k: int, seed: int, splits: int = SPLITS) -> np.ndarray:
    """The original's top-k on one half of the prompt pairs against its top-k on the other half, per random split."""
    w_a, w_b = half_splits(per.shape[0], splits, seed)
    return jaccard(top_masks(per, w_a, k), top_masks(per, w_b, k))


def split_overlaps(a: np.ndarray, others: list[np.ndarray], weights: np.ndarray, k: int, w_a: np.ndarray,
                   w_b: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Like for like, on the same half-splits (w_a, w_b: (splits, n)) of the prompt pairs under each row of item
    weights (m, n) (a resample's counts; a row of ones: the prompt pairs as they are): R (m,), the original `a`'s
    top-k on one half against its top-k on the other, and for each of `others` V (m,), its top-k on one half against
    the original's on the other, both ways; each the mean over the splits. A split one of whose halves a resample
    left empty counts for neither (NaN where every split did)."""
    m, splits = weights.shape[0], w_a.shape[0]
    r_sum, r_n = np.zeros(m), np.zeros(m)
    v_sum = [np.zeros(m) for _ in others]
    step = max(1, 8192 // max(m, 1))  # splits per pass: at most about 8k rows of weights at once
    for first in range(0, splits, step):
        part_a, part_b = w_a[first:first + step], w_b[first:first + step]
        wa = (weights[None] * part_a[:, None]).reshape(-1, weights.shape[1])  # (splits x m, n), split-major
        wb = (weights[None] * part_b[:, None]).reshape(-1, weights.shape[1])
        ok = ((wa.sum(1) > 0) & (wb.sum(1) > 0)).reshape(-1, m)
        o_a, o_b = top_masks(a, wa, k), top_masks(a, wb, k)
        r_sum += np.where(ok, jaccard(o_a, o_b).reshape(-1, m), 0.0).sum(0)
        r_n += ok.sum(0)
        for i, b in enumerate(others):
            both = 0.5 * (jaccard(top_masks(b, wa, k), o_b) + jaccard(top_masks(b, wb, k), o_a))
            v_sum[i] += np.where(ok, both.reshape(-1, m), 0.0).sum(0)
    def mean(total):
        return np.where(r_n > 0, total / np.maximum(r_n, 1), np.nan)
    return mean(r_sum), [mean(v) for v in v_sum]


def chance(k: int, total: int) -> float:
    """The expected Jaccard of two random k-sets of `total` heads (k^2/N shared of 2k - k^2/N)."""
    k = min(k, total)
    return float(k / (2 * total - k)) if total else float("nan")
