"""S2 · Extreme quantization with distillation, XTC (Wu et al., arXiv 2206.01859)."""

from lmlab.lazy import Lazy, lazy_exports
from lmlab.studies.base import StudySpec, register
from lmlab.studies.quantize.config import Config

SPEC = register(StudySpec(name="quantize", title="S2 · Extreme quantization with distillation (XTC)",
                          paper="Wu et al., arXiv 2206.01859",
                          citation=("Wu, Yao, Zhang, Li and He, "
                                    "\"Extreme Compression for Pre-trained Transformers Made Simple and Efficient\" (XTC), "
                                    "arXiv 2206.01859"),
                          config=Config,
                          run=Lazy(f"{__name__}.recipe:run"),
                          figure=Lazy(f"{__name__}.analysis:figure"), verdict=Lazy(f"{__name__}.analysis:verdict"),
                          default_model="minilm-l6",
                          paper_figure=("GLUE (CoLA, MNLI, QNLI, QQP, STS-B, average of 8) at 32 / 2 / 1 bits: teacher "
                                        "average 83.95; Budget-C about 84.0 at 2 bits and 83.44 at 1 bit; Budget-A about "
                                        "83.8 and 82.5."),
                          summary=Lazy(f"{__name__}.analysis:key_rows")))

__all__ = ["SPEC", "Config", "figure", "run", "verdict"]

# the functions load with their submodules on first use (torch and transformers stay out of `lmlab --help`)
__getattr__ = lazy_exports(__name__, {"figure": "analysis", "key_rows": "analysis",
                                     "verdict": "analysis", "run": "recipe"})
