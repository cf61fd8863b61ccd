"""Interventions that work through torch module hooks (plus the z/pattern taps of `Capture`).

Hook points, TransformerLens vocabulary:
  resid_pre / resid_post  a block's input / output (the residual stream)
  attn_out / mlp_out      the attention / MLP sub-block's output before the residual add
  mlp_act                 act(gate_proj(x)) in gated MLPs, act(fc_in(x)) otherwise
  z                       per-head attention output, (batch, pos, head, head_dim) = o_proj's input split
  scores                  pre-softmax attention scores, (batch, head, query, key), 0 where masked
  pattern                 post-softmax attention, (batch, head, query, key)
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from lmlab.errors import LmlabError
from lmlab.interventions.core import Intervention, where_rows
from lmlab.models.layout import Layout

HOOK_POINTS = ("resid_pre", "resid_post", "attn_out", "mlp_out", "mlp_act", "z", "scores", "pattern")


def _hidden_in(args, kwargs) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden_in(args, kwargs, new):
    if args:
        return (new, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": new}


def _tensor_out(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _with_tensor_out(out, new):
    return (new, *out[1:]) if isinstance(out, tuple) else new


def _module_for(layout: Layout, point: str, layer: int):
    return {"resid_pre": layout.block, "resid_post": layout.block, "attn_out": layout.o_proj,
            "mlp_out": layout.mlp_out, "mlp_act": layout.mlp_act}[point](layer)


class Capture(Intervention):
    """Record activations. `cap["z", 3]` is layer 3's z; `cap.stacked("resid_pre")` stacks all layers.

    On a hybrid, z, pattern, scores and attn_out exist in its attention layers only (`layers` may name no other).

    Values are detached unless `grad=True` (then they stay in the graph, for attribution patching).
    Each forward pass overwrites the previous one's values.
    """

    z_order = 1

    def __init__(self, *points: str, layers: Iterable[int] | int | None = None, grad: bool = False):
        super().__init__(layers)
        unknown = [p for p in points if p not in HOOK_POINTS]
        if unknown or not points:
            raise LmlabError(f"unknown hook point '{(unknown or ['(none)'])[0]}'; known: {', '.join(HOOK_POINTS)}")
        self.points = tuple(points)
        self.in_attention = any(p in ("z", "pattern", "scores", "attn_out") for p in points)
        self.grad = grad
        self.store: dict[str, dict[int, torch.Tensor]] = {p: {} for p in points}

    def __getitem__(self, key) -> torch.Tensor:
        point, layer = key
        try:
            return self.store[point][layer]
        except KeyError:
            raise LmlabError(f"nothing captured for {point} at layer {layer}") from None

    def stacked(self, point: str) -> torch.Tensor:
        """All captured layers of `point`, stacked on a new first dimension, in layer order."""
        layers = sorted(self.store[point])
        first = self.store[point][layers[0]]  # layers may sit on different devices (a dispatched model)
        return torch.stack([self.store[point][l].to(first.device) for l in layers])

    def _keep(self, point: str, layer: int, value: torch.Tensor) -> None:
        self.store[point][layer] = value if self.grad else value.detach()

    def uses_scores(self, layer):
        return ("pattern" in self.points or "scores" in self.points) and self.on_layer(layer)

    def on_scores(self, layer, scores, allowed, ctx):
        if "scores" in self.points:
            self._keep("scores", layer, scores.masked_fill(~allowed, 0.0))

    def uses_z(self, layer):
        return "z" in self.points and self.on_layer(layer)

    def on_pattern(self, layer, pattern, ctx):
        if "pattern" in self.points:
            self._keep("pattern", layer, pattern)

    def edit_z(self, layer, z, ctx):
        self._keep("z", layer, z)
        return z

    def hooks(self, layout):
        handles = []
        for layer in range(layout.n_layers):
            if not self.on_layer(layer):
                continue
            for point in self.points:
                if point in ("z", "pattern", "scores") or (point == "attn_out" and self.layers is None
                                                            and layer not in layout.attention_layers):
                    continue  # (the attention function captures those; a hybrid's other blocks have no attn_out)
                module = _module_for(layout, point, layer)
                if point == "resid_pre":
                    fn = (lambda l: lambda m, a, k: self._keep("resid_pre", l, _hidden_in(a, k)))(layer)
                    handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
                else:
                    fn = (lambda p, l: lambda m, a, o: self._keep(p, l, _tensor_out(o)))(point, layer)
                    handles.append(module.register_forward_hook(fn))
        return handles


class PatchResid(Intervention):
    """Replace the residual stream at one layer (`where` = 'pre' or 'post') with given values.

    `values` (batch, pos, d_model), typically `Capture('resid_pre')` of another run; `positions`
    (batch, pos) bool limits the patch to some positions (None = all).
    """

    def __init__(self, layer: int, values: torch.Tensor, positions: torch.Tensor | None = None, where: str = "pre"):
        super().__init__([layer])
        if where not in ("pre", "post"):
            raise LmlabError("PatchResid: where must be 'pre' or 'post'")
        self.layer, self.values, self.positions, self.where = layer, values, positions, where

    def _patched(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[:2] != self.values.shape[:2]:
            raise LmlabError(f"PatchResid: values of shape {tuple(self.values.shape[:2])} do not match the "
                             f"forward pass's (batch, positions) {tuple(hidden.shape[:2])}")
        return where_rows(self.positions, self.values.to(hidden), hidden)  # the layer's device and dtype

    def hooks(self, layout):
        block = layout.block(self.layer)
        if self.where == "pre":
            return [block.register_forward_pre_hook(
                lambda m, a, k: _with_hidden_in(a, k, self._patched(_hidden_in(a, k))), with_kwargs=True)]
        return [block.register_forward_hook(lambda m, a, o: _with_tensor_out(o, self._patched(_tensor_out(o))))]


class EditMLPAct(Intervention):
    """Apply `fn(act, layer) -> act` to the MLP activation act(gate_proj(x)) of chosen layers."""

    def __init__(self, fn: Callable[[torch.Tensor, int], torch.Tensor], layers: Iterable[int] | int | None = None):
        super().__init__(layers)
        self.fn = fn

    def hooks(self, layout):
        handles, seen = [], set()
        for layer in range(layout.n_layers):
            if not self.on_layer(layer):
                continue
            module = layout.mlp_act(layer)
            if not isinstance(module, torch.nn.Module) or id(module) in seen:
                raise LmlabError(f"the MLP activation of layer {layer} is not a separate module and cannot be edited")
            seen.add(id(module))
            handles.append(module.register_forward_hook((lambda l: lambda m, a, o: self.fn(o, l))(layer)))
        return handles


class PatchOutput(Intervention):
    """Replace a sub-block's output (`point` 'mlp_out' or 'attn_out') at chosen layers with given values.

    `reference` {layer: (batch, pos, d_model)}, typically `Capture(point)` of another run (activation
    patching of a whole MLP); `positions` (batch, pos) bool limits the patch to some positions.
    """

    def __init__(self, point: str, reference: dict[int, torch.Tensor], positions: torch.Tensor | None = None):
        if point not in ("mlp_out", "attn_out"):
            raise LmlabError(f"PatchOutput patches mlp_out or attn_out, not '{point}'")
        super().__init__(list(reference))
        self.point, self.reference, self.positions = point, reference, positions

    def _patched(self, layer: int, out: torch.Tensor) -> torch.Tensor:
        ref = self.reference[layer]
        if ref.shape != out.shape:
            raise LmlabError(f"PatchOutput: values of shape {tuple(ref.shape)} do not match layer {layer}'s "
                             f"{self.point} {tuple(out.shape)}")
        return where_rows(self.positions, ref.to(out), out)

    def hooks(self, layout):
        return [_module_for(layout, self.point, layer).register_forward_hook(
            (lambda l: lambda m, a, o: _with_tensor_out(o, self._patched(l, _tensor_out(o))))(layer))
            for layer in sorted(self.reference)]


class RetireRows(Intervention):
    """Drop batch rows from the end as the forward pass goes up: block j runs only the first `active[j]` rows.

    For batches whose rows need different depths (a knockout sweep reads row k at layer k only): order the
    rows by the depth they need, deepest first, and the later blocks compute nothing they would discard.
    Every tensor the block receives with the batch as its first dimension (hidden states, attention mask,
    positions, rotary tables; a first dimension of 1 broadcasts and stays) and the block's KV-cache layer
    are cut to the same rows; other per-row interventions act on the leading rows. Captures at block j hold
    its `active[j]` rows, and the model's output holds the last block's.
    """

    def __init__(self, active: list[int]):
        super().__init__()
        self._batch = 0
        if any(b > a for a, b in zip(active, active[1:])) or (active and active[-1] < 1):
            raise LmlabError(f"RetireRows needs a non-increasing count of at least 1 row per layer, not {active}")
        self.active = list(active)

    def bind(self, layout):
        super().bind(layout)
        if len(self.active) != layout.n_layers:
            raise LmlabError(f"RetireRows: {len(self.active)} counts for a model of {layout.n_layers} layers")

    def _cut(self, layer, args, kwargs):
        keep, rows = self.active[layer], _hidden_in(args, kwargs).shape[0]
        if layer == 0:
            self._batch = rows  # the whole batch: the model hands every block its per-row tensors at this size
        batch_sizes = {rows, self._batch}

        def cut(value):
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] in batch_sizes \
                    and value.shape[0] > keep:
                return value[:keep]
            if isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
                return tuple(cut(v) for v in value)
            return value

        for value in list(args) + list(kwargs.values()):
            cache_layers = getattr(value, "layers", None)
            if isinstance(cache_layers, list) and layer < len(cache_layers):  # the KV cache
                entry = cache_layers[layer]
                if getattr(entry, "keys", None) is not None and entry.keys.dim() >= 2 and entry.keys.shape[0] > keep:
                    entry.keys, entry.values = entry.keys[:keep], entry.values[:keep]
        return tuple(cut(a) for a in args), {k: cut(v) for k, v in kwargs.items()}

    def hooks(self, layout):
        return [layout.block(layer).register_forward_pre_hook(
            (lambda l: lambda m, a, k: self._cut(l, a, k))(layer), with_kwargs=True) for layer in range(layout.n_layers)]


class _Restore:
    """A handle that puts a module's own `forward` back (what `intervene` removes on exit)."""

    def __init__(self, module: torch.nn.Module, had_own: bool, own):
        self.module, self.had_own, self.own = module, had_own, own

    def remove(self) -> None:
        if self.had_own:
            self.module.forward = self.own  # e.g. accelerate's device-moving wrapper of a dispatched block
        else:
            self.module.__dict__.pop("forward", None)


class StartAt(Intervention):
    """Run the forward pass from block `layer` up: blocks 0..layer-1 pass their input through untouched (they
    compute nothing) and block `layer` receives `resid` (batch, pos, d_model), the residual stream a run on the
    same inputs had there (`Capture('resid_pre')` of it), instead.

    For edits at `layer` or above, everything below is unchanged by construction, so a run from the cached
    residual gives the full run's result at (L - layer) / L of its cost (activation patching of a head at layer
    l: the layers below are the clean run's). The batch may hold `resid`'s rows several times over (R = m x B
    rows, block i = rows [i*B, (i+1)*B), e.g. one block per patched head); `resid` is tiled to match. The
    model still embeds the inputs and builds its masks and rotary tables for the whole batch (cheap), and the
    layers' own per-row inputs come from the model as usual, on each layer's device under a device map.
    Captures at layers below `layer` record the pass-through, not the model's states.
    """

    def __init__(self, layer: int, resid: torch.Tensor):
        super().__init__([layer])
        self.layer, self.resid = layer, resid

    def _resid_for(self, hidden: torch.Tensor) -> torch.Tensor:
        rows, blocks = hidden.shape[0], self.resid.shape[0]
        if hidden.shape[1:] != self.resid.shape[1:] or rows % blocks:
            raise LmlabError(f"StartAt: a residual of shape {tuple(self.resid.shape)} does not fit this forward "
                             f"pass's {tuple(hidden.shape)} (its rows must be a whole number of the residual's)")
        resid = self.resid.to(device=hidden.device, dtype=hidden.dtype)
        return resid if rows == blocks else resid.repeat(rows // blocks, 1, 1)

    def hooks(self, layout):
        handles = []
        for j in range(self.layer):
            block = layout.block(j)
            had_own = "forward" in block.__dict__
            handles.append(_Restore(block, had_own, block.__dict__.get("forward")))
            block.forward = lambda hidden_states, *args, **kwargs: hidden_states
        block = layout.block(self.layer)
        handles.append(block.register_forward_pre_hook(
            lambda m, a, k: _with_hidden_in(a, k, self._resid_for(_hidden_in(a, k))), with_kwargs=True))
        return handles
