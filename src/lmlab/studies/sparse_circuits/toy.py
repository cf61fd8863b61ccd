"""The toy of Draye et al.'s Figure 1: a 4-layer transformer trained from scratch on 2-digit addition.

A sequence is `<bos>` followed by PROBLEMS problems `a b + c d = e f g` (digits as tokens, the sum
written with three digits), 46 tokens; the loss covers the answer digits only. Exact match is per
problem: teacher-forced argmax on its three answer digits, which equals greedy generation of the
fixed-length answer. DECISION (issue 18): several problems per sequence so that the floor of one edge
per query is 2/47 = 4.3% of the causal edges, under the few per cent the paper reports; with a single
10-token problem the floor was 18%, and no sparse model could show the paper's sparsity. The model is a Llama block stack
(from a config, no download) so every lmlab intervention applies to it unchanged, including the
sparse edge gate used for its sparse post-training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from lmlab.models.batch import module_device

VOCAB = [str(d) for d in range(10)] + ["+", "=", "<bos>", "<pad>"]
TOK = {t: i for i, t in enumerate(VOCAB)}
BOS, PAD = TOK["<bos>"], TOK["<pad>"]
PROBLEMS = 5  # problems per sequence
PROBLEM_LEN = 9  # a b + c d = e f g
SEQ_LEN = 1 + PROBLEMS * PROBLEM_LEN
ANSWER_POS = [1 + PROBLEM_LEN * j + k for j in range(PROBLEMS) for k in (6, 7, 8)]  # every e f g
POSITION_NAMES = ["bos", "a", "b", "+", "c", "d", "=", "e", "f", "g"]  # the first problem's window


def encode(x: int, y: int) -> list[int]:
    """One problem as its own sequence: <bos> a b + c d = e f g."""
    return [BOS] + _problem(x, y)


def _problem(x: int, y: int) -> list[int]:
    return [TOK[c] for c in f"{x:02d}+{y:02d}={x + y:03d}"]


def pack(pairs: list[tuple[int, int]]) -> list[int]:
    return [BOS] + [t for x, y in pairs for t in _problem(x, y)]


@dataclass
class AdditionData:
    train: list[list[int]]
    test: list[list[int]]


def addition_data(n_test: int = 1000, seed: int = 0, repeats: int = 4) -> AdditionData:
    """All 10,000 pairs (a b, c d), split into disjoint train and test pairs by a seeded shuffle, then packed
    PROBLEMS to a sequence: test once (n_test // PROBLEMS sequences), train `repeats` times in fresh orders."""
    pairs = [(x, y) for x in range(100) for y in range(100)]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    test_pairs, train_pairs = pairs[:n_test], pairs[n_test:]
    test = [pack(test_pairs[i:i + PROBLEMS]) for i in range(0, len(test_pairs) - PROBLEMS + 1, PROBLEMS)]
    train = []
    for _ in range(repeats):
        order = train_pairs[:]
        rng.shuffle(order)
        train += [pack(order[i:i + PROBLEMS]) for i in range(0, len(order) - PROBLEMS + 1, PROBLEMS)]
    return AdditionData(train=train, test=test)


def build_toy(seed: int = 0, d_model: int = 128, n_layers: int = 4, n_heads: int = 4, device: str = "cpu"):
    """The toy as a `LoadedModel` (through `load_model("scratch")`), fp32 for training."""
    from lmlab.models import ScratchSpec, load_model

    spec = ScratchSpec(vocab_size=len(VOCAB), d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_positions=64,
                       bos=BOS, eos=PAD, pad=PAD, tie_embeddings=False, seed=seed)
    return load_model("scratch", scratch=spec, dtype=torch.float32, device=device)


def collate(seqs: list[list[int]]) -> dict:
    ids = torch.tensor(seqs, dtype=torch.long, device="cpu")  # the training loop moves batches to its device
    labels = torch.full_like(ids, -100)
    labels[:, ANSWER_POS] = ids[:, ANSWER_POS]
    return {"input_ids": ids, "labels": labels}


def answer_loss(model, batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss


@torch.no_grad()
def evaluate(model, seqs: list[list[int]], batch_size: int = 500) -> dict:
    """Exact match per problem (all three answer digits right) and the answer cross-entropy."""
    model.eval()
    correct, ce, n = 0, 0.0, 0
    device = module_device(model)
    pos = torch.tensor(ANSWER_POS, device=device)
    for start in range(0, len(seqs), batch_size):
        batch = {k: v.to(device) for k, v in collate(seqs[start:start + batch_size]).items()}
        out = model(input_ids=batch["input_ids"], labels=batch["labels"])
        pred = out.logits[:, pos - 1].argmax(-1).view(-1, PROBLEMS, 3)
        gold = batch["input_ids"][:, pos].view(-1, PROBLEMS, 3)
        correct += int((pred == gold).all(-1).sum())
        ce += float(out.loss) * len(batch["input_ids"])
        n += len(batch["input_ids"]) * PROBLEMS
    return {"exact_match": correct / n, "ce": ce * PROBLEMS / n}


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
        model(input_ids=torch.tensor(seqs, dtype=torch.long, device=module_device(model)))
        pattern = cap.stacked("pattern")  # (layers, batch, heads, q, k)
    return pattern.mean(1).float().cpu().numpy()
