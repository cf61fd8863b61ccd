"""ARM, the Activation Redistribution Module (Shi et al., arXiv 2510.01032), as an MLP-activation edit.

In the chosen layers' MLP, a = act(gate_proj(x)) before the multiply with up_proj. Per token
(DECISION: statistics are taken over each token's d_mlp entries):
    eps      = 1.4826 * MAD(|a|) * c
    p        = share of entries with |a| < eps;  fraction = clip(p, 0.02, 0.25)
    the round(fraction * d_mlp) entries of smallest |a| keep their sign and get magnitude u * R,
    u ~ U(0, 1), R = the p1-th percentile of the token's positive entries (for positive entries),
    |min a| (for negative ones; zeros count as positive).
Seeded: the same generator seed gives the same edit.
"""

from __future__ import annotations

import torch

from lmlab.interventions.hooks import EditMLPAct


def redistribute(a: torch.Tensor, c: float, p1: float, generator: torch.Generator | None = None) -> torch.Tensor:
    mag = a.abs()
    d = a.shape[-1]
    med = mag.median(-1, keepdim=True).values
    mad = (mag - med).abs().median(-1, keepdim=True).values
    eps = 1.4826 * mad * c
    fraction = (mag < eps).float().mean(-1, keepdim=True).clamp(0.02, 0.25)
    k = (fraction * d).round()
    rank = torch.empty_like(mag, dtype=torch.long)
    order = mag.argsort(dim=-1, stable=True)
    rank.scatter_(-1, order, torch.arange(d, device=a.device).expand_as(order).contiguous())
    chosen = rank < k
    positive = torch.where(a > 0, a, torch.full_like(a, float("nan")))
    r_pos = torch.nanquantile(positive.float(), p1 / 100, dim=-1, keepdim=True).nan_to_num(0.0).to(a.dtype)
    r_neg = (-a.min(-1, keepdim=True).values).clamp_min(0)
    u = torch.rand(a.shape, generator=generator, device="cpu").to(device=a.device, dtype=a.dtype)
    sign = torch.where(a < 0, -1.0, 1.0).to(a.dtype)
    new = sign * u * torch.where(sign > 0, r_pos, r_neg)
    return torch.where(chosen, new, a)


class ActivationRedistribution(EditMLPAct):
    """`with intervene(lm, ActivationRedistribution(c=0.13, p1=99.5)):` edits layer 0 (by default)."""

    def __init__(self, c: float = 0.13, p1: float = 99.5, layers=(0,), seed: int = 0):
        self.c, self.p1 = c, p1
        self.generator = torch.Generator().manual_seed(seed)
        super().__init__(lambda act, layer: redistribute(act, self.c, self.p1, self.generator), layers)
