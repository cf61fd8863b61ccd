"""Where weights come from (`load_model`) and how each family is laid out (`Layout`)."""

from lmlab.models.embedded import EMBEDDED, cache_dir
from lmlab.models.layout import FAMILIES, Layout, layout_of
from lmlab.models.batch import pad_sequences
from lmlab.models.load import (LoadedModel, check_context, classifier_from, known_names, load_model, resize_vocabulary,
                              save_model, weights_fingerprint)
from lmlab.models.scratch import ScratchSpec

__all__ = ["EMBEDDED", "FAMILIES", "Layout", "LoadedModel", "ScratchSpec", "cache_dir", "check_context", "classifier_from",
           "known_names", "layout_of", "load_model", "pad_sequences", "resize_vocabulary", "save_model",
           "weights_fingerprint"]
