"""S2 · Extreme quantization with distillation, XTC (Wu et al., arXiv 2206.01859).

Recipe (the paper's): the teacher is the full-precision model fine-tuned per task. Each student starts
as a copy of the teacher, is quantized (Q, K, V, attention output, FFN in/out per matrix; word
embeddings per row; 8-bit per-token activations; see interventions/quant.py), and is trained from
step 0 with one-stage KD only (logits KL or MSE + attention-score MSE + hidden-state MSE, weights 1,
no label loss; train/kd.py) on the foundation's training loop. Budgets (our decision): B = 3x
and C = 6x the epochs of A, same schedule shape (linear decay after one warm-up epoch). The warm-up is at most a
third of Budget-A (config.student_warmup): the paper's Budget-A is 3 epochs, one of them warm-up, and a 1-epoch
Budget-A that warmed up for its whole epoch would end at its peak rate, never decaying. Students are
stored packed (interventions/quant.save_packed) and the size on disk is measured.

Beside the students, one cell per width takes no KD step: `undistilled`, the teacher quantized and scored as it
is (ours, not the paper's; scoring only, so it costs one pass over the test set a task and width; with no training
it is the same student in every replicate, scored once and recorded per replicate; not packed: packed/ holds the
method's students, which `lmlab compare` and `lmlab export` read). It is the harm the closeness
claims are measured against: where quantization alone already stays within 2 points of the teacher, a distilled
student's "close" says nothing of the method, and the analysis says so (analysis.py).

What the verdict's convergence gates read (analysis.py): the teacher's dev score at each epoch's end, and each
student's at the start of its last quarter and at its end (measure.DevCurve, at most 1000 dev examples); the KD
loss's last two quarters only where a run has no dev curve. Under the linear decay to 0 the KD loss keeps falling
as the rate falls, whether or not the student still gets better at its task, so it cannot say whether a student
still learns.

DECISIONS for CPU minutes (fewer cells, more steps each): the quick profile runs one task with headroom
(fact-mnli; fact-qnli's teacher sits at a ceiling of 99.8) with a pool of 2000 generated inputs (our stand-in for
XTC's TinyBERT data augmentation; the teacher fine-tunes on it until its dev score stops rising, config.
teacher_patience, at most teacher_epochs), 3000 test examples, 4 replicates, Budget-A = 3 epochs = 186 KD
steps and Budget-C = 18 epochs = 1116 (the paper's epochs; at 6 the 2-bit students still rose 2 points over their
last quarter), at lr 1e-3 (budget compensation; the paper's 2e-5..5e-5 is for many more steps; at 2e-4 the
1-bit Budget-A students stayed at fact-qnli's majority class, at 1e-3 every student of every cell learned there).
The full profile (GPU) runs all five tasks on 4000 inputs each, 3 epochs for A, lr 5e-5 with weight decay
0.01, and keeps each student's best dev checkpoint (scored every epoch), as DeepSpeed's XTC example does.
A task whose teacher scores below 50 (analysis.MIN_TEACHER; fact-stsb: Pearson 0.17 at 192 examples) is left
out of the average, and the verdict names it. Every student cell runs once per replicate (`--seeds`, each its own
seed: dropout masks and batch order; the teacher and its cached outputs are one per task), and each claim's
interval covers the replicates and the test examples (lmlab.claims). Under a launch (`torchrun -m lmlab quantize`, docs/scaling.md) every process trains the teacher and each
student together, data-parallel (each a slice of every KD batch; lmlab.train), each scores its share of the test set, and
rank 0 alone packs and records each unit. `--layer-reduction true` makes every student keep teacher layers 1, 3, 5, ... (the last one always),
with student block j distilled from teacher block 2j + 1 (DECISION: the paper keeps "every other layer"
without saying which).

The placebo (`--placebo`, `config.placebo`): the same run (tasks, data, teacher, sizes, seeds, replicates) with the
treatment replaced so that none of the paper's claims can hold by construction, in one run:
- every budget's students train exactly as Budget-A (Budget-A's epochs, warm-up and schedule); Budget-A's keep the
  replicate seeds (they are the study's own Budget-A students), Budget-B's and C's take seeds past the run's own
  (config.placebo_seed), so C is another draw of A: "Budget-C - Budget-A" has no effect to find;
- the 1-bit cells are quantized at the 2-bit width (ternary), trained as the 2-bit cells are: "2-bit - 1-bit" has
  none either;
- the claims that the method does no harm ("teacher - 2-bit / 1-bit within 2 points") read the undistilled cells
  instead of the distilled ones: the harm itself, which must not come out "close". The 1-bit claim reads a ternary
  undistilled student too, like every 1-bit cell of the placebo: the harder test of the two, as a binary student
  keeps less of its teacher than a ternary one.
The teacher fine-tunes as usual. The recipe records measurements only (the cells, their widths, seeds and steps);
which claim reads which cell is the analysis's (analysis.py's docstring).
"""

from __future__ import annotations

import copy
import json
import random
import shutil
from pathlib import Path

import pandas as pd

from lmlab import parallel
from lmlab.data.formats import GLUE, read_glue
from lmlab.data.generated.nlu import NLUTask, generate_task
from lmlab.errors import LmlabError
from lmlab.files import atomic_write
from lmlab.interventions.quant import check_bits
from lmlab.models import LoadedModel, classifier_from
from lmlab.runs import RunDir
from lmlab.studies.quantize.config import (MULTIPLIER, TEACHER_MARGIN, TEACHER_PLATEAU, UNDISTILLED, Config,
                                           placebo_seed)
from lmlab.studies.quantize.decoder.run import run_decoder
from lmlab.studies.quantize.measure import (TEACHER_FIT, DevCurve, collate_for, loss_quarters, majority_score,
                                            run_unit, seed_unit, steps_per_epoch, teacher_cache, train_config)
from lmlab.train import train


def load_task(name: str, config: Config) -> NLUTask:
    if name.startswith("glue-"):
        glue, _, folder = name[5:].partition(":")
        if glue not in GLUE:
            raise LmlabError(f"use glue-NAME (from the hub) or glue-NAME:DIR with NAME one of {', '.join(GLUE)}")
        metric, labels = GLUE[glue][0], GLUE[glue][1]
        from lmlab.data.formats import glue_splits
        from lmlab.data.hubdata import is_saved_dataset

        if not folder or is_saved_dataset(Path(folder).expanduser()):
            train_rows, dev_rows = glue_splits(glue, Path(folder).expanduser() if folder else None)
        else:  # the tsv files as distributed
            train_rows = read_glue(glue, f"{folder}/train.tsv")
            dev_rows = read_glue(glue, f"{folder}/dev.tsv" if glue != "mnli" else f"{folder}/dev_matched.tsv")
        random.Random(config.seed).shuffle(train_rows)
        half = len(dev_rows) // 2  # GLUE test labels are hidden: dev is split into our dev and test
        return NLUTask(name, metric, labels, tuple(train_rows[: config.size("n_train")]), tuple(dev_rows[:half]),
                       tuple(dev_rows[half:]))
    return generate_task(name, config.size("n_train"), config.size("n_eval"), config.seed)


def _teacher(config: Config, run_dir: RunDir, task: NLUTask, lm: LoadedModel | None, collate):
    """The task's teacher, fine-tuned (or read back from `teachers/<task>`) and frozen, with what the verdict's
    "teachers learned and converged" gate reads of its fine-tuning: its dev score at the last epoch and its rise
    over the best epoch before, the epochs it took and whether the patience rule ended it (config.teacher_patience;
    else it met its cap, teacher_epochs), and its loss over the last two quarters of its steps."""
    teacher_dir = run_dir.path / "teachers" / task.name
    teacher = (classifier_from(lm, task.num_labels, config.seed) if lm is not None else
               config.load(train=True, head="classifier", num_labels=task.num_labels, seed=config.seed).model)
    if (teacher_dir / "model.safetensors").exists():
        teacher = type(teacher).from_pretrained(teacher_dir)
    else:
        seed_unit(config.seed, task.name, "teacher")
        work = run_dir.path / "work" / f"teacher-{task.name}"
        curve = DevCurve(teacher, collate, task, steps_per_epoch(config, len(task.train)),
                         patience=config.teacher_patience, min_rise=TEACHER_PLATEAU,
                         learned_above=majority_score(task) + TEACHER_MARGIN,
                         precision=config.train_settings()["mixed_precision"])
        trained = train(teacher, task.train, collate, lambda m, b: m(**b).loss,
                        train_config(config, config.size("teacher_epochs"), len(task.train), config.teacher_lr,
                                     f"teacher {task.name}"), work, on_step=curve, state=curve)
        if parallel.is_main():  # (every process holds the same weights after data-parallel training)
            teacher.save_pretrained(teacher_dir, safe_serialization=True)
            atomic_write(teacher_dir / TEACHER_FIT, json.dumps({**loss_quarters(trained.losses), **curve.reading()}))
            shutil.rmtree(work, ignore_errors=True)
    fit = teacher_dir / TEACHER_FIT
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher, (json.loads(fit.read_text()) if fit.is_file() else {})


def _budgets(config: Config) -> list[str]:
    """The student cells' budgets: the profile's, then the undistilled students' (no KD step; scoring only)."""
    return list(config.size("budgets")) + [UNDISTILLED]


def _seed(config: Config, budget: str | None, replicate: int | None) -> int | None:
    """A unit's seed: the replicate's (None: the teacher, which is one per task); in the placebo, a Budget-B or C
    student, trained as Budget-A, takes another seed (config.placebo_seed)."""
    if replicate is None:
        return None
    if config.placebo and budget in ("B", "C"):
        return placebo_seed(config.seed, budget, replicate, config.n_seeds)
    return config.replicate_seeds()[replicate]


def _task_units(config: Config, run_dir: RunDir, task, lm: LoadedModel | None, tokenizer, done: dict) -> list[dict]:
    """One task's teacher and students, each unit trained and scored unless recorded (`done`, updated), its rows.
    The teacher is one per task (the claim is student vs its teacher); every student cell runs once per replicate,
    each from its own seed (dropout masks, batch order)."""
    collate = collate_for(tokenizer, task, config.max_length)
    teacher, teacher_info = _teacher(config, run_dir, task, lm, collate)
    cache = None
    units = [("teacher", 32, None, None)] + [(f"{bits}bit-{b}-rep{r}", bits, b, r) for bits in config.size("bits")
                                              for b in _budgets(config) for r in range(config.n_seeds)]
    rows: list[dict] = []
    for key, bits, budget, replicate in units:
        unit_key = f"{task.name}|{key}"
        if unit_key not in done:
            if budget == UNDISTILLED and replicate:  # no training: every replicate is replicate 0's student
                first = done[f"{task.name}|{bits}bit-{UNDISTILLED}-rep0"]
                done[unit_key] = [{**row, "replicate": replicate, **({"seed": _seed(config, budget, replicate)}
                                                                     if row["kind"] == "score" else {})}
                                  for row in first]
            else:
                if bits != 32 and cache is None and budget != UNDISTILLED:  # once per task, for all its students
                    cache = teacher_cache(config, task, teacher, collate)
                done[unit_key] = run_unit(config, run_dir, task, teacher, collate, bits, budget, key, cache,
                                          replicate=replicate, seed=_seed(config, budget, replicate),
                                          tokenizer=tokenizer, teacher_info=teacher_info)
            if parallel.is_main():  # the others trained and scored with it; rank 0 records
                run_dir.record("results", unit_key, done[unit_key])
        rows += done[unit_key]
    return rows


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    for b in config.size("bits"):
        check_bits(b)
    budgets = config.size("budgets")
    bad = [b for b in budgets if b not in MULTIPLIER]
    if bad:
        raise LmlabError(f"unknown budget '{bad[0]}'; use A, B or C")
    # a model passed in is copied wherever the recipe changes it (the teacher is cast and frozen)
    probe = copy.deepcopy(lm) if lm is not None else config.load(train=True)
    if probe.layout.causal:  # the decoder option: KD on self-sampled text, perplexity and circuit-task accuracy
        return run_decoder(config, run_dir, probe)
    del probe
    tasks = [load_task(name, config) for name in config.size("tasks")]
    base = lm or config.load(train=True, head="classifier", num_labels=2)
    rows: list[dict] = []
    done = run_dir.done("results")
    parallel.sync()  # every process has read the same units as done before any records one
    for task in tasks:
        rows += _task_units(config, run_dir, task, lm, base.tokenizer, done)
    parallel.main_only()
    run_dir.describe(model=base.name, tasks=",".join(t.name for t in tasks), n_train=config.size("n_train"),
                     n_eval=config.size("n_eval"), epochs_a=config.size("epochs_a"), seeds=config.n_seeds,
                     bits=",".join(map(str, config.size("bits"))), budgets=",".join(_budgets(config)),
                     steps_per_epoch=steps_per_epoch(config, config.size("n_train")))
    return pd.DataFrame(rows)
