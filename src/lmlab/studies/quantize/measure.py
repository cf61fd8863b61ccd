"""S2 measurements: batches, predictions, and one unit of the grid (the teacher's score, or one quantized
student trained with one-stage KD and scored)."""

from __future__ import annotations

import copy
import shutil
import zlib
from collections.abc import Iterable

import numpy as np
import torch
from torch.nn.utils import parametrize

from lmlab import parallel
from lmlab.data.generated.nlu import NLUTask
from lmlab.evaluation import majority_score as majority_of, metric_value
from lmlab.interventions.export import export_compressed
from lmlab.interventions.quant import keep_layers, quantize_model, save_packed
from lmlab.models.batch import module_device
from lmlab.models.layout import layout_of
from lmlab.runs import packed_student
from lmlab.studies.quantize.config import Config, claims_budget, student_arm, student_warmup
from lmlab.train import TrainConfig, train
from lmlab.train.kd import Indexed, TeacherCache, indexed_collate, kd_loss
from lmlab.train.precision import scoring_precision


def collate_for(tokenizer, task: NLUTask, max_length: int, pad_to_max: bool = False):
    """Batches padded to their longest row (what the study uses), or to `max_length` (the benchmark's baseline)."""
    def collate(examples):
        a = [e.text_a for e in examples]
        b = [e.text_b for e in examples] if examples[0].text_b is not None else None
        with torch.device("cpu"):  # tokenized on the host; the loop and `predict` move batches to the model
            enc = tokenizer(a, b, padding="max_length" if pad_to_max else True, truncation=True,
                            max_length=max_length, return_tensors="pt")
        dtype = torch.float if task.num_labels == 1 else torch.long
        enc["labels"] = torch.tensor([e.label for e in examples], dtype=dtype, device="cpu")
        return dict(enc)
    return collate


@torch.no_grad()
def predict(model, collate, examples, batch_size: int = 64) -> np.ndarray:
    """Predictions in the examples' order. The batches are formed in order of text length, so that each is
    padded little (a row's prediction does not depend on its batch: padding is masked)."""
    model.eval()
    device = module_device(model)
    examples = list(examples)
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].text_a) + len(examples[i].text_b or ""))
    out = []
    for start in range(0, len(order), batch_size):
        batch = collate([examples[i] for i in order[start:start + batch_size]])
        batch.pop("labels")
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(**batch).logits
        out.append(logits[:, 0] if logits.shape[-1] == 1 else logits.argmax(-1))
    preds = np.empty(len(examples), dtype=np.float32)
    preds[order] = torch.cat(out).float().cpu().numpy() if out else []
    return preds


def predict_shared(model, collate, examples, precision: str = "no") -> np.ndarray:
    """`predict` over the examples, in the `precision` the model trained in (`TrainConfig.mixed_precision`); under a
    launch each process predicts its share (every process holds the same weights, and a row's prediction is its
    own) and every process gets all of them back, in order."""
    examples = list(examples)
    with scoring_precision(module_device(model), precision):
        return np.array(parallel.share_out(len(examples), lambda idx: predict(
            model, collate, [examples[i] for i in idx]).tolist()), dtype=np.float32)


def seed_unit(seed: int, task: str, unit: str) -> None:
    """Each unit draws its own random numbers (dropout, data order), so a resumed run matches a whole one."""
    torch.manual_seed(zlib.crc32(f"{seed}|{task}|{unit}".encode()))


CHECKPOINT_STEPS = 50  # at most one checkpoint (weights and AdamW state, ~270 MB for MiniLM) per this many steps


def steps_per_epoch(config: Config, n: int) -> int:
    return max(1, n // config.size("batch_size"))


def train_config(config: Config, epochs: int, n: int, lr: float, desc: str, weight_decay: float = 0.0,
                 seed: int | None = None, warmup: int | None = None) -> TrainConfig:
    """A checkpoint at the end of an epoch, but not more often than every CHECKPOINT_STEPS steps: the demo's
    10-step epochs made a checkpoint every 9 s, 6% of the training time, where resuming loses little. `warmup`: the
    linear schedule's warm-up steps (one epoch unless given)."""
    per_epoch = steps_per_epoch(config, n)
    every = per_epoch * max(1, -(-CHECKPOINT_STEPS // per_epoch))
    return TrainConfig(steps=epochs * per_epoch, batch_size=config.size("batch_size"), lr=lr, schedule="linear",
                       warmup_steps=per_epoch if warmup is None else warmup,
                       seed=config.seed if seed is None else seed, weight_decay=weight_decay,
                       description=desc,
                       checkpoint_every=every, **config.train_settings())


def _dev_score(model, collate, metric: str, dev, labels: np.ndarray, precision: str = "no") -> float:
    """The model's score on dev examples (`metric`, a fraction), the model back in training mode after."""
    with parametrize.cached():  # under a launch each process scores its share of the dev set
        preds = predict_shared(model, collate, dev, precision)
    model.train()
    return float(metric_value(metric, labels, preds))


class _BestDev:
    """`on_step` hook: scores the student on the dev set every `every` steps and keeps its best weights
    (in memory; a resumed run restarts the search from its checkpoint, a DECISION for simplicity)."""

    def __init__(self, model, collate, task: NLUTask, every: int, precision: str = "no"):
        self.model, self.collate, self.task, self.every, self.precision = model, collate, task, every, precision
        self.labels = np.array([e.label for e in task.dev])
        self.best: tuple[float, int, dict] | None = None

    def __call__(self, step: int, loss: float) -> None:
        if (step + 1) % self.every:
            return
        score = _dev_score(self.model, self.collate, self.task.metric, self.task.dev, self.labels, self.precision)
        if self.best is None or score > self.best[0]:
            self.best = (score, step + 1, {k: v.detach().clone() for k, v in self.model.state_dict().items()})

    def restore(self) -> tuple[int | None, float | None]:
        if self.best is None:
            return None, None
        self.model.load_state_dict(self.best[2])
        return self.best[1], 100 * self.best[0]


class DevCurve:
    """`on_step` hook and training state (so a resumed training keeps it): the model's dev score, in points, after
    every `every` steps (the teacher: each epoch's end) and after each step count in `at` (a student: the start of
    its last quarter and its end), on the first `limit` dev examples. The gates read whether it still rose at the
    end: the teacher's over its last epoch, a student's over its last quarter.

    `patience` (the teacher's rule): once its best dev score is above `learned_above` (the teacher: the majority
    class's score plus TEACHER_MARGIN), the training ends when the dev score has risen by less than `min_rise` points
    over the best before it at `patience` readings in a row (the hook returns True, lmlab.train), and the model
    goes back to its best reading's weights, kept in memory and in every checkpoint (`tensors`), as a fine-tuning
    that keeps its best dev checkpoint does; a training the rule did not end keeps its last weights (it met its
    cap still rising, which the teacher gate then says). `stopped` travels in the checkpoint, so a resumed training
    ends where it ended."""

    def __init__(self, model, collate, task: NLUTask, every: int = 0, at: Iterable[int] = (), limit: int | None = None,
                 patience: int = 0, min_rise: float = 0.0, learned_above: float = float("-inf"), precision: str = "no"):
        self.model, self.collate, self.every, self.at, self.precision = model, collate, every, set(at), precision
        self.metric, self.dev = task.metric, tuple(task.dev[:limit])
        self.labels = np.array([e.label for e in self.dev])
        self.patience, self.min_rise, self.learned_above = patience, min_rise, learned_above
        self.scores: list[float] = []
        self.stopped = False
        self.best: dict[str, torch.Tensor] = {}

    def __call__(self, step: int, loss: float) -> bool:
        n = step + 1
        if (self.every and n % self.every == 0) or n in self.at:
            self.scores.append(100 * _dev_score(self.model, self.collate, self.metric, self.dev, self.labels,
                                                self.precision))
            if self.patience and self.scores[-1] >= max(self.scores):
                self.best = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.stopped = self.settled()
            if self.stopped and self.best:
                self.model.load_state_dict(self.best)
        return self.stopped

    def settled(self) -> bool:
        """The patience rule: each of the last `patience` scores under the best before it plus `min_rise`, once the
        best is above `learned_above` (a model still at the majority class has not begun: it trains on to its cap)."""
        p = self.patience
        if not p or len(self.scores) <= p or max(self.scores) < self.learned_above:
            return False
        return all(self.scores[i] - max(self.scores[:i]) < self.min_rise for i in range(len(self.scores) - p,
                                                                                      len(self.scores)))

    def state_dict(self) -> dict:
        return {"dev_scores": list(self.scores), "stopped": self.stopped}

    def load_state_dict(self, state: dict) -> None:
        self.scores = list(state.get("dev_scores", []))
        self.stopped = bool(state.get("stopped", False))

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.best)

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.best = dict(tensors)

    def reading(self) -> dict:
        """The last dev score and its rise over the best one before it (none with one score); with the patience
        rule, the readings it took (the teacher: its epochs), whether the rule ended it (else it met its cap), and
        the score of the weights it kept (its best reading, where the rule ended it)."""
        out = {"dev_last": self.scores[-1]} if self.scores else {}
        if len(self.scores) >= 2:
            out["dev_rise"] = self.scores[-1] - max(self.scores[:-1])
        if self.patience and self.scores:
            out.update(dev_readings=len(self.scores), settled=self.stopped,
                       dev_kept=max(self.scores) if self.stopped else self.scores[-1])
        return out


def majority_score(task: NLUTask) -> float:
    """The dev score, in points, of predicting the dev set's most common label (0 for a regression task, whose metric
    a constant prediction leaves undefined)."""
    if task.num_labels == 1 or not task.dev:
        return 0.0
    return majority_of(task.metric, np.array([e.label for e in task.dev]))


def teacher_cache(config: Config, task: NLUTask, teacher, collate) -> TeacherCache | None:
    """The teacher's outputs over the task's KD pool, computed once for every student (None: recompute them
    every step, `--no-teacher-cache`)."""
    if not config.teacher_cache:
        return None
    return TeacherCache(teacher, task.train, collate, batch_size=64, scores=config.kd_attention > 0)


TEACHER_FIT = "training.json"  # beside a fine-tuned teacher: its loss over the last two quarters of its steps


def loss_quarters(losses: list[float]) -> dict:
    """A training's mean loss over the third and the last quarter of its steps ({} under four steps)."""
    q = len(losses) // 4
    if not q:
        return {}
    return {"loss_q3": float(np.mean(losses[-2 * q:-q])), "loss_q4": float(np.mean(losses[-q:]))}


STUDENT_DEV = 1000  # a student's dev curve scores at most this many dev examples, twice (a quarter before its end; its end)


def _train_student(config, run_dir, task, teacher, collate, bits, budget, key, cache, replicate, seed) -> tuple:
    """A quantized copy of the teacher trained with KD: (the student, its steps, what the gates read of its training:
    the KD loss's last two quarters and, at the budget the claims read, its dev score's rise over its last quarter).
    The curve costs two scorings of STUDENT_DEV examples (MiniLM: 13-15 s for 1000 at one AVX2 thread, about a
    third of a 62-step Budget-A student), so the budgets the gate does not read skip it. Its width and epochs are
    the cell's (`config.student_arm`: an undistilled student takes no step, the teacher quantized and scored as it
    is; in the placebo every budget trains as Budget-A and the 1-bit cells are ternary)."""
    seed_unit(seed, task.name, key)
    model = copy.deepcopy(teacher)
    for p in model.parameters():
        p.requires_grad_(True)
    layer_map = None
    if config.layer_reduction:  # keep teacher layers 1, 3, 5, ...: the last layer is always kept
        n = layout_of(model).n_layers
        layer_map = keep_layers(model, list(range(1, n, 2)) if n > 1 else [0])
    width, epochs = student_arm(bits, budget, config.placebo)
    quantize_model(model, width)
    if not epochs:  # the undistilled reference: the teacher quantized, no KD step, scored but not kept (packed/
        return model, 0, {"weight_bits": width}  # holds the method's students, which `lmlab compare` reads)
    regression = task.num_labels == 1
    per_epoch = steps_per_epoch(config, len(task.train))
    tc = train_config(config, config.size("epochs_a") * epochs, len(task.train),
                      config.size("student_lr"), f"{task.name} {bits}-bit Budget-{budget}"
                      + (f", replicate {replicate}" if replicate is not None else ""),
                      weight_decay=config.size("weight_decay"), seed=seed,
                      warmup=student_warmup(per_epoch, config.size("epochs_a")))
    work = run_dir.path / "work" / f"{task.name}-{key}"
    weights = dict(w_logit=config.kd_logit, w_att=config.kd_attention, w_hid=config.kd_hidden, layer_map=layer_map)
    best = _BestDev(model, collate, task, per_epoch, tc.mixed_precision) if config.size("best_dev") else None
    curve = (DevCurve(model, collate, task, at=(tc.steps - tc.steps // 4, tc.steps), limit=STUDENT_DEV,
                      precision=tc.mixed_precision)
             if budget == claims_budget(config.size("budgets")) else None)  # the gate reads only that budget's
    data, batches = (Indexed(task.train), indexed_collate(collate)) if cache is not None else (task.train, collate)
    trained = train(model, data, batches, lambda m, b: kd_loss(m, teacher, b, regression, cache=cache, **weights)[0],
                    tc, work, on_step=_Hooks(*(h for h in (best, curve) if h is not None)), state=curve)
    info = {**loss_quarters(trained.losses), **(curve.reading() if curve else {}),  # what the convergence gate reads
            "weight_bits": width}  # (the cell's `bits` but for the placebo's 1-bit cells, which are ternary)
    if best is not None:  # (every process scored the same weights on dev, so each restores the same best)
        info["best_dev_step"], info["best_dev"] = best.restore()
    if parallel.is_main():  # the other processes trained their slices; rank 0 holds the same weights
        shutil.rmtree(work, ignore_errors=True)
        info.update(save_packed(model, packed_student(run_dir.path, f"{task.name}-{key}")))
    return model, tc.steps, info


class _Hooks:
    """Several `on_step` hooks, called in order."""

    def __init__(self, *hooks):
        self.hooks = hooks

    def __call__(self, step: int, loss: float) -> None:
        for hook in self.hooks:
            hook(step, loss)


def run_unit(config, run_dir, task, teacher, collate, bits, budget, key, cache: TeacherCache | None = None,
             replicate: int | None = None, seed: int | None = None, tokenizer=None,
             teacher_info: dict | None = None) -> list[dict]:
    """One configuration of one task: the teacher's own score (with `teacher_info`, its fine-tuning's loss
    quarters and dev curve), or one quantized student (replicate `replicate`, seeded `seed`) trained with KD (the
    undistilled reference: with none)."""
    labels = np.array([e.label for e in task.test])
    seed = config.seed if seed is None else seed
    if bits == 32:
        model, steps, info = teacher, 0, dict(teacher_info or {})
    else:
        model, steps, info = _train_student(config, run_dir, task, teacher, collate, bits, budget, key, cache,
                                            replicate, seed)
        if config.export and steps and parallel.is_main():  # beside the packed file (the undistilled have none);
            # rewritten whole if the unit runs again
            export_compressed(model, run_dir.path / "export" / config.export / f"{task.name}-{key}", tokenizer)
    with parametrize.cached():  # the weights do not change during evaluation: quantize them once
        preds = predict_shared(model, collate, task.test, config.train_settings()["mixed_precision"])  # under a
        # launch each process scores its share; in the precision the students trained in (bf16 autocast on a GPU)
    if not parallel.is_main():  # rank 0 writes the unit's rows
        return []
    score = metric_value(task.metric, labels, preds)
    rows = [dict(kind="score", task=task.name, metric=task.metric, bits=bits, budget=budget or "teacher",
                 replicate=replicate, seed=seed if replicate is not None else None, score=100 * score, steps=steps,
                 **info)]
    rows += [dict(kind="pred", task=task.name, bits=bits, budget=budget or "teacher", replicate=replicate, idx=i,
                  pred=float(p), label=float(y)) for i, (p, y) in enumerate(zip(preds, labels))]
    return rows
