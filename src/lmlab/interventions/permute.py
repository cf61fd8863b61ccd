"""Moving attention heads within a layer, in the weights: `permute_heads`.

After `permute_heads(model, {layer: perm})`, head j of that layer computes what head perm[j] computed before: its
query, key and value slices and its slice of the output projection's input move together, so every head's output z
is the old one at another index and the model's output is unchanged (float rounding aside). Only *where* each head's
computation lives moves; a circuit found by head index is then elsewhere.

Grouped-query attention: heads of one KV group share a key and a value. A permutation is applied exactly only where it
keeps each group's heads together: the new group g holds, in some order, the heads of one old group s(g), with s a
permutation of the groups (the key and value slices then move group by group). Such permutations are within-group
exchanges (only the query and output slices move), whole-group exchanges, and their products; anything else would
give a head another head's key and value, and is refused.

The projections supported: separate q/k/v projections with an output projection (Llama, Mistral, Qwen, OLMo, Gemma
and the other families with q_proj/k_proj/v_proj; their biases; a q_norm/k_norm over one head's width is shared by
every head and stays, one over all heads' width moves with them) and GPT-2's fused c_attn/c_proj. An attention with
any other parameter (a per-head sink, a fused projection of another layout) is refused in one sentence: a parameter
lmlab does not know how to move with its head would stay behind.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import nn

from lmlab.errors import LmlabError
from lmlab.models.layout import Layout, layout_of

_SEPARATE = ("q_proj", "k_proj", "v_proj")
_NORMS = ("q_norm", "k_norm")


def _model_and_layout(target) -> tuple[nn.Module, Layout]:
    model = target if isinstance(target, nn.Module) else target.model
    layout = getattr(target, "layout", None) or layout_of(model)
    return model, layout


def group_map(perm: Sequence[int], n_heads: int, n_kv: int) -> list[int]:
    """The KV-group permutation s a head permutation implies (new group g holds old group s[g]'s heads); one sentence
    where `perm` is not a permutation of the heads or splits a group."""
    perm = [int(p) for p in perm]
    if sorted(perm) != list(range(n_heads)):
        raise LmlabError(f"a head permutation lists every head 0..{n_heads - 1} once; got {perm}")
    if n_kv < 1 or n_heads % n_kv:
        raise LmlabError(f"{n_heads} heads do not split into {n_kv} key-value groups")
    size = n_heads // n_kv
    groups = []
    for g in range(n_kv):
        old = {perm[j] // size for j in range(g * size, (g + 1) * size)}
        if len(old) != 1:
            raise LmlabError(f"heads {g * size}..{(g + 1) * size - 1} share one key and value (grouped-query "
                             f"attention); the permutation gives them heads of groups {sorted(old)}: a group's heads "
                             "must move together, or only within their group")
        groups.append(old.pop())
    if sorted(groups) != list(range(n_kv)):
        raise LmlabError(f"the permutation sends two key-value groups to one ({groups})")
    return groups


def _rows(blocks: Sequence[int], width: int) -> torch.Tensor:
    """The indices of blocks of `width` rows, in the order given."""
    return torch.cat([torch.arange(b * width, (b + 1) * width) for b in blocks])


def _op(param: torch.Tensor, dim: int, index: torch.Tensor, what: str) -> tuple:
    """One slice move, checked now (applied once every layer's moves are known to be possible)."""
    if param.device.type == "meta" or not param.dtype.is_floating_point:
        raise LmlabError(f"cannot move heads: {what} is not a plain tensor of weights here (offloaded or quantized "
                         "weights); load the model in full or half precision on one device")
    return param, dim, index


def _check_parameters(attn: nn.Module, known: tuple[str, ...], layer: int) -> None:
    for name, _ in attn.named_parameters():
        if name.split(".")[0] not in known:
            raise LmlabError(f"cannot move heads in layer {layer}: its attention has a parameter lmlab does not know "
                             f"how to move with a head ({name})")


def permute_heads(target, perms: Mapping[int, Sequence[int]]) -> None:
    """Move heads in the weights, in place: afterwards head j of layer l computes what head perms[l][j] did.

    `target`: a LoadedModel or the model. Every permutation and every layer's projections are checked (each head
    once; grouped-query attention: a group's heads together, see the module's docstring) before any weight moves."""
    _, layout = _model_and_layout(target)
    ops = []
    for layer, perm in perms.items():
        if not 0 <= int(layer) < layout.n_layers:
            raise LmlabError(f"layer {layer} does not exist; the model has layers 0..{layout.n_layers - 1}")
        perm = [int(p) for p in perm]
        ops += _layer_ops(layout, int(layer), perm, group_map(perm, layout.n_heads, layout.n_kv_heads))
    with torch.no_grad():
        for param, dim, index in ops:
            param.copy_(param.index_select(dim, index.to(param.device)))


def _layer_ops(layout: Layout, layer: int, perm: list[int], groups: list[int]) -> list[tuple]:
    """The slice moves of one layer's permutation (param, dim, index), each checked."""
    n, n_kv, d = layout.n_heads, layout.n_kv_heads, layout.head_dim_of(layer)
    attn, o_proj = layout.attn(layer), layout.o_proj(layer)
    o_name = next((name for name, m in attn.named_children() if m is o_proj), None)
    if o_name is None:
        raise LmlabError(f"cannot move heads in layer {layer}: its output projection is not part of its attention")
    q_rows, kv_rows = _rows(perm, d), _rows(groups, d)
    ops = []
    if all(hasattr(attn, p) for p in _SEPARATE):
        _check_parameters(attn, _SEPARATE + _NORMS + (o_name,), layer)
        for name, rows, heads in (("q_proj", q_rows, n), ("k_proj", kv_rows, n_kv), ("v_proj", kv_rows, n_kv)):
            proj = getattr(attn, name)
            if not isinstance(proj, nn.Linear) or proj.weight.shape[0] != heads * d:
                raise LmlabError(f"cannot move heads in layer {layer}: {name} is not a linear layer of {heads} "
                                 f"heads x {d}")
            ops.append(_op(proj.weight, 0, rows, f"{name}.weight"))
            if proj.bias is not None:
                ops.append(_op(proj.bias, 0, rows, f"{name}.bias"))
        for name, rows, heads in (("q_norm", q_rows, n), ("k_norm", kv_rows, n_kv)):
            weight = getattr(getattr(attn, name, None), "weight", None)
            if weight is None or tuple(weight.shape) == (d,):
                continue  # none, or one head's width: shared by every head
            if tuple(weight.shape) != (heads * d,):
                raise LmlabError(f"cannot move heads in layer {layer}: {name} has shape {tuple(weight.shape)}")
            ops.append(_op(weight, 0, rows, f"{name}.weight"))
    elif type(getattr(attn, "c_attn", None)).__name__ == "Conv1D":
        _check_parameters(attn, ("c_attn", o_name), layer)
        width = n * d
        if attn.c_attn.weight.shape[1] != 3 * width or n_kv != n:
            raise LmlabError(f"cannot move heads in layer {layer}: c_attn is not three projections of {n} heads")
        cols = torch.cat([q_rows + i * width for i in range(3)])
        ops.append(_op(attn.c_attn.weight, 1, cols, "c_attn.weight"))
        if attn.c_attn.bias is not None:
            ops.append(_op(attn.c_attn.bias, 0, cols, "c_attn.bias"))
    else:
        raise LmlabError(f"cannot move heads in layer {layer}: lmlab moves the heads of attentions with q_proj, "
                         "k_proj and v_proj, or GPT-2's c_attn; this one has "
                         + ", ".join(name for name, _ in attn.named_children()))
    # the output projection reads z (heads x head_dim): a Linear by its columns, a Conv1D by its rows
    conv = type(o_proj).__name__ == "Conv1D"
    if o_proj.weight.shape[0 if conv else 1] != n * d:
        raise LmlabError(f"cannot move heads in layer {layer}: the output projection does not read {n} heads x {d}")
    ops.append(_op(o_proj.weight, 0 if conv else 1, q_rows, f"{o_name}.weight"))
    return ops
