"""Interventions inside the attention function: knockout, head ablation/patching, sparse edge gates."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch

from lmlab.errors import LmlabError
from lmlab.interventions.core import Intervention, example_keys, where_rows


def _heads_by_layer(heads) -> dict[int, list[int]]:
    """Accept {layer: [heads]} or [(layer, head), ...]."""
    if isinstance(heads, Mapping):
        return {int(l): sorted({int(h) for h in hs}) for l, hs in heads.items()}
    out: dict[int, set[int]] = {}
    for layer, head in heads:
        out.setdefault(int(layer), set()).add(int(head))
    return {l: sorted(hs) for l, hs in out.items()}


def _check_heads(layout, heads: Iterable[int]) -> None:
    bad = [h for h in heads if not 0 <= h < layout.n_heads]
    if bad:
        raise LmlabError(f"head {bad[0]} does not exist; the model has heads 0..{layout.n_heads - 1}")


def _mixers(layout) -> str:
    """"the state space blocks (layers 0, 1) and convolution blocks (layers 3-5)": a hybrid's other mixers."""
    from lmlab.models.layout import layer_ranges

    by_kind: dict[str, list[int]] = {}
    for layer in layout.mixing_layers:
        by_kind.setdefault(layout.kinds[layer], []).append(layer)
    return "its " + " and ".join(f"{kind} blocks (layers {layer_ranges(layers)})" for kind, layers in by_kind.items())


def check_knockout(layout) -> None:
    """Raise where a knockout cannot block what it claims to: a hybrid block that mixes positions besides softmax
    attention through no module lmlab can find (its recurrent states would carry the knocked-out tokens on). (A study
    that knocks out asks before any work.)"""
    for layer in layout.mixing_layers:
        try:
            layout.mixer(layer)
        except LmlabError:
            raise LmlabError(f"a knockout cuts attention edges, but this {layout.family} model also moves information "
                             f"between positions in {_mixers(layout)}, and lmlab finds no mixer module in layer "
                             f"{layer} to keep the knocked-out tokens out of") from None


_CACHES = ("cache", "cache_params", "past_key_values", "past_key_value", "layer_past", "cache_position")


def _compacted(keep: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Each row's kept positions packed to the front, in order, zeros after (batch, n kept at most, ...)."""
    width = int(keep.sum(1).max())
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :width]
    valid = torch.arange(width, device=keep.device)[None, :] < keep.sum(1, keepdim=True)
    index = order.reshape(*order.shape, *([1] * (values.dim() - 2))).expand(-1, -1, *values.shape[2:])
    packed = values.gather(1, index)
    return packed * valid.reshape(*valid.shape, *([1] * (values.dim() - 2))).to(packed.dtype)


class Knockout(Intervention):
    """Block attention from key positions to query positions (-inf before the softmax).

    keys     (batch, seq) bool: the key positions to cut off.
    queries  (batch, seq) bool: the queries that may no longer read any of them. Default: `scope`.
    scope    with no `queries`, which later positions lose each key:
             'each' (default; the paper's knockout, arXiv 2601.07422): every key e is blocked from every
                 query q > e, so the keys cannot read each other either ("Burk|ina| F|aso" cannot
                 compose the subject);
             'span': every position after the *last* blocked key loses all keys (the keys still read
                 each other, and a token between two blocked keys reads the earlier one).
             Both also block positions generated later.
    layers   the layers where the edges are cut (default all); `layer_mask` (batch, n_layers) bool
             instead gives each example its own set (one batched pass for several layer cut-offs).
    heads    the heads (default all).
    Positions index the padded batch as the model sees it; `Knockout.spans` takes positions within
    each unpadded prompt and checks them.
    """

    in_attention = False  # (its layers may be a hybrid's other blocks: checked in `bind`)

    SCOPES = ("each", "span")

    def __init__(self, keys: torch.Tensor, queries: torch.Tensor | None = None, *, scope: str = "each",
                 layers: Iterable[int] | int | None = None, heads: Iterable[int] | None = None,
                 layer_mask: torch.Tensor | None = None):
        super().__init__(layers)
        if scope not in self.SCOPES:
            raise LmlabError(f"unknown knockout scope '{scope}'; use one of {', '.join(self.SCOPES)}")
        self.keys = keys.bool()
        self.scope = scope if queries is None else "queries"
        self.query_after = None
        if queries is None:
            seq = keys.shape[1]
            idx = torch.arange(seq, device=keys.device)
            last = torch.where(self.keys, idx, torch.full_like(idx, -1)).amax(1, keepdim=True)
            first = torch.where(self.keys, idx, torch.full_like(idx, seq)).amin(1, keepdim=True)
            # the queries that lose at least one key (positions generated later are handled in `block`)
            after = last if scope == "span" else first
            queries = (idx[None, :] > after) & (last >= 0)
            self.query_after = after.masked_fill(last < 0, -1)
        self.queries = queries.bool()
        self.heads = None if heads is None else sorted(set(heads))
        self.layer_mask = layer_mask

    @classmethod
    def spans(cls, attention_mask: torch.Tensor, key_positions: Sequence[Sequence[int]],
              query_positions: Sequence[Sequence[int]] | None = None, **kwargs) -> "Knockout":
        """Build from positions counted within each prompt (0 = its first real token), left or right padded."""
        real = attention_mask.bool()
        batch, seq = real.shape
        if len(key_positions) != batch or (query_positions is not None and len(query_positions) != batch):
            raise LmlabError(f"knockout positions are given for {len(key_positions)} prompts, the batch has {batch}")
        lengths = real.sum(1).tolist()

        def to_mask(positions, what):
            mask = torch.zeros(batch, seq, dtype=torch.bool, device=attention_mask.device)
            for b, pos in enumerate(positions):
                real_idx = real[b].nonzero().flatten()
                for p in pos:
                    if not 0 <= p < lengths[b]:
                        raise LmlabError(f"knockout {what} position {p} is outside prompt {b}, which has "
                                         f"{lengths[b]} tokens (positions 0..{lengths[b] - 1})")
                    mask[b, real_idx[p]] = True
            return mask

        queries = None if query_positions is None else to_mask(query_positions, "query")
        return cls(to_mask(key_positions, "key"), queries, **kwargs)

    def bind(self, layout):
        super().bind(layout)
        check_knockout(layout)
        for layer in sorted(self.layers or ()):  # an attention block, a hybrid's other mixer, or an MLP block
            if layer not in layout.attention_layers and layer not in layout.mixing_layers \
                    and layout.kinds[layer] != "mlp":
                layout.check_attention(layer)
        if self.heads is not None:
            _check_heads(layout, self.heads)
        if self.layer_mask is not None and self.layer_mask.shape != (self.keys.shape[0], layout.n_layers):
            raise LmlabError(f"layer_mask must be (batch, n_layers) = ({self.keys.shape[0]}, {layout.n_layers})")

    def uses_scores(self, layer):
        return self.on_layer(layer) and (self.layer_mask is None or bool(self.layer_mask[:, layer].any()))

    def hooks(self, layout):
        """A hybrid's other mixers (linear attention, state space, recurrence, short convolution) in the knocked-out
        layers: each runs again on the sequence without the knocked-out tokens (`_cut_mixer`)."""
        return [layout.mixer(layer).register_forward_hook(
            (lambda l: lambda m, a, k, o: self._cut_mixer(l, m, a, k, o))(layer), with_kwargs=True)
            for layer in layout.mixing_layers if self.uses_scores(layer)]

    def _cut_mixer(self, layer, module, args, kwargs, out):
        """The mixer's outputs at the queries that lose the keys, recomputed from the sequence with the key positions
        deleted: no key token writes into the recurrent state (nor decays it) or into a later position's short
        convolution, and the keys' own outputs stay as they were. (For scope 'each', a key's own output keeps what
        earlier keys wrote there: the recurrence has no per-pair edge to cut.)"""
        hidden = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.dim() == 3)
        rows, seq = hidden.shape[:2]
        if seq != self.keys.shape[1]:
            raise LmlabError(f"a knockout in layer {layer}'s {self.layout.kinds[layer]} block runs on whole sequences "
                             f"({self.keys.shape[1]} positions), not on {seq} after a cache")
        keys = self.keys[:rows].to(hidden.device)
        replaced = self.queries[:rows].to(hidden.device) & ~keys
        if self.layer_mask is not None:
            replaced &= self.layer_mask[:rows, layer].to(hidden.device)[:, None]
        if not bool(replaced.any()):
            return None
        keep = ~keys
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() != 2:
            raise LmlabError(f"layer {layer}'s mixer reads a {mask.dim()}-D mask; a knockout there needs the "
                             f"padding mask (batch, positions)")

        def packed(value):  # every per-position input (the states, the padding mask, positions) without the keys
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == seq \
                    and value.shape[0] in (rows, 1):
                return _compacted(keep, value.expand(rows, *value.shape[1:]))
            return value

        new_args = [packed(a) for a in args]
        new_kwargs = {k: (None if k in _CACHES else packed(v)) for k, v in kwargs.items()}
        again = module.forward(*new_args, **new_kwargs)
        again = again[0] if isinstance(again, tuple) else again
        position = (keep.long().cumsum(1) - 1).clamp_min(0)
        spread = again.gather(1, position[..., None].expand(-1, -1, again.shape[-1]))
        first = out[0] if isinstance(out, tuple) else out
        cut = torch.where(replaced[..., None], spread.to(first.dtype), first)
        return (cut, *out[1:]) if isinstance(out, tuple) else cut

    def block(self, layer, ctx):
        if ctx.batch > self.keys.shape[0]:
            raise LmlabError(f"this knockout was built for a batch of {self.keys.shape[0]}, the model got {ctx.batch}")
        rows = ctx.batch  # fewer when `RetireRows` has dropped rows from the end: the leading ones remain
        seq = self.keys.shape[1]
        keys = torch.zeros(rows, ctx.kv_len, dtype=torch.bool, device=ctx.device)
        keys[:, : min(seq, ctx.kv_len)] = self.keys[:rows, : ctx.kv_len].to(ctx.device)
        q_pos = ctx.query_positions
        inside = q_pos < seq
        queries = torch.zeros(rows, ctx.q_len, dtype=torch.bool, device=ctx.device)
        queries[:, inside] = self.queries[:rows].to(ctx.device)[:, q_pos[inside]]
        if self.query_after is not None:  # generated positions: blocked when after the span
            queries |= (q_pos[None, :] >= seq) & (self.query_after[:rows].to(ctx.device) >= 0)
        if self.layer_mask is not None:
            queries &= self.layer_mask[:rows, layer].to(ctx.device)[:, None]
        blocked = queries[:, :, None] & keys[:, None, :]  # (B, Q, K)
        if self.scope == "each":  # key e only from queries q > e
            later = q_pos[:, None] > torch.arange(ctx.kv_len, device=ctx.device)[None, :]
            blocked = blocked & later[None]
        blocked = blocked[:, None]  # (B, 1, Q, K)
        if self.heads is not None:
            head_sel = torch.zeros(ctx.n_heads, dtype=torch.bool, device=ctx.device)
            head_sel[self.heads] = True
            blocked = blocked & head_sel[None, :, None, None]
        return blocked


class AblateHeads(Intervention):
    """Replace chosen heads' outputs z.

    heads      {layer: [head, ...]} or [(layer, head), ...]
    mode       'zero'; 'mean' (reference[layer]: (n_heads, head_dim), e.g. a mean of captured z);
               'patch' (reference[layer]: (batch, pos, n_heads, head_dim), another run's captured z);
               'scale' (multiply by `scale`)
    positions  (batch, pos) bool: only these query positions (default all)
    """

    in_attention = True

    MODES = ("zero", "mean", "patch", "scale")

    def __init__(self, heads, mode: str = "zero", reference: Mapping[int, torch.Tensor] | None = None,
                 positions: torch.Tensor | None = None, scale: float = 0.0):
        self.by_layer = _heads_by_layer(heads)
        super().__init__(self.by_layer.keys())
        if mode not in self.MODES:
            raise LmlabError(f"unknown ablation mode '{mode}'; use one of {', '.join(self.MODES)}")
        if mode in ("mean", "patch") and reference is None:
            raise LmlabError(f"ablation mode '{mode}' needs reference values (e.g. captured z of another run)")
        self.mode, self.reference, self.positions, self.scale = mode, reference, positions, scale

    def bind(self, layout):
        super().bind(layout)
        for heads in self.by_layer.values():
            _check_heads(layout, heads)
        if self.reference is not None:
            missing = [l for l in self.by_layer if l not in self.reference]
            if missing:
                raise LmlabError(f"ablation reference has no values for layer {missing[0]}")

    def uses_z(self, layer):
        return layer in self.by_layer

    def edit_z(self, layer, z, ctx):
        heads = self.by_layer[layer]
        q_pos = ctx.query_positions
        if self.mode == "zero":
            new = torch.zeros_like(z[:, :, heads])
        elif self.mode == "scale":
            new = z[:, :, heads] * self.scale
        elif self.mode == "mean":
            new = self.reference[layer].to(z)[heads].expand_as(z[:, :, heads])
        else:
            ref = self.reference[layer].to(z)
            if ref.shape[0] != z.shape[0] or ref.shape[1] <= int(q_pos[-1]):
                raise LmlabError(f"patch reference for layer {layer} has shape {tuple(ref.shape)}, which does not "
                                 f"cover this batch of {z.shape[0]} x {ctx.kv_len} positions")
            new = ref[:, q_pos][:, :, heads]
        positions = None if self.positions is None else self.positions.to(z.device)[:, q_pos]
        out = z.clone()
        out[:, :, heads] = where_rows(positions, new, z[:, :, heads])
        return out


class PatchHeadRows(Intervention):
    """Patch different heads in each block of rows: the batch is m blocks of B rows (block i = rows
    [i*B, (i+1)*B), the same B prompts in each), and block i gets the heads `heads[i]` of layer `layer` (one
    head, several, or None for none) replaced by `reference` (B, pos, n_heads, head_dim), their z on other
    inputs (`Capture('z')` of a corrupted run), every other head left alone. m patching runs as one batched
    forward pass: activation patching (one head a block; with `StartAt(layer, ...)` each starts from the clean
    residual at that layer) or an explained-effect curve (block i patches every head outside the top N_i)."""

    in_attention = True

    def __init__(self, layer: int, heads: Sequence[int | Iterable[int] | None], reference: torch.Tensor):
        super().__init__([layer])
        self.layer, self.reference = layer, reference
        self.heads = [[] if h is None else ([int(h)] if isinstance(h, int) else sorted({int(x) for x in h}))
                      for h in heads]

    def bind(self, layout):
        super().bind(layout)
        _check_heads(layout, [h for block in self.heads for h in block])
        self._patched = [[h in block for h in range(layout.n_heads)] for block in self.heads]  # (blocks, heads)

    def uses_z(self, layer):
        return layer == self.layer

    def edit_z(self, layer, z, ctx):
        blocks, ref = len(self.heads), self.reference.to(z)
        per = ref.shape[0]
        if z.shape[0] != blocks * per or ref.shape[1] <= int(ctx.query_positions[-1]):
            raise LmlabError(f"PatchHeadRows: {blocks} blocks of a reference of shape {tuple(ref.shape)} do not "
                             f"fit this batch of {z.shape[0]} rows x {ctx.kv_len} positions")
        ref = ref[:, ctx.query_positions]
        # made on the layer's device at each call (a default-device context may hold another at bind time)
        mask = torch.tensor(self._patched, dtype=torch.bool, device=z.device)[:, None, None, :, None]
        shape = z.shape
        out = torch.where(mask, ref[None], z.reshape(blocks, per, *shape[1:]))
        return out.reshape(shape)


_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """A 64-bit constant as torch's int64 holds it (two's complement)."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


_MIX = [_signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)]
_SPREAD = [_signed(0x9E3779B97F4A7C15), _signed(0xD1B54A32D192ED03), _signed(0x8CB92BA72F3D8DD7),
           _signed(0xABC98388FB8FAC03)]


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """A logical right shift of int64 values (torch's >> keeps the sign)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def keyed_uniform(keys: torch.Tensor, layer: int, real: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, heads, Q, Q) uniforms in [0, 1), each a function of (its example's key, the layer, the head, and the query's
    and key's index among the example's real tokens) alone: splitmix64 of a mixed counter, computed in one pass for
    the whole batch. Pairs with a padded token get 0.5 (they are masked out of the gate anyway)."""
    rank = (real.long().cumsum(-1) - 1).clamp_min(0)  # (B, Q): a token's index among its example's real tokens
    b = keys.long()[:, None, None, None] * _SPREAD[0]
    h = torch.arange(heads, device=keys.device, dtype=torch.long)[None, :, None, None] * _SPREAD[1]
    i = rank[:, None, :, None] * _SPREAD[2]
    j = rank[:, None, None, :] * _SPREAD[3]
    z = b + h + i + j + (int(layer) * 1_000_003 + 1)
    z = (z ^ _shr(z, 30)) * _MIX[0]
    z = (z ^ _shr(z, 27)) * _MIX[1]
    z = z ^ _shr(z, 31)
    u = _shr(z, 11).to(torch.float64) * (2.0 ** -53)
    pair = real[:, None, :, None] & real[:, None, None, :]
    return torch.where(pair, u, torch.full_like(u, 0.5)).to(torch.float32)


class SparseAttention(Intervention):
    """Stochastic edge gates on attention (Draye et al.): keep edge (i, j) with p = sigmoid(s_ij).

    Training (`sample=True`): a binary-concrete (Gumbel) sample with a straight-through gradient.
    Evaluation (`sample=False`): the gate is deterministic, s_ij > 0. Softmax runs over kept edges
    only; a query with no kept edge keeps its self-edge. After each forward pass `expected_edges`
    (sum of sigmoid(s_ij) over causal pairs, differentiable), `kept_edges` (edges the gate kept, the
    self-edge fallback not counted), `fallback_edges` (queries that kept nothing and fell back to
    themselves), `queries` (query rows, per head and layer) and `total_edges` (causal pairs) hold the
    totals over the gated layers; call `reset()` before the next pass. Where queries and keys are the same
    positions (no KV cache), the counts leave out padded query rows: a padding token's row is not an edge.

    The noise comes from `generator` (default: torch's global one), or, with `keyed=True` inside the training
    loop, from a hash of each example's key (`interventions.example_keys`), the layer, the head and the pair's
    indices among the example's real tokens (`keyed_uniform`, one vectorised pass): an example's noise is then the
    same whatever batch, padding or process it runs in (so N processes follow one process's curve).
    """

    in_attention = True

    def __init__(self, layers=None, sample: bool = True, temperature: float = 2 / 3,
                 generator: torch.Generator | None = None, keyed: bool = False, replicas: int = 1):
        super().__init__(layers)
        self.sample, self.temperature, self.generator, self.keyed = sample, temperature, generator, keyed
        self.replicas = replicas  # a stacked model's (lmlab.train.ensemble): every count is also kept per replicate
        self.reset()

    def reset(self) -> None:
        k = self.replicas
        self.expected_per = torch.zeros(k, device="cpu")  # moves to the scores' device on the first call
        self.kept_per, self.fallback_per, self.queries_per, self.total_per = (
            torch.zeros(k, dtype=torch.float64, device="cpu") for _ in range(4))

    # totals over every replicate (the one model's, for an ordinary model)
    @property
    def expected_edges(self) -> torch.Tensor:
        return self.expected_per.sum()

    @property
    def kept_edges(self) -> float:
        return float(self.kept_per.sum())

    @property
    def fallback_edges(self) -> float:
        return float(self.fallback_per.sum())

    @property
    def queries(self) -> float:
        return float(self.queries_per.sum())

    @property
    def total_edges(self) -> float:
        return float(self.total_per.sum())

    def _rows(self, per_row: torch.Tensor) -> torch.Tensor:
        """(B,) per batch row -> (replicas,): a stacked model's rows are each replicate's in turn."""
        return per_row.reshape(self.replicas, -1).sum(1)

    @property
    def kept_fraction(self) -> float:
        """Edges the gate kept over all causal edges; the self-edge fallback is not an edge the gate kept."""
        return self.kept_edges / max(self.total_edges, 1.0)

    @property
    def edges_per_query(self) -> float:
        """Kept edges per query row (per head and layer), fallback not counted: 0 means every query fell back."""
        return self.kept_edges / max(self.queries, 1.0)

    def uses_scores(self, layer):
        return self.on_layer(layer)

    def _noise(self, layer: int, scores: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
        keys = example_keys() if self.keyed else None
        if keys is None or real is None or len(keys) != scores.shape[0]:
            return torch.rand(scores.shape, generator=self.generator, device="cpu").to(scores.device)
        return keyed_uniform(keys.to(scores.device), layer, real, scores.shape[1])

    def gate(self, layer, scores, allowed, ctx):
        real = None  # (B, Q) the real query rows, where queries are the keys' own positions (no cache)
        row = 1.0  # what a query row counts for: 0 for a padded one
        if ctx.q_len == ctx.kv_len:
            real = allowed.any(-2).any(1)  # a real token is a key some query may read (itself at least)
            row = real[:, None, :, None].to(scores.dtype)
        probs = torch.sigmoid(scores) * row  # masked pairs have score -inf, so probability 0
        total = self._rows(probs.sum((1, 2, 3)))
        total = total if self.sample else total.detach()  # a deterministic gate trains nothing
        self.expected_per = self.expected_per.to(scores.device) + total
        if self.sample:
            u = self._noise(layer, scores, real)
            u = u.clamp(1e-6, 1 - 1e-6)
            soft = torch.sigmoid((scores + torch.log(u) - torch.log1p(-u)) / self.temperature)
            gate = (soft > 0.5).to(soft.dtype) + soft - soft.detach()
        else:
            gate = (scores > 0).to(scores.dtype)
        gate = gate * allowed
        self.kept_per += self._rows((gate.detach() * row).sum((1, 2, 3))).double().cpu()
        # self-edge fallback: a query whose every edge was dropped keeps the edge to itself
        keys = allowed.expand(gate.shape).sum(-1)  # (B, H, Q): causal keys of each query row
        empty = (gate.detach().sum(-1) == 0) & (keys > 0)
        diag = torch.zeros(ctx.q_len, ctx.kv_len, dtype=gate.dtype, device=gate.device)
        diag[torch.arange(ctx.q_len, device=gate.device), ctx.query_positions] = 1.0
        gate = gate + empty[..., None].to(gate.dtype) * diag
        counted_keys = (keys if real is None else keys * real[:, None, :]).expand(empty.shape)
        self.fallback_per += self._rows((empty & (counted_keys > 0)).sum((1, 2))).double().cpu()
        self.queries_per += self._rows((counted_keys > 0).sum((1, 2))).double().cpu()
        self.total_per += self._rows(counted_keys.sum((1, 2))).double().cpu()
        return gate
