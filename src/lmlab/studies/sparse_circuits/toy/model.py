"""The toy of Draye et al.'s Figure 1: a 4-layer transformer trained from scratch on 2-digit addition.

A sequence is `<bos>` followed by PROBLEMS problems `a b + c d = e f g` (digits as tokens, the sum
written with three digits), 46 tokens; the loss covers the answer digits only. Exact match is per
problem: teacher-forced argmax on its three answer digits, which equals greedy generation of the
fixed-length answer. DECISION: several problems per sequence so that the floor of one edge
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
from lmlab.studies.sparse_circuits.config import TOY_TASKS
from lmlab.train.ensemble import per_replicate_ce, replicas, rows

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
    test_pairs: list[tuple[int, int]]


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
    return AdditionData(train=train, test=test, test_pairs=test_pairs)


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
    """The answer digits' mean cross-entropy; a stacked model of k replicates (lmlab.train.ensemble): one per
    replicate, each over its own rows."""
    k = replicas(model)
    if k == 1:
        return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    ce, tokens = per_replicate_ce(model(input_ids=batch["input_ids"]).logits, batch["labels"], k)
    return ce / tokens


@torch.no_grad()
def evaluate(model, seqs: list[list[int]], batch_size: int = 500) -> dict:
    """Exact match per problem (all three answer digits right) and the answer cross-entropy; `per_sequence`:
    the share of each sequence's problems answered exactly. A stacked model of k replicates: each value is a
    list, one per replicate (every replicate reads the same sequences)."""
    model.eval()
    k = replicas(model)
    device = module_device(model)
    pos = torch.tensor(ANSWER_POS, device=device)
    right, nll = [], []
    for start in range(0, len(seqs), batch_size):
        batch = {key: rows(model, v.to(device)) for key, v in collate(seqs[start:start + batch_size]).items()}
        logits = model(input_ids=batch["input_ids"]).logits[:, pos - 1].float()
        gold = batch["input_ids"][:, pos]
        pred = logits.argmax(-1).view(k, -1, PROBLEMS, 3)
        right.append((pred == gold.view(k, -1, PROBLEMS, 3)).all(-1).float().mean(-1))  # (k, B)
        nll.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), gold, reduction="none")
                   .view(k, -1, len(ANSWER_POS)).mean(-1))  # (k, B)
    per_seq, ce_seq = torch.cat(right, 1).cpu(), torch.cat(nll, 1).cpu()
    out = {"exact_match": per_seq.mean(1).tolist(), "ce": ce_seq.mean(1).tolist(), "per_sequence": per_seq.tolist()}
    return out if k > 1 else {key: value[0] for key, value in out.items()}


@torch.no_grad()
def edge_usage(model, seqs: list[list[int]], interventions=()) -> np.ndarray:
    """(layers, heads, query, key): the mean attention weight of each edge over `seqs`.

    With a deterministic sparse gate installed among `interventions`, a dropped edge weighs exactly 0, so
    `usage > 0` is the set of edges the sparse model ever uses on these inputs.
    """
    from lmlab.interventions import Capture, intervene

    model.eval()
    k = replicas(model)
    with intervene(model, *interventions, Capture("pattern")) as ivs:
        cap = ivs[-1] if isinstance(ivs, tuple) else ivs
        model(input_ids=rows(model, torch.tensor(seqs, dtype=torch.long, device=module_device(model))))
        pattern = cap.stacked("pattern")  # (layers, k * batch, heads, q, k)
    pattern = pattern.reshape(pattern.shape[0], k, -1, *pattern.shape[2:]).mean(2).float().cpu().numpy()
    return pattern[:, 0] if k == 1 else pattern.transpose(1, 0, 2, 3, 4)  # a stacked model: (replicate, ...)


@torch.no_grad()
def sparse_edges(model, seqs: list[list[int]]) -> dict:
    """The deterministic gate's edges on each sequence: (replicates, sequences) arrays of the kept share of causal
    edges, edges per query and the share of queries that fell back to their self-edge (all heads and layers)."""
    from lmlab.interventions import SparseAttention, intervene

    model.eval()
    k = replicas(model)
    ids = rows(model, torch.tensor(seqs, dtype=torch.long, device=module_device(model)))
    gate = SparseAttention(sample=False, replicas=len(ids))  # one count per row
    with intervene(model, gate):
        model(input_ids=ids)
    shape = (k, len(seqs))
    kept, total = gate.kept_per.reshape(shape), gate.total_per.reshape(shape)
    queries, fallback = gate.queries_per.reshape(shape), gate.fallback_per.reshape(shape)
    return {"kept": (kept / total).numpy(), "edges_per_query": (kept / queries).numpy(),
            "fallback": (fallback / queries).numpy()}


def circuit_task(pairs: list[tuple[int, int]], n_prompts: int, seed: int = 0, kind: str = "ones"):
    """The toy's circuit task `kind` (TOY_TASKS) on up to `n_prompts` clean problems drawn from `pairs` (the test
    pairs): a CircuitTask whose prompts end where the asked digit comes next."""
    from lmlab.data.generated.circuits import CircuitPrompt, CircuitTask
    from lmlab.errors import LmlabError

    if kind not in TOY_TASKS:
        raise LmlabError(f"unknown toy circuit task '{kind}'; known: {', '.join(TOY_TASKS)}")
    rng = random.Random(f"toy-circuit|{seed}" if kind == "ones" else f"toy-circuit|{kind}|{seed}")
    cut = {"ones": 9, "tens": 8, "carry": 8}[kind]  # <bos> a b + c d = e | f | g: the asked digit's index
    prompts = []
    for x, y in _clean_problems(pairs, n_prompts, rng, kind):
        x2, y2 = _corrupted(x, y, rng, kind)
        clean, bad = encode(x, y), encode(x2, y2)
        prompts.append(CircuitPrompt(tuple(clean[:cut]), tuple(bad[:cut]), f"{x:02d}+{y:02d}=",
                                     f"{x2:02d}+{y2:02d}=", answer=clean[cut], distractor=bad[cut]))
    return CircuitTask("addition" if kind == "ones" else f"addition-{kind}", "logit_diff", prompts)


def _clean_problems(pairs, n: int, rng: random.Random, kind: str) -> list[tuple[int, int]]:
    """The clean problems: any pair for "ones"; for "tens" those whose sum's hundreds digit survives the change of c
    (a + c + carry < 9); for "carry" those with a carry into the tens (b + d >= 10) and no overflow either way."""
    if kind == "tens":
        pairs = [(x, y) for x, y in pairs if x // 10 + y // 10 + (x % 10 + y % 10 >= 10) < 9]
    elif kind == "carry":
        pairs = [(x, y) for x, y in pairs if x % 10 + y % 10 >= 10 and x // 10 + y // 10 < 9]
    return rng.sample(pairs, min(n, len(pairs)))


def _corrupted(x: int, y: int, rng: random.Random, kind: str) -> tuple[int, int]:
    if kind == "ones":
        return x - x % 10 + rng.choice([d for d in range(10) if d != x % 10]), y
    if kind == "carry":  # b such that b + d < 10: the carry into the tens goes, f falls by one
        return x - x % 10 + rng.choice([b for b in range(10) if b + y % 10 < 10]), y
    carry = x % 10 + y % 10 >= 10  # "tens": another c that keeps the sum under 100 * (its hundreds digit + 1)
    options = [c for c in range(10) if c != y // 10 and x // 10 + c + carry < 10]
    return x, y % 10 + 10 * rng.choice(options)
