"""Compare · does a compressed or sparse model keep its original's circuits? (lmlab's own study: no paper claims this)"""

from lmlab.studies.registry import define, study_exports
from lmlab.studies.compare.config import Config

SPEC = define(__name__, Config, derives=True,
    name="compare",
    title="Compare · do compressed or sparse variants keep the original's circuits?",
    paper="lmlab's own comparison (no paper claims this)",
    citation="lmlab: circuits of a model and its compressed or sparse variants, side by side (attribution patching "
             "as in Draye et al., arXiv 2512.05865; students as in Wu et al., arXiv 2206.01859)",
    default_model="smollm2-135m",
    paper_figure="No paper's figure: per task, each head's attribution in the original against the variant, the top-k "
                 "overlap against k beside the original's own split-half overlap, and the explained-effect curves.",
    in_reproduce=False)

__all__ = ["SPEC", "Config", "figure", "report_rows", "run", "verdict"]
__getattr__ = study_exports(__name__)
