"""Readers for the real QA files users have. A bad row is an error naming the file, line and field.

    popqa     .tsv or .jsonl with question, subj, prop, possible_answers (JSON list), s_pop
    triviaqa  .json {"Data": [{"Question", "Answer": {"Value", "Aliases"}}]} (the unfiltered/rc release)
    nq        .jsonl with question and answer (a list of strings): NQ-open
    hotpotqa  .json list of {"question", "answer"} (the distractor/fullwiki dev files)
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable, Iterator

from lmlab.data.qa import QAItem
from lmlab.errors import LmlabError


def _need(row: dict, field: str, where: str):
    if not isinstance(row, dict):
        raise LmlabError(f"{where}: not a JSON object (found {type(row).__name__})")
    value = row.get(field)
    if value is None or value == "" or value == []:
        raise LmlabError(f"{where}: missing field '{field}'")
    return value


def _jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise LmlabError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise LmlabError(f"{path}:{n}: not a JSON object (found {type(row).__name__})")
                yield f"{path}:{n}", row


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LmlabError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def read_popqa(path: Path) -> list[QAItem]:
    if path.suffix == ".tsv":
        with open(path, encoding="utf-8", newline="") as fh:
            rows = [(f"{path}:{n}", r) for n, r in enumerate(csv.DictReader(fh, delimiter="\t"), 2)]
    else:
        rows = list(_jsonl(path))
    items = []
    for where, row in rows:
        answers = _need(row, "possible_answers", where)
        if isinstance(answers, str):
            try:
                answers = json.loads(answers)
            except json.JSONDecodeError:
                raise LmlabError(f"{where}: field 'possible_answers' is not a JSON list") from None
        pop = row.get("s_pop")
        items.append(QAItem(id=f"popqa-{len(items):05d}", dataset="popqa", question=_need(row, "question", where),
                            aliases=list(answers), subject=_need(row, "subj", where), prop=row.get("prop") or None,
                            popularity=float(pop) if pop not in (None, "") else None))
    return items


def read_triviaqa(path: Path) -> list[QAItem]:
    data = _json(path)
    if not isinstance(data, dict) or "Data" not in data:
        raise LmlabError(f"{path}: expected a TriviaQA JSON object with a 'Data' list")
    items = []
    for i, row in enumerate(data["Data"]):
        where = f"{path}: item {i}"
        answer = _need(row, "Answer", where)
        if not isinstance(answer, dict):
            raise LmlabError(f"{where}: field 'Answer' is not a JSON object")
        aliases = list(answer.get("Aliases") or []) + [a for a in [answer.get("Value")] if a]
        if not aliases:
            raise LmlabError(f"{where}: missing field 'Answer.Aliases'")
        items.append(QAItem(id=f"triviaqa-{i:05d}", dataset="triviaqa", question=_need(row, "Question", where),
                            aliases=aliases))
    return items


def read_nq(path: Path) -> list[QAItem]:
    items = []
    for where, row in _jsonl(path):
        answers = _need(row, "answer", where)
        items.append(QAItem(id=f"nq-{len(items):05d}", dataset="nq", question=_need(row, "question", where),
                            aliases=list(answers) if isinstance(answers, list) else [answers]))
    return items


def read_hotpotqa(path: Path) -> list[QAItem]:
    data = _json(path)
    if not isinstance(data, list):
        raise LmlabError(f"{path}: expected a HotpotQA JSON list")
    return [QAItem(id=f"hotpotqa-{i:05d}", dataset="hotpotqa", question=_need(r, "question", f"{path}: item {i}"),
                   aliases=[_need(r, "answer", f"{path}: item {i}")]) for i, r in enumerate(data)]


READERS: dict[str, Callable[[Path], list[QAItem]]] = {
    "popqa": read_popqa, "triviaqa": read_triviaqa, "nq": read_nq, "hotpotqa": read_hotpotqa}


def read_qa(kind: str, path: str | Path) -> list[QAItem]:
    if kind not in READERS:
        raise LmlabError(f"unknown QA file format '{kind}'; known: {', '.join(READERS)}")
    path = Path(path).expanduser()
    if not path.is_file():
        raise LmlabError(f"no {kind} file at {path}")
    items = READERS[kind](path)
    if not items:
        raise LmlabError(f"{path} holds no questions")
    return items


# --- GLUE (tsv files as distributed) ---------------------------------------------------------------------
# name: (metric, num_labels, text_a column, text_b column or None, label column, label values or None=float)
GLUE = {
    "cola": ("matthews", 2, 3, None, 1, ["0", "1"]),  # no header: source, label, original label, sentence
    "sst2": ("accuracy", 2, "sentence", None, "label", ["0", "1"]),
    "mrpc": ("f1", 2, "#1 String", "#2 String", "Quality", ["0", "1"]),
    "stsb": ("pearson", 1, "sentence1", "sentence2", "score", None),
    "qqp": ("f1", 2, "question1", "question2", "is_duplicate", ["0", "1"]),
    "mnli": ("accuracy", 3, "sentence1", "sentence2", "gold_label", ["entailment", "neutral", "contradiction"]),
    "qnli": ("accuracy", 2, "question", "sentence", "label", ["entailment", "not_entailment"]),
    "rte": ("accuracy", 2, "sentence1", "sentence2", "label", ["entailment", "not_entailment"]),
}


def read_glue(task: str, path: str | Path):
    """Examples (text_a, text_b, label) of one GLUE tsv file; a bad row is an error naming file and line."""
    from lmlab.data.generated.nlu import NLUExample

    if task not in GLUE:
        raise LmlabError(f"unknown GLUE task '{task}'; known: {', '.join(GLUE)}")
    path = Path(path).expanduser()
    if not path.is_file():
        raise LmlabError(f"no GLUE {task} file at {path}")
    _, _, col_a, col_b, col_y, values = GLUE[task]
    lines = path.read_text(encoding="utf-8").splitlines()
    header = None if isinstance(col_a, int) else lines[0].split("\t")
    rows = lines if header is None else lines[1:]
    out = []
    for n, line in enumerate(rows, 1 if header is None else 2):
        cells = line.split("\t")
        try:
            get = (lambda c: cells[c]) if header is None else (lambda c: cells[header.index(c)])
            a, b, y = get(col_a), (get(col_b) if col_b else None), get(col_y)
            label = values.index(y) if values else float(y)
        except (IndexError, ValueError):
            raise LmlabError(f"{path}:{n}: bad {task} row (expected columns {col_a}, {col_b}, {col_y} "
                             f"with a label in {values or 'numbers'})") from None
        out.append(NLUExample(a, b, label))
    if not out:
        raise LmlabError(f"{path} holds no rows")
    return out
