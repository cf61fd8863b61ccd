"""S3 · Meaningless tokens and the Activation Redistribution Module (Shi et al., arXiv 2510.01032)."""

from lmlab.lazy import Lazy, lazy_exports
from lmlab.studies.base import StudySpec, register
from lmlab.studies.filler.config import Config

SPEC = register(StudySpec(name="filler", title="S3 · Meaningless tokens and the Activation Redistribution Module",
                          paper="Shi et al., arXiv 2510.01032",
                          citation=("Shi, Wan, Wang, Wang, Yang, Kreiss and Tang, "
                                    "\"Meaningless Tokens, Meaningful Gains: How Activation Shifts Enhance LLM Reasoning\", "
                                    "arXiv 2510.01032"),
                          config=Config,
                          run=Lazy(f"{__name__}.recipe:run"),
                          figure=Lazy(f"{__name__}.analysis:figure"), verdict=Lazy(f"{__name__}.analysis:verdict"),
                          default_model="smollm2-135m", full_models=("smollm2-135m", "gemma3-270m"),
                          paper_figure=("Math-500 accuracy w/o, w/ Mless, w/ Mful: Qwen2.5-Math-1.5B about 64 / 66 / 66%, "
                                        "Qwen2.5-Math-7B about 73 / 76 / 74%, Llama-3.1-8B-Instruct about 44 / 46 / 48%. "
                                        "Average attention on head 14: inserted tokens lower the peaks on the original "
                                        "tokens."),
                          summary=Lazy(f"{__name__}.analysis:key_rows")))

__all__ = ["SPEC", "Config", "figure", "run", "verdict"]

# the functions load with their submodules on first use (torch and transformers stay out of `lmlab --help`)
__getattr__ = lazy_exports(__name__, {"figure": "analysis", "key_rows": "analysis",
                                     "verdict": "analysis", "run": "recipe"})
