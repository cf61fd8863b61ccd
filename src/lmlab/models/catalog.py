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
    from types import SimpleNamespace

    from lmlab.models.layout import family_of, is_encoder

    text = config.get("text_config") or config
    layers = text.get("num_hidden_layers", text.get("n_layer"))
    heads = text.get("num_attention_heads", text.get("n_head"))
    model_type = config.get("model_type", "?")
    encoder = is_encoder(SimpleNamespace(model_type=model_type, is_decoder=config.get("is_decoder", False)))
    return dict(family=family_of(model_type, encoder=encoder), layers=layers, heads=heads,
                kv_heads=text.get("num_key_value_heads") or heads)


def describe_folder(folder: Path) -> dict:
    return describe_config(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))


def shape_without_weights(spec: str) -> dict | None:
    """`describe_config` of a model read from its config.json alone: a model folder, a hub id whose config the local
    hub cache holds, an embedded model whose cache is prepared, a tiny model's listed shape. None where no config
    can be read that cheaply (a GGUF file, a hub id not cached, an embedded model not prepared yet): its shape is
    known once it loads."""
    from lmlab.models.embedded import EMBEDDED, cached_model_dir, is_cached

    if spec in TINY_SHAPES:
        return TINY_SHAPES[spec]
    if spec in EMBEDDED:
        return describe_folder(cached_model_dir(spec)) if is_cached(EMBEDDED[spec]) else None
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return describe_folder(path)
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not path.exists():
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(spec, "config.json")
        return describe_folder(Path(found).parent) if isinstance(found, str) else None
    return None


def known_names() -> list[str]:
    from lmlab.models.embedded import EMBEDDED

    return list(EMBEDDED) + list(TINY_NAMES)


# the weight files transformers' from_pretrained reads from a folder (single or sharded)
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.bin.index.json")


def check_safetensors(path: Path) -> None:
    """A safetensors file whose header does not parse, or whose tensors run past its end (a copy or download cut
    short), is one sentence, read from its header alone (no torch): safetensors would fail only after the model's
    other files load, with its own traceback."""
    from lmlab.errors import LmlabError

    def damaged(what: str) -> LmlabError:
        return LmlabError(f"{path} is damaged: {what}; copy or download the weights again")

    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length <= 0 or 8 + length > size:
            raise damaged(f"its header is cut short or not a safetensors header ({size} bytes in all)")
        try:
            header = json.loads(fh.read(length))
        except ValueError:
            raise damaged("its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise damaged("its header is not a table of tensors")
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        raise damaged("its header does not give every tensor's place in the file") from None
    if 8 + length + end > size:
        raise damaged(f"it holds {size} bytes but its tensors need {8 + length + end}")


def check_hub_model(spec: str) -> None:
    """A hub id where no hub can be reached and nothing of it is in the local cache: one sentence, in a second
    (no torch; load_model asks the same before its retries would take minutes)."""
    from lmlab.errors import LmlabError
    from lmlab.hub import cached_locally, hub_reachable, unreachable_message

    if not hub_reachable() and not cached_locally(spec):
        raise LmlabError(unreachable_message(f"'{spec}'", "pass a local model directory or a .gguf file"))


def check_model_available(spec: str, scratch_ok: bool = False) -> str:
    """check_model_spec, and for a hub id whether it can be had (check_hub_model)."""
    kind = check_model_spec(spec, scratch_ok)
    if kind == "hub":
        check_hub_model(spec)
    return kind


def check_model_spec(spec: str, scratch_ok: bool = False) -> str:
    """What `spec` names, checked without torch: 'scratch', 'tiny', 'embedded', 'gguf', 'folder' or 'hub'. A
    path that is not a model, or an unknown name, is the one sentence load_model gives (it calls this too)."""
    from lmlab.errors import LmlabError
    from lmlab.models.embedded import EMBEDDED

    if spec == "scratch":
        if not scratch_ok:
            raise LmlabError("--model scratch is a model trained in the run; only studies that train one "
                             "(latent) accept it")
        return "scratch"
    if spec in TINY_NAMES:
        return "tiny"
    if spec in EMBEDDED:
        return "embedded"
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise LmlabError(f"no GGUF file at {spec}")
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise LmlabError(f"{spec} is not a GGUF file (it does not start with the GGUF magic bytes); "
                                 "a download cut short, or another format renamed?")
        return "gguf"
    if path.exists():
        if not (path.is_dir() and (path / "config.json").is_file()):
            raise LmlabError(f"{spec} is not a model directory (no config.json) or a .gguf file")
        try:  # an architecture lmlab does not know, then missing weights: both before torch loads
            describe_folder(path)
        except (ValueError, OSError) as exc:
            raise LmlabError(f"{path / 'config.json'} cannot be read as JSON ({exc})") from None
        if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES):
            raise LmlabError(f"{spec} has a config.json but no weights (model.safetensors, pytorch_model.bin or "
                             "a sharded index); copy the weight files into it")
        for weights in sorted(path.glob("*.safetensors")):
            check_safetensors(weights)
        return "folder"
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return "hub"
    if "/" in spec or spec.startswith((".", "~")):
        raise LmlabError(f"no such file or directory: {spec}")
    raise LmlabError(f"unknown model '{spec}'; embedded models: {', '.join(known_names())} "
                     f"(or give a hub id, a local model directory or a .gguf file)")
