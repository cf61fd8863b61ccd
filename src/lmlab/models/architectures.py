"""Which Hugging Face architectures lmlab supports: the table the conformance checks wrote (architectures.json,
beside this file), read without torch.

Each causal-LM type the transformers it was written with registers is "supported" (every intervention matched an
independent computation on a tiny random instance of it) or "refused" with one sentence why. A type the table does
not know (a newer transformers) is tried by discovery and is not marked checked. The encoders the quantize study
distils (BERT and its kin, loaded as sequence classifiers) have a table of their own, checked on what that study
uses of them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

PATH = Path(__file__).with_name("architectures.json")


@lru_cache(maxsize=1)
def table() -> dict:
    """{"transformers": version, "types": {model_type: {"status", "reason", and for a hybrid "blocks": its kinds of
    block}}, "encoders": {...the same}}."""
    data = json.loads(PATH.read_text(encoding="utf-8")) if PATH.exists() else {"transformers": "", "types": {}}
    return {"transformers": data["transformers"], "types": dict(sorted(data["types"].items())),
            "encoders": dict(sorted(data.get("encoders", {}).items()))}


def refusal(model_type: str, encoder: bool = False) -> str | None:
    """The reason a checked architecture is refused, or None (supported, or a causal LM the table does not know;
    the families spelled out in the layout table are asked before this). `encoder`: the model is loaded as a
    bidirectional encoder, judged by the encoders' table."""
    if encoder:
        row = table()["encoders"].get(model_type)
        if row is None:
            return ("not among the encoders checked (`lmlab models --architectures` lists them); BERT, RoBERTa, "
                    "ELECTRA and their kin are")
        return row["reason"] if row["status"] == "refused" else None
    row = table()["types"].get(model_type)
    if row is not None:
        return row["reason"] if row["status"] == "refused" else None
    if model_type in _installed_causal_types():
        return None  # registered by a transformers newer than the table: discovery tries it, unchecked
    return ("not a decoder-only language model among those checked (`lmlab models --architectures` lists them; "
            "a causal LM whose type the table lacks is tried as found)")


def _installed_causal_types() -> set[str]:
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return set()
    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def counts() -> tuple[int, int]:
    rows = table()["types"].values()
    return sum(r["status"] == "supported" for r in rows), len(rows)


def markdown() -> str:
    """The table as Markdown, one row an architecture (what docs/models.md carries)."""
    supported, total = counts()
    lines = [f"{supported} of {total} architectures supported (transformers {table()['transformers']}).", "",
             "| model_type | status | blocks (a hybrid's kinds) | what is refused, and why |", "|---|---|---|---|"]
    for name, row in table()["types"].items():
        lines.append(f"| {name} | {row['status']} | {row.get('blocks', '')} | {row['reason'].replace('|', '/')} |")
    encoders = table()["encoders"]
    if encoders:
        n = sum(r["status"] == "supported" for r in encoders.values())
        lines += ["", f"Encoders, for the quantize study's classifiers: {n} of {len(encoders)} supported.", "",
                  "| model_type | status | what is refused, and why |", "|---|---|---|"]
        for name, row in encoders.items():
            lines.append(f"| {name} | {row['status']} | {row['reason'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"
