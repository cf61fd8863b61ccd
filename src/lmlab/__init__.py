"""lmlab: a lab bench for dissecting and compressing transformer language models.

    import lmlab
    result = lmlab.run("knockout", model="smollm2-135m", profile="quick")

The API (`run`, `load_result`, `load_model`, `studies`) is imported on first use, so `import lmlab`
and the CLI's `--help` stay fast.
"""

from lmlab.errors import LmlabError
from lmlab.extras import quiet_import_notes
from lmlab.lazy import lazy_exports

quiet_import_notes()

__version__ = "0.1.0"
__all__ = ["LmlabError", "__version__", "load_model", "load_result", "run", "studies"]

__getattr__ = lazy_exports(__name__, {name: "api" for name in ("run", "load_result", "load_model", "studies")})
