"""One package per paper, all the same shape (see registry.py); each registers itself on import."""

from lmlab.lazy import lazy_exports
from lmlab.studies.config import StudyConfig
from lmlab.studies.registry import STUDIES, StudySpec, get_study, register
from lmlab.studies.verdict import Verdict
# registration order = the order `lmlab reproduce` runs them (knockout, quantize, filler, ...)
from lmlab.studies import knockout, quantize, filler, sparse_circuits, latent, compare  # noqa: E402,F401,I001  (they register themselves)

__all__ = ["STUDIES", "StudyConfig", "StudyResult", "StudySpec", "Verdict", "get_study", "load_result", "register",
           "run_study"]

# results and the runner (pandas, torch, transformers) load on first use: the CLI registers every study fast
__getattr__ = lazy_exports(__name__, {"StudyResult": "result", "load_result": "result", "run_study": "runner"})
