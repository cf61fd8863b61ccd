"""What a model is, read from its config.json alone (no torch): `lmlab models` lists every model this way in
well under a second, without loading weights. The tiny test models' shapes are listed here too (a test
checks them against the models as built)."""

from __future__ import annotations

import json
from pathlib import Path

TINY_NAMES = ("tiny-llama", "tiny-gpt2", "tiny-bert")
TINY_SHAPES = {"tiny-llama": dict(family="llama", layers=3, heads=4, kv_heads=2),
               "tiny-gpt2": dict(family="gpt2", layers=3, heads=4, kv_heads=4),
               "tiny-bert": dict(family="bert", layers=3, heads=4, kv_heads=4)}


def describe_config(config: dict) -> dict:
    """family, layers, heads and kv_heads of a Hugging Face config (as a dict)."""
    from lmlab.models.layout import family_of

    text = config.get("text_config") or config
    layers = text.get("num_hidden_layers", text.get("n_layer"))
    heads = text.get("num_attention_heads", text.get("n_head"))
    return dict(family=family_of(config.get("model_type", "?")), layers=layers, heads=heads,
                kv_heads=text.get("num_key_value_heads") or heads)


def describe_folder(folder: Path) -> dict:
    return describe_config(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))
