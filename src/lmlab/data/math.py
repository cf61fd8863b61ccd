"""Math problems: a generated arithmetic benchmark with difficulty levels, and GSM8K / MATH-500 readers.

Generated levels (seeded; problems never repeat across splits):
    1 one-digit sum         What is 3 + 5?
    2 two-digit sum         What is 23 + 45?
    3 two-digit difference  What is 81 - 36?
    4 three terms           What is 23 + 45 - 17?
    5 word problem          Tom has 12 apples. He buys 7 more and then gives 5 away. How many ...?
Real files, one rule for both formats: a row that is not JSON, lacks a field, or has an answer we cannot
read is an error naming the file and line (never silently skipped, never scored). `read_gsm8k` is the one
GSM8K parser: the filler study takes its final answers, the latent study its reasoning lines too.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from lmlab.data import hubdata
from lmlab.data.scoring import normalize_number
from lmlab.errors import LmlabError

NAMES = ["Tom", "Anna", "Ravi", "Mei", "Omar", "Lucia", "Kofi", "Sara"]
THINGS = ["apples", "books", "stamps", "marbles", "pencils", "coins"]


@dataclass(frozen=True)
class MathItem:
    id: str
    source: str
    level: int
    question: str
    answer: str


def _make(level: int, rng: random.Random) -> tuple[str, int]:
    if level == 1:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"What is {a} + {b}?", a + b
    if level == 2:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"What is {a} + {b}?", a + b
    if level == 3:
        a, b = sorted(rng.sample(range(10, 100), 2), reverse=True)
        return f"What is {a} - {b}?", a - b
    if level == 4:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 60)
        return f"What is {a} + {b} - {c}?", a + b - c
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b, c = rng.randint(5, 30), rng.randint(2, 15), rng.randint(1, 5)
    return (f"{name} has {a} {thing}. {name} buys {b} more and then gives {c} away. "
            f"How many {thing} does {name} have now?"), a + b - c


def generate_arithmetic(n_per_level: int, seed: int = 0, levels=(1, 2, 3, 4, 5),
                        exclude: set[str] | None = None) -> list[MathItem]:
    """`n_per_level` distinct problems per level; `exclude` keeps splits disjoint."""
    rng = random.Random(f"arith-{seed}")
    seen = set(exclude or ())
    items = []
    for level in levels:
        made, tries = 0, 0
        while made < n_per_level and tries < 50 * n_per_level:
            tries += 1
            question, answer = _make(level, rng)
            if question in seen:
                continue
            seen.add(question)
            items.append(MathItem(f"arith-L{level}-{seed}-{made:04d}", "arithmetic", level, question, str(answer)))
            made += 1
    return items


def split_arithmetic(n_dev_per_level: int, n_test_per_level: int, seed: int = 0) -> tuple[list[MathItem], list[MathItem]]:
    dev = generate_arithmetic(n_dev_per_level, seed)
    test = generate_arithmetic(n_test_per_level, seed + 1, exclude={i.question for i in dev})
    return dev, test


_CALC = re.compile(r"<<[^>]*>>")


@dataclass(frozen=True)
class GsmRow:
    line: int
    question: str
    steps: tuple[str, ...]  # the reasoning lines, calculator annotations <<48/2=24>> removed
    answer: str  # the integer after "####", commas removed


def _rows(path: Path, kind: str):
    if not path.is_file():
        raise LmlabError(f"no {kind} file at {path}")
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    raise LmlabError(f"{path}:{n}: not a JSON object") from None
                if not isinstance(row, dict):
                    raise LmlabError(f"{path}:{n}: not a JSON object")
                yield n, row


def gsm8k_row(row: dict, where: str, n: int) -> GsmRow:
    """One GSM8K row (a file's line or a hub dataset's row): question, answer = reasoning lines then "#### N"."""
    question, answer = (row.get("question"), row.get("answer")) if isinstance(row, dict) else (None, None)
    if not isinstance(question, str) or not question.strip() or not isinstance(answer, str) or "####" not in answer:
        raise LmlabError(f"{where}: a GSM8K row needs 'question' and an 'answer' ending in '#### N'")
    reasoning, final = answer.rsplit("####", 1)
    final = final.strip().replace(",", "")
    if not re.fullmatch(r"-?\d+", final):
        raise LmlabError(f"{where}: the final answer {final!r} is not an integer")
    steps = tuple(x for x in (_CALC.sub("", line).strip() for line in reasoning.splitlines()) if x)
    if not steps:
        raise LmlabError(f"{where}: the answer has no reasoning lines before '####'")
    return GsmRow(n, question.strip(), steps, str(int(final)))


def math500_item(row: dict, where: str, n: int) -> MathItem:
    """One MATH-500 row: problem, answer (and level, when given)."""
    question, raw = (row.get("problem"), row.get("answer")) if isinstance(row, dict) else (None, None)
    answer = normalize_number(str(raw)) if raw not in (None, "") else None
    if not isinstance(question, str) or not question.strip() or not answer:
        raise LmlabError(f"{where}: a MATH-500 row needs 'problem' and a non-empty 'answer'")
    level = int(row.get("level", 0)) if str(row.get("level", "0")).isdigit() else 0
    return MathItem(f"math500-{n:05d}", "math500", level, question, answer)


def read_gsm8k(path: str | Path) -> list[GsmRow]:
    """Every row of a GSM8K jsonl file, or of a saved dataset folder (`save_to_disk`)."""
    path = Path(path).expanduser()
    if path.is_dir():
        out = [gsm8k_row(row, where, n) for n, (where, row) in enumerate(hubdata.saved_rows(path, "gsm8k"), 1)]
    else:
        out = [gsm8k_row(row, f"{path}:{n}", n) for n, row in _rows(path, "GSM8K")]
    if not out:
        raise LmlabError(f"{path} holds no problems")
    return out


def read_math_file(kind: str, path: str | Path) -> list[MathItem]:
    """The items of a GSM8K or MATH-500 jsonl file (or saved dataset folder); a malformed row or an empty
    file is an error."""
    path = Path(path).expanduser()
    if kind == "gsm8k":
        return [MathItem(f"gsm8k-{r.line:05d}", kind, 0, r.question, r.answer) for r in read_gsm8k(path)]
    if kind != "math500":
        raise LmlabError(f"unknown math file format '{kind}'; known: gsm8k, math500")
    if path.is_dir():
        items = [math500_item(row, where, n) for n, (where, row) in enumerate(hubdata.saved_rows(path, kind), 1)]
    else:
        items = [math500_item(row, f"{path}:{n}", n) for n, row in _rows(path, kind)]
    if not items:
        raise LmlabError(f"{path} holds no problems")
    return items


def hub_gsm8k(split: str | None = None) -> list:
    """The GSM8K rows (`GsmRow`: question, reasoning lines, answer) of the hub's `split` (default test)."""
    got = [gsm8k_row(row, where, n) for n, (where, row) in enumerate(hubdata.hub_rows("gsm8k", split), 1)]
    if not got:
        raise LmlabError(f"the hub dataset {hubdata.HUB['gsm8k'].repo} holds no problems")
    return got


def hub_math_items(kind: str) -> list:
    """The test problems (`MathItem`) of the hub's GSM8K or MATH-500."""
    if kind == "gsm8k":
        return [MathItem(f"gsm8k-{r.line:05d}", kind, 0, r.question, r.answer) for r in hub_gsm8k()]
    if kind != "math500":
        raise LmlabError(f"unknown math dataset '{kind}'; known: gsm8k, math500")
    got = [math500_item(row, where, n) for n, (where, row) in enumerate(hubdata.hub_rows(kind), 1)]
    if not got:
        raise LmlabError(f"the hub dataset {hubdata.HUB[kind].repo} holds no problems")
    return got
