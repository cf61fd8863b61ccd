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
from typing import Callable, Sequence

import torch

from lmlab.interventions import SparseAttention, intervene
from lmlab.parallel import all_sum, group_size
from lmlab.train.ensemble import replicas
from lmlab.train.geco import GECO
from lmlab.train.loop import TrainConfig, TrainResult, train


@dataclass
class SparseTraining:
    result: TrainResult
    gecos: list[GECO]  # one per replicate; each trace: (CE, bound, moving average, lambda) per step
    histories: list[list[dict]] = field(default_factory=list)  # per replicate, per step: step, expected_edges, ...

    @property
    def geco(self) -> GECO:
        """The one model's multiplier (replicate 0 of a stacked model)."""
        return self.gecos[0]

    @property
    def history(self) -> list[dict]:
        return self.histories[0]


@dataclass
class _Checkpointed:
    """What a checkpoint carries besides the weights: the multipliers and the per-step edge records, so a
    resumed run continues exactly and its record is whole."""
    gecos: list[GECO]
    histories: list[list[dict]]

    def state_dict(self) -> dict:
        if len(self.gecos) == 1:  # the one-model layout of earlier runs
            return {"geco": self.gecos[0].state_dict(), "history": self.histories[0]}
        return {"gecos": [g.state_dict() for g in self.gecos], "histories": self.histories}

    def load_state_dict(self, state: dict) -> None:
        gecos = state.get("gecos") or [state["geco"]]
        histories = state.get("histories") or [state["history"]]
        for geco, saved in zip(self.gecos, gecos):
            geco.load_state_dict(saved)
        for history, saved in zip(self.histories, histories):
            history[:] = saved


def sparse_post_train(model, dataset, collate, ce_fn: Callable[[torch.nn.Module, dict], torch.Tensor],
                      tau: float | Sequence[float], config: TrainConfig, out_dir: str | Path, rate: float = 0.05,
                      alpha: float = 0.9, initial_multiplier: float = 1.0, clip: float | None = None) -> SparseTraining:
    """A stacked model of k replicates (lmlab.train.ensemble, `config.replicate_seeds`) post-trains each replicate
    with its own multiplier: `ce_fn` then returns k CEs (and k bounds, k token counts), and `tau` may give each
    replicate its own bound."""
    k = replicas(model)
    taus = [float(t) for t in tau] if isinstance(tau, (list, tuple)) else [float(tau)] * k
    gecos = [GECO(t, rate=rate, alpha=alpha, initial=initial_multiplier, clip=clip) for t in taus]
    gate = SparseAttention(sample=True, keyed=True, replicas=k)  # noise per example, from its key (see the loop)
    histories: list[list[dict]] = [[] for _ in range(k)]

    def vector(value, default: float) -> torch.Tensor:  # on the host, whatever the default device
        value = default if value is None else value
        if torch.is_tensor(value):
            return value.detach().to("cpu", torch.float64).reshape(-1).expand(k)
        return torch.tensor(value, dtype=torch.float64, device="cpu").reshape(-1).expand(k)

    def loss_fn(m, batch):
        gate.reset()
        out = ce_fn(m, batch)
        out = out if isinstance(out, tuple) else (out, None)
        ce, bound, weight = (*out, None) if len(out) == 2 else out  # weight: this batch's tokens (default: alike)
        ce = ce.reshape(-1)
        paired = bound is not None
        w, b = vector(weight, 1.0), vector(bound, 0.0)
        local = torch.stack([w, ce.detach().double().cpu() * w, b * w, gate.expected_per.detach().double().cpu(),
                             gate.total_per, gate.kept_per, gate.fallback_per, gate.queries_per])
        summed = torch.tensor(all_sum(local.reshape(-1).tolist()), dtype=torch.float64, device="cpu").reshape(8, k)
        tokens, ce_sum, bound_sum, expected, total, kept, fallback, queries = summed  # one reduction a step
        n = group_size()
        # each process's share of the global batch's mean (their mean over processes, DDP's average, is it)
        ce_part = ce * (w * n / tokens.clamp_min(1e-12)).to(ce)
        edges_part = gate.expected_per * (n / total.clamp_min(1.0)).to(gate.expected_per)
        losses = []
        for r, geco in enumerate(gecos):
            bound_r = float(bound_sum[r] / tokens[r]) if paired else None
            losses.append(geco.loss(edges_part[r], ce_part[r], bound_r))
            geco.update(float(ce_sum[r] / tokens[r]), bound_r)
            histories[r].append({"step": geco.steps, "expected_edges": float(expected[r] / max(total[r], 1.0)),
                                 "kept_edges": float(kept[r] / max(total[r], 1.0)),
                                 "fallback": float(fallback[r] / max(queries[r], 1.0))})
        return torch.stack(losses)

    with intervene(model, gate):
        result = train(model, dataset, collate, loss_fn, config, out_dir, state=_Checkpointed(gecos, histories))
    return SparseTraining(result, gecos, histories)


def qk_scale(scale: float) -> dict[str, float]:
    """TrainConfig.lr_scale for the query and key projections (Llama/Gemma names), which alone feed the gate's
    scores; GPT-NeoX and GPT-2 fuse q, k and v in one matrix, which then takes the multiplier whole."""
    if scale == 1.0:
        return {}
    return {name: scale for name in ("q_proj", "k_proj", "query_key_value", "c_attn")}
