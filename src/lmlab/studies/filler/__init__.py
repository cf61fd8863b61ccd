"""S3 · Meaningless tokens and the Activation Redistribution Module (Shi et al., arXiv 2510.01032), seed 003."""

from lmlab.studies.base import StudySpec, register
from lmlab.studies.filler.analysis import figure, key_rows, verdict
from lmlab.studies.filler.config import Config
from lmlab.studies.filler.recipe import run

SPEC = register(StudySpec(name="filler", title="S3 · Meaningless tokens and the Activation Redistribution Module",
                          paper="Shi et al., arXiv 2510.01032", seed_file="003_1081a18ae74e4138.txt", config=Config,
                          run=run, figure=figure, verdict=verdict, default_model="smollm2-135m", full_models=("smollm2-135m", "gemma3-270m"),
                          seed_summary=("Math-500 accuracy w/o, w/ Mless, w/ Mful: Qwen2.5-Math-1.5B about 64 / 66 / 66%, "
                                        "Qwen2.5-Math-7B about 73 / 76 / 74%, Llama-3.1-8B-Instruct about 44 / 46 / 48%. "
                                        "Average attention on head 14: inserted tokens lower the peaks on the original "
                                        "tokens."),
                          summary=key_rows))



__all__ = ["SPEC", "Config", "figure", "run", "verdict"]
