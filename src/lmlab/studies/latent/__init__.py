"""S0 · Latent compression of reasoning chains, Token Assorted (Su et al., arXiv 2502.03275), seed 000."""

from lmlab.studies.base import StudySpec, register
from lmlab.studies.latent.analysis import figure, summary, verdict
from lmlab.studies.latent.config import Config
from lmlab.studies.latent.recipe import final_weights, prepare, run

SPEC = register(StudySpec(
    name="latent",
    title="S0 · Latent compression of reasoning chains (Token Assorted)",
    paper="Su et al., arXiv 2502.03275",
    seed_file="000_255a087192c42e30.txt",
    config=Config, run=run, figure=figure, verdict=verdict, default_model="scratch",
    seed_summary="Llama-3.2-3B, average math accuracy and reasoning-trace tokens vs latent compression rate r: "
                 "tokens fall from about 590 to 480 as r rises, accuracy rises from 27.1 to a peak of 28.1 near "
                 "r = 16 (within about one point of CoT throughout).",
    summary=summary,
    loads_model=False,
))

__all__ = ["SPEC", "Config", "figure", "final_weights", "prepare", "run", "verdict"]
