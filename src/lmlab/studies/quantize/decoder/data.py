"""The decoder option's inputs: its sizes (the profile's `decoder` variant first), the KD text the teacher samples
itself (sampled once and stored in the run folder, so a resumed run trains on the same text), equal-length batches
of it, and the circuit tasks and budgets a run names, each checked."""

from __future__ import annotations

import json

import torch

from lmlab.data.generated.circuits import TASKS as CIRCUIT_TASKS
from lmlab.data.generated.selftext import sample_text
from lmlab.errors import LmlabError
from lmlab.files import atomic_write
from lmlab.runs import RunDir
from lmlab.studies.quantize.config import MULTIPLIER


def size(config, name: str):
    """A size for the decoder option: the field, else profiles.yaml's `decoder` variant, else the profile."""
    return config.size(name, "decoder")


def texts(lm, config, run_dir: RunDir) -> dict:
    """Sampled once and stored, so a resumed run trains on the same text."""
    path = run_dir.path / "kd_text.json"
    if path.is_file():
        return json.loads(path.read_text())
    length = size(config, "text_tokens")
    n_train, n_eval = size(config, "n_text"), size(config, "n_eval_text")
    seqs = sample_text(lm, 2 * (n_train + n_eval), new_tokens=length, seed=config.seed)
    full = [s[:length] for s in seqs if len(s) >= length]  # early-stopped samples are dropped, the rest cropped
    if len(full) < n_train + n_eval:
        raise LmlabError(f"the teacher sampled only {len(full)} sequences of {length} tokens; lower --n-text")
    data = {"eval": full[:n_eval], "train": full[n_eval:n_eval + n_train]}
    atomic_write(path, json.dumps(data))
    return data


def batch(seqs, device="cpu") -> dict:
    """Equal-length sequences as a batch on `device` (cpu for the training loop, which moves batches itself)."""
    ids = torch.tensor(seqs, dtype=torch.long, device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def tasks_and_budgets(config) -> tuple[list[str], list[str]]:
    """The circuit tasks a decoder is scored on (all, or those named) and the budgets, each checked."""
    if "tasks" in config.model_fields_set:
        bad = [t for t in config.tasks if t not in CIRCUIT_TASKS]
        if bad:
            raise LmlabError(f"a decoder is scored on the circuit tasks ({', '.join(CIRCUIT_TASKS)}), not '{bad[0]}'")
        names = list(config.tasks)
    else:
        names = list(CIRCUIT_TASKS)
    budgets = size(config, "budgets")
    bad = [b for b in budgets if b not in MULTIPLIER]
    if bad:
        raise LmlabError(f"unknown budget '{bad[0]}'; use A, B or C")
    return names, budgets
