"""S0 · Latent compression of reasoning chains, Token Assorted (Su et al., arXiv 2502.03275)."""

from lmlab.lazy import Lazy, lazy_exports
from lmlab.studies.base import StudySpec, register
from lmlab.studies.latent.config import Config

SPEC = register(StudySpec(
    name="latent",
    title="S0 · Latent compression of reasoning chains (Token Assorted)",
    paper="Su et al., arXiv 2502.03275",
    citation=("Su, Zhu, Xu, Jiao, Tian and Zheng, "
              "\"Token Assorted: Mixing Latent and Text Tokens for Improved Language Model Reasoning\", "
              "arXiv 2502.03275"),
    config=Config, run=Lazy(f"{__name__}.recipe:run"),
    figure=Lazy(f"{__name__}.analysis:figure"), verdict=Lazy(f"{__name__}.analysis:verdict"),
    default_model="scratch",
    paper_figure="Llama-3.2-3B, average math accuracy and reasoning-trace tokens vs latent compression rate r: "
                 "tokens fall from about 590 to 480 as r rises, accuracy rises from 27.1 to a peak of 28.1 near "
                 "r = 16 (within about one point of CoT throughout).",
    summary=Lazy(f"{__name__}.analysis:summary"),
    loads_model=False,
))

__all__ = ["SPEC", "Config", "figure", "final_weights", "prepare", "run", "verdict"]

# the functions load with their submodules on first use (torch and transformers stay out of `lmlab --help`)
__getattr__ = lazy_exports(__name__, {"figure": "analysis", "summary": "analysis", "verdict": "analysis",
                                     "final_weights": "recipe", "prepare": "recipe", "run": "recipe"})
