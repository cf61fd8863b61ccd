"""Batched greedy generation and last-token features: the two loops most studies run over a dataset.

Both take token-id lists (so spans computed on the prompt stay exact), batch them left-padded, and
show a progress bar.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from rich.progress import Progress

from lmlab.interventions import Capture, intervene
from lmlab.models import LoadedModel


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


@torch.no_grad()
def greedy_answers(lm: LoadedModel, prompts: Sequence[list[int]], max_new_tokens: int = 8, batch_size: int = 16,
                   stop_at_newline: bool = True, description: str = "generating") -> list[list[int]]:
    """Greedy continuation of each prompt (token ids), cut at the first newline / end of sequence."""
    eos = {t for t in (lm.tokenizer.eos_token_id, lm.tokenizer.pad_token_id) if t is not None}
    out: list[list[int]] = []
    with Progress(transient=True) as bar:
        task = bar.add_task(description, total=len(prompts))
        for a, b in _batches(len(prompts), batch_size):
            batch = lm.pad_batch(list(prompts[a:b]))
            batch.pop("position_ids", None)  # generate derives positions from the mask itself
            gen = lm.model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=lm.tokenizer.pad_token_id)
            new = gen[:, batch["input_ids"].shape[1]:].tolist()
            out += [_cut_at_newline(lm.tokenizer, ids, eos) if stop_at_newline else ids for ids in new]
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
                lm.model(**batch)
            for j, layer in enumerate(layers):
                feats[a:b, j] = cap[point, layer][:, -1].float().cpu().numpy()
            bar.advance(task, b - a)
    return feats
