"""Batched greedy generation and last-token features: the two loops most studies run over a dataset.

Both take token-id lists (so spans computed on the prompt stay exact), batch them with the padding on
the left (generation: between the batch's common prefix and each row's own tokens), and show a progress bar.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from rich.progress import Progress
from transformers.cache_utils import DynamicLayer

from lmlab.errors import LmlabError
from lmlab.interventions import Capture, intervene
from lmlab.models import LoadedModel
from lmlab.models.load import check_context


def _batches(n: int, size: int):
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _cut_at_newline(tokenizer, ids: list[int], eos: set[int]) -> list[int]:
    out = []
    for tok in ids:
        if tok in eos or "\n" in tokenizer.decode([tok]):
            break
        out.append(tok)
    return out


def shared_prefix_length(prompts: Sequence[list[int]], minimum: int = 16) -> int:
    """Tokens every prompt starts with, leaving each prompt at least one token of its own (0 below `minimum`)."""
    n = len(os.path.commonprefix([list(p) for p in prompts]))
    n = min(n, min(len(p) for p in prompts) - 1)
    return n if n >= minimum else 0


def stop_tokens(lm: LoadedModel) -> set[int]:
    """End of sequence as the tokenizer and the generation config name it, and padding."""
    ids = {lm.tokenizer.eos_token_id, lm.tokenizer.pad_token_id}
    config_eos = getattr(getattr(lm.model, "generation_config", None), "eos_token_id", None)
    ids |= set(config_eos) if isinstance(config_eos, (list, tuple)) else {config_eos}
    return {t for t in ids if t is not None}


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """(rows, vocab) logits -> (rows,) tokens: argmax at temperature 0, else a draw from the softmax at
    `temperature`, restricted to the smallest set of tokens whose probability reaches `top_p` (nucleus)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # tokens after the nucleus is full
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _insert_gap(cache, mask: torch.Tensor, at: int, width: int) -> torch.Tensor:
    """Insert `width` masked, all-zero cache columns at position `at` of every layer (and of the mask)."""
    if width <= 0:
        return mask
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            gap = t.new_zeros(t.shape[:-2] + (width, t.shape[-1]))
            setattr(layer, name, torch.cat([t[..., :at, :], gap, t[..., at:, :]], dim=-2))
    return torch.cat([mask[:, :at], mask.new_zeros((mask.shape[0], width)), mask[:, at:]], dim=1)


def _join(cache, mask: torch.Tensor, new_cache, new_mask: torch.Tensor, at: int) -> torch.Tensor:
    """Append the joining rows' cache to the running one, the shorter side widened by masked zero columns at
    `at` (after the shared prefix); returns the joined mask."""
    width = mask.shape[1] - new_mask.shape[1]
    new_mask = _insert_gap(new_cache, new_mask, at, width)
    mask = _insert_gap(cache, mask, at, -width)
    for layer, other in zip(cache.layers, new_cache.layers):
        layer.keys, layer.values = torch.cat([layer.keys, other.keys]), torch.cat([layer.values, other.values])
    return torch.cat([mask, new_mask])


ROOM = 64  # cache columns a decoding batch's buffers grow by at a time
IN_PLACE = True  # False: transformers' own growing layer (the generation-cache benchmark's baseline)


class _RoomyLayer(DynamicLayer):
    """A growing cache layer whose keys and values are views of buffers with room for more columns: a decode step
    writes its column in place, where transformers' layer copies the whole cache into a new tensor (`torch.cat`) at
    every step, and at a GPU's batch of 1024 that copy (some 9 GB for SmolLM2-135M at 256 new tokens), with a fresh
    allocation of a size never seen before, is most of a step. Keys or values replaced from outside (rows joining,
    `_insert_gap`) are copied into new buffers at the next step."""

    def _room_for(self, n: int) -> bool:
        buf = getattr(self, "_buffers", None)
        return (buf is not None and n <= buf[0].shape[-2] and self.keys.data_ptr() == buf[0].data_ptr()
                and self.values.data_ptr() == buf[1].data_ptr() and self.keys.shape[:-2] == buf[0].shape[:-2]
                and self.keys.stride() == buf[0].stride())

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized or not self.keys.numel():
            return super().update(key_states, value_states, *args, **kwargs)
        n, add = self.keys.shape[-2], key_states.shape[-2]
        if not self._room_for(n + add):
            self._buffers = tuple(t.new_empty(t.shape[:-2] + (n + add + ROOM, t.shape[-1])) for t in (self.keys, self.values))
            for buf, t in zip(self._buffers, (self.keys, self.values)):
                buf[..., :n, :] = t
        for buf, t in zip(self._buffers, (key_states, value_states)):
            buf[..., n:n + add, :] = t
        self.keys, self.values = (buf[..., :n + add, :] for buf in self._buffers)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices`: one copy of the buffers (their room included), not a copy and a re-buffering."""
        if not self._room_for(self.keys.shape[-2]):
            return super().batch_select_indices(indices)
        n = self.keys.shape[-2]
        self._buffers = tuple(buf[indices] for buf in self._buffers)
        self.keys, self.values = (buf[..., :n, :] for buf in self._buffers)


def _with_room(cache):
    """`cache` with its plain growing layers made roomy (`_RoomyLayer`: the same values, written in place)."""
    for layer in getattr(cache, "layers", []) if IN_PLACE else []:
        if type(layer) is DynamicLayer:
            layer.__class__ = _RoomyLayer
    return cache


def _refillable(cache) -> bool:
    """Rows can join a running batch when every cache layer is a plain growing one (not a sliding window)."""
    return cache is not None and all(type(layer) in (DynamicLayer, _RoomyLayer) and layer.is_initialized
                                     for layer in cache.layers)


@torch.no_grad()
def _generate(lm: LoadedModel, prompts: Sequence[list[int]], max_new_tokens: int, stop: set[int], share_prefix: bool,
              batch_size: int, temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None,
              finished=None, masked: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Decode every prompt with the KV cache, each row to its first stop token or the budget, at most
    `batch_size` rows at a time.

    The prompts' common prefix (the system prompt and instruction a study puts before every problem) is run
    once and its cache copied to every row; the rows' own tokens follow, right-aligned with masked columns
    between prefix and suffix, each with its true positions. Rows that stop leave the batch, and when half
    the batch has left, waiting prompts join it: their own tokens are run once and their cache is aligned to
    the running one by masked columns after the prefix (or the running rows' is, when theirs is longer).
    Decoding a few rows costs nearly as much per step as a full batch (the weights are read either way), so
    this keeps the batch full instead of finishing each batch's longest answer alone.

    `masked` (one list of prompt positions per prompt, see `greedy_answers`): those columns of the attention mask
    are 0, so no query reads their keys; the shared prefix stops before the first of them.
    """
    if masked is not None and len(masked) != len(prompts):
        raise LmlabError(f"masked positions are given for {len(masked)} prompts, there are {len(prompts)}")
    cut = [p[:min(m)] if m else p for p, m in zip(prompts, masked)] if masked is not None else prompts
    # a hybrid's recurrent states hold every column they read: no prefix copied to rows, no masked gap, no rows
    # leaving or joining (its cache layers have no row selection)
    share_prefix = share_prefix and not lm.layout.mixing_layers
    prefix, shared = prefix_cache(lm, cut) if share_prefix else (0, None)
    stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=lm.device)
    out: list[list[int]] = [[] for _ in range(len(prompts))]
    waiting = list(range(len(prompts)))[::-1]  # popped from the end: prompts join in order
    running = None  # the rows generating
    draw = dict(temperature=temperature, top_p=top_p, generator=generator)
    while waiting or (running is not None and running.n_live):
        if waiting and (running is None or not running.n_live
                        or (running.refill and running.n_live <= batch_size // 2)):
            take = running.n_live if running is not None else 0
            join = [waiting.pop() for _ in range(min(batch_size - take, len(waiting)))]
            running, fresh = _admit(lm, running, prompts, join, prefix, shared, draw, masked)
        else:
            running.step(lm, draw)
            fresh = 0
        for row, tok, live in zip(running.rows.tolist()[fresh:], running.token.tolist()[fresh:],
                                  running.live.tolist()[fresh:]):
            if live:
                out[row].append(tok)
        running.drop_finished(out, stop_ids, max_new_tokens, finished)
    return [o[:-1] if o and o[-1] in stop else o for o in out]


LEAVE_AT = 8  # finished rows leave the batch once they are an eighth of it


@dataclass
class _Running:
    """The rows generating: `rows` (indices into the prompts), their cache, `token` (each row's newest token, not
    yet in the cache, at position `following`) and `mask` (the cache's columns); `live` the rows not yet finished
    (the finished ones stay in the batch until `LEAVE_AT`); `refill` whether rows may join."""
    rows: torch.Tensor
    cache: object
    token: torch.Tensor
    mask: torch.Tensor
    following: torch.Tensor
    refill: bool = True
    live: torch.Tensor = field(init=False)
    n_live: int = field(init=False)

    def __post_init__(self):
        self.live = torch.ones(len(self.rows), dtype=torch.bool, device=self.rows.device)
        self.n_live = len(self.rows)

    def step(self, lm: LoadedModel, draw: dict) -> None:
        """Every row's newest token goes into the cache and the next one comes out."""
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        result = lm.forward_last(dict(input_ids=self.token[:, None], attention_mask=self.mask,
                                      position_ids=self.following[:, None], cache=self.cache, use_cache=True))
        self.cache = result.cache
        self.token = next_token(result.logits[:, -1], **draw)
        self.following = self.following + 1

    def drop_finished(self, out: list[list[int]], stop_ids: torch.Tensor, max_new_tokens: int, finished) -> None:
        """Rows whose newest token stops them, or whose budget is spent, are finished. They leave the batch (and its
        cache) once they are an eighth of it: leaving copies the whole cache, which at a GPU's batch of 1024, where
        some row ends at nearly every step, would be a copy a step. A finished row's tokens are not kept, and its
        row of the batch changes no other row's (its own mask and positions), though under ARM it stays in the
        statistics of the call until it leaves, as a finished row of `transformers`' `generate` does."""
        lengths = torch.tensor([len(out[r]) for r in self.rows.tolist()], device=self.token.device)
        ending = self.live & (torch.isin(self.token, stop_ids) | (lengths >= max_new_tokens))
        n_ending = int(ending.sum())
        if n_ending:
            if finished is not None:
                finished(n_ending)
            self.live = self.live & ~ending
            self.n_live -= n_ending
        if LEAVE_AT * (len(self.rows) - self.n_live) >= max(len(self.rows), 1):
            self.leave()

    def leave(self) -> None:
        """The finished rows leave the batch and its cache."""
        if self.n_live == len(self.rows) or not all(hasattr(l, "batch_select_indices")
                                                      for l in getattr(self.cache, "layers", [])):
            return
        keep = self.live.nonzero().squeeze(1)
        if len(keep):
            self.cache.batch_select_indices(keep)
        self.rows, self.token, self.mask, self.following, self.live = (
            self.rows[keep], self.token[keep], self.mask[keep], self.following[keep], self.live[keep])


def _admit(lm: LoadedModel, running: _Running | None, prompts, join: list[int], prefix: int, shared,
           draw: dict, masked: Sequence[Sequence[int]] | None = None) -> tuple[_Running, int]:
    """The prompts `join` run once (after the shared prefix) and their first tokens drawn; they become the batch, or
    join the running rows with the two caches aligned by masked columns. (the batch, where the new rows start: their
    first tokens are new, the running rows' were counted already)."""
    batch, own = _after_prefix(lm, [prompts[i] for i in join], prefix, shared,
                               None if masked is None else [masked[i] for i in join])
    result = lm.forward_last(batch)
    if getattr(result, "cache", None) is None:
        raise LmlabError(f"{lm.name} returns no cache from its forward pass (none at all, or a recurrent state kept "
                         f"inside its modules), and lmlab's generation continues its rows from one")
    new = _Running(rows=torch.tensor(join, dtype=torch.long, device=lm.device), cache=_with_room(result.cache),
                   token=next_token(result.logits[:, -1], **draw), mask=batch["attention_mask"],
                   following=own["position_ids"][:, -1] + prefix + 1)
    if running is None or not running.n_live:
        new.refill = _refillable(new.cache)
        return new, 0
    running.leave()
    fresh = len(running.rows)
    running.mask = _join(running.cache, running.mask, new.cache, new.mask, prefix)
    running.token = torch.cat([running.token, new.token])
    running.following, running.rows = torch.cat([running.following, new.following]), torch.cat([running.rows, new.rows])
    running.live, running.n_live = torch.cat([running.live, new.live]), running.n_live + new.n_live
    running.refill = _refillable(running.cache)
    return running, fresh


@torch.no_grad()
def greedy_answers(lm: LoadedModel, prompts: Sequence[list[int]], max_new_tokens: int = 8, batch_size: int = 16,
                   stop_at_newline: bool = True, description: str = "generating",
                   share_prefix: bool = True, temperature: float = 0.0, top_p: float = 1.0,
                   seed: int = 0, masked: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Greedy continuation of each prompt (token ids), up to its end-of-sequence token (not included) or the
    budget, and cut at the first newline when `stop_at_newline`. With `temperature` > 0 the tokens are
    sampled instead (nucleus `top_p`), seeded by `seed`, so a rerun on the same prompts draws the same tokens.

    `share_prefix` runs the prompts' common prefix once (the same logits as running every row whole, tested);
    pass False under an intervention that draws random numbers per position (ARM), so rows draw their own.

    `masked`: for each prompt, positions whose keys no query may read, in any layer or head, the prompt's later
    tokens and the generated ones alike (their attention-mask columns are 0, as padding's are, and travel with the
    cache as rows join and leave), while every token keeps its position: the prompt as if those tokens were not
    there, at the positions it has with them (the filler study's placebo: filler inserted, then hidden).
    """
    if not prompts:
        return []
    limit = lm.layout.context_length
    longest = max(len(p) for p in prompts)
    if limit is not None and longest + max_new_tokens > limit:  # learned positions would index past their table
        raise LmlabError(f"a prompt of {longest} tokens and {max_new_tokens} new ones are longer than {lm.name}'s "
                         f"context of {limit} tokens; shorten the prompt, generate fewer tokens, or use a model "
                         f"with a longer context")
    stop = stop_tokens(lm)
    generator = torch.Generator(device=lm.device).manual_seed(seed * 1_000_003) if temperature > 0 else None
    with Progress(transient=True) as bar:
        task = bar.add_task(description, total=len(prompts))
        new = _generate(lm, prompts, max_new_tokens, stop, share_prefix, batch_size, temperature, top_p, generator,
                        finished=lambda k: bar.advance(task, k), masked=masked)
    return [_cut_at_newline(lm.tokenizer, ids, stop) if stop_at_newline else ids for ids in new]


def _after_prefix(lm: LoadedModel, sequences: Sequence[list[int]], prefix: int, cache,
                  masked: Sequence[Sequence[int]] | None = None) -> tuple[dict, dict]:
    """The forward batch of `sequences` whose first `prefix` tokens are in `cache` (`prefix_cache`; none when
    `prefix` is 0): a copy of the cache for every row, then each row's own tokens left-padded, with masked
    columns between prefix and suffix and their true positions. Returns (forward batch, padded suffixes).
    `masked`: each row's prompt positions (all past the prefix) whose mask columns are 0, their positions kept."""
    own = lm.pad_batch([list(s[prefix:]) for s in sequences])
    check_context(lm, prefix + own["input_ids"].shape[1])
    rows = None
    if prefix:
        rows = copy.deepcopy(cache)
        rows.batch_repeat_interleave(len(sequences))
    ones = torch.ones((len(sequences), prefix), dtype=own["attention_mask"].dtype, device=lm.device)
    mask = torch.cat([ones, own["attention_mask"]], dim=1)
    for row, (seq, hide) in enumerate(zip(sequences, masked or [])):
        if hide and not prefix <= min(hide) <= max(hide) < len(seq):
            raise LmlabError(f"masked positions {min(hide)}..{max(hide)} are not all in prompt {row}'s own tokens "
                             f"(positions {prefix}..{len(seq) - 1})")
        if hide:  # the prompts are right-aligned: prompt position p sits in column width - len + p
            mask[row, [mask.shape[1] - len(seq) + p for p in hide]] = 0
    return dict(input_ids=own["input_ids"], attention_mask=mask,
                position_ids=own["position_ids"] + prefix, cache=rows, use_cache=True), own


@torch.no_grad()
def prefix_cache(lm: LoadedModel, sequences: Sequence[list[int]]):
    """(n, cache): the tokens every sequence starts with (`shared_prefix_length`) run once, and their KV cache;
    (0, None) when they share too little, or the model is not a causal LM with a cache. Copy the cache
    (`copy.deepcopy`) before running more tokens on it."""
    n = shared_prefix_length(sequences) if lm.layout.causal and len(sequences) > 1 else 0
    if not n:
        return 0, None
    out = lm.forward_last(dict(input_ids=torch.tensor([list(sequences[0][:n])], device=lm.device), use_cache=True))
    return (n, out.cache) if getattr(out, "cache", None) is not None else (0, None)


@torch.no_grad()
def last_token_features(lm: LoadedModel, sequences: Sequence[list[int]], layers: Sequence[int], batch_size: int = 16,
                        point: str = "resid_post", description: str = "hidden states",
                        share_prefix: bool = True) -> np.ndarray:
    """(n, len(layers), d_model) float32: `point` at each sequence's last token.

    The sequences' common prefix (a few-shot prompt a study puts before every question) is run once and its
    cache copied to every batch (`share_prefix`); each row's own tokens follow, left-padded, with masked
    columns between prefix and suffix and their true positions, as in generation. The knockout study's prompts
    share 46 of their ~54 tokens."""
    feats = np.zeros((len(sequences), len(layers), lm.layout.d_model), dtype=np.float32)
    share_prefix = share_prefix and not lm.layout.mixing_layers  # (a hybrid's recurrent states: as in `_generate`)
    prefix, cache = prefix_cache(lm, sequences) if share_prefix else (0, None)
    with Progress(transient=True) as bar:
        task = bar.add_task(description, total=len(sequences))
        for a, b in _batches(len(sequences), batch_size):
            if prefix:
                batch = _after_prefix(lm, sequences[a:b], prefix, cache)[0]
            else:
                batch = lm.pad_batch(list(sequences[a:b]))  # left padding: the last column is every row's last token
            with intervene(lm, Capture(point, layers=layers)) as cap:
                lm.forward_last(batch)  # the states are captured; no logits beyond the last position
            for j, layer in enumerate(layers):
                feats[a:b, j] = cap[point, layer][:, -1].float().cpu().numpy()
            bar.advance(task, b - a)
    return feats
