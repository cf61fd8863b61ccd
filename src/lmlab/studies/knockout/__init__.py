"""S1 · Attention knockout: two pathways to truthfulness (Luo et al., arXiv 2601.07422)."""

from lmlab.lazy import Lazy, lazy_exports
from lmlab.studies.base import StudySpec, register
from lmlab.studies.knockout.config import Config

SPEC = register(StudySpec(name="knockout", title="S1 · Attention knockout: two pathways to truthfulness",
                   paper="Luo et al., arXiv 2601.07422",
                   citation=("Luo et al., "
                             "\"Two Pathways to Truthfulness: On the Intrinsic Encoding of LLM Hallucinations\", "
                             "arXiv 2601.07422"),
                   config=Config,
                   run=Lazy(f"{__name__}.recipe:run"),
                   figure=Lazy(f"{__name__}.analysis:figure"), verdict=Lazy(f"{__name__}.analysis:verdict"),
                   default_model="smollm2-135m", full_models=("smollm2-135m", "gemma3-270m"),
                   paper_figure=("ΔP vs layer for Llama-3.2-1B and -3B. Q-Anchored lines (PopQA, TriviaQA, HotpotQA, "
                                 "NQ) fall from about 0 at layer 0 to about −50 to −80 pp in middle and late layers; "
                                 "A-Anchored lines stay well above them (about −20 to −60 pp)."),
                   summary=Lazy(f"{__name__}.analysis:key_rows")))

__all__ = ["SPEC", "Config", "figure", "run", "verdict"]

# the functions load with their submodules on first use (torch and transformers stay out of `lmlab --help`)
__getattr__ = lazy_exports(__name__, {"figure": "analysis", "key_rows": "analysis",
                                     "verdict": "analysis", "run": "recipe"})
