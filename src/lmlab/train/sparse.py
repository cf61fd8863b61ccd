"""Sparse attention post-training (Draye et al.): fewest attention edges at the dense model's loss.

    minimise  expected edges / all causal edges        (sum of sigmoid(s_ij), differentiable)
    subject   CE <= tau                                 (tau = dense CE on the same data + slack)

`ce_fn(model, batch)` returns the CE, constrained by the fixed `tau`, or (CE, tau of this batch): the dense
model's CE on the same batch plus the slack, which removes the batch-to-batch spread of the text from the
constraint (the expectation is the same bound).

with the edge gate of `interventions.SparseAttention` (binary-concrete straight-through samples during
training; deterministic s_ij > 0 afterwards) on every layer and a GECO multiplier (`train.geco`). It
runs on the foundation's loop, so it checkpoints (weights, optimizer, RNG and the multiplier) and
resumes; a NaN loss stops with the last good checkpoint named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from lmlab.interventions import SparseAttention, intervene
from lmlab.train.geco import GECO
from lmlab.train.loop import TrainConfig, TrainResult, train


@dataclass
class SparseTraining:
    result: TrainResult
    geco: GECO  # its trace: (CE, bound, moving average, lambda) per step
    history: list[dict] = field(default_factory=list)  # per step: step, expected_edges, kept_edges, fallback


@dataclass
class _Checkpointed:
    """What a checkpoint carries besides the weights: the multiplier and the per-step edge record, so a
    resumed run continues exactly and its record is whole."""
    geco: GECO
    history: list[dict]

    def state_dict(self) -> dict:
        return {"geco": self.geco.state_dict(), "history": self.history}

    def load_state_dict(self, state: dict) -> None:
        self.geco.load_state_dict(state["geco"])
        self.history[:] = state["history"]


def sparse_post_train(model, dataset, collate, ce_fn: Callable[[torch.nn.Module, dict], torch.Tensor], tau: float,
                      config: TrainConfig, out_dir: str | Path, rate: float = 0.05, alpha: float = 0.9,
                      initial_multiplier: float = 1.0) -> SparseTraining:
    geco = GECO(tau, rate=rate, alpha=alpha, initial=initial_multiplier)
    gate = SparseAttention(sample=True)  # noise from torch's global generator, which checkpoints save
    history: list[dict] = []

    def loss_fn(m, batch):
        gate.reset()
        out = ce_fn(m, batch)
        ce, bound = out if isinstance(out, tuple) else (out, None)  # (CE, this batch's tau) or CE against `tau`
        edges = gate.expected_edges / max(gate.total_edges, 1.0)
        loss = geco.loss(edges, ce, bound)
        geco.update(float(ce.detach()), bound)
        history.append({"step": geco.steps, "expected_edges": float(edges.detach()), "kept_edges": gate.kept_fraction,
                        "fallback": gate.fallback_edges / max(gate.queries, 1.0)})
        return loss

    with intervene(model, gate):
        result = train(model, dataset, collate, loss_fn, config, out_dir, state=_Checkpointed(geco, history))
    return SparseTraining(result, geco, history)
