"""lmlab: a lab bench for dissecting and compressing transformer language models.

    import lmlab
    result = lmlab.run("knockout", model="smollm2-135m", profile="quick")

The API (`run`, `load_result`, `load_model`, `studies`) is imported on first use, so `import lmlab`
and the CLI's `--help` stay fast.
"""

from lmlab.errors import LmlabError

__version__ = "0.1.0"
__all__ = ["LmlabError", "__version__", "load_model", "load_result", "run", "studies"]


def __getattr__(name: str):
    if name in ("run", "load_result", "load_model", "studies"):
        from lmlab import api

        return getattr(api, name)
    raise AttributeError(f"module 'lmlab' has no attribute '{name}'")
