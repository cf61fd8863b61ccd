"""Sparse attention post-training (Draye et al.): fewest attention edges at the dense model's loss.

    minimise  expected edges / all causal edges        (sum of sigmoid(s_ij), differentiable)
    subject   CE <= tau                                 (tau = dense CE on the same data + slack)

`ce_fn(model, batch)` returns the CE, constrained by the fixed `tau`, or (CE, tau of this batch): the dense
model's CE on the same batch plus the slack, which removes the batch-to-batch spread of the text from the
constraint (the expectation is the same bound), or (CE, tau of this batch, tokens): the CE and its bound are
then token-weighted means, and several processes weigh each other's tokens alike.

Over several processes every term is the global batch's: the CE, its bound and the edges are reduced over
the processes (the CE and the edges as `loop.share`s, so DDP's average of the gradients is the global
batch's gradient), the multiplier moves on the global values, identically everywhere, and the gate's noise
is keyed per example; one process and N follow the same curve.

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
from lmlab.parallel import all_sum
from lmlab.train.loop import TrainConfig, TrainResult, share, train


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
    gate = SparseAttention(sample=True, keyed=True)  # noise per example, from its key (see the loop)
    history: list[dict] = []

    def loss_fn(m, batch):
        gate.reset()
        out = ce_fn(m, batch)
        out = out if isinstance(out, tuple) else (out, None)
        ce, bound, weight = (*out, 1.0) if len(out) == 2 else out  # weight: this batch's tokens (default: alike)
        paired = bound is not None
        tokens, ce_sum, bound_sum, expected, total, kept, fallback, queries = all_sum(  # one reduction a step
            [weight, float(ce.detach()) * weight, (bound if paired else 0.0) * weight, gate.expected_edges.detach(),
             gate.total_edges, gate.kept_edges, gate.fallback_edges, gate.queries])
        ce_part = share(ce * weight, weight, tokens)  # mean over processes: the global batch's CE
        edges_part = share(gate.expected_edges, gate.total_edges, total)
        ce_value, bound = ce_sum / tokens, (bound_sum / tokens if paired else None)
        loss = geco.loss(edges_part, ce_part, bound)
        geco.update(ce_value, bound)
        history.append({"step": geco.steps, "expected_edges": expected / max(total, 1.0),
                        "kept_edges": kept / max(total, 1.0), "fallback": fallback / max(queries, 1.0)})
        return loss

    with intervene(model, gate):
        result = train(model, dataset, collate, loss_fn, config, out_dir, state=_Checkpointed(geco, history))
    return SparseTraining(result, geco, history)
