"""S1 · Attention knockout: two pathways to truthfulness (Luo et al., arXiv 2601.07422), seed 001."""

from lmlab.studies.base import StudySpec, register
from lmlab.studies.knockout.analysis import figure, key_rows, verdict
from lmlab.studies.knockout.config import Config
from lmlab.studies.knockout.recipe import run

SPEC = register(StudySpec(name="knockout", title="S1 · Attention knockout: two pathways to truthfulness",
                   paper="Luo et al., arXiv 2601.07422", seed_file="001_d74166a5ea5d8370.txt", config=Config,
                   run=run, figure=figure, verdict=verdict, default_model="smollm2-135m", full_models=("smollm2-135m", "gemma3-270m"),
                   seed_summary=("ΔP vs layer for Llama-3.2-1B and -3B. Q-Anchored lines (PopQA, TriviaQA, HotpotQA, "
                                 "NQ) fall from about 0 at layer 0 to about −50 to −80 pp in middle and late layers; "
                                 "A-Anchored lines stay well above them (about −20 to −60 pp)."),
                   summary=key_rows))



__all__ = ["SPEC", "Config", "figure", "run", "verdict"]
