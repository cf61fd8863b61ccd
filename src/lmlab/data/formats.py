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

from lmlab.data import hubdata
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


# --- one row -> one item: the same mapping for a file's rows and a hub dataset's rows -------------------

def popqa_item(row: dict, where: str, i: int) -> QAItem:
    answers = _need(row, "possible_answers", where)
    if isinstance(answers, str):
        try:
            answers = json.loads(answers)
        except json.JSONDecodeError:
            raise LmlabError(f"{where}: field 'possible_answers' is not a JSON list") from None
    if not isinstance(answers, list) or not answers:
        raise LmlabError(f"{where}: field 'possible_answers' is not a non-empty list")
    pop = row.get("s_pop")
    return QAItem(id=f"popqa-{i:05d}", dataset="popqa", question=_need(row, "question", where),
                  aliases=[str(a) for a in answers], subject=_need(row, "subj", where), prop=row.get("prop") or None,
                  popularity=float(pop) if pop not in (None, "") else None)


def triviaqa_item(row: dict, where: str, i: int) -> QAItem:
    """The release's JSON files say Question / Answer{Value, Aliases}; the hub's rows say question /
    answer{value, aliases}: both read the same."""
    if not isinstance(row, dict):
        raise LmlabError(f"{where}: not a JSON object (found {type(row).__name__})")
    upper = "Question" in row or "Answer" in row
    answer = _need(row, "Answer" if upper else "answer", where)
    if not isinstance(answer, dict):
        raise LmlabError(f"{where}: field '{'Answer' if upper else 'answer'}' is not a JSON object")
    value, aliases = ("Value", "Aliases") if upper else ("value", "aliases")
    found = list(answer.get(aliases) or []) + [a for a in [answer.get(value)] if a]
    if not found:
        raise LmlabError(f"{where}: missing field '{'Answer' if upper else 'answer'}.{aliases}'")
    return QAItem(id=f"triviaqa-{i:05d}", dataset="triviaqa", question=_need(row, "Question" if upper else "question",
                                                                             where), aliases=found)


def nq_item(row: dict, where: str, i: int) -> QAItem:
    answers = _need(row, "answer", where)
    return QAItem(id=f"nq-{i:05d}", dataset="nq", question=_need(row, "question", where),
                  aliases=list(answers) if isinstance(answers, list) else [answers])


def hotpotqa_item(row: dict, where: str, i: int) -> QAItem:
    return QAItem(id=f"hotpotqa-{i:05d}", dataset="hotpotqa", question=_need(row, "question", where),
                  aliases=[_need(row, "answer", where)])


QA_ROWS: dict[str, Callable[[dict, str, int], QAItem]] = {
    "popqa": popqa_item, "triviaqa": triviaqa_item, "nq": nq_item, "hotpotqa": hotpotqa_item}


def read_popqa(path: Path) -> list[QAItem]:
    if path.suffix == ".tsv":
        with open(path, encoding="utf-8", newline="") as fh:
            rows = [(f"{path}:{n}", r) for n, r in enumerate(csv.DictReader(fh, delimiter="\t"), 2)]
    else:
        rows = list(_jsonl(path))
    return [popqa_item(row, where, i) for i, (where, row) in enumerate(rows)]


def read_triviaqa(path: Path) -> list[QAItem]:
    data = _json(path)
    if not isinstance(data, dict) or "Data" not in data:
        raise LmlabError(f"{path}: expected a TriviaQA JSON object with a 'Data' list")
    return [triviaqa_item(row, f"{path}: item {i}", i) for i, row in enumerate(data["Data"])]


def read_nq(path: Path) -> list[QAItem]:
    return [nq_item(row, where, i) for i, (where, row) in enumerate(_jsonl(path))]


def read_hotpotqa(path: Path) -> list[QAItem]:
    data = _json(path)
    if not isinstance(data, list):
        raise LmlabError(f"{path}: expected a HotpotQA JSON list")
    return [hotpotqa_item(r, f"{path}: item {i}", i) for i, r in enumerate(data)]


READERS: dict[str, Callable[[Path], list[QAItem]]] = {
    "popqa": read_popqa, "triviaqa": read_triviaqa, "nq": read_nq, "hotpotqa": read_hotpotqa}


def read_qa(kind: str, path: str | Path) -> list[QAItem]:
    if kind not in READERS:
        raise LmlabError(f"unknown QA file format '{kind}'; known: {', '.join(READERS)}")
    path = Path(path).expanduser()
    if path.is_dir():  # a dataset saved with `save_to_disk`
        items = [QA_ROWS[kind](row, where, i) for i, (where, row) in enumerate(hubdata.saved_rows(path, kind))]
    elif not path.is_file():
        raise LmlabError(f"no {kind} file or saved dataset folder at {path}")
    else:
        items = READERS[kind](path)
    if not items:
        raise LmlabError(f"{path} holds no questions")
    return items


def hub_qa(kind: str) -> list:
    """The QA items of the hub dataset `kind` (popqa, triviaqa, nq, hotpotqa)."""
    items = [QA_ROWS[kind](row, where, i) for i, (where, row) in enumerate(hubdata.hub_rows(kind))]
    if not items:
        raise LmlabError(f"the hub dataset {hubdata.HUB[kind].repo} holds no questions")
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


# the hub's GLUE (nyu-mll/glue): text columns per task; `label` is the class index in the order of GLUE's
# label values above (mnli: entailment, neutral, contradiction), a float for stsb, -1 on the hidden test split
GLUE_HUB_COLUMNS = {"cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
                    "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"),
                    "mnli": ("premise", "hypothesis"), "qnli": ("question", "sentence"),
                    "rte": ("sentence1", "sentence2")}


def glue_example(task: str, row: dict, where: str):
    """One row of the hub's GLUE `task` as an NLUExample; a missing text or label is an error naming the row."""
    from lmlab.data.generated.nlu import NLUExample

    col_a, col_b = GLUE_HUB_COLUMNS[task]
    num_labels = GLUE[task][1]
    a, b = _need(row, col_a, where), (_need(row, col_b, where) if col_b else None)
    label = row.get("label")
    if label is None or isinstance(label, bool) or not isinstance(label, (int, float)):
        raise LmlabError(f"{where}: missing field 'label'")
    if num_labels > 1 and not (isinstance(label, int) and 0 <= label < num_labels):
        raise LmlabError(f"{where}: label {label} is not a class of {task} (0..{num_labels - 1}; the test split's "
                         f"labels are hidden)")
    return NLUExample(str(a), None if b is None else str(b), float(label) if num_labels == 1 else int(label))


def glue_splits(task: str, folder: Path | None = None) -> tuple[list, list]:
    """(train, dev) examples of GLUE `task`, from the hub (folder None) or a saved DatasetDict folder."""
    if task not in GLUE:
        raise LmlabError(f"unknown GLUE task '{task}'; known: {', '.join(GLUE)}")
    dev_split = "validation_matched" if task == "mnli" else "validation"
    out = []
    for split in ("train", dev_split):
        if folder is None:
            repo = hubdata.GLUE_REPO
            found = hubdata.rows(hubdata.load_hub(repo, task, split, f"glue-{task}"), f"{repo}/{task}[{split}]")
        else:
            found = hubdata.saved_rows(folder, f"glue-{task}", split)
        examples = [glue_example(task, row, where) for where, row in found]
        if not examples:
            raise LmlabError(f"GLUE {task} {split} holds no rows")
        out.append(examples)
    return out[0], out[1]
