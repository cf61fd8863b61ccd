"""One package per paper, all the same shape (see base.py); each registers itself on import."""

from lmlab.studies.base import STUDIES, StudyConfig, StudySpec, Verdict, get_study, register
from lmlab.studies.result import StudyResult, load_result
from lmlab.studies.runner import run_study
# registration order = the order `lmlab reproduce` runs them (DESIGN.md: knockout, quantize, filler, ...)
from lmlab.studies import knockout, quantize, filler, sparse_circuits, latent  # noqa: E402,F401,I001  (they register themselves)

__all__ = ["STUDIES", "StudyConfig", "StudyResult", "StudySpec", "Verdict", "get_study", "load_result", "register",
           "run_study"]
