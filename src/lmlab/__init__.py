"""lmlab: a lab bench for dissecting and compressing transformer language models."""

from lmlab.errors import LmlabError

__version__ = "0.1.0"
__all__ = ["LmlabError", "__version__"]
