"""S4 configuration: every knob with its default and a sentence; the quick/full sizes are in profiles.yaml."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from lmlab.data.generated.circuits import TASKS
from lmlab.studies.config import StudyConfig

MIN_PROMPTS = 64  # the bar for a multiplier verdict with power (12-16 pairs give intervals like [0.5, 3.7])


# The toy's circuit tasks, each clean prompt `<bos> a b + c d = ...` cut before the digit it asks for, and its
# corrupted twin changing one operand digit so that this digit changes (metric: its logit minus the corrupted
# prompt's digit's, at the last position). Measured on a dense toy (4 layers x 64, 600 steps, 97.7% exact match; the
# heads of 16 needed for 0.9 of the effect): "ones" 1, "tens" 5, "carry" 11. A curve that saturates at one head
# cannot show a circuit shrinking: the tens and the carry tasks let the multiplier move.
TOY_TASKS = {
    "ones": "the sum's ones digit g, the first operand's ones digit b changed",
    "tens": "the sum's tens digit f, the second operand's tens digit c changed (no carry changes)",
    "carry": "the sum's tens digit f, the first operand's ones digit b changed so the carry into the tens flips",
}


PLACEBO = ("post-training at the same steps with the edge term's weight at zero: the same gates (sampled in training, "
           "s_ij > 0 at evaluation), GECO loop, text, steps and seeds, on the model and on the addition toy, so the "
           "'sparse' model is the dense one post-trained the same way with nothing pushing its edges down")


class Config(StudyConfig):
    placebo_treatment: ClassVar[str] = PLACEBO
    device_map_refusal = ("the sparse-circuits study post-trains the model unless --sparse-model names an earlier run's "
                          "sparse model, and post-training runs on one device per process (docs/scaling.md)")
    launch_refusal = None  # discovery by task, post-training and the toy data-parallel (lmlab.parallel)
    tasks: list[str] = Field(default_factory=lambda: list(TASKS), description=f"circuit tasks ({', '.join(TASKS)})")
    circuits: bool | None = Field(None, description="run the model's circuit discovery and sparse post-training "
                                                    "(false: the addition toy alone, judged on its own)")
    toy: bool = Field(True, description="with --circuits: also train the addition toy (false: the model's half "
                                        "alone, its sparse models and circuits without the toy's minutes)")
    sparse_model: str | None = Field(None, description="the sparse_model folder of an earlier run on this model: "
                                                       "measure it instead of post-training (the study then "
                                                       "only runs the model, and takes --device-map)")
    n_prompts: int | None = Field(None, ge=1, description="prompt pairs per task")
    threshold: float = Field(0.9, gt=0, le=1, description="explained effect the circuit must reach")
    fine_grid: bool | None = Field(None, description="circuit-size grid: every N to 8, then +2, then x1.15 (false: x1.4 steps)")
    verify_heads: int | None = Field(None, ge=0, description="heads checked by activation patching on the first task")
    rank_draws: int | None = Field(None, ge=0, description="resamples of the prompt pairs for the multiplier's "
                                   "interval, each ranking the heads on its own draw and measuring that circuit "
                                   "again (about a quarter of a curve's forward passes each; 0: the ranking fixed on "
                                   "every pair, and a gate then keeps the study from 'reproduced')")
    mlps: bool = Field(False, description="MLPs as circuit components too (each layer's MLP output is one)")
    sparse_steps: int | None = Field(None, ge=1, description="post-training steps of the sparse-attention model")
    sparse_batch: int | None = Field(None, ge=1, description="sequences per post-training step")
    sparse_lr: float = Field(1e-4, gt=0, description="post-training learning rate")
    qk_lr_scale: float = Field(10.0, description="q/k projections train at sparse_lr x this (the gates read only them)")
    slack: float = Field(0.1, description="tau = dense CE + slack (nats)")
    paired_tau: bool = Field(True, description="hold each batch to the dense CE of the same batch + slack "
                                               "(false: one tau, the dense CE over all the text + slack)")
    geco_rate: float | None = Field(None, description="GECO multiplier rate (default: sized to the step budget, "
                                                      "a slack-sized violation held for half of it moves lambda 10x)")
    geco_initial: float = Field(1.0, description="GECO multiplier at step 0")
    geco_clip: float | None = Field(2.0, description="the largest constraint violation one multiplier update acts on, "
                                                     "in slacks (none: unbounded)")
    n_text: int | None = Field(None, ge=1, description="sequences the dense model samples for post-training "
                                                 "(with the docstrings: steps x batch, so none is seen twice)")
    n_docstrings: int | None = Field(None, ge=0, description="stdlib docstrings mixed into the post-training text")
    text_tokens: int = Field(128, ge=2, description="tokens per post-training sequence (sampled continuation)")
    n_eval_text: int | None = Field(None, ge=1, description="held-out sampled sequences for sparsity and CE")
    eval_tokens: int | None = Field(None, ge=0, description="tokens per held-out sequence (0: the model's context "
                                                      "length)")
    toy_tasks: list[str] = Field(default_factory=lambda: ["tens", "carry"], description="toy: circuit tasks ("
                                 + "; ".join(f"{k}: {v}" for k, v in TOY_TASKS.items()) + ")")
    toy_seeds: int | None = Field(None, ge=1, description="toy: independent replicates (unset: --seeds where given, "
                                                       "else the profile's toy_seeds, else its seeds)")
    toy_steps: int | None = Field(None, ge=1, description="toy: dense training steps")
    toy_sparse_steps: int | None = Field(None, ge=1, description="toy: sparse post-training steps")
    toy_width: int | None = Field(None, ge=8, description="toy: d_model")
    toy_batch: int | None = Field(None, ge=1, description="toy: sequences (of 5 problems) per dense training step")
    toy_sparse_batch: int | None = Field(None, ge=1, description="toy: sequences per sparse post-training step")
    toy_slack: float = Field(0.03, description="toy: tau = dense answer CE + this (nats)")
    toy_lr: float = Field(3e-3, gt=0, description="toy: dense training learning rate (cosine, 5% warm-up)")
    toy_sparse_lr: float | None = Field(None, gt=0, description="toy: sparse post-training peak learning rate")
    toy_sparse_schedule: Literal["constant", "cosine", "linear"] | None = Field(
        None, description="toy: the sparse post-training's learning-rate schedule (cosine: to 0 at the last step)")
    toy_rollback: float | None = Field(None, ge=0, description="toy: a replicate whose constraint's moving average "
                                       "goes this many slacks over its bound returns to its last state within bound "
                                       "(weights and optimizer moments), its multiplier doubled (0: never)")
    toy_rollback_window: int | None = Field(None, ge=0, description="toy, with toy_rollback: a replicate whose CE "
                                            "stayed over its bound on average over this many steps, by more than "
                                            "the constraint gate allows (a tenth of the slack), returns the same way "
                                            "(0: only spikes)")
    toy_rank_draws: int | None = Field(None, ge=0, description="toy: resamples of the prompt pairs for the toy's "
                                       "multiplier, the heads re-ranked on each (as rank_draws)")
    toy_qk_lr_scale: float = Field(1.0, description="toy: q/k projections train at toy_sparse_lr x this (at 10 the "
                                                    "edges collapse within 40 steps and the multiplier then explodes)")
    batch_size: int = Field(16, ge=1, description="prompts or sequences per forward pass")

    def toy_replicate_seeds(self) -> list[int]:
        """The toy's replicate seeds: --toy-seeds, else --seeds, else the profile's toy_seeds, else its seeds;
        replicate r draws the same seed at any count (lmlab.resampling.replicate_seed)."""
        from lmlab.resampling import replicate_seed

        n = self.toy_seeds or self.seeds or self.size("toy_seeds") or self.n_seeds
        return [replicate_seed(self.seed, r) for r in range(int(n))]

    def check_inputs(self, models: bool = True) -> None:
        super().check_inputs(models)
        from lmlab.errors import LmlabError

        bad = [t for t in self.toy_tasks if t not in TOY_TASKS]
        if bad or not self.toy_tasks:
            what = f"unknown toy circuit task '{bad[0]}'" if bad else "--toy-tasks names no task"
            raise LmlabError(f"{what}; known: {', '.join(TOY_TASKS)}")
        for name in self.tasks:
            if name not in TASKS:
                raise LmlabError(f"unknown circuit task '{name}'; registered tasks: {', '.join(TASKS)}")
        if not self.toy and not self.size("circuits"):
            raise LmlabError("--toy false leaves nothing to run without the model's half: add --circuits true")
        if self.sparse_model:
            if self.placebo:
                raise LmlabError("--placebo post-trains the model with the edge term off; --sparse-model measures a "
                                 "model post-trained earlier: give one or the other")
            self.sparse_training()

    def identity(self) -> dict:
        """As every study's, and --toy where it is on (the default), so that a run's folder is the one it had before
        the option existed."""
        settings = super().identity()
        if self.toy:
            settings.pop("toy", None)
        return settings

    def placement_refusal(self) -> str | None:
        """With --sparse-model nothing trains the model, so it may be spread over devices (the toy, a model of
        its own, still trains on one)."""
        return None if self.sparse_model else self.device_map_refusal

    def sparse_training(self) -> dict:
        """What the run that post-trained --sparse-model recorded (its sparse_training.json, beside the folder);
        one sentence when the folder is not an earlier run's sparse model of this config's model."""
        import json
        from pathlib import Path

        from lmlab.errors import LmlabError

        folder = Path(self.sparse_model)
        if not self.size("circuits"):
            raise LmlabError("--sparse-model is measured by the circuit half of the study; add --circuits true")
        extras = folder / "lmlab.json"
        if not extras.is_file() or not json.loads(extras.read_text()).get("sparse_attention"):
            raise LmlabError(f"--sparse-model {folder} is not a sparse-attention model folder (the sparse_model/ "
                             "folder of a sparse-circuits run)")
        record = folder.parent / "sparse_training.json"
        if not record.is_file():
            raise LmlabError(f"--sparse-model {folder} has no sparse_training.json beside it: give a "
                             "post_training/repN/sparse_model folder of a sparse-circuits run")
        # the run folder's manifest: beside the record (an older layout) or two folders up (post_training/repN)
        manifest = next((p / "manifest.json" for p in (folder.parent, folder.parent.parent.parent)
                         if (p / "manifest.json").is_file()), None)
        source = json.loads(manifest.read_text()).get("model") if manifest is not None else None
        if source is not None and source != self.model:
            raise LmlabError(f"--sparse-model {folder} was post-trained from {source}, not {self.model}")
        return json.loads(record.read_text())
