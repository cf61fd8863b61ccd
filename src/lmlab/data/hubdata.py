"""Datasets by hub id, through the `datasets` library, mapped onto the same items as the file readers.

    popqa       akariasai/PopQA                     test
    triviaqa    mandarjoshi/trivia_qa, rc.nocontext validation
    nq          google-research-datasets/nq_open    validation
    hotpotqa    hotpotqa/hotpot_qa, distractor      validation
    gsm8k       openai/gsm8k, main                  test (S0 trains: train, split into its train/dev/test)
    math500     HuggingFaceH4/MATH-500              test
    glue-NAME   nyu-mll/glue, NAME                  train and validation (mnli: validation_matched)

Each row goes through the same mapping as a row of the real file (`formats.QA_ROWS`, `math.gsm8k_row`,
`math.math500_item`, `formats.glue_example`), so a hub row with a missing field is the same one-line error
as a file's, naming the dataset and row. A folder written by `save_to_disk` (a Dataset, or a DatasetDict
holding the split) is read by `FORMAT:DIR`, wherever `FORMAT:PATH` takes a file.

Without a reachable hub a hub id is one sentence, at once. With HF_HUB_OFFLINE=1 the local datasets cache
is read, and a dataset not in it is one sentence too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from lmlab.errors import LmlabError


@dataclass(frozen=True)
class HubSource:
    repo: str
    name: str | None
    split: str


HUB = {
    "popqa": HubSource("akariasai/PopQA", None, "test"),
    "triviaqa": HubSource("mandarjoshi/trivia_qa", "rc.nocontext", "validation"),
    "nq": HubSource("google-research-datasets/nq_open", "nq_open", "validation"),
    "hotpotqa": HubSource("hotpotqa/hotpot_qa", "distractor", "validation"),
    "gsm8k": HubSource("openai/gsm8k", "main", "test"),
    "math500": HubSource("HuggingFaceH4/MATH-500", None, "test"),
}
GLUE_REPO = "nyu-mll/glue"


def _datasets():
    try:
        import datasets
    except ImportError:
        raise LmlabError("hub datasets and saved dataset folders need the `datasets` package "
                         "(pip install datasets)") from None
    datasets.logging.set_verbosity_error()
    return datasets


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_hub(repo: str, name: str | None, split: str, kind: str) -> Any:
    """`datasets.load_dataset(repo, name, split=split)`, or one sentence saying why not."""
    from huggingface_hub import constants

    from lmlab.hub import endpoint, hub_reachable

    label = repo + (f" ({name})" if name else "")
    offline = bool(constants.HF_HUB_OFFLINE)
    if not offline and not hub_reachable():
        raise LmlabError(f"no hub reachable ({endpoint()}) to fetch the dataset {label}: pass {kind}:PATH (a file or "
                         f"a save_to_disk folder), or set HF_HUB_OFFLINE=1 to read the local datasets cache")
    datasets = _datasets()
    try:
        return datasets.load_dataset(repo, name, split=split)
    except Exception as exc:  # the library raises many kinds; the user needs the first line and what to do
        if offline:
            raise LmlabError(f"the dataset {label} is not in the local datasets cache and HF_HUB_OFFLINE=1 forbids "
                             f"fetching it: pass {kind}:PATH (a file or a save_to_disk folder)") from None
        raise LmlabError(f"could not load the dataset {label}, split {split}: {_first_line(exc)}") from None


def rows(dataset: Any, label: str) -> Iterator[tuple[str, dict]]:
    """(where, row) for each row of a `datasets.Dataset` (or any sequence of dicts)."""
    for i, row in enumerate(dataset):
        yield f"{label} row {i}", row


def hub_rows(kind: str, split: str | None = None) -> Iterator[tuple[str, dict]]:
    source = HUB[kind]
    split = split or source.split
    return rows(load_hub(source.repo, source.name, split, kind), f"{source.repo}[{split}]")


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json"))


def load_saved(path: Path, kind: str, split: str | None = None) -> Any:
    """The Dataset saved at `path`; for a DatasetDict, its `split` (default: the hub's split for `kind`, or
    the only split there is)."""
    path = Path(path).expanduser()
    if not is_saved_dataset(path):
        raise LmlabError(f"{path} is not a dataset folder written by save_to_disk (no dataset_dict.json or "
                         f"state.json)")
    datasets = _datasets()
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise LmlabError(f"{path}: not a readable saved dataset ({_first_line(exc)})") from None
    if isinstance(ds, datasets.DatasetDict):
        want = split or (HUB[kind].split if kind in HUB else None)
        if want in ds:
            return ds[want]
        if split is None and len(ds) == 1:
            return next(iter(ds.values()))
        raise LmlabError(f"{path} holds the splits {', '.join(ds)}, not '{want}'")
    return ds


def saved_rows(path: Path, kind: str, split: str | None = None) -> Iterator[tuple[str, dict]]:
    return rows(load_saved(path, kind, split), str(path) + (f"[{split}]" if split else ""))


def hub_qa(kind: str) -> list:
    """The QA items of the hub dataset `kind` (popqa, triviaqa, nq, hotpotqa)."""
    from lmlab.data.formats import QA_ROWS

    items = [QA_ROWS[kind](row, where, i) for i, (where, row) in enumerate(hub_rows(kind))]
    if not items:
        raise LmlabError(f"the hub dataset {HUB[kind].repo} holds no questions")
    return items


def hub_gsm8k(split: str | None = None) -> list:
    """The GSM8K rows (`GsmRow`: question, reasoning lines, answer) of the hub's `split` (default test)."""
    from lmlab.data.math import gsm8k_row

    got = [gsm8k_row(row, where, n) for n, (where, row) in enumerate(hub_rows("gsm8k", split), 1)]
    if not got:
        raise LmlabError(f"the hub dataset {HUB['gsm8k'].repo} holds no problems")
    return got


def hub_math_items(kind: str) -> list:
    """The test problems (`MathItem`) of the hub's GSM8K or MATH-500."""
    from lmlab.data.math import MathItem, math500_item

    if kind == "gsm8k":
        return [MathItem(f"gsm8k-{r.line:05d}", kind, 0, r.question, r.answer) for r in hub_gsm8k()]
    if kind != "math500":
        raise LmlabError(f"unknown math dataset '{kind}'; known: gsm8k, math500")
    got = [math500_item(row, where, n) for n, (where, row) in enumerate(hub_rows(kind), 1)]
    if not got:
        raise LmlabError(f"the hub dataset {HUB[kind].repo} holds no problems")
    return got


def glue_splits(task: str, folder: Path | None = None) -> tuple[list, list]:
    """(train, dev) examples of GLUE `task`, from the hub (folder None) or a saved DatasetDict folder."""
    from lmlab.data.formats import GLUE, glue_example

    if task not in GLUE:
        raise LmlabError(f"unknown GLUE task '{task}'; known: {', '.join(GLUE)}")
    dev_split = "validation_matched" if task == "mnli" else "validation"
    out = []
    for split in ("train", dev_split):
        if folder is None:
            found = rows(load_hub(GLUE_REPO, task, split, f"glue-{task}"), f"{GLUE_REPO}/{task}[{split}]")
        else:
            found = saved_rows(folder, f"glue-{task}", split)
        examples = [glue_example(task, row, where) for where, row in found]
        if not examples:
            raise LmlabError(f"GLUE {task} {split} holds no rows")
        out.append(examples)
    return out[0], out[1]
