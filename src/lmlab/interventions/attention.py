"""One attention function for every family, registered with transformers' AttentionInterface.

A layer with nothing to do calls the stock sdpa function, so untouched layers stay bit-identical to
the plain model. A layer with work builds the scores explicitly (nanoGPT style, below), lets each
active intervention edit them, takes the softmax, lets interventions read the pattern, and lets
them edit the per-head output `z` (batch, query, head, head_dim) before the output projection.

What an intervention may do here (each is a method on `Intervention`, see `base.py`):
  block(layer, ctx)            -> bool mask of (query, key) pairs to remove before the softmax
  gate(layer, scores, allowed) -> multiplicative edge gate (sparse attention)
  on_scores(layer, scores, ok) -> read the pre-softmax scores and the allowed pairs (capture, distillation)
  on_pattern(layer, pattern)   -> read the post-softmax pattern (capture)
  edit_z(layer, z, ctx)        -> replace/scale head outputs (ablation, patching), applied where the output
                                  projection reads them (`edit_heads`)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from lmlab.errors import LmlabError

IMPL = "lmlab"


@dataclass
class AttnContext:
    """What an intervention needs to know about one attention call."""

    layer: int
    batch: int
    q_len: int
    kv_len: int
    n_heads: int
    device: torch.device

    @property
    def query_positions(self) -> torch.Tensor:
        """Absolute positions of this call's queries (the last q_len of kv_len when a KV cache is used)."""
        return torch.arange(self.kv_len - self.q_len, self.kv_len, device=self.device)


@dataclass
class LayerPlan:
    """The interventions active on one attention layer, split by what they need."""

    layer: int
    score_edits: list = field(default_factory=list)  # need explicit scores: block / gate / pattern
    z_edits: list = field(default_factory=list)

    @property
    def explicit(self) -> bool:
        return bool(self.score_edits)


def allowed_pairs(attention_mask, module, q_len: int, kv_len: int, device) -> torch.Tensor:
    """The model's own mask as booleans (True = may attend), broadcastable to (B, H, Q, K)."""
    if attention_mask is None:
        if getattr(module, "is_causal", False) and q_len > 1:
            q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
            return (torch.arange(kv_len, device=device)[None, :] <= q_pos)[None, None]
        return torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=device)
    if attention_mask.dtype == torch.bool:
        return attention_mask[..., :kv_len]
    mask = attention_mask[..., :kv_len]  # an additive float mask
    return mask > torch.finfo(mask.dtype).min / 2


def explicit_attention(module, query, key, value, attention_mask, plan: LayerPlan, scaling, dropout, softcap=None,
                       ctx: AttnContext | None = None, sinks=None):
    """Scores -> edits -> softmax -> pattern readers -> weighted values; returns z as (B, Q, H, D).

    `sinks` (H,): a learned logit per head that joins every query's softmax as one more key with no value (GPT-OSS's
    attention sinks): the pattern over the real keys then sums to less than 1, and a query whose every key is
    blocked reads nothing."""
    n_rep = query.shape[1] // key.shape[1]  # grouped-query attention: one K/V head serves n_rep query heads
    key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:  # Gemma-style logit soft-capping
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        scores = scores + attention_mask[..., : key.shape[-2]]  # keep additive biases (e.g. ALiBi-style)
    allowed = allowed_pairs(attention_mask, module, ctx.q_len, ctx.kv_len, query.device)
    for edit in plan.score_edits:
        blocked = edit.block(plan.layer, ctx)
        if blocked is not None:
            allowed = allowed & ~blocked
    allowed = allowed.expand(scores.shape)
    for edit in plan.score_edits:
        edit.on_scores(plan.layer, scores, allowed, ctx)
    scores = scores.float().masked_fill(~allowed, float("-inf"))
    gate = None
    for edit in plan.score_edits:
        g = edit.gate(plan.layer, scores, allowed, ctx)
        if g is not None:
            gate = g if gate is None else gate * g
    if sinks is not None:
        if gate is not None:
            raise LmlabError("the sparse attention gate is not defined for an attention with sinks")
        sink = sinks.reshape(1, -1, 1, 1).float().expand(scores.shape[0], -1, scores.shape[2], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1) if gate is None else gated_softmax(scores, gate)
    # A row with no allowed key (a padded query, or one whose every key was knocked out) reads nothing.
    weights = torch.nan_to_num(weights, nan=0.0)
    for edit in plan.score_edits:
        edit.on_pattern(plan.layer, weights, ctx)
    weights = weights.to(value.dtype)
    if dropout and module.training:
        weights = torch.nn.functional.dropout(weights, p=dropout)
    z = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return z, weights


def gated_softmax(scores: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Softmax over the kept edges only: w_ij = g_ij exp(s_ij) / sum_k g_ik exp(s_ik).

    Written so that gradients stay finite: the shift is the largest *kept* score (so every kept term is
    <= 1 and a row with a kept edge has a sum >= 1), dropped edges above it are clipped to exp(0) (their
    forward weight is 0 anyway; the straight-through gate still passes them a gradient), and a row with no
    kept edge (a padded query) divides by 1 and reads nothing.
    """
    kept = gate.detach() > 0
    shift = scores.masked_fill(~kept, float("-inf")).amax(-1, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift)).detach()
    terms = torch.exp((scores - shift).clamp(max=0.0)) * gate
    total = terms.sum(-1, keepdim=True)
    return terms / torch.where(total > 0, total, torch.ones_like(total))


def lmlab_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    plan: LayerPlan | None = getattr(module, "_lmlab_plan", None)
    softcap = kwargs.get("softcap")
    sinks = kwargs.pop("s_aux", None)
    if sinks is None:  # a sink kept as the module's parameter (read from its dict: no AttributeError per call)
        sinks = module._parameters.get("sinks")
    if plan is None and softcap is None and sinks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    plan = plan or LayerPlan(layer=-1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    ctx = AttnContext(layer=plan.layer, batch=query.shape[0], q_len=query.shape[2], kv_len=key.shape[2],
                      n_heads=query.shape[1], device=query.device)
    if plan.explicit or softcap is not None or sinks is not None:
        z, weights = explicit_attention(module, query, key, value, attention_mask, plan, scaling, dropout,
                                        softcap=softcap, ctx=ctx, sinks=sinks)
    else:
        z, weights = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                            dropout=dropout, **kwargs)
    if plan.z_edits:  # read by the output projection's pre-hook, where the head edits act (`edit_heads`)
        module.__dict__["_lmlab_ctx"] = ctx
    return z, weights


def edit_heads(attn, plan: LayerPlan, x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The head edits of one layer applied to its output projection's input `x` (batch, query, heads x head_dim),
    seen as z (batch, query, head, head_dim): what the projection reads of each head, after anything the attention
    does between its attention function and the projection (Qwen3-Next's output gate, BitNet's norm), so that a
    head's ablation or patch is the same whatever the family does there."""
    ctx = attn.__dict__.pop("_lmlab_ctx", None)  # (one reading per attention call: never a stale one)
    if ctx is None or ctx.batch != x.shape[0] or ctx.q_len != x.shape[1]:
        raise LmlabError(f"layer {plan.layer}'s output projection read an input of shape {tuple(x.shape)} that its "
                         f"attention did not compute in this forward pass, so its heads cannot be edited")
    z = x.reshape(*x.shape[:-1], n_heads, x.shape[-1] // n_heads)
    for edit in plan.z_edits:
        z = edit.edit_z(plan.layer, z, ctx)
    return z.reshape(x.shape)


def register() -> None:
    """Register the function and its mask builder under the name `lmlab` (idempotent).

    The mask function must be registered too: without it transformers passes no mask at all for an
    unknown implementation, silently, and padded rows go wrong.
    """
    AttentionInterface.register(IMPL, lmlab_attention)
    AttentionMaskInterface.register(IMPL, sdpa_mask)


register()
