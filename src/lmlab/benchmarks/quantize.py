"""The quantize study's packed checkpoint sizes, measured on disk: the quantized matrices packed vs the same
matrices in fp32.

Two safetensors files are written for each bit width, one with the packed codes and scales of every
quantized matrix, one with those matrices in fp32, and their sizes on disk are compared (XTC: 32x).
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

from lmlab.benchmarks.registry import benchmark
from lmlab.environment import bf16_hardware
from lmlab.interventions.quant import quant_targets, quantize_model, save_packed
from lmlab.models import load_model


@benchmark("packed-size")
def packed_size_bench(**_) -> list[dict]:
    name = "minilm-l6"  # always the encoder study's model, whatever `lmlab bench --model` names
    lm = load_model(name, head="classifier", num_labels=2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for bits, target in ((1, 1 / 28), (2, 1 / 14)):
            student = copy.deepcopy(lm.model)
            quantize_model(student, bits)
            full = Path(tmp) / f"packed-{bits}.safetensors"
            save_packed(student, full)
            tensors = load_file(str(full))
            packed = {k: v for k, v in tensors.items() if not k.startswith("rest.")}
            save_file(packed, str(Path(tmp) / f"q-{bits}.safetensors"))
            fp32 = {n: m.weight.detach().contiguous() for n, (m, _) in quant_targets(student).items()}
            save_file(fp32, str(Path(tmp) / f"f-{bits}.safetensors"))
            q_size = (Path(tmp) / f"q-{bits}.safetensors").stat().st_size
            f_size = (Path(tmp) / f"f-{bits}.safetensors").stat().st_size
            rows.append(dict(benchmark="packed-size", case=f"{bits}-bit packed vs fp32 (quantized matrices)",
                             value=round(q_size / 2**20, 2), unit="MiB on disk", ratio=round(q_size / f_size, 4),
                             target=round(target, 4), setup=f"{name}: {round(f_size / 2**20, 1)} MiB in fp32; "
                                                             f"whole packed checkpoint {round(full.stat().st_size / 2**20, 1)} MiB"))
    return rows


def _bf16_hardware() -> str:
    """Whether this CPU computes bf16 matmuls in hardware (AMX or AVX512-BF16; elsewhere torch emulates them)."""
    kinds = bf16_hardware()
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")  # a cap below them makes oneDNN emulate bf16 on this CPU too
    return (" and ".join(kinds) if kinds else "none (emulated)") + (f", oneDNN capped at {cap}" if cap else "")


def _kd_step(run: dict, batch: dict, teacher) -> None:
    """One KD step of a benchmark case: its student, its optimizer, its teacher outputs (cached or not), and the
    forward pass under bf16 autocast where the case says so (the backward outside it, as the training loop does)."""
    import torch

    from lmlab.train.kd import kd_loss

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run["bf16"]):
        loss = kd_loss(run["student"], teacher, batch, cache=run["cache"])[0]
    loss.backward()
    run["opt"].step()
    run["opt"].zero_grad()


@benchmark("kd-step")
def kd_step_bench(steps: int = 12, **_) -> list[dict]:
    """The quantize study's KD step (2-bit student, MiniLM, batch 32 of fact-mnli), side by side in one run: batches
    padded to max_length with the teacher run every step, padded per batch (the study before the cache), padded per
    batch with the teacher's outputs read from a TeacherCache built once (the study; its one-off build time is
    reported apart and amortised over every student's steps), and that step with its forward pass under bf16
    autocast (`--dtype bfloat16`; float32 master weights, as the training loop keeps them; the row says whether this
    CPU has bf16 in hardware). Each case trains its own fresh student on the same batches with the study's optimizer
    (AdamW, fused), and the cases take turns step by step (the order rotating), so that a drift in the machine's
    speed falls on all of them alike; a case's rate is from its median step time after two warm-up steps."""
    import time

    import torch

    from lmlab.data.generated.nlu import generate_task
    from lmlab.studies.quantize.measure import collate_for
    from lmlab.train.kd import Indexed, TeacherCache, indexed_collate

    name = "minilm-l6"
    lm = load_model(name, head="classifier", num_labels=3)
    teacher = lm.model.eval()
    task = generate_task("fact-mnli", 32 * steps, 8, seed=0)
    fixed, per_batch = collate_for(lm.tokenizer, task, 64, pad_to_max=True), collate_for(lm.tokenizer, task, 64)
    t0 = time.perf_counter()
    cache = TeacherCache(teacher, task.train, per_batch)
    build = time.perf_counter() - t0
    data = Indexed(task.train)
    study = "padded per batch, teacher outputs cached (the study)"
    cases = (("padded to max_length 64, teacher every step", indexed_collate(fixed), None, False),
             ("padded per batch, teacher every step", indexed_collate(per_batch), None, False),
             (study, indexed_collate(per_batch), cache, False),
             ("the study's step under bf16 autocast (--dtype bfloat16)", indexed_collate(per_batch), cache, True))
    runs = []
    for case, collate, use, bf16 in cases:
        student = copy.deepcopy(teacher)
        quantize_model(student, 2)
        student.train()
        opt = torch.optim.AdamW(student.parameters(), lr=1e-5, fused=True)
        batches = [collate([data[j] for j in range(i * 32, (i + 1) * 32)]) for i in range(steps)]
        runs.append(dict(case=case, student=student, opt=opt, batches=batches, cache=use, bf16=bf16, times=[]))
    rates = _taking_turns(runs, steps, teacher)
    return [_kd_row(run, rates, cases[1][0], study, build, steps, len(task.train), name) for run in runs]


def _taking_turns(runs: list[dict], steps: int, teacher) -> dict[str, float]:
    """The cases' KD steps taken in turns, step by step (the order rotating); each case's steps a second from its
    median step time after two warm-up steps."""
    import statistics
    import time

    for i in range(steps):
        for k in range(len(runs)):
            run = runs[(i + k) % len(runs)]
            t0 = time.perf_counter()
            _kd_step(run, run["batches"][i], teacher)
            if i >= 2:  # two warm-up steps
                run["times"].append(time.perf_counter() - t0)
    return {run["case"]: 1 / statistics.median(run["times"]) for run in runs}


def _kd_row(run, rates, base, study, build, steps, pool, name) -> dict:
    """A kd-step case's row: its rate, its ratio to `base` (and the bf16 case's to the study's fp32 step)."""
    width = sum(b["input_ids"].shape[1] for b in run["batches"]) / steps
    setup = f"{name} 2-bit student, batch 32 fact-mnli pairs, mean width {width:.0f} tokens"
    if run["bf16"]:
        setup += (f"; {rates[run['case']] / rates[study]:.2f}x the study's float32 step; bf16 in hardware: "
                  f"{_bf16_hardware()}")
    elif run["cache"] is not None:
        setup += f"; cache built once in {build:.1f} s for {pool} examples"
    return dict(benchmark="kd-step", case=run["case"], value=round(rates[run["case"]], 2), unit="KD steps/s",
                ratio=round(rates[run["case"]] / rates[base], 2), target=None,
                note="aim >= 1.3x" if run["cache"] is not None and not run["bf16"] else None, setup=setup)
