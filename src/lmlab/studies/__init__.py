"""One module per paper, all the same shape (see base.py); each registers itself on import."""

from lmlab.studies.base import STUDIES, StudyConfig, StudySpec, Verdict, get_study, register, run_study
# registration order = the order `lmlab reproduce` runs them (DESIGN.md: knockout, quantize, filler, ...)
from lmlab.studies import knockout, quantize, filler, sparse_circuits, latent  # noqa: E402,F401,I001  (they register themselves)

__all__ = ["STUDIES", "StudyConfig", "StudySpec", "Verdict", "get_study", "register", "run_study"]
