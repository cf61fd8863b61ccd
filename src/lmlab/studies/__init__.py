"""One module per paper, all the same shape (see base.py); each registers itself on import."""

from lmlab.studies.base import STUDIES, StudyConfig, StudySpec, Verdict, get_study, register, run_study
from lmlab.studies import filler, knockout, quantize  # noqa: E402,F401  (they register themselves)

__all__ = ["STUDIES", "StudyConfig", "StudySpec", "Verdict", "get_study", "register", "run_study"]
