"""ARM, the Activation Redistribution Module (Shi et al., arXiv 2510.01032), as an MLP-activation edit.

In the chosen layers' MLP, a = act(gate_proj(x)) before the multiply with up_proj. Over a group of
entries (`scope`, below):
    eps      = 1.4826 * MAD(|a|) * c
    S        = share of entries with |a| < eps;  fraction = clip(S, p_min, 0.25)
    the k = max(1, round(fraction * n)) entries of smallest |a| keep their sign (0 counts as positive)
    and get magnitude u * R, u ~ U(0, 1) per entry: R = the p1-th percentile of all of the group's
    entries (signed) for positive ones, |min a| of the group for negative ones.
`scope` (as in the authors' code, checked against github.com/vanpe20/ARM-Meaningless-tokens):
    "call"  the whole activation tensor of one forward call (the authors' code: statistics, the
            percentile and the choice of entries are global over batch x positions x d_mlp, so they
            depend on the batch's composition and its padding, as theirs do);
    "row"   each sequence of the batch on its own (the call at batch size 1; independent of batching);
    "token" each position's d_mlp entries on their own (lmlab's earlier reading).
DECISION: p_min defaults to 0.02 as we read the paper; the authors' code uses 0.2 (pmin) by
default, available as `p_min=0.2`.
Seeded: the same generator seed gives the same edit.
"""

from __future__ import annotations

import torch

from lmlab.errors import LmlabError
from lmlab.interventions.hooks import EditMLPAct

SCOPES = ("call", "row", "token")


def _percentile(sorted_values: torch.Tensor, q: float) -> torch.Tensor:
    """Linear-interpolation percentile (numpy's default) along the last dim of already sorted values."""
    n = sorted_values.shape[-1]
    pos = q / 100 * (n - 1)
    lo, hi = int(pos), min(int(pos) + 1, n - 1)
    frac = pos - lo
    return sorted_values[..., lo:lo + 1] * (1 - frac) + sorted_values[..., hi:hi + 1] * frac


def redistribute(a: torch.Tensor, c: float, p1: float, generator: torch.Generator | None = None,
                 scope: str = "call", p_min: float = 0.02, p_max: float = 0.25) -> torch.Tensor:
    if scope not in SCOPES:
        raise LmlabError(f"unknown ARM scope '{scope}'; use one of {', '.join(SCOPES)}")
    shape = a.shape
    groups = {"call": a.reshape(1, -1), "row": a.reshape(shape[0], -1),
              "token": a.reshape(-1, shape[-1])}[scope].float()
    n = groups.shape[-1]
    mag = groups.abs()
    med = mag.median(-1, keepdim=True).values
    mad = (mag - med).abs().median(-1, keepdim=True).values.clamp_min(1e-12)
    eps = 1.4826 * mad * c
    fraction = (mag < eps).float().mean(-1, keepdim=True).clamp(p_min, p_max)
    k = (fraction * n).round().clamp_min(1)
    order = mag.argsort(dim=-1, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(n, device=a.device).expand_as(order).contiguous())
    chosen = rank < k
    r_pos = _percentile(groups.sort(-1).values, p1)
    r_neg = (-groups.min(-1, keepdim=True).values).clamp_min(0)
    u = torch.rand(groups.shape, generator=generator, device="cpu").to(a.device)
    sign = torch.where(groups < 0, -1.0, 1.0)
    new = sign * u * torch.where(sign > 0, r_pos, r_neg)
    return torch.where(chosen, new, groups).to(a.dtype).reshape(shape)


class ActivationRedistribution(EditMLPAct):
    """`with intervene(lm, ActivationRedistribution(c=0.13, p1=99.5)):` edits layer 0 (by default)."""

    def __init__(self, c: float = 0.13, p1: float = 99.5, layers=(0,), seed: int = 0, scope: str = "call",
                 p_min: float = 0.02):
        if scope not in SCOPES:
            raise LmlabError(f"unknown ARM scope '{scope}'; use one of {', '.join(SCOPES)}")
        self.c, self.p1, self.scope, self.p_min = c, p1, scope, p_min
        self.generator = torch.Generator().manual_seed(seed)
        super().__init__(lambda act, layer: redistribute(act, self.c, self.p1, self.generator, self.scope,
                                                         self.p_min), layers)
