"""S0 configuration: every knob with its default and a sentence, and the checks that fail before any
training. The quick/full sizes are in profiles.yaml, with two variants: `arithmetic` (the arithmetic
stress test and GSM8K) and `pretrained` (a pretrained model: fewer, smaller steps at a fine-tuning rate)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from lmlab.errors import LmlabError
from lmlab.studies.config import StudyConfig

DATA = ("turtle", "walk", "classes", "arithmetic")
PRETRAINED = {"smollm2-135m"}


class Config(StudyConfig):
    device_map_refusal = ("the latent study fine-tunes the model on one device per process "
                          "(docs/scaling.md)")
    launch_refusal = None  # every model trains data-parallel; codes and generation in shares (recipe.py)
    rates: list[int] | None = Field(None, description="compression rates r (each divides the chunk length)")
    chunk: int = Field(16, ge=1, description="chunk length L (chain tokens per VQ-VAE chunk)")
    codebook: int | None = Field(None, description="codebook size K (the paper uses 1024 for math; the quick "
                                                  "profile 512, which rebuilds a 24-move walk's chunks whole)")
    n_train: int | None = Field(None, ge=1, description="training problems")
    n_test: int | None = Field(None, ge=1, description="test problems")
    steps: int | None = Field(None, ge=1, description="training steps of every variant (CoT, answer-only, each rate), "
                                                     "each from the same initial weights")
    vq_steps: int | None = Field(None, ge=1, description="steps of the VQ-VAE's training")
    d_model: int | None = Field(None, ge=1, description="scratch model: width")
    n_layers: int | None = Field(None, ge=1, description="scratch model: layers")
    batch_size: int | None = Field(None, ge=1, description="sequences per training step")
    lr: float | None = Field(None, gt=0, description="learning rate of the CoT and latent models")
    moves: int | None = Field(None, ge=1, description="turtle and walk: moves per walk (default: 8 for the turtle, "
                                                      "7-9 for the walk)")
    grid: int | None = Field(None, ge=2, le=10, description="turtle and walk: side of the walled square grid "
                                                          "(default: 4 for the turtle, 6 for the walk)")
    plan: bool | None = Field(None, description="turtle: the chain opens with a plan restating the prompt (true, "
                                                "the default) or at the first move (false: the codes then replace "
                                                "moves whose results the rest of the walk needs)")
    max_steps_per_problem: int = Field(4, ge=2, description="arithmetic: reasoning steps per problem (2..this)")
    data: str = Field("turtle", description="turtle (a walk steered by turns, the default), walk (a maze-style "
                                            "grid walk), classes (ProsQA-style class chains), arithmetic (short "
                                            "+/- chains, a stress test), or "
                                          "gsm8k (the hub's GSM8K train split), or gsm8k:PATH (a GSM8K jsonl "
                                          "file or saved dataset folder)")
    max_new: int | None = Field(None, ge=1, description="generated tokens per test problem (default: the longest "
                                                  "training chain + answer, plus 16)")

    trains_own_model = True
    placebo_treatment: ClassVar[str] = (
        "every latent position holds one constant code, in training and in the forced-codes evaluation alike: the "
        "same m and the same number of codes between <boLatent> and <eoLatent> as the study, codes that carry "
        "nothing about the chain they replace")

    def check_inputs(self, models: bool = True) -> None:
        """check_config, and a gsm8k:PATH file read and parsed."""
        super().check_inputs(models)
        check_config(self)
        if self.data.startswith("gsm8k:"):
            from lmlab.data.math import read_gsm8k

            read_gsm8k(self.data.partition(":")[2])

    def variants(self) -> list[str]:
        if self.model in PRETRAINED:
            return ["pretrained"]
        return ["arithmetic"] if self.task in ("arithmetic", "gsm8k") else []

    @property
    def task(self) -> str:
        """turtle, walk, classes, arithmetic or gsm8k ("generated", the name before the walk existed, is arithmetic)."""
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
    if config.size("codebook") < 2:
        raise LmlabError("the codebook needs at least 2 codes")
    if config.model not in ("scratch", *sorted(PRETRAINED)):
        raise LmlabError(f"latent supports --model scratch (a small transformer trained in the run, the default) "
                         f"or {', '.join(sorted(PRETRAINED))}, not '{config.model}'")
    if config.task != "turtle" and config.plan is not None:
        raise LmlabError(f"--plan sets the turtle task's chain, not {config.task}'s")
    if config.task not in ("turtle", "walk") and (config.moves is not None or config.grid is not None):
        raise LmlabError(f"--moves and --grid set the turtle and walk tasks' size, not {config.task}'s")
    if config.task not in (*DATA, "gsm8k"):
        raise LmlabError(f"unknown --data '{config.data}'; use turtle, walk, classes, arithmetic, gsm8k or gsm8k:PATH")
