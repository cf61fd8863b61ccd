"""S4 configuration: every knob with its default, and the quick/full sizes."""

from __future__ import annotations

from pydantic import Field

from lmlab.data.generated.circuits import TASKS
from lmlab.studies.base import StudyConfig

PROFILES = {
    "quick": dict(fine_grid=False, n_prompts=12, sparse_steps=40, sparse_batch=4, n_text=64, n_docstrings=64, toy_steps=500,
                  toy_sparse_steps=150, verify_heads=16),
    "full": dict(fine_grid=True, n_prompts=64, sparse_steps=2000, sparse_batch=16, n_text=4096, n_docstrings=1024, toy_steps=4000,
                 toy_sparse_steps=3000, verify_heads=270),
}


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
    slack: float = Field(0.1, description="tau = dense CE + slack (nats)")
    geco_rate: float = Field(0.2, description="GECO multiplier update rate")
    geco_initial: float = Field(0.01, description="GECO multiplier at step 0 (small: the edge term leads first)")
    n_text: int | None = Field(None, description="sequences the dense model samples for post-training")
    n_docstrings: int | None = Field(None, description="stdlib docstrings mixed into the post-training text")
    text_tokens: int = 48
    toy_steps: int | None = None
    toy_sparse_steps: int | None = None
    batch_size: int = 16

    def size(self, name: str):
        value = getattr(self, name)
        return PROFILES[self.profile][name] if value is None else value
