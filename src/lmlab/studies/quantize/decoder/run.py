"""The decoder option's measurements: the teacher scored, then each student (bits x budget x replicate) copied from
it, quantized, distilled on the teacher's own text (data-parallel under a launch), packed by rank 0 and scored
(perplexity on held-out text, accuracy and per-prompt predictions on the circuit tasks), each a unit a resumed run
skips."""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil

import numpy as np
import pandas as pd
import torch

from lmlab import parallel
from lmlab.errors import LmlabError
from lmlab.data.generated.circuits import make_task
from lmlab.evaluation import causal_lm_ce, metric_values
from lmlab.interventions.export import export_compressed, export_refusal
from lmlab.interventions.quant import quant_targets, quantize_model, save_packed
from lmlab.models.batch import module_device
from lmlab.runs import RunDir, packed_student
from lmlab.studies.quantize.config import UNDISTILLED, placebo_seed, student_arm, student_warmup
from lmlab.studies.quantize.decoder.data import batch, size, tasks_and_budgets, texts
from lmlab.studies.quantize.measure import seed_unit
from lmlab.train import TrainConfig, train
from lmlab.train.kd import kd_loss


def _evaluate(lm, model, tasks, eval_text, batch_size: int) -> tuple[dict, list[dict]]:
    model.eval()
    view = dataclasses.replace(lm, model=model)
    with torch.no_grad():
        device = module_device(model)
        per_seq, _ = causal_lm_ce(model, (batch(eval_text[i:i + batch_size], device)
                                         for i in range(0, len(eval_text), batch_size)))
        correct = {t.name: metric_values(view, t, batch_size=16) > 0 for t in tasks}
    return {"ce": float(np.mean(per_seq)), "perplexity": float(math.exp(np.mean(per_seq)))}, \
        [dict(task=name, correct=c) for name, c in correct.items()]


def run_decoder(config, run_dir: RunDir, lm) -> pd.DataFrame:
    """XTC on a decoder: the teacher scored, then each student (bits x budget x replicate) distilled on
    self-sampled text, packed and scored (perplexity on held-out text, accuracy on the circuit tasks)."""
    names, budgets = tasks_and_budgets(config)
    quant_targets(lm.model)  # a model whose weights XTC cannot reach is refused, by name, before any work
    refusal = export_refusal(lm.model) if config.export else None
    if refusal:
        raise LmlabError(f"--export {config.export}: {refusal}")
    tasks = [make_task(n, lm.tokenizer, size(config, "n_prompts"), config.seed) for n in names]
    teacher = lm.model.float().eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    data = parallel.main_first(lambda: texts(lm, config, run_dir))  # sampled once, by rank 0; the rest read it
    done = run_dir.done("results")
    parallel.sync()  # every process has read the same units as done before rank 0 records one
    rows: list[dict] = []
    seeds = config.replicate_seeds()
    units = [("teacher", 32, None, None)] + [(f"{bits}bit-{b}-rep{r}", bits, b, r) for bits in config.size("bits")
                                             for b in budgets + [UNDISTILLED] for r in range(len(seeds))]
    for key, bits, budget, replicate in units:
        if key not in done and budget == UNDISTILLED and replicate:  # no training: replicate 0's student again
            if not parallel.is_main():  # (rank 0 scored it and records it)
                continue
            done[key] = [{**row, "replicate": replicate} for row in done[f"{bits}bit-{UNDISTILLED}-rep0"]]
            run_dir.record("results", key, done[key])
        if key not in done:
            seed = (config.seed if replicate is None else
                    placebo_seed(config.seed, budget, replicate, len(seeds)) if config.placebo and budget in ("B", "C")
                    else seeds[replicate])  # the placebo's Budget-B and C train as Budget-A from other seeds
            model, steps, info = (teacher, 0, {}) if bits == 32 else _student(
                config, run_dir, lm, teacher, data, key, bits, budget, replicate, seed)
            if not parallel.is_main():  # it trained its slices; rank 0 scores, packs and records the unit
                continue
            done[key] = _score_unit(run_dir, lm, model, tasks, data, key, bits, budget, replicate, steps, info,
                                    size(config, "batch_size"))
            if bits != 32:
                del model  # free this student before the next one is copied (one student in memory at a time)
        rows += done[key]
    parallel.main_only()
    run_dir.describe(model=lm.name, tasks=",".join(names), n_train=len(data["train"]), n_eval=len(data["eval"]),
                     epochs_a=size(config, "epochs_a"))
    return pd.DataFrame(rows)


def _student(config, run_dir: RunDir, lm, teacher, data: dict, key: str, bits: int, budget: str, replicate: int,
             seed: int):
    """One student: the teacher copied, quantized to `bits`, distilled for its budget's steps (data-parallel under a
    launch), then packed (and exported) by rank 0. (model, steps, the packed sizes)."""
    batch_size = size(config, "batch_size")
    per_epoch = max(1, len(data["train"]) // batch_size)
    seed_unit(seed, "decoder", key)
    model = copy.deepcopy(teacher)
    for p in model.parameters():
        p.requires_grad_(True)
    width, epochs = student_arm(bits, budget, config.placebo)  # the placebo's arms: see the encoder's recipe
    quantize_model(model, width)
    steps = size(config, "epochs_a") * epochs * per_epoch
    tc = TrainConfig(steps=steps, batch_size=batch_size, lr=size(config, "student_lr"), schedule="linear",
                     warmup_steps=student_warmup(per_epoch, size(config, "epochs_a")), seed=seed,
                     description=f"{bits}-bit Budget-{budget} KD, replicate {replicate}",
                     **config.train_settings())
    weights = dict(w_logit=config.kd_logit, w_att=config.kd_attention, w_hid=config.kd_hidden)
    work = run_dir.path / "work" / key
    if not steps:  # the undistilled reference: the teacher quantized, scored, not packed (the encoder's recipe)
        return model, 0, {"weight_bits": width}
    train(model, data["train"], batch, lambda m, b: kd_loss(m, teacher, b, **weights)[0], tc, work)
    info = {"weight_bits": width}
    if parallel.is_main():
        shutil.rmtree(work, ignore_errors=True)
        info.update(save_packed(model, packed_student(run_dir.path, key)))
        if config.export:  # beside the packed file
            export_compressed(model, run_dir.path / "export" / config.export / key, lm.tokenizer)
    return model, steps, info


def _score_unit(run_dir: RunDir, lm, model, tasks, data: dict, key: str, bits: int, budget: str | None,
                replicate: int | None, steps: int, info: dict, batch_size: int) -> list[dict]:
    """A model's rows (perplexity; each task's accuracy and per-prompt predictions), recorded under `key`."""
    lm_metrics, task_rows = _evaluate(lm, model, tasks, data["eval"], batch_size)
    budget_name = budget or "teacher"
    unit_rows = [dict(kind="lm", bits=bits, budget=budget_name, replicate=replicate, steps=steps, **lm_metrics)]
    for t in task_rows:
        unit_rows.append(dict(kind="score", task=t["task"], metric="accuracy", bits=bits, budget=budget_name,
                              replicate=replicate, score=100 * float(np.mean(t["correct"])), steps=steps, **info))
        unit_rows += [dict(kind="pred", task=t["task"], bits=bits, budget=budget_name, replicate=replicate,
                           idx=i, pred=float(c), label=1.0) for i, c in enumerate(t["correct"])]
    run_dir.record("results", key, unit_rows)
    run_dir.log(f"{key}: perplexity {lm_metrics['perplexity']:.2f}, accuracy "
                + ", ".join(f"{r['task']} {r['score']:.0f}%" for r in unit_rows if r["kind"] == "score"))
    return unit_rows
