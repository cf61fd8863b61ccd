"""lmlab's attention function for families whose attention computes in a method of its own instead of calling
transformers' attention interface (GPT-Neo, the original OpenAI GPT, XGLM, TrOCR's decoder).

Each adapter replaces one attention module's score-and-softmax method (`_attn`) or, for the BART-style attentions
whose forward computes everything inline, its forward, on that instance only, from the first `intervene` block on
its model: a layer with nothing to do calls the family's own method (the model computes as it always does, bit for
bit); a layer with work turns the family's masks into one additive mask (its causal buffer, GPT-Neo's local window,
the padding mask) and calls lmlab's attention function with the family's scaling (GPT-Neo scales by 1, the OpenAI
GPT by 1/sqrt(head size), the BART-style ones scale the query as it projects), returning what the family's method
returns. The head
edits then act at the output projection's input, as for every family. `LEGACY_ATTENTION` in the layout names the
classes adapted here (a test checks that the two lists agree).
"""

from __future__ import annotations

from types import MethodType

import torch
from torch import nn

from lmlab.interventions.attention import lmlab_attention


def _additive(allowed: torch.Tensor, attention_mask, dtype) -> torch.Tensor:
    """The family's boolean pairs and its additive padding mask as one float mask (the dtype's minimum where
    blocked)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)
    if attention_mask is not None:
        mask = (mask + attention_mask.to(dtype)).clamp_min(torch.finfo(dtype).min)
    return mask


def _dropout(module) -> float:
    """The attention dropout's rate in training, 0 in evaluation (as the families' own modules have it)."""
    return module.attn_dropout.p if module.training else 0.0


def _neo_attn(module, query, key, value, attention_mask=None):
    """GPT-Neo's `_attn` (query, key, value: batch, head, position, head size): float32 scores without scaling, its
    causal (or local-window) buffer, the padding mask added; (output, weights)."""
    if "_lmlab_plan" not in module.__dict__:
        return type(module)._attn(module, query, key, value, attention_mask)
    q_len, k_len = query.shape[-2], key.shape[-2]
    allowed = module.bias[:, :, k_len - q_len:k_len, :k_len]
    mask = _additive(allowed, attention_mask, torch.float32)
    z, weights = lmlab_attention(module, query.float(), key.float(), value.float(), mask, scaling=1.0,
                                 dropout=_dropout(module))
    return z.transpose(1, 2).to(value.dtype), weights


def _openai_attn(module, q, k, v, attention_mask=None, output_attentions=False):
    """The OpenAI GPT's `_attn` (its key comes transposed: batch, head, head size, position): scaled by 1/sqrt(head
    size) where the block says `scale`, its causal buffer, the padding mask added; [output] (+ [weights])."""
    if "_lmlab_plan" not in module.__dict__:
        return type(module)._attn(module, q, k, v, attention_mask, output_attentions)
    q_len, k_len = q.shape[-2], k.shape[-1]
    allowed = module.bias[:, :, k_len - q_len:k_len, :k_len].bool()
    mask = _additive(allowed, attention_mask, q.dtype)
    scaling = v.shape[-1] ** -0.5 if module.scale else 1.0
    z, weights = lmlab_attention(module, q, k.transpose(-1, -2), v, mask, scaling=scaling, dropout=_dropout(module))
    return [z.transpose(1, 2)] + ([weights] if output_attentions else [])


def _bart_forward(module, hidden_states, key_value_states=None, cache=None, attention_mask=None, *args, **kwargs):
    """The forward of a BART-style self-attention (XGLM's, TrOCR's decoder's): the query scaled as it projects, its
    cache updated, the model's additive mask; (output, weights). A cross-attention call, or a layer with nothing to
    do, runs the family's own forward."""
    if "_lmlab_plan" not in module.__dict__ or key_value_states is not None:
        return type(module).forward(module, hidden_states, key_value_states, cache, attention_mask, *args, **kwargs)
    from transformers.cache_utils import EncoderDecoderCache

    batch, length = hidden_states.shape[:2]
    shape = (batch, length, -1, module.head_dim)
    query = (module.q_proj(hidden_states) * module.scaling).view(shape).transpose(1, 2)
    key = module.k_proj(hidden_states).view(shape).transpose(1, 2)
    value = module.v_proj(hidden_states).view(shape).transpose(1, 2)
    if cache is not None:
        own = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        key, value = own.update(key, value, module.layer_idx)
    z, weights = lmlab_attention(module, query, key, value, attention_mask, scaling=1.0,
                                 dropout=module.dropout if module.training else 0.0)
    return module.out_proj(z.reshape(batch, length, -1)), weights


# class -> (the method an adapter replaces, the adapter)
ADAPTERS = {"transformers.models.gpt_neo.modeling_gpt_neo.GPTNeoSelfAttention": ("_attn", _neo_attn),
            "transformers.models.openai.modeling_openai.Attention": ("_attn", _openai_attn),
            "transformers.models.xglm.modeling_xglm.XGLMAttention": ("forward", _bart_forward),
            "transformers.models.trocr.modeling_trocr.TrOCRAttention": ("forward", _bart_forward)}


def install(model: nn.Module) -> bool:
    """Route every adapted attention module of `model` through lmlab's function (idempotent; per instance); whether
    the model has any. A forward that accelerate wraps (a dispatched model) is replaced beneath its wrapper."""
    found = False
    for module in model.modules():
        name, adapter = ADAPTERS.get(f"{type(module).__module__}.{type(module).__qualname__}", (None, None))
        if adapter is None:
            continue
        found = True
        if name == "forward" and hasattr(module, "_hf_hook"):
            name = "_old_forward"  # (accelerate's hook calls this one after moving the inputs)
        current = module.__dict__.get(name)
        if getattr(current, "__func__", None) is not adapter:
            setattr(module, name, MethodType(adapter, module))
    return found
