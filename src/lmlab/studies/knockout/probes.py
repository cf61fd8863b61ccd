"""S1 probes: one logistic regression per layer, class-balanced, with AUROC; detection with a mixture of probes.

The split is by group (question subject), so no question (or subject) is on both sides. The best
layer is chosen by cross-validated AUROC on the training split, never by the test split.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupShuffleSplit, StratifiedKFold, cross_val_predict
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from lmlab.stats import Interval, percentile_interval
from lmlab.studies.knockout.config import MIN_GROUP


def group_split(groups: list[str], test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train/test indices such that no group appears on both sides."""
    splitter = GroupShuffleSplit(n_splits=1, test_size=test_fraction, random_state=seed)
    train, test = next(splitter.split(np.zeros(len(groups)), groups=groups))
    return np.sort(train), np.sort(test)


def make_probe(seed: int, c: float = 0.05) -> Pipeline:
    return make_pipeline(StandardScaler(), LogisticRegression(C=c, class_weight="balanced", max_iter=3000,
                                                              random_state=seed))


def auroc(y: np.ndarray, score: np.ndarray) -> float:
    return float(roc_auc_score(y, score)) if len(set(np.asarray(y).tolist())) == 2 else float("nan")


def auroc_rows(y: np.ndarray, score: np.ndarray) -> np.ndarray:
    """AUROC of each row of (m, n) labels (0/1) and scores at once, from ranks (Mann-Whitney: the chance that a
    positive outscores a negative, ties counting one half, which is what roc_auc_score's trapezoids give); NaN
    for a row with one class."""
    from scipy.stats import rankdata

    y = np.asarray(y, dtype=bool)
    ranks = rankdata(np.asarray(score, dtype=float), axis=1)  # midranks for ties
    pos = y.sum(1)
    neg = y.shape[1] - pos
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (np.where(y, ranks, 0.0).sum(1) - pos * (pos + 1) / 2) / (pos * neg)
    return np.where((pos > 0) & (neg > 0), out, np.nan)


@dataclass
class LayerProbe:
    layer: int
    model: Pipeline
    cv_auroc: float
    test_auroc: float

    def p_true(self, features: np.ndarray) -> np.ndarray:
        """Probability of class 1 ("correct") for rows of features."""
        return self.model.predict_proba(np.atleast_2d(features))[:, 1]


PROBE_ARRAYS = ("mean", "scale", "var", "coef", "intercept", "samples")  # what probe_weights gives


def probe_weights(probe: LayerProbe) -> dict[str, np.ndarray]:
    """What a fitted probe computes with: its scaler's mean, scale and variance, and its logistic regression's
    coefficients and intercept (arrays, for a safetensors file)."""
    scaler, lr = probe.model.steps[0][1], probe.model.steps[1][1]
    return {"mean": scaler.mean_, "scale": scaler.scale_, "var": scaler.var_, "coef": lr.coef_,
            "intercept": lr.intercept_, "samples": np.atleast_1d(scaler.n_samples_seen_)}


def restored_probe(layer: int, weights: dict[str, np.ndarray], seed: int, cv_auroc: float,
                   test_auroc: float) -> LayerProbe:
    """A probe from `probe_weights`: the same pipeline with the fitted values set, so it scores as the fitted
    one did, to the last bit (a resumed run's probes are read back, not fit again)."""
    model = make_probe(seed)
    scaler, lr = model.steps[0][1], model.steps[1][1]
    scaler.mean_, scaler.scale_, scaler.var_ = weights["mean"], weights["scale"], weights["var"]
    scaler.n_samples_seen_ = weights["samples"].item()
    lr.coef_, lr.intercept_, lr.classes_ = weights["coef"], weights["intercept"], np.array([0, 1])
    scaler.n_features_in_ = lr.n_features_in_ = weights["coef"].shape[1]
    return LayerProbe(layer, model, cv_auroc, test_auroc)


def fit_layer_probes(features: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray, layers: list[int],
                     seed: int, folds: int = 5) -> list[LayerProbe]:
    """features: (n, n_layers_captured, d) in the order of `layers`; y: 0/1."""
    probes = []
    cv = StratifiedKFold(n_splits=min(folds, int(np.bincount(y[train]).min())), shuffle=True, random_state=seed)
    for j, layer in enumerate(layers):
        x = features[:, j]
        cv_scores = cross_val_predict(make_probe(seed), x[train], y[train], cv=cv, method="predict_proba")[:, 1]
        model = make_probe(seed).fit(x[train], y[train])
        probes.append(LayerProbe(layer, model, auroc(y[train], cv_scores), auroc(y[test], model.predict_proba(x[test])[:, 1])))
    return probes


def _auroc_interval(y, score, seed) -> Interval:
    y, score = np.asarray(y), np.asarray(score)
    idx = np.random.default_rng(seed).integers(0, len(y), (1000, len(y)))  # 1000 resamples
    stats = auroc_rows(y[idx], score[idx])
    # resamples with one class have no AUROC and are left out, which scipy's bootstrap cannot do
    return replace(percentile_interval(auroc(y, score), stats[~np.isnan(stats)]), n=len(y))


def detection_rows(x, y, train, test, groups, probe, best, seed, ids) -> list[dict]:
    """Hallucination detection on the test split: the single probe vs the gated mixture of two probes (one per
    pathway group, trained on the training split's samples of that group; `groups` is each sample's group). Returns
    one `detection` row per method (with a note where the mixture could not be trained) and one `detection_score` row
    per method and test sample (its score and label): the AUROC and its interval are the analysis's
    (`detection_summary`)."""
    groups = np.array(groups)
    rows = [dict(kind="detection", method="probe", layer=best, n_test=len(test))]
    rows += _scores("probe", best, test, y, probe.p_true(x[test]), ids)
    fits = {}
    for g in ("Q", "A"):
        idx = train[groups[train] == g]
        if len(idx) >= 2 * MIN_GROUP and len(set(y[idx].tolist())) == 2:
            fits[g] = make_probe(seed).fit(x[idx], y[idx])
    is_q = (groups[train] == "Q").astype(int)
    if len(fits) < 2 or len(set(is_q.tolist())) < 2:
        have = ", ".join(f"{g}: {int(((groups[train] == g) & (y[train] == 1)).sum())} correct / "
                         f"{int(((groups[train] == g) & (y[train] == 0)).sum())} incorrect" for g in ("Q", "A"))
        rows.append(dict(kind="detection", method="mixture of probes", layer=best, n_test=len(test),
                         note=f"not trained: each pathway group needs {2 * MIN_GROUP} training samples with both "
                              f"classes ({have})"))
        return rows
    gate = make_probe(seed).set_params(logisticregression=LogisticRegression(C=0.05, max_iter=3000)).fit(x[train], is_q)
    g = gate.predict_proba(x[test])[:, 1]
    mix = g * fits["Q"].predict_proba(x[test])[:, 1] + (1 - g) * fits["A"].predict_proba(x[test])[:, 1]
    rows.append(dict(kind="detection", method="mixture of probes", layer=best, n_test=len(test)))
    return rows + _scores("mixture of probes", best, test, y, mix, ids)


def _scores(method, best, test, y, score, ids) -> list[dict]:
    return [dict(kind="detection_score", method=method, layer=best, id=ids[i], correct=int(y[i]), score=float(s))
            for i, s in zip(test, score)]


def detection_summary(det, scores, seed: int = 0):
    """The detection table with each method's test AUROC and its bootstrap interval over the test samples, computed
    from the recorded scores (a run recorded before the scores were kept carries them already)."""
    import pandas as pd

    if det.empty or "auroc" in det or scores.empty:
        return det
    det = det.assign(replicate=det["replicate"] if "replicate" in det else 0,
                     probe_set=det["probe_set"] if "probe_set" in det else "all")
    scores = scores.assign(replicate=scores["replicate"] if "replicate" in scores else 0,
                           probe_set=scores["probe_set"] if "probe_set" in scores else "all")
    out = []
    for row in det.to_dict("records"):
        part = scores[(scores.replicate == row["replicate"]) & (scores.probe_set == row["probe_set"])
                      & (scores.method == row["method"])]
        if len(part):
            iv = _auroc_interval(part.correct.to_numpy(int), part.score.to_numpy(float), seed + int(row["replicate"]))
            row.update(auroc=iv.estimate, low=iv.low, high=iv.high)
        else:
            row.update(auroc=float("nan"), low=float("nan"), high=float("nan"))
        out.append(row)
    return pd.DataFrame(out)
