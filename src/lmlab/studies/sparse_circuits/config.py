"""S4 configuration: every knob with its default, and the quick/full sizes."""

from __future__ import annotations

from pydantic import Field

from lmlab.data.generated.circuits import TASKS
from lmlab.studies.base import StudyConfig

PROFILES = {
    "quick": dict(fine_grid=False, n_prompts=12, sparse_steps=20, sparse_batch=16, n_text=256, n_docstrings=64,
                  n_eval_text=16, eval_tokens=256, toy_steps=600, toy_sparse_steps=300, toy_width=64, verify_heads=16),
    "full": dict(fine_grid=True, n_prompts=64, sparse_steps=2000, sparse_batch=16, n_text=30976, n_docstrings=1024,
                 n_eval_text=64, eval_tokens=0, toy_steps=4000, toy_sparse_steps=3000, toy_width=128, verify_heads=270),
}
MIN_PROMPTS = 64  # the bar for a multiplier verdict with power (12-16 pairs give intervals like [0.5, 3.7])


class Config(StudyConfig):
    tasks: list[str] = Field(default_factory=lambda: list(TASKS), description=f"circuit tasks ({', '.join(TASKS)})")
    n_prompts: int | None = Field(None, description="prompt pairs per task (quick 12, full 64)")
    threshold: float = Field(0.9, description="explained effect the circuit must reach")
    fine_grid: bool | None = Field(None, description="N grid: every N to 8, then +2, then x1.15 (quick: x1.4 steps)")
    verify_heads: int | None = Field(None, description="heads checked by activation patching on the first task")
    mlps: bool = Field(False, description="MLPs as circuit components too (each layer's MLP output is one)")
    sparse_steps: int | None = None
    sparse_batch: int | None = None
    sparse_lr: float = 1e-4
    qk_lr_scale: float = Field(10.0, description="q/k projections train at sparse_lr x this (the gates read only them)")
    slack: float = Field(0.1, description="tau = dense CE + slack (nats)")
    paired_tau: bool = Field(True, description="hold each batch to the dense CE of the same batch + slack "
                                               "(false: one tau, the dense CE over all the text + slack)")
    geco_rate: float | None = Field(None, description="GECO multiplier rate (default: sized to the step budget, "
                                                      "a slack-sized violation held for half of it moves lambda 10x)")
    geco_initial: float = Field(1.0, description="GECO multiplier at step 0")
    n_text: int | None = Field(None, description="sequences the dense model samples for post-training "
                                                 "(with the docstrings: steps x batch, so none is seen twice)")
    n_docstrings: int | None = Field(None, description="stdlib docstrings mixed into the post-training text")
    text_tokens: int = Field(128, description="tokens per post-training sequence (sampled continuation)")
    n_eval_text: int | None = Field(None, description="held-out sampled sequences for sparsity and CE (quick 16)")
    eval_tokens: int | None = Field(None, description="tokens per held-out sequence (quick 256; full 0 = the "
                                                      "model's context length)")
    toy_steps: int | None = None
    toy_sparse_steps: int | None = None
    toy_width: int | None = Field(None, description="toy d_model (quick 64, full 128)")
    toy_slack: float = Field(0.03, description="toy: tau = dense answer CE + this (nats)")
    batch_size: int = 16

    def size(self, name: str):
        value = getattr(self, name)
        return PROFILES[self.profile][name] if value is None else value
