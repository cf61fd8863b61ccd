"""S2 configuration: every knob with its default and a sentence; the quick/full sizes (and the decoder
option's) are in profiles.yaml, with the quick learning-rate DECISION."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from lmlab.studies.config import StudyConfig

MULTIPLIER = {"A": 1, "B": 3, "C": 6}
BITS = (1, 2, 4, 8, 32)  # interventions.quant.BITS, said here without torch (a test keeps the two equal)
UNDISTILLED = "undistilled"  # students quantized from the teacher and never distilled (zero KD steps)
PLACEBO = ("Budget-C trained exactly as Budget-A from another seed, the 1-bit students at the 2-bit width (ternary), "
           "and, for the claims that students stay close to the teacher, students quantized from it with zero KD "
           "steps (never distilled) in place of the distilled ones")


def claims_budget(budgets) -> str | None:
    """The budget the verdict's claims read students at, and whose convergence its gate reads: C where it ran, else
    the longest that did (None: no student)."""
    return max(budgets, key=lambda b: MULTIPLIER.get(b, 0), default=None)  # C is the longest


def student_arm(bits: int, budget: str, placebo: bool) -> tuple[int, int]:
    """(the bits its weights are quantized to, its KD epochs in Budget-A's) of the student in cell (bits, budget).
    The study's own: (bits, the budget's MULTIPLIER), and the UNDISTILLED cell (the teacher quantized, the reference
    the closeness claims are measured against) at zero epochs. The placebo's (`Config.placebo`): every budget
    trained as Budget-A (1), and the 1-bit cells at the 2-bit width (ternary)."""
    epochs = 0 if budget == UNDISTILLED else 1 if placebo else MULTIPLIER[budget]
    return (2 if placebo and bits == 1 else bits), epochs


def placebo_seed(seed: int, budget: str, replicate: int, n_seeds: int) -> int:
    """The placebo's seed for a Budget-B or Budget-C student, trained as Budget-A: a replicate seed past the run's own
    ones (B: replicates n..2n-1, C: 2n..3n-1 of `seed`), so that the cell is another independent draw of Budget-A's
    training, not Budget-A's students again."""
    from lmlab.resampling import replicate_seed

    return replicate_seed(seed, n_seeds * (1 + "BC".index(budget)) + replicate)


def student_warmup(per_epoch: int, epochs_a: int) -> int:
    """A student's warm-up steps, the same for every budget: one epoch, as DeepSpeed's XTC example warms up its
    18-epoch (Budget-C) runs, which makes the paper's Budget-A (C / 6 = 3 epochs) one third warm-up; at most that
    third of Budget-A here, so that a shorter Budget-A (1 epoch in the demo and quick profiles) still decays after
    its warm-up instead of ending at its peak rate having warmed up all along."""
    return max(1, min(per_epoch, -(-epochs_a * per_epoch // 3)))


TEACHER_PLATEAU = 1.0  # a teacher whose dev score still rose by this many points over its last epoch is still learning
TEACHER_MARGIN = 10.0  # a teacher must clear the majority class by more: every student is measured against it


class Config(StudyConfig):
    device_map_refusal = ("the quantize study trains a teacher and quantized students (KD) on one device per "
                          "process (docs/scaling.md)")
    launch_refusal = None  # teacher and students train data-parallel; the test set scored in shares (lmlab.parallel)
    placebo_treatment: ClassVar[str] = PLACEBO
    tasks: list[str] | None = Field(None, description="generated tasks (fact-cola, fact-mrpc, fact-mnli, fact-stsb, "
                                                      "fact-qnli), glue-NAME from the hub, or glue-NAME:DIR (the tsv "
                                                      "files or a saved DatasetDict)")
    bits: list[int] | None = Field(None, description="student weight bits")
    budgets: list[str] | None = Field(None, description="KD budgets: A (epochs_a), B (3x), C (6x)")
    n_train: int | None = Field(None, ge=1, description="generated: the task's training pool (teacher data, KD "
                                                        "inputs)")
    n_eval: int | None = Field(None, ge=1, description="generated: dev and test examples each")
    epochs_a: int | None = Field(None, ge=1, description="epochs of Budget-A (B = 3x, C = 6x)")
    teacher_epochs: int | None = Field(None, ge=1, description="the most epochs the full-precision teacher fine-tunes "
                                                               "(its cap; the patience rule may end it sooner)")
    teacher_patience: int = Field(1, ge=0, description="the teacher's fine-tuning ends once its dev score has risen "
                                                       "less than TEACHER_PLATEAU points over its best at this many "
                                                       "epochs' ends in a row (0: it trains every teacher epoch)")
    batch_size: int | None = Field(None, ge=1, description="examples per training step")
    teacher_lr: float = Field(2e-4, gt=0, description="teacher fine-tuning learning rate")
    student_lr: float | None = Field(None, gt=0, description="KD learning rate (quick: a DECISION; full: the paper's)")
    weight_decay: float | None = Field(None, ge=0, description="students' weight decay")
    best_dev: bool | None = Field(None, description="keep the student's best dev checkpoint, scored each epoch")
    max_length: int = Field(64, ge=8, description="tokens per encoder input (longer inputs are cut)")
    teacher_cache: bool = Field(True, description="compute the teacher's KD outputs once per task and reuse them "
                                                  "(false: recompute them every step; the same loss)")
    layer_reduction: bool = Field(False, description="students keep every other teacher layer (1, 3, 5, ...)")
    kd_logit: float = Field(1.0, ge=0, description="weight of the logit term (KL, or MSE for regression)")
    kd_attention: float = Field(1.0, ge=0, description="weight of the attention-score MSE")
    kd_hidden: float = Field(1.0, ge=0, description="weight of the hidden-state MSE")
    act_grid: Literal["int8"] = Field("int8", description="the 8-bit activation grid: int8 (-128..127, scale amax/127.5, "
                                                          "as compressed-tensors and vLLM compute it; a run folder "
                                                          "from before this field is not resumed)")
    export: Literal["compressed-tensors"] | None = Field(None, description="also write each student in this format "
                                                                      "beside its packed file (export/FORMAT/NAME; "
                                                                      "pip install 'lmlab[export]')")
    n_text: int | None = Field(None, ge=1, description="decoders: sampled KD training sequences")
    n_eval_text: int | None = Field(None, ge=1, description="decoders: held-out sampled sequences for perplexity")
    text_tokens: int | None = Field(None, ge=1, description="decoders: tokens per sampled sequence")
    n_prompts: int | None = Field(None, ge=1, description="decoders: prompts per circuit task")

    def check_inputs(self, models: bool = True) -> None:
        """Bits, budgets and task names, and a glue-NAME:DIR folder's files read and parsed."""
        super().check_inputs(models)
        from pathlib import Path

        from lmlab.data.formats import GLUE, read_glue
        from lmlab.data.generated.nlu import TASKS
        from lmlab.data.hubdata import is_saved_dataset
        from lmlab.errors import LmlabError

        for bits in self.size("bits"):
            check_bits(bits)
        if self.export is not None:
            import importlib.util

            from lmlab.extras import EXPORT

            if importlib.util.find_spec("compressed_tensors") is None:
                raise LmlabError(EXPORT)
        bad = [b for b in self.size("budgets") if b not in MULTIPLIER]
        if bad:
            raise LmlabError(f"unknown budget '{bad[0]}'; use A, B or C")
        for name in self.size("tasks"):
            if name in TASKS:  # its countries give enough distinct dev and test examples (a sentence if not)
                if self.size("n_eval"):
                    from lmlab.data.generated.nlu import generate_task

                    generate_task(name, 1, self.size("n_eval"), self.seed)
                continue
            if not name.startswith("glue-"):
                raise LmlabError(f"unknown task '{name}'; generated: {', '.join(TASKS)}; or glue-NAME (the hub) or "
                                 f"glue-NAME:DIR")
            glue, _, folder = name[5:].partition(":")
            if glue not in GLUE:
                raise LmlabError(f"use glue-NAME (from the hub) or glue-NAME:DIR with NAME one of {', '.join(GLUE)}")
            if folder and not is_saved_dataset(Path(folder).expanduser()):
                read_glue(glue, f"{folder}/train.tsv")
                read_glue(glue, f"{folder}/dev.tsv" if glue != "mnli" else f"{folder}/dev_matched.tsv")


def check_bits(bits: int) -> int:
    from lmlab.errors import LmlabError

    if bits not in BITS:
        raise LmlabError(f"{bits}-bit weights are not supported; use one of {', '.join(map(str, BITS))}")
    return bits
