"""Where weights come from (`load_model`) and how each family is laid out (`Layout`).

The names load on first use (`lmlab.lazy`), so the torch-free parts (the embedded list, the catalog) import
without torch: `lmlab models` lists models in well under a second.
"""

from lmlab.lazy import lazy_exports
from lmlab.models.embedded import EMBEDDED, cache_dir

__all__ = ["EMBEDDED", "FAMILIES", "Layout", "LoadedModel", "ScratchSpec", "cache_dir", "check_context", "classifier_from",
           "known_names", "layout_of", "load_model", "module_device", "pad_sequences", "resize_vocabulary", "save_model",
           "weights_fingerprint"]

__getattr__ = lazy_exports(__name__, {
    "FAMILIES": "layout", "Layout": "layout", "layout_of": "layout", "pad_sequences": "batch", "module_device": "batch",
    "LoadedModel": "load", "check_context": "load", "classifier_from": "load", "known_names": "load",
    "load_model": "load", "resize_vocabulary": "load", "save_model": "load", "weights_fingerprint": "load",
    "ScratchSpec": "scratch"})
