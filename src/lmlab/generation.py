"""Batched greedy generation and last-token features: the two loops most studies run over a dataset.

Both take token-id lists (so spans computed on the prompt stay exact), batch them with the padding on
the left (generation: between the batch's common prefix and each row's own tokens), and show a progress bar.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import torch
from rich.progress import Progress

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


@torch.no_grad()
def _greedy_batch(lm: LoadedModel, prompts: Sequence[list[int]], max_new_tokens: int, stop: set[int],
                  share_prefix: bool, temperature: float = 0.0, top_p: float = 1.0,
                  generator: torch.Generator | None = None) -> list[list[int]]:
    """Greedy decoding of one batch with the KV cache, each row to its first stop token or the budget.

    The prompts' common prefix (the system prompt and instruction a study puts before every problem) is run
    once and its cache copied to every row; the rows' own tokens follow, right-aligned with the padding
    between prefix and suffix, each with its true positions. Rows that stop leave the batch.
    """
    device, n = lm.device, len(prompts)
    prefix = shared_prefix_length(prompts) if share_prefix and n > 1 else 0
    own = lm.pad_batch([list(p[prefix:]) for p in prompts])  # left-padded, positions from each row's first token
    check_context(lm, prefix + own["input_ids"].shape[1])
    cache = None
    if prefix:
        cache = lm.forward_last(dict(input_ids=torch.tensor([list(prompts[0][:prefix])], device=device),
                                     use_cache=True)).past_key_values
        cache.batch_repeat_interleave(n)
    ids = own["input_ids"]
    mask = torch.cat([torch.ones((n, prefix), dtype=own["attention_mask"].dtype, device=device),
                      own["attention_mask"]], dim=1)
    positions = own["position_ids"] + prefix
    following = positions[:, -1] + 1
    stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=device)
    rows = torch.arange(n, device=device)  # the batch rows still generating, as indices into `prompts`
    out: list[list[int]] = [[] for _ in range(n)]
    for step in range(max_new_tokens):
        result = lm.forward_last(dict(input_ids=ids, attention_mask=mask, position_ids=positions,
                                      past_key_values=cache, use_cache=True))
        cache = result.past_key_values
        token = next_token(result.logits[:, -1], temperature, top_p, generator)
        for row, tok in zip(rows.tolist(), token.tolist()):
            out[row].append(tok)
        going = ~torch.isin(token, stop_ids)
        if step == max_new_tokens - 1 or not going.any():
            break
        if not going.all():
            keep = going.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, token, mask, following = rows[keep], token[keep], mask[keep], following[keep]
        ids = token[:, None]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = following[:, None]
        following = following + 1
    return [o[:-1] if o and o[-1] in stop else o for o in out]


@torch.no_grad()
def greedy_answers(lm: LoadedModel, prompts: Sequence[list[int]], max_new_tokens: int = 8, batch_size: int = 16,
                   stop_at_newline: bool = True, description: str = "generating",
                   share_prefix: bool = True, temperature: float = 0.0, top_p: float = 1.0,
                   seed: int = 0) -> list[list[int]]:
    """Greedy continuation of each prompt (token ids), up to its end-of-sequence token (not included) or the
    budget, and cut at the first newline when `stop_at_newline`. With `temperature` > 0 the tokens are
    sampled instead (nucleus `top_p`), seeded by `seed` and the batch's place, so a resumed run draws the
    same tokens.

    `share_prefix` runs a batch's common prefix once (the same logits as running every row whole, tested);
    pass False under an intervention that draws random numbers per position (ARM), so rows draw their own.
    """
    stop = stop_tokens(lm)
    out: list[list[int]] = []
    with Progress(transient=True) as bar:
        task = bar.add_task(description, total=len(prompts))
        for a, b in _batches(len(prompts), batch_size):
            generator = None
            if temperature > 0:
                generator = torch.Generator(device=lm.device).manual_seed(seed * 1_000_003 + a)
            new = _greedy_batch(lm, prompts[a:b], max_new_tokens, stop, share_prefix, temperature, top_p, generator)
            out += [_cut_at_newline(lm.tokenizer, ids, stop) if stop_at_newline else ids for ids in new]
            bar.advance(task, b - a)
    return out


@torch.no_grad()
def last_token_features(lm: LoadedModel, sequences: Sequence[list[int]], layers: Sequence[int], batch_size: int = 16,
                        point: str = "resid_post", description: str = "hidden states") -> np.ndarray:
    """(n, len(layers), d_model) float32: `point` at each sequence's last token."""
    feats = np.zeros((len(sequences), len(layers), lm.layout.d_model), dtype=np.float32)
    with Progress(transient=True) as bar:
        task = bar.add_task(description, total=len(sequences))
        for a, b in _batches(len(sequences), batch_size):
            batch = lm.pad_batch(list(sequences[a:b]))  # left padding: the last column is every row's last token
            with intervene(lm, Capture(point, layers=layers)) as cap:
                lm.forward_last(batch)  # the states are captured; no logits beyond the last position
            for j, layer in enumerate(layers):
                feats[a:b, j] = cap[point, layer][:, -1].float().cpu().numpy()
            bar.advance(task, b - a)
    return feats
