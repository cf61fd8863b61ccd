"""S2 configuration: every knob with its default, and the quick/full sizes."""

from __future__ import annotations

from pydantic import Field

from lmlab.data.generated.nlu import TASKS
from lmlab.studies.base import StudyConfig

PROFILES = {"quick": dict(n_train=128, n_eval=160, epochs_a=1, teacher_epochs=6, budgets=["A", "C"]),
            "full": dict(n_train=2000, n_eval=1000, epochs_a=3, teacher_epochs=5, budgets=["A", "B", "C"])}
MULTIPLIER = {"A": 1, "B": 3, "C": 6}


class Config(StudyConfig):
    tasks: list[str] = Field(default_factory=lambda: list(TASKS), description="generated tasks, or glue-NAME:DIR")
    bits: list[int] = Field(default_factory=lambda: [2, 1], description="student weight bits")
    budgets: list[str] | None = Field(None, description="A, B, C (quick: A,C; full: A,B,C)")
    n_train: int | None = None
    n_eval: int | None = None
    epochs_a: int | None = Field(None, description="epochs of Budget-A (B = 3x, C = 6x)")
    teacher_epochs: int | None = None
    batch_size: int = 32
    teacher_lr: float = 2e-4
    student_lr: float = 2e-4
    max_length: int = 64
    layer_reduction: bool = Field(False, description="students keep every other teacher layer (1, 3, 5, ...)")
    kd_logit: float = Field(1.0, description="weight of the logit term (KL, or MSE for regression)")
    kd_attention: float = Field(1.0, description="weight of the attention-score MSE")
    kd_hidden: float = Field(1.0, description="weight of the hidden-state MSE")
    n_text: int | None = Field(None, description="decoders: sampled KD training sequences (quick 96)")
    n_eval_text: int | None = Field(None, description="decoders: held-out sampled sequences for perplexity")
    text_tokens: int | None = Field(None, description="decoders: tokens per sampled sequence")
    n_prompts: int | None = Field(None, description="decoders: prompts per circuit task")

    def size(self, name: str):
        value = getattr(self, name)
        return PROFILES[self.profile][name] if value is None else value
