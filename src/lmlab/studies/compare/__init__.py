"""Compare · does a compressed or sparse model keep its original's circuits? (lmlab's own study: no paper claims this)"""

from lmlab.lazy import Lazy, lazy_exports
from lmlab.studies.base import StudySpec, register
from lmlab.studies.compare.config import Config

SPEC = register(StudySpec(
    name="compare",
    title="Compare · do compressed or sparse variants keep the original's circuits?",
    paper="lmlab's own comparison (no paper claims this)",
    citation="lmlab: circuits of a model and its compressed or sparse variants, side by side (attribution patching "
             "as in Draye et al., arXiv 2512.05865; students as in Wu et al., arXiv 2206.01859)",
    config=Config, run=Lazy(f"{__name__}.recipe:run"),
    figure=Lazy(f"{__name__}.analysis:figure"), verdict=Lazy(f"{__name__}.analysis:verdict"),
    default_model="smollm2-135m",
    paper_figure="No paper's figure: per task, each head's attribution in the original against the variant, the top-k "
                 "overlap against k beside the original's own split-half overlap, and the explained-effect curves.",
    summary=Lazy(f"{__name__}.analysis:summary"),
    in_reproduce=False,
))

__all__ = ["SPEC", "Config", "figure", "run", "verdict"]

__getattr__ = lazy_exports(__name__, {"figure": "analysis", "summary": "analysis", "verdict": "analysis",
                                     "run": "recipe"})
