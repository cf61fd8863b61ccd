"""Linear probes on hidden states: one logistic regression per layer, class-balanced, with AUROC.

The split is by group (question subject), so no question (or subject) is on both sides. The best
layer is chosen by cross-validated AUROC on the training split, never by the test split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupShuffleSplit, StratifiedKFold, cross_val_predict
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler


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


@dataclass
class LayerProbe:
    layer: int
    model: Pipeline
    cv_auroc: float
    test_auroc: float

    def p_true(self, features: np.ndarray) -> np.ndarray:
        """Probability of class 1 ("correct") for rows of features."""
        return self.model.predict_proba(np.atleast_2d(features))[:, 1]


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
