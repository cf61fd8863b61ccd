"""S4 · Sparse attention post-training and circuit size (Draye et al., arXiv 2512.05865)."""

from lmlab.studies.registry import define, study_exports
from lmlab.studies.sparse_circuits.config import Config

SPEC = define(__name__, Config, derives=True, more_figures=True,
    name="sparse-circuits",
    title="S4 · Sparse attention post-training and circuit size",
    paper="Draye et al., arXiv 2512.05865",
    citation=("Draye, Lei, Pan, Posner and Schölkopf, "
              "\"Sparse Attention Post-Training for Mechanistic Interpretability\", "
              "arXiv 2512.05865"),
    answers={"demo": "the addition toy only (claims of ours): figure; prices the model half",
             "quick": "the model half answers on a GPU; on a CPU it is priced",
             "full": "the paper's sizes (a GPU)"},
    default_model="smollm2-135m",
    full_models=("smollm2-135m", "gemma3-270m"),
    paper_figure="Explained effect vs number of heads kept, dense vs sparse model, four tasks. Multipliers "
                 "(dense heads / sparse heads at equal explained effect): Greater-Than 0.6x, IOI 2.0x (GPT-2), "
                 "Docstring 1.3x, IOI-Long 1.6x (OLMo-7B); the sparse models keep about 0.4% of attention edges "
                 "at unchanged loss.")

__all__ = ["SPEC", "Config", "figure", "report_rows", "run", "verdict"]
__getattr__ = study_exports(__name__)
