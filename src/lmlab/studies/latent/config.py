"""S0 configuration: every knob with its default, the quick/full sizes (scratch and pretrained), and the
checks that fail before any training."""

from __future__ import annotations

from pydantic import Field

from lmlab.errors import LmlabError
from lmlab.studies.base import StudyConfig

PROFILES = {
    "quick": dict(rates=[4, 16], n_train=3000, n_test=500, base_steps=700, finetune_steps=150, vq_steps=1000,
                  d_model=64, n_layers=3, batch_size=32, lr=3e-3),
    "full": dict(rates=[2, 4, 8, 16], n_train=20000, n_test=2000, base_steps=6000, finetune_steps=2000,
                 vq_steps=3000, d_model=256, n_layers=6, batch_size=64, lr=2e-3),
}
# the arithmetic stress test and GSM8K keep the sizes they were measured with
ARITHMETIC_PROFILES = {
    "quick": dict(n_test=100, base_steps=1200, finetune_steps=300, vq_steps=500, d_model=128, lr=2e-3),
    "full": dict(n_test=1000),
}
DATA = ("walk", "classes", "arithmetic")
# the pretrained option: fewer, smaller steps at a fine-tuning learning rate (d_model / n_layers unused)
PRETRAINED_PROFILES = {
    "quick": dict(rates=[4, 16], n_train=3000, n_test=60, base_steps=60, finetune_steps=25, vq_steps=1200,
                  batch_size=8, lr=3e-4),
    "full": dict(rates=[2, 4, 8, 16], n_train=20000, n_test=1000, base_steps=2000, finetune_steps=600,
                 vq_steps=3000, batch_size=32, lr=1e-4),
}
PRETRAINED = {"smollm2-135m"}


class Config(StudyConfig):
    rates: list[int] | None = Field(None, description="compression rates r (quick: 4,16; full: 2,4,8,16)")
    chunk: int = Field(16, ge=1, description="chunk length L (chain tokens per VQ-VAE chunk)")
    codebook: int = Field(64, description="codebook size K (the paper uses 1024 for math; 64 holds a walk's "
                                           "position)")
    n_train: int | None = Field(None, ge=1)
    n_test: int | None = Field(None, ge=1)
    base_steps: int | None = Field(None, ge=1)
    finetune_steps: int | None = Field(None, ge=1)
    vq_steps: int | None = Field(None, ge=1)
    d_model: int | None = Field(None, ge=1)
    n_layers: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)
    lr: float | None = Field(None, description="learning rate (scratch 3e-3 quick, 2e-3 full and arithmetic; "
                                               "smollm2-135m 3e-4 quick, 1e-4 full)")
    max_steps_per_problem: int = Field(4, description="arithmetic: reasoning steps per problem (2..this)")
    data: str = Field("walk", description="walk (a maze-style grid walk, the default), classes (ProsQA-style class "
                                          "chains), arithmetic (short +/- chains, a stress test), or "
                                          "gsm8k (the hub's GSM8K train split), or gsm8k:PATH (a GSM8K jsonl "
                                          "file or saved dataset folder)")
    max_new: int | None = Field(None, description="generated tokens per test problem (default: the longest "
                                                  "training chain + answer, plus 16)")

    def size(self, name: str):
        value = getattr(self, name)
        if value is not None:
            return value
        if self.model in PRETRAINED:
            table = PRETRAINED_PROFILES[self.profile]
        elif self.task in ("arithmetic", "gsm8k"):
            table = ARITHMETIC_PROFILES[self.profile]
        else:
            table = {}
        return table.get(name, PROFILES[self.profile].get(name))

    @property
    def task(self) -> str:
        """walk, classes, arithmetic or gsm8k ("generated", the name before the walk existed, is arithmetic)."""
        if self.data == "gsm8k" or self.data.startswith("gsm8k:"):
            return "gsm8k"
        return "arithmetic" if self.data == "generated" else self.data


def check_config(config: Config) -> None:
    """Every bad setting fails here, before any training."""
    rates = config.size("rates")
    bad = [r for r in rates if r < 1 or config.chunk % r]
    if bad:
        raise LmlabError(f"rate {bad[0]} does not divide the chunk length {config.chunk}")
    if not rates:
        raise LmlabError("give at least one compression rate")
    if config.codebook < 2:
        raise LmlabError("the codebook needs at least 2 codes")
    if config.model not in ("scratch", *sorted(PRETRAINED)):
        raise LmlabError(f"latent supports --model scratch (a small transformer trained in the run, the default) "
                         f"or {', '.join(sorted(PRETRAINED))}, not '{config.model}'")
    if config.task not in (*DATA, "gsm8k"):
        raise LmlabError(f"unknown --data '{config.data}'; use walk, classes, arithmetic, gsm8k or gsm8k:PATH")
