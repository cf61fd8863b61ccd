"""S2 configuration: every knob with its default, and the quick/full sizes."""

from __future__ import annotations

from pydantic import Field

from lmlab.data.generated.nlu import TASKS
from lmlab.studies.base import StudyConfig

# quick (issue 18): fewer cells with more steps each. Two tasks, a KD pool of 2000 generated inputs per task
# (1 epoch = 62 steps: Budget-A 62 KD steps, Budget-C 372), 1000 test examples; lr 2e-4 is a DECISION
# (budget compensation: the paper's 2e-5..5e-5 is for ~18 epochs). full: the five tasks, the paper's
# learning rate and weight decay, and the best dev checkpoint kept (DeepSpeed's XTC example does so).
PROFILES = {"quick": dict(tasks=["fact-mnli", "fact-qnli"], n_train=2000, n_eval=1000, epochs_a=1, teacher_epochs=2,
                          budgets=["A", "C"], student_lr=2e-4, weight_decay=0.0, best_dev=False),
            "full": dict(tasks=list(TASKS), n_train=4000, n_eval=1000, epochs_a=3, teacher_epochs=5,
                         budgets=["A", "B", "C"], student_lr=5e-5, weight_decay=0.01, best_dev=True)}
MULTIPLIER = {"A": 1, "B": 3, "C": 6}


class Config(StudyConfig):
    tasks: list[str] | None = Field(None, description="generated tasks, or glue-NAME:DIR (quick: fact-mnli, "
                                                      "fact-qnli; full: all five)")
    bits: list[int] = Field(default_factory=lambda: [2, 1], description="student weight bits")
    budgets: list[str] | None = Field(None, description="A, B, C (quick: A,C; full: A,B,C)")
    n_train: int | None = Field(None, description="generated: the task's training pool (teacher data, KD inputs)")
    n_eval: int | None = Field(None, description="generated: dev and test examples each")
    epochs_a: int | None = Field(None, description="epochs of Budget-A (B = 3x, C = 6x)")
    teacher_epochs: int | None = None
    batch_size: int = 32
    teacher_lr: float = 2e-4
    student_lr: float | None = Field(None, description="KD learning rate (quick 2e-4, a DECISION; full 5e-5)")
    weight_decay: float | None = Field(None, description="students' weight decay (quick 0, full 0.01)")
    best_dev: bool | None = Field(None, description="keep the student's best dev checkpoint, scored each epoch "
                                                    "(quick no, full yes)")
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
