"""k independently initialised replicates of one small model, trained as one ("stacked weights").

A study that trains a small model from scratch (the latent study's scratch model, the sparse-circuits study's
addition toy) answers a claim about its *training method*, so it trains k replicates, each from its own seed. On
such models a step is mostly per-call overhead (Python, one small kernel after another), so k models one after the
other cost about k times one; the same k models as one module whose every weight has a leading replicate dimension
cost little more than one.

`stack(models)` returns a copy of the first model in which every `nn.Linear`, `nn.Embedding` and RMSNorm holds
the k models' weights stacked (k, ...), under the same parameter names. Its batch is k blocks of rows, replicate
r's rows at [r*B, (r+1)*B): each linear layer multiplies block r by replicate r's weights (one batched matmul),
and everything without weights (attention and its interventions, rotary embeddings, the masks, `generate`) runs
on the k*B rows unchanged. Nothing mixes rows of different replicates, so replicate r computes what model r
alone computes on its rows, to float rounding (tests check it against each model trained alone).

The training loop (`lmlab.train.train`) trains a stacked model when its TrainConfig names one seed per replicate
(`replicate_seeds`): each replicate draws its own batches from its own seed, the loss function returns one loss
per replicate, and gradient clipping is per replicate. `member(stacked, r)` and `unstack` give a replicate back
as an ordinary model or state dict.

Supported: Llama-architecture models built from a config (lmlab's scratch models). Anything else with weights
is refused in one sentence.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn

from lmlab.errors import LmlabError

REPLICAS = "_lmlab_replicas"


class StackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (k, out, in)
        self.bias = nn.Parameter(bias) if bias is not None else None  # (k, out)

    @property
    def replicas(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.replicas
        shape = x.shape
        flat = x.reshape(k, -1, shape[-1])  # block r: replicate r's rows
        out = torch.bmm(flat, self.weight.transpose(1, 2).to(flat.dtype))
        if self.bias is not None:
            out = out + self.bias[:, None, :].to(out.dtype)
        return out.reshape(*shape[:-1], out.shape[-1])


class StackedEmbedding(nn.Module):
    def __init__(self, weight: torch.Tensor, padding_idx: int | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (k, vocab, dim)
        self.padding_idx = padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        k, vocab, dim = self.weight.shape
        offsets = torch.arange(k, device=ids.device)[:, None] * vocab
        flat = ids.reshape(k, -1) + offsets
        return nn.functional.embedding(flat, self.weight.reshape(k * vocab, dim)).reshape(*ids.shape, dim)


class StackedRMSNorm(nn.Module):
    """Llama's RMSNorm (normalise in float32, back to the input dtype, then scale) with per-replicate scales."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (k, dim)
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        h = hidden.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        k = self.weight.shape[0]
        h = h.to(dtype)
        return (self.weight[:, None, :] * h.reshape(k, -1, h.shape[-1])).reshape(hidden.shape)


def _is_rmsnorm(module: nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


def stack(models: Sequence[nn.Module]) -> nn.Module:
    """One module holding `models` (same architecture, each initialised from its own seed) as replicates."""
    models = list(models)
    if not models:
        raise LmlabError("stack() needs at least one model")
    k = len(models)
    out = copy.deepcopy(models[0])
    by_name = [dict(m.named_modules()) for m in models]
    shared: dict[int, nn.Parameter] = {}  # tied weights (the input embedding and the output head) stay tied
    for name, module in list(out.named_modules()):
        if not name or not list(module.parameters(recurse=False)):
            continue
        originals = [d[name] for d in by_name]
        key = id(originals[0].weight)
        if isinstance(module, nn.Embedding):
            new = StackedEmbedding(torch.stack([m.weight.detach() for m in originals]), module.padding_idx)
        elif isinstance(module, nn.Linear):
            bias = torch.stack([m.bias.detach() for m in originals]) if module.bias is not None else None
            new = StackedLinear(torch.stack([m.weight.detach() for m in originals]), bias)
        elif _is_rmsnorm(module):
            new = StackedRMSNorm(torch.stack([m.weight.detach() for m in originals]), module.variance_epsilon)
        else:
            raise LmlabError(f"cannot stack replicates of {type(models[0]).__name__}: its module '{name}' "
                             f"({type(module).__name__}) has weights of a kind stack() does not know")
        if key in shared:  # a weight tied to one stacked before: share the stacked parameter
            new.weight = shared[key]
        shared[key] = new.weight
        parent, _, attr = name.rpartition(".")
        setattr(out.get_submodule(parent) if parent else out, attr, new)
    setattr(out, REPLICAS, k)
    return out


def replicas(model: nn.Module) -> int:
    """How many replicates a stacked model holds (1 for an ordinary model); a wrapper (DDP's, under a launch) is
    looked through."""
    while not hasattr(model, REPLICAS) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return int(getattr(model, REPLICAS, 1))


def unstack(model: nn.Module) -> list[dict[str, torch.Tensor]]:
    """Each replicate's state dict, under the ordinary model's names."""
    k = replicas(model)
    stacked = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    state = model.state_dict()
    return [{name: (t[r] if name in stacked else t).detach().clone() for name, t in state.items()} for r in range(k)]


def member(model: nn.Module, r: int, template: nn.Module) -> nn.Module:
    """Replicate r as an ordinary model: a copy of `template` (the unstacked architecture) with its weights."""
    solo = copy.deepcopy(template)
    solo.load_state_dict(unstack(model)[r])
    solo.train(model.training)
    return solo


def rows(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The same inputs for every replicate: (B, ...) -> (k*B, ...), replicate-major."""
    k = replicas(model)
    return batch if k == 1 else batch.repeat(k, *([1] * (batch.dim() - 1)))


@torch.no_grad()
def clip_per_replicate(params: Sequence[nn.Parameter], k: int, max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ for each replicate alone: the norm over replicate r's slice of every gradient,
    each slice scaled by max_norm / (its norm + 1e-6), at most 1. Returns the k norms."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(k, device="cpu")
    norms = torch.stack([g.reshape(k, -1).float().pow(2).sum(1) for g in grads]).sum(0).sqrt()
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype).reshape(k, *([1] * (g.dim() - 1))))
    return norms


def per_replicate_ce(logits: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal LM cross-entropy summed per replicate, and the token count per replicate: (k,), (k,). Labels are
    shifted as transformers does (position t predicts label t + 1); -100 is ignored."""
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    loss = nn.functional.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                                       ignore_index=-100, reduction="none").reshape(shift_labels.shape)
    real = (shift_labels != -100)
    return loss.reshape(k, -1).sum(1), real.reshape(k, -1).sum(1).to(loss.dtype)
