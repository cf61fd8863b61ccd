"""S3 · Meaningless tokens and the Activation Redistribution Module (Shi et al., arXiv 2510.01032)."""

from lmlab.studies.registry import define, study_exports
from lmlab.studies.filler.config import Config

SPEC = define(__name__, Config,
    name="filler",
    title="S3 · Meaningless tokens and the Activation Redistribution Module",
    paper="Shi et al., arXiv 2510.01032",
    citation=("Shi, Wan, Wang, Wang, Yang, Kreiss and Tang, "
              "\"Meaningless Tokens, Meaningful Gains: How Activation Shifts Enhance LLM Reasoning\", "
              "arXiv 2510.01032"),
    answers={"demo": "figure; prices its answer (no answers are generated at this size)",
             "quick": "answers where the problems are generated at speed (a GPU)",
             "full": "the paper's sizes (a GPU)"},
    default_model="smollm2-135m", full_models=("smollm2-135m", "gemma3-270m"),
    paper_figure=("Math-500 accuracy w/o, w/ Mless, w/ Mful: Qwen2.5-Math-1.5B about 64 / 66 / 66%, "
                  "Qwen2.5-Math-7B about 73 / 76 / 74%, Llama-3.1-8B-Instruct about 44 / 46 / 48%. "
                  "Average attention on head 14: inserted tokens lower the peaks on the original "
                  "tokens."))

__all__ = ["SPEC", "Config", "figure", "report_rows", "run", "verdict"]
__getattr__ = study_exports(__name__)
