"""A GGUF file's header read once per load.

transformers reads a GGUF file's whole header (every metadata field: for a vocabulary of 262,144 tokens, a million
of them, each parsed in Python) once for the configuration, again inside the model's `from_pretrained`, again for
its weights and again for the tokenizer: four parses of the same bytes, most of a first load's time (Gemma-3-270M's
vocabulary). Inside `read_once()` the reader is built once per file, and the header's parsed metadata (asked for
without the tensors) is computed once and handed out as copies; the tensors are still read, once, by the one call
that asks for them. Outside it nothing changes. Where a later transformers or gguf moves these functions, the
context does nothing and the load is as slow as transformers makes it, never different.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager


@contextmanager
def read_once():
    patches = []
    try:
        import gguf
        from transformers import modeling_gguf_pytorch_utils as hf_gguf
    except ImportError:
        yield
        return
    readers: dict = {}
    headers: dict = {}
    reader_class, load_checkpoint = getattr(gguf, "GGUFReader", None), getattr(hf_gguf, "load_gguf_checkpoint", None)

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    def checkpoint(path, return_tensors=False, *args, **kwargs):
        if return_tensors or args or kwargs:
            return load_checkpoint(path, return_tensors, *args, **kwargs)
        key = os.path.realpath(path)
        if key not in headers:
            headers[key] = load_checkpoint(path, False)
        return copy.deepcopy(headers[key])

    if reader_class is not None:
        patches.append((gguf, "GGUFReader", reader_class, reader))
    if load_checkpoint is not None:
        patches.append((hf_gguf, "load_gguf_checkpoint", load_checkpoint, checkpoint))
    for module, name, _, new in patches:
        setattr(module, name, new)
    try:
        yield
    finally:
        for module, name, old, _ in patches:
            setattr(module, name, old)
        readers.clear()
        headers.clear()
