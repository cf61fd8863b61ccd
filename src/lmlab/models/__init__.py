"""Where weights come from (`load_model`) and how each family is laid out (`Layout`)."""

from lmlab.models.embedded import EMBEDDED, cache_dir
from lmlab.models.layout import FAMILIES, Layout, layout_of
from lmlab.models.load import LoadedModel, check_context, known_names, load_model, resize_vocabulary, save_model

__all__ = ["EMBEDDED", "FAMILIES", "Layout", "LoadedModel", "cache_dir", "check_context", "known_names", "resize_vocabulary",
           "layout_of", "load_model", "save_model"]
