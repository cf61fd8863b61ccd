"""Datasets by hub id, through the `datasets` library: the rows of a hub dataset or of a saved dataset folder. The
readers map them onto items (formats.py: QA and GLUE; math.py: GSM8K and MATH-500), so this module knows no format
and imports none of them.

    popqa       akariasai/PopQA                     test
    triviaqa    mandarjoshi/trivia_qa, rc.nocontext validation
    nq          google-research-datasets/nq_open    validation
    hotpotqa    hotpotqa/hotpot_qa, distractor      validation
    gsm8k       openai/gsm8k, main                  test (the latent study: train, split into its train/dev/test)
    math500     HuggingFaceH4/MATH-500              test
    glue-NAME   nyu-mll/glue, NAME                  train and validation (mnli: validation_matched)

Each row goes through the same mapping as a row of the real file (`formats.hub_qa` with `formats.QA_ROWS`,
`math.hub_gsm8k`, `math.hub_math_items`, `formats.glue_splits`), so a hub row with a missing field is the same one-line error
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
