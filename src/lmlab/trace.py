"""Knockout trace of one prompt: how much does the answer depend on a span, layer by layer?

For each k, attention from each of the span's tokens to every later position (the span's own later
tokens included) is blocked in layers 0..k
(cumulative, as in Luo et al.), and p(target) at the last position is compared with the clean run.
All k run in one batched forward pass: each batch row carries its own layer set (`layer_mask`).
"""

from __future__ import annotations

import pandas as pd
import torch

from lmlab.data.spans import find_span
from lmlab.errors import LmlabError
from lmlab.interventions import Knockout, check_knockout, intervene
from lmlab.models import LoadedModel


def target_token(lm: LoadedModel, target: str) -> int:
    ids = lm.tokenizer(target, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = lm.tokenizer.convert_ids_to_tokens(ids)
        raise LmlabError(f"the target {target!r} is {len(ids)} tokens for {lm.name} ({pieces}); give a single-token "
                         f"target, e.g. {lm.tokenizer.decode(ids[:1])!r}")
    return ids[0]


@torch.no_grad()
def knockout_trace(lm: LoadedModel, prompt: str, target: str, span: str) -> pd.DataFrame:
    if not lm.layout.causal:
        raise LmlabError(f"{lm.name} is not a causal language model; the trace needs next-token probabilities")
    check_knockout(lm.layout)
    tid = target_token(lm, target)
    positions = find_span(lm.tokenizer, prompt, span)
    enc = lm.encode(prompt)
    n_layers = lm.layout.n_layers
    clean = torch.softmax(lm.last_logits(enc)[0].float(), -1)[tid].item()
    batch = {k: v.expand(n_layers, -1) for k, v in enc.items()}
    keys = torch.zeros(batch["input_ids"].shape, dtype=torch.bool, device=lm.device)
    keys[:, positions] = True
    layer_mask = torch.tril(torch.ones(n_layers, n_layers, dtype=torch.bool, device=lm.device))  # row k: 0..k
    with intervene(lm, Knockout(keys, layer_mask=layer_mask)):
        knocked = torch.softmax(lm.last_logits(batch).float(), -1)[:, tid]
    rows = [dict(layer=k, p_clean=clean, p_knockout=float(knocked[k]), delta_pp=100 * (float(knocked[k]) - clean),
                 span_tokens=len(positions)) for k in range(n_layers)]
    return pd.DataFrame(rows)
