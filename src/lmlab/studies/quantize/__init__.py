"""S2 · Extreme quantization with distillation, XTC (Wu et al., arXiv 2206.01859)."""

from lmlab.studies.registry import define, study_exports
from lmlab.studies.quantize.config import Config

SPEC = define(__name__, Config,
    name="quantize",
    title="S2 · Extreme quantization with distillation (XTC)",
    paper="Wu et al., arXiv 2206.01859",
    citation=("Wu, Yao, Zhang, Li and He, "
              "\"Extreme Compression for Pre-trained Transformers Made Simple and Efficient\" (XTC), "
              "arXiv 2206.01859"),
    answers={"demo": "figure; prices its answer (2-bit students only: 1-bit and Budget-A run at quick)",
             "quick": "every paper claim run (an hour or more a seed on a CPU)",
             "full": "the paper's sizes (a GPU)"},
    default_model="minilm-l6",
    paper_figure=("GLUE (CoLA, MNLI, QNLI, QQP, STS-B, average of 8) at 32 / 2 / 1 bits: teacher "
                  "average 83.95; Budget-C about 84.0 at 2 bits and 83.44 at 1 bit; Budget-A about "
                  "83.8 and 82.5."))

__all__ = ["SPEC", "Config", "figure", "report_rows", "run", "verdict"]
__getattr__ = study_exports(__name__)
