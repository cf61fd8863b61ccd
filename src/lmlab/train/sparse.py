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
    rollbacks: list[int] = field(default_factory=list)  # per replicate: how often it returned to a saved state

    @property
    def geco(self) -> GECO:
        """The one model's multiplier (replicate 0 of a stacked model)."""
        return self.gecos[0]

    @property
    def history(self) -> list[dict]:
        return self.histories[0]


class Rollback:
    """Recovery from a spike: each replicate's last state within its bound (its weights and AdamW moments, taken
    every `every` steps while the constraint's moving average holds); once that average goes `threshold` over the
    bound, the replicate returns to that state, its moving average to the one it had there, and its multiplier
    doubles, so the edge term that cost it the constraint pushes half as hard on the way back down.

    Why: the edge term sometimes prunes an edge the model needs; its CE then jumps over the bound, the multiplier (its
    update clipped) takes hundreds of steps to climb, and by then the decayed learning rate can no longer relearn
    what was lost. Returning to the last state within
    bound undoes the spike in one step. A stacked model of k replicates (lmlab.train.ensemble) holds replicate r at
    index r of every weight's leading dimension; the others are left as they are.

    A drift as well (`window` steps, 0: off): a replicate whose CE stayed over its bound by more than `tolerance` on
    average over its last `window` steps (since its last return) returns the same way. A drift under the spike's
    threshold, held to the end, fails the gate that reads the last quarter's mean (a small excess that the
    multiplier, climbing too slowly under a decayed learning rate, does not remove in time)."""

    def __init__(self, k: int, threshold: float, every: int = 10, window: int = 0, tolerance: float = 0.0):
        self.k, self.threshold, self.every = k, float(threshold), max(int(every), 1)
        self.window, self.tolerance = max(int(window), 0), float(tolerance)
        self.saved: dict[int, dict[str, torch.Tensor]] = {}  # replicate -> "param|weight" / "param|exp_avg" ...
        self.meta: dict[int, dict] = {}  # replicate -> {"step", "ema"} of its saved state
        self.count = [0] * k
        self.since = [0] * k  # per replicate: the trace's length at its last return (a drift is read after it)

    def _drift(self, r: int, geco: GECO) -> bool:
        n = len(geco.trace)
        if not self.window or n - self.since[r] < self.window:
            return False
        tail = geco.trace[n - self.window:]
        return sum(ce - bound for ce, bound, _, _ in tail) / self.window > self.tolerance

    def _slots(self, model, optimizer):
        """(name, tensor) of every weight and optimizer moment, replicate r's part at [r] (k > 1)."""
        state = getattr(optimizer, "optimizer", optimizer).state
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            yield f"{name}|weight", param
            for key, value in state.get(param, {}).items():
                if torch.is_tensor(value) and value.shape == param.shape:
                    yield f"{name}|{key}", value

    def _part(self, tensor: torch.Tensor, r: int) -> torch.Tensor:
        return tensor[r] if self.k > 1 else tensor

    @torch.no_grad()
    def __call__(self, step: int, model, optimizer, gecos: list[GECO], histories: list[list[dict]]) -> None:
        for r, geco in enumerate(gecos):
            if r in self.saved and ((geco.ema is not None and geco.ema > self.threshold) or self._drift(r, geco)):
                for name, tensor in self._slots(model, optimizer):
                    if name in self.saved[r]:
                        self._part(tensor, r).copy_(self.saved[r][name].to(tensor.device, tensor.dtype))
                geco.ema = self.meta[r]["ema"]
                geco.multiplier = min(2.0 * geco.multiplier, geco.bounds[1])
                self.count[r] += 1
                self.since[r] = len(geco.trace)
                if histories[r]:
                    histories[r][-1]["rollback_to"] = self.meta[r]["step"]
            elif geco.holds and (step + 1) % self.every == 0:
                self.saved[r] = {name: self._part(tensor, r).detach().clone()
                                 for name, tensor in self._slots(model, optimizer)}
                self.meta[r] = {"step": step + 1, "ema": geco.ema}

    def state_dict(self) -> dict:
        return {"meta": {str(r): m for r, m in self.meta.items()}, "count": self.count, "since": self.since}

    def load_state_dict(self, state: dict) -> None:
        self.meta = {int(r): m for r, m in state.get("meta", {}).items()}
        self.count = list(state.get("count", [0] * self.k))
        self.since = list(state.get("since", [0] * self.k))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"{r}|{name}": t for r, saved in self.saved.items() for name, t in saved.items()}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.saved = {}
        for key, value in tensors.items():
            r, _, name = key.partition("|")
            self.saved.setdefault(int(r), {})[name] = value


@dataclass
class _Checkpointed:
    """What a checkpoint carries besides the weights: the multipliers, the per-step edge records and the rollback's
    saved states, so a resumed run continues exactly and its record is whole."""
    gecos: list[GECO]
    histories: list[list[dict]]
    rollback: Rollback | None = None

    def state_dict(self) -> dict:
        if len(self.gecos) == 1:  # the one-model layout of earlier runs
            state = {"geco": self.gecos[0].state_dict(), "history": self.histories[0]}
        else:
            state = {"gecos": [g.state_dict() for g in self.gecos], "histories": self.histories}
        return {**state, "rollback": self.rollback.state_dict()} if self.rollback else state

    def load_state_dict(self, state: dict) -> None:
        gecos = state.get("gecos") or [state["geco"]]
        histories = state.get("histories") or [state["history"]]
        for geco, saved in zip(self.gecos, gecos):
            geco.load_state_dict(saved)
        for history, saved in zip(self.histories, histories):
            history[:] = saved
        if self.rollback and state.get("rollback"):
            self.rollback.load_state_dict(state["rollback"])

    def tensors(self) -> dict[str, torch.Tensor]:
        return self.rollback.tensors() if self.rollback else {}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.rollback:
            self.rollback.load_tensors(tensors)


def sparse_post_train(model, dataset, collate, ce_fn: Callable[[torch.nn.Module, dict], torch.Tensor],
                      tau: float | Sequence[float], config: TrainConfig, out_dir: str | Path, rate: float = 0.05,
                      alpha: float = 0.9, initial_multiplier: float = 1.0, clip: float | None = None,
                      rollback: float | None = None, rollback_every: int = 10, drift: tuple[int, float] = (0, 0.0),
                      edge_weight: float = 1.0) -> SparseTraining:
    """A stacked model of k replicates (lmlab.train.ensemble, `config.replicate_seeds`) post-trains each replicate
    with its own multiplier: `ce_fn` then returns k CEs (and k bounds, k token counts), and `tau` may give each
    replicate its own bound. `rollback` (nats; None: never): a replicate whose constraint's moving average goes that
    far over its bound returns to its last state within bound (`Rollback`); a step that did so names the step it
    returned to (`rollback_to`) in its history; its states are saved every `rollback_every` steps. `drift` (steps,
    nats): with a rollback, a replicate over its bound by more than the nats on average over that many steps returns
    too. `edge_weight`: the weight of the edge term in the objective (0: a placebo, the same loop, gates and
    multiplier with nothing pushing the edges down; the edges are still counted)."""
    k = replicas(model)
    taus = [float(t) for t in tau] if isinstance(tau, (list, tuple)) else [float(tau)] * k
    gecos = [GECO(t, rate=rate, alpha=alpha, initial=initial_multiplier, clip=clip) for t in taus]
    gate = SparseAttention(sample=True, keyed=True, replicas=k)  # noise per example, from its key (see the loop)
    histories: list[list[dict]] = [[] for _ in range(k)]

    loss_fn = _sparse_loss(ce_fn, gate, gecos, histories, edge_weight)
    back = Rollback(k, rollback, rollback_every, *drift) if rollback is not None else None
    after = (lambda step, m, opt: back(step, m, opt, gecos, histories)) if back else None
    with intervene(model, gate):
        result = train(model, dataset, collate, loss_fn, config, out_dir, state=_Checkpointed(gecos, histories, back),
                       after_update=after)
    return SparseTraining(result, gecos, histories, back.count if back else [0] * k)


def _per_replicate(value, default: float, k: int) -> torch.Tensor:
    """`value` (a number, a tensor, or None for `default`) as k float64 values on the host, whatever the default
    device."""
    value = default if value is None else value
    if torch.is_tensor(value):
        return value.detach().to("cpu", torch.float64).reshape(-1).expand(k)
    return torch.tensor(value, dtype=torch.float64, device="cpu").reshape(-1).expand(k)


def _sparse_loss(ce_fn, gate, gecos: list, histories: list[list[dict]], edge_weight: float):
    """The training loss of `sparse_post_train`: per replicate, GECO's Lagrangian of the edge term (weighted by
    `edge_weight`) under the CE constraint, each process's share of the global batch's mean; every step's edges
    and multipliers appended to `histories` (one reduction over the processes a step)."""
    k = len(gecos)

    def loss_fn(m, batch):
        gate.reset()
        out = ce_fn(m, batch)
        out = out if isinstance(out, tuple) else (out, None)
        ce, bound, weight = (*out, None) if len(out) == 2 else out  # weight: this batch's tokens (default: alike)
        ce = ce.reshape(-1)
        paired = bound is not None
        w, b = _per_replicate(weight, 1.0, k), _per_replicate(bound, 0.0, k)
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
            losses.append(geco.loss(edge_weight * edges_part[r], ce_part[r], bound_r))
            geco.update(float(ce_sum[r] / tokens[r]), bound_r)
            histories[r].append({"step": geco.steps, "expected_edges": float(expected[r] / max(total[r], 1.0)),
                                 "kept_edges": float(kept[r] / max(total[r], 1.0)),
                                 "fallback": float(fallback[r] / max(queries[r], 1.0))})
        return torch.stack(losses)

    return loss_fn


def qk_scale(scale: float) -> dict[str, float]:
    """TrainConfig.lr_scale for the query and key projections (Llama/Gemma names), which alone feed the gate's
    scores; GPT-NeoX and GPT-2 fuse q, k and v in one matrix, which then takes the multiplier whole."""
    if scale == 1.0:
        return {}
    return {name: scale for name in ("q_proj", "k_proj", "query_key_value", "c_attn")}
