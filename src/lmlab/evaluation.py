"""Measurements two studies share (no study imports another study's code): task metrics on a model's
outputs, per-sequence causal-LM cross-entropy, and per-prompt circuit-task metrics."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch
from scipy.stats import pearsonr
from sklearn.metrics import f1_score, matthews_corrcoef

from lmlab.data.generated.circuits import CircuitTask, task_metric
from lmlab.interventions import SparseAttention, installed, intervene
from lmlab.models import LoadedModel


def metric_value(metric: str, labels: np.ndarray, preds: np.ndarray) -> float:
    if metric == "pearson":
        return float(pearsonr(preds, labels)[0]) if np.std(preds) > 0 else 0.0
    if metric == "matthews":
        return float(matthews_corrcoef(labels.astype(int), preds.astype(int)))
    if metric == "f1":
        return float(f1_score(labels.astype(int), preds.astype(int)))
    return float((labels == preds).mean())


def majority_score(metric: str, labels: np.ndarray) -> float:
    """The score, in points, of predicting the most common label for every example (the smallest where several tie):
    what a classifier that learned nothing of the inputs reaches."""
    values, counts = np.unique(labels, return_counts=True)
    return 100 * metric_value(metric, labels, np.full(len(labels), values[np.argmax(counts)]))


def causal_lm_ce(model, batches, interventions=()) -> tuple[list[float], float]:
    """Per-sequence mean next-token CE (and the edge fraction kept, if a gate is among `interventions`)."""
    per_seq, counts = causal_lm_ce_edges(model, batches, interventions)
    return per_seq, (counts["kept"] / max(counts["total"], 1.0) if counts else 1.0)


@torch.no_grad()
def causal_lm_ce_edges(model, batches, interventions=()) -> tuple[list[float], dict]:
    """Per-sequence mean next-token CE and, with a sparse gate installed or among `interventions`, its edge
    counts over every batch: kept (self-edge fallback not counted), fallback, queries, total (causal pairs).
    Padded query rows count as queries with edges: pass unpadded batches (one sequence, or equal lengths)."""
    per_seq: list[float] = []
    gates = [iv for iv in (*interventions, *installed(model)) if isinstance(iv, SparseAttention)]
    for gate in gates:
        gate.reset()
    with intervene(model, *interventions) if interventions else nullcontext():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                           position_ids=batch.get("position_ids")).logits[:, :-1].float()
            labels = batch["labels"][:, 1:]
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100,
                                                     reduction="none")
            counts = (labels != -100).sum(-1).clamp_min(1)
            per_seq.extend((loss.sum(-1) / counts).tolist())
    if not gates:
        return per_seq, {}
    g = gates[0]
    return per_seq, {"kept": g.kept_edges, "fallback": g.fallback_edges, "queries": g.queries, "total": g.total_edges}


def circuit_batches(task: CircuitTask, batch_size: int):
    for start in range(0, len(task), batch_size):
        yield task.prompts[start:start + batch_size]


def _encode(lm: LoadedModel, prompts, corrupted: bool) -> dict:
    return lm.pad_batch([list(p.corrupted if corrupted else p.clean) for p in prompts])


def encode_pairs(lm: LoadedModel, prompts, corrupted: bool) -> dict:
    """A batch of a circuit task's clean (or corrupted) prompts, on the model's device."""
    return lm.pad_batch([list(p.corrupted if corrupted else p.clean) for p in prompts])


@torch.no_grad()
def metric_values(lm: LoadedModel, task: CircuitTask, batch_size: int = 16, corrupted: bool = False,
                  interventions_for=None) -> np.ndarray:
    """Per-prompt metric; `interventions_for(prompts, start)` may return interventions for that batch."""
    out = []
    for i, prompts in enumerate(circuit_batches(task, batch_size)):
        batch = encode_pairs(lm, prompts, corrupted)
        extra = interventions_for(i) if interventions_for else ()
        with intervene(lm, *extra) if extra else nullcontext():
            out.append(task_metric(lm.last_logits(batch), prompts, task.metric).float().cpu())
    return torch.cat(out).numpy()
