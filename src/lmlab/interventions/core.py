"""`Intervention`, the base every edit shares, and `intervene(model, ...)`, which installs them.

An intervention touches the model in two ways only: through the attention function (`attention.py`:
blocking score pairs, gating edges, reading patterns, editing head outputs `z`) and through torch
module hooks (`hooks.py`: residual stream, MLP activations, sub-block outputs). `intervene` builds one
`LayerPlan` per attention layer from everything active, registers the hooks, and undoes both on exit,
also when the body raises. Contexts nest: an inner `intervene` adds to the outer one.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterable

import torch
from torch import nn

from lmlab.errors import LmlabError
from lmlab.interventions import attention, legacy
from lmlab.models.layout import Layout, layout_of


class Intervention:
    """Base class. `layers=None` means every layer. Subclasses override what they need."""

    def __init__(self, layers: Iterable[int] | int | None = None):
        self.layers = None if layers is None else ({layers} if isinstance(layers, int) else set(layers))
        self.layout: Layout | None = None

    def on_layer(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    # whether it acts in the attention function (scores, pattern, z): on a hybrid, the layers it names must hold
    # softmax attention, and "every layer" means every attention layer
    in_attention = False

    def bind(self, layout: Layout) -> None:
        """Check the intervention against the model before anything runs."""
        self.layout = layout
        if self.layers is not None:
            bad = sorted(l for l in self.layers if not 0 <= l < layout.n_layers)
            if bad:
                raise LmlabError(f"layer {bad[0]} does not exist; the model has layers 0..{layout.n_layers - 1}")
            if self.in_attention:
                for layer in sorted(self.layers):
                    layout.check_attention(layer)

    # --- what it needs from the attention function, per layer
    def uses_scores(self, layer: int) -> bool:
        return False

    def uses_z(self, layer: int) -> bool:
        return False

    # --- attention-function callbacks (see attention.py)
    def block(self, layer, ctx):
        return None

    def gate(self, layer, scores, allowed, ctx):
        return None

    def on_scores(self, layer, scores, allowed, ctx) -> None:
        pass

    def on_pattern(self, layer, pattern, ctx) -> None:
        pass

    def edit_z(self, layer, z, ctx):
        return z

    # --- module hooks
    def hooks(self, layout: Layout) -> list:
        """Register torch hooks; return their handles (removed on exit)."""
        return []

    # Captures read z after every edit of it, whatever order the user listed things in.
    z_order = 0


def _model_of(target) -> nn.Module:
    """The model itself: a `LoadedModel`'s `.model`, or the module given (unwrapped from DDP). (Not `getattr(x, "model", x)`:
    a HF `...ForCausalLM` has a `.model` too, its inner stack, and the two must not be confused.)"""
    model = target if isinstance(target, nn.Module) else target.model
    # a model wrapped for data-parallel training (inside the training loop's loss) is edited as the model itself
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _ensure_lmlab_attention(model: nn.Module) -> None:
    if model.__dict__.get("_lmlab_legacy") is None:  # a family whose attention has a method of its own: adapted
        model.__dict__["_lmlab_legacy"] = legacy.install(model)
    if model.__dict__["_lmlab_legacy"]:
        return
    if getattr(model.config, "_attn_implementation", None) != attention.IMPL:
        try:
            model.set_attn_implementation(attention.IMPL)
        except (ValueError, AttributeError) as exc:
            raise LmlabError(f"this model's attention cannot be routed through lmlab ({exc})") from exc


def _rebuild_plans(layout: Layout, active: list[Intervention]) -> None:
    for layer in layout.attention_layers:
        plan = attention.LayerPlan(layer=layer)
        for iv in active:
            if iv.uses_scores(layer):
                plan.score_edits.append(iv)
            if iv.uses_z(layer):
                plan.z_edits.append(iv)
        plan.z_edits.sort(key=lambda iv: iv.z_order)
        module = layout.attn(layer)
        old = module.__dict__.pop("_lmlab_z_hook", None)
        if old is not None:
            old.remove()
        module.__dict__.pop("_lmlab_ctx", None)
        if plan.score_edits or plan.z_edits:
            module._lmlab_plan = plan
        elif hasattr(module, "_lmlab_plan"):
            del module._lmlab_plan
        if plan.z_edits:  # z is what the output projection reads: edited there
            module.__dict__["_lmlab_z_hook"] = layout.o_proj(layer).register_forward_pre_hook(
                (lambda attn, p: lambda m, args: (attention.edit_heads(attn, p, args[0], layout.n_heads),
                                                  *args[1:]))(module, plan))


@contextmanager
def intervene(target, *interventions: Intervention):
    """`with intervene(model_or_loaded, Knockout(...), Capture(...)) as (ko, cap):`.

    Yields the single intervention, or the tuple of them. The attention implementation is switched to
    `lmlab` (bit-identical to sdpa where nothing is active) and stays so after the block.
    """
    model = _model_of(target)
    layout = getattr(target, "layout", None) or layout_of(model)
    for iv in interventions:
        if not isinstance(iv, Intervention):
            raise LmlabError(f"{iv!r} is not an intervention")
        iv.bind(layout)
    _ensure_lmlab_attention(model)
    stack: list[Intervention] = model.__dict__.setdefault("_lmlab_active", [])
    handles = []
    stack.extend(interventions)
    try:
        for iv in interventions:
            handles.extend(iv.hooks(layout))
        _rebuild_plans(layout, stack)
        yield interventions[0] if len(interventions) == 1 else interventions
    finally:
        for handle in handles:
            handle.remove()
        for iv in interventions:
            stack.remove(iv)
        _rebuild_plans(layout, stack)


def install(target, *interventions: Intervention) -> None:
    """Make interventions part of the model for good (a sparse model's edge gate, say).

    They join every later `intervene` block, like an outer block that never closes. `uninstall` removes
    them.
    """
    model = _model_of(target)
    layout = getattr(target, "layout", None) or layout_of(model)
    for iv in interventions:
        if not isinstance(iv, Intervention):
            raise LmlabError(f"{iv!r} is not an intervention")
        if type(iv).hooks is not Intervention.hooks:
            raise LmlabError(f"{type(iv).__name__} uses module hooks and cannot be installed permanently")
        iv.bind(layout)
    _ensure_lmlab_attention(model)
    stack: list[Intervention] = model.__dict__.setdefault("_lmlab_active", [])
    standing: list[Intervention] = model.__dict__.setdefault("_lmlab_standing", [])
    stack[:0] = interventions
    standing.extend(interventions)
    _rebuild_plans(layout, stack)


def installed(target) -> list[Intervention]:
    """The interventions `install` made part of the model."""
    return list(_model_of(target).__dict__.get("_lmlab_standing", []))


def uninstall(target, *interventions: Intervention) -> None:
    model = _model_of(target)
    layout = getattr(target, "layout", None) or layout_of(model)
    stack = model.__dict__.get("_lmlab_active", [])
    standing = model.__dict__.get("_lmlab_standing", [])
    for iv in interventions or tuple(standing):
        if iv in standing:
            standing.remove(iv)
            stack.remove(iv)
    _rebuild_plans(layout, stack)


_EXAMPLE_KEYS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("lmlab_example_keys",
                                                                                    default=None)


def example_keys() -> torch.Tensor | None:
    """One int64 key per row of the batch now running (set by the training loop, `keyed_examples`), so that an
    intervention's per-example randomness does not depend on how a batch is split over processes or padded;
    None when no one set them."""
    return _EXAMPLE_KEYS.get()


@contextmanager
def keyed_examples(keys: torch.Tensor):
    token = _EXAMPLE_KEYS.set(keys)
    try:
        yield
    finally:
        _EXAMPLE_KEYS.reset(token)


def where_rows(mask: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """`new` where mask (broadcast over trailing dims), else `old`; gradient-friendly."""
    if mask is None:
        return new
    mask = mask.to(new.device)
    while mask.dim() < new.dim():
        mask = mask.unsqueeze(-1)
    return torch.where(mask, new, old)
