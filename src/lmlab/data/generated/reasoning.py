"""Multi-step arithmetic word problems with a step-by-step chain of thought (the latent study's offline data).

    Question: Emma has 23 apples. She buys 14 more. Then she gives away 9. How many apples does she have now?
    Chain:    23 + 14 = 37 . 37 - 9 = 28 .
    Answer:   28

2-4 steps of + / -, every intermediate value in 0..99, names and objects from fixed lists. Splits are
disjoint by construction: a problem is identified by its (start, operations) tuple, and each tuple is
assigned to exactly one split by a seeded hash, so no test problem appears in training in any wording.
Real data: `read_gsm8k_problems` reads a GSM8K jsonl file (question, answer = reasoning lines then
"#### N") into the same Problem shape, the reasoning lines as steps with the calculator annotations
<<48/2=24>> removed; `split_problems` assigns them to disjoint splits by the same seeded hash.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from lmlab.data.math import read_gsm8k
from lmlab.errors import LmlabError

NAMES = ["Emma", "Liam", "Olivia", "Noah", "Ava", "Lucas", "Mia", "Leo", "Zoe", "Sam", "Nina", "Omar"]
OBJECTS = ["apples", "coins", "stickers", "books", "marbles", "cards", "shells", "stamps", "pencils", "beads"]
GAIN = ["buys {n} more", "finds {n} more", "gets {n} more from a friend", "wins {n} more"]
LOSS = ["gives away {n}", "loses {n}", "sells {n}", "uses {n}"]
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Problem:
    question: str
    steps: tuple[str, ...]  # "23 + 14 = 37"
    answer: int
    key: tuple  # (start, (op, n), ...): what makes two problems the same

    @property
    def chain(self) -> str:
        return " ".join(s if s[-1] in ".!?" else f"{s} ." for s in self.steps)


def _split_of(key: tuple, seed: int, fractions=(0.8, 0.1, 0.1)) -> str:
    h = zlib.crc32(f"{seed}|{key}".encode()) / 2**32
    return "train" if h < fractions[0] else ("dev" if h < fractions[0] + fractions[1] else "test")


def _problem(rng: random.Random, min_steps: int, max_steps: int) -> Problem:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    value = rng.randint(5, 60)
    start = value
    sentences, steps, ops = [f"{name} has {value} {obj}."], [], []
    for i in range(rng.randint(min_steps, max_steps)):
        gain = value < 10 or (value < 90 and rng.random() < 0.5)
        n = rng.randint(1, min(40, 99 - value)) if gain else rng.randint(1, min(40, value))
        new = value + n if gain else value - n
        phrase = rng.choice(GAIN if gain else LOSS).format(n=n)
        sentences.append(("Then " if i else "") + ("she " if i else f"{name} ") + phrase + ".")
        steps.append(f"{value} {'+' if gain else '-'} {n} = {new}")
        ops.append(("+" if gain else "-", n))
        value = new
    sentences.append(f"How many {obj} does {name} have now?")
    question = " ".join(s[0].upper() + s[1:] for s in sentences)
    return Problem(question, tuple(steps), value, (start, tuple(ops)))


def generate_problems(n_train: int, n_dev: int, n_test: int, seed: int = 0, min_steps: int = 2,
                      max_steps: int = 4) -> dict[str, list[Problem]]:
    """Disjoint train/dev/test sets of the requested sizes, the same for the same seed."""
    if not 1 <= min_steps <= max_steps:
        raise LmlabError("the arithmetic task needs 1 <= min_steps <= max_steps")
    return generate_disjoint(lambda rng: _problem(rng, min_steps, max_steps), n_train, n_dev, n_test, seed)


def generate_disjoint(make, n_train: int, n_dev: int, n_test: int, seed: int, tries_per_problem: int = 200) -> dict:
    """Draw problems with `make(rng)` until each split has its count; a problem's `key` decides its split by a
    seeded hash and is never drawn twice, so the splits are disjoint and the same for the same seed."""
    if min(n_train, n_dev, n_test) < 0:
        raise LmlabError("problem counts must be >= 0")
    want = {"train": n_train, "dev": n_dev, "test": n_test}
    out: dict[str, list] = {s: [] for s in SPLITS}
    seen: set[tuple] = set()
    rng = random.Random(seed)
    tries = 0
    while any(len(out[s]) < want[s] for s in SPLITS):
        tries += 1
        if tries > tries_per_problem * (n_train + n_dev + n_test) + 1000:
            raise LmlabError("could not generate enough distinct problems; lower the counts")
        p = make(rng)
        if p.key in seen:
            continue
        split = _split_of(p.key, seed)
        if len(out[split]) < want[split]:
            seen.add(p.key)
            out[split].append(p)
    return out


def read_gsm8k_problems(path: str | Path | None) -> list[Problem]:
    """GSM8K jsonl (or saved dataset folder) -> Problems with their reasoning chains (`lmlab.data.math.read_gsm8k`
    parses the file). `path` None: the hub's GSM8K train split (the latent study trains on it; `split_problems` then
    makes its disjoint train/dev/test)."""
    if path is None:
        from lmlab.data.math import hub_gsm8k

        rows = hub_gsm8k("train")
    else:
        rows = read_gsm8k(path)
    return [Problem(r.question, r.steps, int(r.answer), (r.question,)) for r in rows]


def split_problems(problems: list[Problem], seed: int = 0, fractions=(0.8, 0.1, 0.1)) -> dict[str, list[Problem]]:
    """Disjoint splits by the seeded hash of each problem's key (duplicates keep their first copy)."""
    out: dict[str, list[Problem]] = {s: [] for s in SPLITS}
    seen: set[tuple] = set()
    for p in problems:
        if p.key not in seen:
            seen.add(p.key)
            out[_split_of(p.key, seed, fractions)].append(p)
    return out
