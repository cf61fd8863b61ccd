"""S4 · Sparse attention post-training and circuit size (Draye et al., arXiv 2512.05865)."""

from lmlab.lazy import Lazy, lazy_exports
from lmlab.studies.base import StudySpec, register
from lmlab.studies.sparse_circuits.config import Config

SPEC = register(StudySpec(
    name="sparse-circuits",
    title="S4 · Sparse attention post-training and circuit size",
    paper="Draye et al., arXiv 2512.05865",
    citation=("Draye, Lei, Pan, Posner and Schölkopf, "
              "\"Sparse Attention Post-Training for Mechanistic Interpretability\", "
              "arXiv 2512.05865"),
    config=Config, run=Lazy(f"{__name__}.recipe:run"),
    figure=Lazy(f"{__name__}.analysis:figure"), verdict=Lazy(f"{__name__}.analysis:verdict"),
    default_model="smollm2-135m",
    full_models=("smollm2-135m", "gemma3-270m"),
    paper_figure="Explained effect vs number of heads kept, dense vs sparse model, four tasks. Multipliers "
                 "(dense heads / sparse heads at equal explained effect): Greater-Than 0.6x, IOI 2.0x (GPT-2), "
                 "Docstring 1.3x, IOI-Long 1.6x (OLMo-7B); the sparse models keep about 0.4% of attention edges "
                 "at unchanged loss.",
    summary=Lazy(f"{__name__}.analysis:summary"),
))

__all__ = ["SPEC", "Config", "figure", "run", "verdict"]

# the functions load with their submodules on first use (torch and transformers stay out of `lmlab --help`)
__getattr__ = lazy_exports(__name__, {"figure": "analysis", "summary": "analysis",
                                     "verdict": "analysis", "run": "recipe"})
