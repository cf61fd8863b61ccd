"""S1 · Attention knockout: two pathways to truthfulness (Luo et al., arXiv 2601.07422)."""

from lmlab.studies.registry import define, study_exports
from lmlab.studies.knockout.config import Config

SPEC = define(__name__, Config,
    name="knockout",
    title="S1 · Attention knockout: two pathways to truthfulness",
    paper="Luo et al., arXiv 2601.07422",
    citation=("Luo et al., "
              "\"Two Pathways to Truthfulness: On the Intrinsic Encoding of LLM Hallucinations\", "
              "arXiv 2601.07422"),
    answers={"demo": "answers on a CPU", "quick": "answers on a CPU (under 30 min a seed)",
             "full": "answers at the paper's sizes (a GPU)"},
    default_model="smollm2-135m", full_models=("smollm2-135m", "gemma3-270m"),
    paper_figure=("ΔP vs layer for Llama-3.2-1B and -3B. Q-Anchored lines (PopQA, TriviaQA, HotpotQA, "
                  "NQ) fall from about 0 at layer 0 to about −50 to −80 pp in middle and late layers; "
                  "A-Anchored lines stay well above them (about −20 to −60 pp)."))

__all__ = ["SPEC", "Config", "figure", "report_rows", "run", "verdict"]
__getattr__ = study_exports(__name__)
