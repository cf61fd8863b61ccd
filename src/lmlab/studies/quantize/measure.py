"""S2 measurements: batches, predictions, and one unit of the grid (the teacher's score, or one quantized
student trained with one-stage KD and scored)."""

from __future__ import annotations

import copy
import shutil
import zlib

import numpy as np
import torch
from torch.nn.utils import parametrize

from lmlab.data.generated.nlu import NLUTask
from lmlab.evaluation import metric_value
from lmlab.interventions.quant import keep_layers, quantize_model, save_packed
from lmlab.models.layout import layout_of
from lmlab.studies.quantize.config import MULTIPLIER, Config
from lmlab.train import TrainConfig, train
from lmlab.train.kd import kd_loss


def collate_for(tokenizer, task: NLUTask, max_length: int):
    def collate(examples):
        a = [e.text_a for e in examples]
        b = [e.text_b for e in examples] if examples[0].text_b is not None else None
        enc = tokenizer(a, b, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        dtype = torch.float if task.num_labels == 1 else torch.long
        enc["labels"] = torch.tensor([e.label for e in examples], dtype=dtype)
        return dict(enc)
    return collate


@torch.no_grad()
def predict(model, collate, examples, batch_size: int = 64) -> np.ndarray:
    model.eval()
    out = []
    for start in range(0, len(examples), batch_size):
        batch = collate(list(examples[start:start + batch_size]))
        batch.pop("labels")
        logits = model(**batch).logits
        out.append(logits[:, 0] if logits.shape[-1] == 1 else logits.argmax(-1))
    return torch.cat(out).float().numpy()


def seed_unit(seed: int, task: str, unit: str) -> None:
    """Each unit draws its own random numbers (dropout, data order), so a resumed run matches a whole one."""
    torch.manual_seed(zlib.crc32(f"{seed}|{task}|{unit}".encode()))


def train_config(config: Config, epochs: int, n: int, lr: float, desc: str) -> TrainConfig:
    per_epoch = max(1, n // config.batch_size)
    return TrainConfig(steps=epochs * per_epoch, batch_size=config.batch_size, lr=lr, schedule="linear",
                       warmup_steps=per_epoch, seed=config.seed, description=desc)


def run_unit(config, run_dir, task, teacher, collate, bits, budget, key) -> list[dict]:
    """One configuration of one task: the teacher's own score, or one quantized student trained with KD."""
    labels = np.array([e.label for e in task.test])
    info: dict = {}
    if bits == 32:
        model = teacher
        steps = 0
    else:
        seed_unit(config.seed, task.name, key)
        model = copy.deepcopy(teacher)
        for p in model.parameters():
            p.requires_grad_(True)
        layer_map = None
        if config.layer_reduction:  # keep teacher layers 1, 3, 5, ...: the last layer is always kept
            n = layout_of(model).n_layers
            layer_map = keep_layers(model, list(range(1, n, 2)) if n > 1 else [0])
        quantize_model(model, bits)
        regression = task.num_labels == 1
        tc = train_config(config, config.size("epochs_a") * MULTIPLIER[budget], len(task.train), config.student_lr,
                           f"{task.name} {bits}-bit Budget-{budget}")
        work = run_dir.path / "work" / f"{task.name}-{key}"
        weights = dict(w_logit=config.kd_logit, w_att=config.kd_attention, w_hid=config.kd_hidden, layer_map=layer_map)
        train(model, task.train, collate, lambda m, b: kd_loss(m, teacher, b, regression, **weights)[0], tc, work)
        shutil.rmtree(work, ignore_errors=True)
        info = save_packed(model, run_dir.path / "packed" / f"{task.name}-{key}.safetensors")
        steps = tc.steps
    with parametrize.cached():  # the weights do not change during evaluation: quantize them once
        preds = predict(model, collate, task.test)
    score = metric_value(task.metric, labels, preds)
    rows = [dict(kind="score", task=task.name, metric=task.metric, bits=bits, budget=budget or "teacher",
                 score=100 * score, steps=steps, **info)]
    rows += [dict(kind="pred", task=task.name, bits=bits, budget=budget or "teacher", idx=i, pred=float(p),
                  label=float(y)) for i, (p, y) in enumerate(zip(preds, labels))]
    return rows
