"""Circuit discovery over attention heads (sparse-circuits): attribution and activation patching, explained effect.

Both scorers answer the same question with the same interface: how much does the task metric move
when one head's output z (o_proj's input slice) is replaced by its output on the corrupted prompt?

    activation patching   the head patched (exact); each patch starts from the clean run's residual at its layer
                          (nothing below it changes) and the heads of a layer go as blocks of one batch, so all
                          heads cost about sum over layers of H x (L - l) / L forwards instead of L x H
                          (`activation_scores`); `activation_scores_naive` is the reference, one full forward
                          per head
    attribution patching  three passes for all heads at once: clean forward + backward (gradient of the
                          metric w.r.t. every z), corrupted forward; score = grad . (z_corrupted - z_clean)
                          summed over positions and head_dim (first-order Taylor estimate of the above)

Explained effect(N) keeps the N heads with the largest |score| clean and patches every other head with
its corrupted-run output: EE(N) = (m(N) - m(none)) / (m(all) - m(none)), m the mean task metric.
Per-prompt metrics are kept, so intervals come from resampling prompts without new forward passes.

MLPs as components (`mlps=True`): each layer's whole MLP output (mlp_out) is one more component, patched
with its corrupted-run output through PatchOutput and scored the same two ways. Score arrays then have
one extra column: (n_layers, n_heads + 1), column n_heads being the layer's MLP, so a component is
(layer, index) either way and `ranking` orders heads and MLPs together.

Each head's induction score (`induction_scores`, Olsson et al. 2022): at every position whose token occurred
before, the attention the head pays to the token that followed its earlier occurrence; 1 for a head that always
looks there, about 1/t for one that spreads its attention evenly.

Everything touches the model only through `lmlab.interventions` (Capture, AblateHeads, PatchOutput).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lmlab.data.generated.circuits import CircuitTask, task_metric
from lmlab.evaluation import circuit_batches as _batches
from lmlab.evaluation import encode_pairs as _encode
from lmlab.evaluation import metric_values
from lmlab.interventions import AblateHeads, Capture, PatchHeadRows, PatchOutput, StartAt, intervene
from lmlab.models.load import LoadedModel


def corrupted_z(lm: LoadedModel, task: CircuitTask, batch_size: int = 16, mlps: bool = False) -> list[dict]:
    """Every layer's z on the corrupted prompts, one dict per batch ({layer: z}; with `mlps`, also
    {("mlp", layer): mlp_out})."""
    return corrupted_run(lm, task, batch_size, mlps)[0]


@torch.no_grad()
def corrupted_run(lm: LoadedModel, task: CircuitTask, batch_size: int = 16,
                  mlps: bool = False) -> tuple[list[dict], np.ndarray]:
    """`corrupted_z` and, from the same passes, the per-prompt task metric on the corrupted prompts (what
    `metric_values(..., corrupted=True)` gives, without a second pass)."""
    out, metrics = [], []
    points = ("z", "mlp_out") if mlps else ("z",)
    for prompts in _batches(task, batch_size):
        with intervene(lm, Capture(*points)) as cap:
            logits = lm.forward_last(_encode(lm, prompts, corrupted=True)).logits[:, -1]
        metrics.append(task_metric(logits, prompts, task.metric).float().cpu())
        ref = dict(cap.store["z"])
        if mlps:
            ref.update({("mlp", l): v for l, v in cap.store["mlp_out"].items()})
        out.append(ref)
    return out, (torch.cat(metrics).numpy() if metrics else np.zeros(0, dtype=np.float32))


def _has_mlps(z_corr) -> bool:
    return any(isinstance(k, tuple) for k in z_corr[0])


def patch_all_but(lm: LoadedModel, patched, ref: dict) -> tuple:
    """Interventions that patch the components `patched` [(layer, index)] with `ref`'s corrupted values
    (index = n_heads: the layer's MLP)."""
    n_heads = lm.layout.n_heads
    heads: dict[int, list[int]] = {}
    mlp_layers = []
    for layer, index in patched:
        if index == n_heads:
            mlp_layers.append(layer)
        else:
            heads.setdefault(layer, []).append(index)
    out = []
    if heads:
        out.append(AblateHeads(heads, mode="patch", reference={l: ref[l] for l in heads}))
    if mlp_layers:
        out.append(PatchOutput("mlp_out", {l: ref[("mlp", l)] for l in mlp_layers}))
    return tuple(out)


def attribution_scores(lm: LoadedModel, task: CircuitTask, batch_size: int = 16,
                       z_corr: list[dict[int, torch.Tensor]] | None = None, per_prompt: bool = False) -> np.ndarray:
    """(n_layers, n_heads) first-order estimates of the mean metric change when each head is patched.
    `per_prompt`: (n_prompts, n_layers, n_heads), each prompt pair's own estimate (their mean is the default's
    array), so a ranking can be resampled over prompt pairs without another pass."""
    layout = lm.layout
    z_corr = z_corr if z_corr is not None else corrupted_z(lm, task, batch_size)
    mlps = _has_mlps(z_corr)
    width = layout.n_heads + int(mlps)
    rows: list[torch.Tensor] = []  # per batch: (B, n_layers, width), on the host
    points = ("z", "mlp_out") if mlps else ("z",)
    for prompts, ref in zip(_batches(task, batch_size), z_corr):
        with torch.enable_grad(), intervene(lm, Capture(*points, grad=True)) as cap:
            logits = lm.last_logits(_encode(lm, prompts, corrupted=False))
            metric = task_metric(logits, prompts, task.metric).sum()
            keys = [("z", l) for l in sorted(cap.store["z"])]
            keys += [("mlp_out", l) for l in sorted(cap.store["mlp_out"])] if mlps else []
            grads = torch.autograd.grad(metric, [cap.store[p][l] for p, l in keys])
        part = torch.zeros(len(prompts), layout.n_layers, width, dtype=torch.float64, device="cpu")
        part[:, [l for l in range(layout.n_layers) if l not in cap.store["z"]], :layout.n_heads] = float("nan")
        for (point, layer), grad in zip(keys, grads):
            clean = cap.store[point][layer].detach()
            if point == "z":
                delta = (ref[layer].to(clean) - clean) * grad  # (B, P, H, D)
                part[:, layer, :layout.n_heads] = delta.sum(dim=(1, 3)).double().cpu()
            else:
                delta = (ref[("mlp", layer)].to(clean) - clean) * grad  # (B, P, d_model)
                part[:, layer, layout.n_heads] = delta.sum(dim=(1, 2)).double().cpu()
        rows.append(part)
    every = torch.cat(rows) if rows else torch.zeros(0, layout.n_layers, width, dtype=torch.float64)
    return every.numpy() if per_prompt else (every.sum(0) / len(task)).numpy()


def _components(layout, width: int, heads) -> dict[int, list[int]]:
    comps = heads if heads is not None else [(l, h) for l in layout.attention_layers for h in range(width)]
    by_layer: dict[int, list[int]] = {}
    for layer, index in comps:
        by_layer.setdefault(int(layer), []).append(int(index))
    return by_layer


@torch.no_grad()
def activation_scores(lm: LoadedModel, task: CircuitTask, batch_size: int = 16,
                      z_corr: list[dict[int, torch.Tensor]] | None = None, heads=None,
                      progress=None, max_rows: int = 256) -> np.ndarray:
    """(n_layers, n_heads [+ 1 with MLPs]) exact mean metric change when each component alone is patched
    (NaN where not run).

    Per batch of prompts: one clean pass records the residual stream at every layer; then, layer by layer, the
    layer's components go as blocks of one batch (at most `max_rows` rows a pass: memory), each block patching
    its own head (`PatchHeadRows`, or the layer's MLP through `PatchOutput`) and every block starting from the
    clean residual at that layer (`StartAt`): the layers below compute nothing. Logits at the metric's position
    only. The same scores as `activation_scores_naive` (float rounding; tests)."""
    layout = lm.layout
    z_corr = z_corr if z_corr is not None else corrupted_z(lm, task, batch_size)
    width = layout.n_heads + int(_has_mlps(z_corr))
    by_layer = _components(layout, width, heads)
    totals = {(l, c): 0.0 for l, comps in by_layer.items() for c in comps}
    base_total, n = 0.0, 0
    batches = list(_batches(task, batch_size))
    for i, prompts in enumerate(batches):
        batch = dict(_encode(lm, prompts, corrupted=False), use_cache=False)
        rows = len(prompts)
        with intervene(lm, Capture("resid_pre", layers=sorted(by_layer))) as cap:
            base_total += float(task_metric(lm.last_logits(batch), prompts, task.metric).double().sum())
        n += rows
        per_pass = max(1, max_rows // rows)
        for layer, comps in sorted(by_layer.items()):
            for start in range(0, len(comps), per_pass):
                chunk = comps[start:start + per_pass]
                m = len(chunk)
                edits = [StartAt(layer, cap["resid_pre", layer]),
                         *_blocks_patching(lm, [[(layer, c)] for c in chunk], z_corr[i], rows)]
                with intervene(lm, *edits):
                    values = task_metric(lm.last_logits(_tiled(batch, m)), list(prompts) * m,
                                         task.metric).double().cpu()
                for c, v in zip(chunk, values.reshape(m, rows)):
                    totals[(layer, c)] += float(v.sum())
                    if progress and i == len(batches) - 1:
                        progress()
    scores = np.full((layout.n_layers, width), np.nan)
    for (layer, c), total in totals.items():
        scores[layer, c] = (total - base_total) / n
    return scores


def activation_scores_naive(lm: LoadedModel, task: CircuitTask, batch_size: int = 16,
                            z_corr: list[dict[int, torch.Tensor]] | None = None, heads=None,
                            progress=None) -> np.ndarray:
    """The reference for `activation_scores`: one full forward pass over every batch per component."""
    layout = lm.layout
    z_corr = z_corr if z_corr is not None else corrupted_z(lm, task, batch_size)
    width = layout.n_heads + int(_has_mlps(z_corr))
    base = metric_values(lm, task, batch_size).mean()
    heads = heads if heads is not None else [(l, h) for l in layout.attention_layers for h in range(width)]
    scores = np.full((layout.n_layers, width), np.nan)
    for layer, head in heads:
        values = metric_values(lm, task, batch_size, interventions_for=lambda i, l=layer, h=head: patch_all_but(
            lm, [(l, h)], z_corr[i]))
        scores[layer, head] = values.mean() - base
        if progress:
            progress()
    return scores


def induction_targets(ids: torch.Tensor, mask: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, t, s + 1) for every real position t of a padded batch whose token occurred before at a real position
    s < t - 1 (the most recent such s): where an induction head at t looks, the token after the earlier one."""
    out = []
    for row, (seq, real) in enumerate(zip(ids.tolist(), mask.tolist())):
        last: dict[int, int] = {}
        for t, (token, on) in enumerate(zip(seq, real)):
            if not on:
                continue
            s = last.get(token)
            if s is not None and s + 1 < t:
                out.append((row, t, s + 1))
            last[token] = t
    return out


@torch.no_grad()
def induction_scores(lm: LoadedModel, task: CircuitTask, batch_size: int = 16) -> np.ndarray:
    """(n_layers, n_heads): each head's mean attention weight from a repeated token to the token after its earlier
    occurrence (`induction_targets`), over every such position of the task's clean prompts; NaN in a layer without
    attention (a hybrid's recurrent layers), 0 everywhere where no prompt repeats a token."""
    layout = lm.layout
    total = np.zeros((layout.n_layers, layout.n_heads))
    seen: set[int] = set()
    count = 0
    for prompts in _batches(task, batch_size):
        batch = _encode(lm, prompts, corrupted=False)
        targets = induction_targets(batch["input_ids"], batch["attention_mask"])
        if not targets:
            continue
        rows, ts, ss = (torch.tensor(v, device=batch["input_ids"].device) for v in zip(*targets))
        with intervene(lm, Capture("pattern")) as cap:
            lm.forward_last(batch)
        for layer, pattern in cap.store["pattern"].items():  # (batch, heads, query, key)
            total[layer] += pattern[rows, :, ts, ss].float().sum(0).cpu().numpy()
            seen.add(layer)
        count += len(targets)
    out = total / max(count, 1)
    if count:
        out[[layer for layer in range(layout.n_layers) if layer not in seen]] = np.nan
    return out


def ranking(scores: np.ndarray, tie: float = 1e-5) -> list[tuple[int, int]]:
    """Heads ordered by |score|, largest first; a head without a score (NaN: a hybrid's layer that holds no softmax
    attention) is not ranked. Scores within `tie` x the largest |score| of each other count as tied and keep their
    position order, so float noise (another summation order, several processes) does not reorder heads whose scores
    only differ in their last digits."""
    flat = np.abs(np.nan_to_num(scores, nan=-np.inf)).ravel()
    top = float(np.max(flat[np.isfinite(flat)])) if np.isfinite(flat).any() else 0.0
    if top > 0:
        flat = np.where(np.isfinite(flat), np.round(flat / (tie * top)), flat)
    order = np.argsort(-flat, kind="stable")
    n_heads = scores.shape[1]
    scored = ~np.isnan(np.asarray(scores, dtype=float)).ravel()
    return [(int(i // n_heads), int(i % n_heads)) for i in order if scored[i]]


def heads_grid(total: int, fine: bool = True) -> list[int]:
    """0, 1, 2, ... denser at small N, always ending at all heads. `fine=False`: about half the points
    (steps of ~1.4x after 4), for CPU budgets; N needed is then resolved to the coarser grid."""
    grid = {0, total}
    n = 1
    while n < total:
        grid.add(n)
        if fine:
            n = n + 1 if n < 8 else (n + 2 if n < 24 else int(round(n * 1.15)))
        else:
            n = n + 1 if n < 4 else int(round(n * 1.4))
    return sorted(grid)


@dataclass
class EffectCurve:
    grid: list[int]
    values: np.ndarray  # (len(grid), n_prompts) per-prompt metric with the top N heads kept
    clean: np.ndarray  # per-prompt m(all)
    none: np.ndarray  # per-prompt m(none): every head patched

    def has_effect(self, idx: np.ndarray | None = None) -> bool:
        """Whether there is an effect to explain: the clean prompts' mean metric differs from the all-patched one
        (beyond float rounding). A model that does not do the task (a tiny random one) can give the same metric
        both ways; its explained effect is then undefined, not a number."""
        sel = slice(None) if idx is None else idx
        top, bottom = float(self.clean[sel].mean()), float(self.none[sel].mean())
        return abs(top - bottom) > 1e-6 * max(abs(top), abs(bottom), 1.0)

    def explained(self, idx: np.ndarray | None = None) -> np.ndarray:
        """(m(top N) - m(none)) / (m(all) - m(none)) at each grid point, means over the prompts `idx`; all NaN when
        there is no effect to explain (has_effect)."""
        sel = slice(None) if idx is None else idx
        if not self.has_effect(idx):
            return np.full(len(self.grid), np.nan)
        top, bottom = self.clean[sel].mean(), self.none[sel].mean()
        return (self.values[:, sel].mean(1) - bottom) / (top - bottom)

    def heads_needed(self, threshold: float = 0.9, idx: np.ndarray | None = None) -> int | None:
        """The smallest N on the grid from which the explained effect stays >= `threshold` (None: never).

        "Stays": curves are not monotone (a single head kept can overshoot while a few more undershoot),
        and the first crossing would reward such a spike; the last crossing is what "a circuit of N
        heads explains 90%" means when every larger circuit must explain it too.
        """
        needed = None
        for n, value in zip(self.grid, self.explained(idx)):
            if value >= threshold:
                needed = n if needed is None else needed
            else:
                needed = None
        return needed


def _tiled(batch: dict, m: int) -> dict:
    """The batch's tensors repeated m times along the rows (m blocks of the same prompts)."""
    return {k: (v.repeat(m, *([1] * (v.dim() - 1))) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def _blocks_patching(lm: LoadedModel, sets: list, ref: dict, rows: int) -> list:
    """Interventions for a batch of len(sets) blocks of `rows` rows, block i patching the components sets[i]
    [(layer, index)] with `ref`'s corrupted values (index n_heads: the layer's MLP)."""
    n_heads = lm.layout.n_heads
    heads: dict[int, list[list[int]]] = {}  # layer -> each block's heads there
    mlps: dict[int, list[bool]] = {}  # layer -> whether each block patches its MLP
    for b, patched in enumerate(sets):
        for layer, index in patched:
            if index == n_heads:
                mlps.setdefault(layer, [False] * len(sets))[b] = True
            else:
                heads.setdefault(layer, [[] for _ in sets])[b].append(index)
    out = [PatchHeadRows(layer, blocks, ref[layer]) for layer, blocks in sorted(heads.items())]
    for layer, blocks in sorted(mlps.items()):
        r = ref[("mlp", layer)]
        block = torch.tensor(blocks, device=lm.device).repeat_interleave(rows)
        out.append(PatchOutput("mlp_out", {layer: r.repeat(len(sets), 1, 1)},
                               positions=block[:, None].expand(-1, r.shape[1])))
    return out


@torch.no_grad()
def effect_curve(lm: LoadedModel, task: CircuitTask, order: list[tuple[int, int]], grid: list[int] | None = None,
                 batch_size: int = 16, z_corr=None, progress=None, max_rows: int = 256) -> EffectCurve:
    """The per-prompt metric with the top N components of `order` kept clean and every other one patched, for
    each N of `grid`: `patched_metrics` with the sets order[N:] (the same values as `effect_curve_naive`, one
    forward per point, to float rounding)."""
    if z_corr is None:
        z_corr = corrupted_z(lm, task, batch_size, mlps=any(h == lm.layout.n_heads for _, h in order))
    grid = sorted(set(grid or heads_grid(len(order))) | {0, len(order)})
    values = patched_metrics(lm, task, [order[n:] for n in grid], batch_size, z_corr, max_rows, progress)
    return EffectCurve(list(grid), values, clean=values[-1], none=values[0])


def _start_layers(sets: list, n_layers: int) -> list[int]:
    """Per set of patched components, the first layer where it keeps a component clean that some set patches
    (n_layers: none). Below that layer the set patches exactly what the reference (the union of the sets patched)
    patches, so its run there is the reference's."""
    union = {tuple(c) for s in sets for c in s}
    return [min((layer for layer, _ in union - {tuple(c) for c in s}), default=n_layers) for s in sets]


def _passes(todo: list[int], starts: list[int], per_pass: int, n_layers: int) -> list[list[int]]:
    """The sets `todo` (ordered by start layer) cut into passes of at most `per_pass` blocks, each pass starting at its
    first set's layer, at the least cost: a pass costs its blocks times the layers it runs, plus about one block's
    layer for the pass itself (its hooks and its embedding)."""
    best = [0.0] + [float("inf")] * len(todo)  # best[j]: the cheapest cut of todo[:j]
    cut = [0] * (len(todo) + 1)
    for j in range(1, len(todo) + 1):
        for i in range(max(0, j - per_pass), j):
            cost = best[i] + (j - i) * (n_layers - starts[todo[i]]) + 1
            if cost < best[j]:
                best[j], cut[j] = cost, i
    chunks, j = [], len(todo)
    while j:
        chunks.append(todo[cut[j]:j])
        j = cut[j]
    return chunks[::-1]


@torch.no_grad()
def patched_metrics(lm: LoadedModel, task: CircuitTask, patched_sets: list, batch_size: int = 16, z_corr=None,
                    max_rows: int = 256, progress=None) -> np.ndarray:
    """(len(patched_sets), n_prompts): the per-prompt metric with every component of patched_sets[i] [(layer,
    index)] patched with its corrupted-run output and every other one clean. `effect_curve` is this with the sets
    order[N:] for each N of its grid; any sets may be asked for here (the heads ranked on a resample of the prompts,
    say).

    Per batch of prompts one reference pass patches the union of the sets and records the residual stream at each
    layer; a set that patches all of the union below its first clean component's layer (`_start_layers`) starts
    there from the reference's residual (`StartAt`): the layers below compute nothing. The sets go, ordered by that
    layer, as blocks of one batch (at most `max_rows` rows a pass), block i patching its own set
    (`PatchHeadRows`); a set that is the union reads the reference's metric. A curve's top heads sit in the upper
    layers where it keeps few of them, so its points with small N cost a fraction of a forward pass. `progress` is
    called once a set when every batch is done."""
    sets = [[tuple(c) for c in s] for s in patched_sets]
    if z_corr is None:
        z_corr = corrupted_z(lm, task, batch_size, mlps=any(h == lm.layout.n_heads for s in sets for _, h in s))
    starts = _start_layers(sets, lm.layout.n_layers)
    values = np.zeros((len(sets), len(task)))
    done = 0
    for b, prompts in enumerate(_batches(task, batch_size)):
        values[:, done:done + len(prompts)] = _batch_metrics(lm, task, prompts, sets, starts, z_corr[b], max_rows)
        done += len(prompts)
    for _ in sets if progress else ():
        progress()
    return values


def _batch_metrics(lm: LoadedModel, task: CircuitTask, prompts: list, sets: list, starts: list[int], ref: dict,
                   max_rows: int) -> np.ndarray:
    """(len(sets), len(prompts)): `patched_metrics` on one batch of prompts (`ref`: its corrupted z)."""
    n_layers, rows = lm.layout.n_layers, len(prompts)
    batch = dict(_encode(lm, prompts, corrupted=False), use_cache=False)
    values = np.zeros((len(sets), rows))
    cap = Capture("resid_pre", layers=sorted({s for s in starts if 0 < s < n_layers}))
    with intervene(lm, cap, *_blocks_patching(lm, [sorted({c for s in sets for c in s})], ref, rows)):
        values[:] = task_metric(lm.last_logits(batch), prompts, task.metric).float().cpu().numpy()  # the union's
    todo = [i for i in sorted(range(len(sets)), key=lambda i: starts[i]) if starts[i] < n_layers]
    for chunk in _passes(todo, starts, max(1, max_rows // rows), n_layers):
        m, start = len(chunk), starts[chunk[0]]
        edits = [StartAt(start, cap["resid_pre", start])] if start > 0 else []
        edits += _blocks_patching(lm, [sets[i] for i in chunk], ref, rows)
        with intervene(lm, *edits):
            metric = task_metric(lm.last_logits(_tiled(batch, m)), list(prompts) * m, task.metric).float().cpu()
        values[chunk] = metric.reshape(m, rows).numpy()
    return values


def effect_curve_naive(lm: LoadedModel, task: CircuitTask, order: list[tuple[int, int]], grid: list[int] | None = None,
                       batch_size: int = 16, z_corr=None, progress=None) -> EffectCurve:
    """The reference for `effect_curve`: one forward pass over the prompts per grid point."""
    if z_corr is None:
        z_corr = corrupted_z(lm, task, batch_size, mlps=any(h == lm.layout.n_heads for _, h in order))
    grid = sorted(set(grid or heads_grid(len(order))) | {0, len(order)})
    rows = []
    for n in grid:
        patched = order[n:]
        if not patched:
            rows.append(metric_values(lm, task, batch_size))
        else:
            rows.append(metric_values(lm, task, batch_size,
                                      interventions_for=lambda i: patch_all_but(lm, patched, z_corr[i])))
        if progress:
            progress()
    values = np.stack(rows)
    return EffectCurve(list(grid), values, clean=values[-1], none=values[0])
