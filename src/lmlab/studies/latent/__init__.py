"""S0 · Latent compression of reasoning chains, Token Assorted (Su et al., arXiv 2502.03275)."""

from lmlab.studies.registry import define, study_exports
from lmlab.studies.latent.config import Config

SPEC = define(__name__, Config,
    name="latent",
    title="S0 · Latent compression of reasoning chains (Token Assorted)",
    paper="Su et al., arXiv 2502.03275",
    citation=("Su, Zhu, Xu, Jiao, Tian and Zheng, "
              "\"Token Assorted: Mixing Latent and Text Tokens for Improved Language Model Reasoning\", "
              "arXiv 2502.03275"),
    answers={"demo": "figure; prices its answer", "quick": "figure; prices its answer",
             "full": "the paper's sizes (a GPU)"},
    default_model="scratch",
    paper_figure="Llama-3.2-3B, average math accuracy and reasoning-trace tokens vs latent compression rate r: "
                 "tokens fall from about 590 to 480 as r rises, accuracy rises from 27.1 to a peak of 28.1 near "
                 "r = 16 (within about one point of CoT throughout).",
    loads_model=False)

__all__ = ["SPEC", "Config", "figure", "report_rows", "run", "verdict", "final_weights", "prepare"]
__getattr__ = study_exports(__name__, "final_weights", "prepare")
