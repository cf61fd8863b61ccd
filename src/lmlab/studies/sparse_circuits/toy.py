"""The toy of Draye et al.'s Figure 1: a 4-layer transformer trained from scratch on 2-digit addition.

Sequences are `<bos> a b + c d = e f g` (digits as tokens, the sum written with three digits), the
loss covers the three answer digits only. Exact match is teacher-forced argmax on all three answer
digits, which equals greedy generation of the fixed-length answer. The model is a Llama block stack
(from a config, no download) so every lmlab intervention applies to it unchanged, including the
sparse edge gate used for its sparse post-training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

VOCAB = [str(d) for d in range(10)] + ["+", "=", "<bos>", "<pad>"]
TOK = {t: i for i, t in enumerate(VOCAB)}
BOS, PAD = TOK["<bos>"], TOK["<pad>"]
SEQ_LEN = 10  # <bos> a b + c d = e f g
ANSWER = slice(7, 10)  # positions of e f g
POSITION_NAMES = ["bos", "a", "b", "+", "c", "d", "=", "e", "f", "g"]


def encode(x: int, y: int) -> list[int]:
    digits = f"{x:02d}+{y:02d}={x + y:03d}"
    return [BOS] + [TOK[c] for c in digits]


@dataclass
class AdditionData:
    train: list[list[int]]
    test: list[list[int]]


def addition_data(n_test: int = 1000, seed: int = 0) -> AdditionData:
    """All 10,000 pairs (a b, c d), split into disjoint train and test sets by a seeded shuffle."""
    pairs = [(x, y) for x in range(100) for y in range(100)]
    random.Random(seed).shuffle(pairs)
    seqs = [encode(x, y) for x, y in pairs]
    return AdditionData(train=seqs[n_test:], test=seqs[:n_test])


def build_toy(seed: int = 0, d_model: int = 128, n_layers: int = 4, n_heads: int = 4):
    """The toy as a `LoadedModel` (through `load_model("scratch")`), fp32 for training."""
    from lmlab.models import ScratchSpec, load_model

    spec = ScratchSpec(vocab_size=len(VOCAB), d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_positions=32,
                       bos=BOS, eos=PAD, pad=PAD, tie_embeddings=False, seed=seed)
    return load_model("scratch", scratch=spec, dtype=torch.float32, device="cpu")


def collate(seqs: list[list[int]]) -> dict:
    ids = torch.tensor(seqs, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    labels[:, ANSWER] = ids[:, ANSWER]
    return {"input_ids": ids, "labels": labels}


def answer_loss(model, batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss


@torch.no_grad()
def evaluate(model, seqs: list[list[int]], batch_size: int = 500) -> dict:
    """Exact match (all three answer digits) and the answer cross-entropy."""
    model.eval()
    correct, ce, n = 0, 0.0, 0
    for start in range(0, len(seqs), batch_size):
        batch = collate(seqs[start:start + batch_size])
        out = model(input_ids=batch["input_ids"], labels=batch["labels"])
        pred = out.logits[:, ANSWER.start - 1:ANSWER.stop - 1].argmax(-1)
        correct += int((pred == batch["input_ids"][:, ANSWER]).all(-1).sum())
        ce += float(out.loss) * len(batch["input_ids"])
        n += len(batch["input_ids"])
    return {"exact_match": correct / n, "ce": ce / n}


@torch.no_grad()
def edge_usage(model, seqs: list[list[int]], interventions=()) -> np.ndarray:
    """(layers, heads, query, key): the mean attention weight of each edge over `seqs`.

    With a deterministic sparse gate installed among `interventions`, a dropped edge weighs exactly 0, so
    `usage > 0` is the set of edges the sparse model ever uses on these inputs.
    """
    from lmlab.interventions import Capture, intervene

    model.eval()
    with intervene(model, *interventions, Capture("pattern")) as ivs:
        cap = ivs[-1] if isinstance(ivs, tuple) else ivs
        model(input_ids=torch.tensor(seqs, dtype=torch.long))
        pattern = cap.stacked("pattern")  # (layers, batch, heads, q, k)
    return pattern.mean(1).numpy()
