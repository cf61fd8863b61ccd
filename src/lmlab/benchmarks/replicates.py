"""Replicates trained together (one stacked module, lmlab.train.ensemble) vs one after the other, side by side.

For the latent study's scratch model (the demo's size, a batch of 32 turtle chains) and the sparse-circuits study's
addition toy (dense steps and sparse post-training steps), the same k = 3 replicates take optimizer steps on the
same batches either as three separate models in turn or as one stacked model; the cases alternate step by step (the
order rotating), so a drift in the machine's speed falls on both alike, and each rate is from the median of steps
after two warm-up steps. The ratio is time one after the other / time together (> 1: together is faster).
"""

from __future__ import annotations

import copy
import statistics
import time

from lmlab.benchmarks.registry import benchmark, drain


def _time_cases(cases: dict, steps: int, device: str = "cpu") -> dict[str, float]:
    """{case: step function}: median seconds per step of each, interleaved (a GPU's queue drained around each)."""
    names = list(cases)
    times = {n: [] for n in names}
    for i in range(steps):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            drain(device)
            t0 = time.perf_counter()
            cases[name]()
            drain(device)
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def _pair(models, batch_of, loss_of, k: int, device: str = "cpu"):
    """Step functions for the k models one after the other and for their stack, each with its own AdamW, on
    `device`: float32 weights, and on a GPU the forward pass under bf16 autocast, as lmlab trains there."""
    import contextlib

    import torch

    from lmlab.train.ensemble import stack

    solo = [copy.deepcopy(m).to(device) for m in models]
    together = stack([copy.deepcopy(m) for m in models]).to(device)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for m in solo]
    opt = torch.optim.AdamW(together.parameters(), lr=1e-4, fused=True)

    def autocast():
        if device.startswith("cuda"):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def one_after_the_other():
        for r, (m, o) in enumerate(zip(solo, opts)):
            with autocast():
                loss = loss_of(m, batch_of(r, 1)).sum()
            loss.backward()
            o.step()
            o.zero_grad()

    def at_once():
        with autocast():
            loss = loss_of(together, batch_of(None, k)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {"one after the other": one_after_the_other, "together (stacked)": at_once}


@benchmark("replicates")
def replicates_bench(steps: int = 12, device: str = "cpu", **_) -> list[dict]:
    k = 3
    cases = [_s0_case(k, steps, device), *_toy_cases(k, steps, device)]
    return [row for name, setup, rates in cases for row in _rate_rows(name, setup, rates, device)]


def _rate_rows(name: str, setup: str, rates: dict[str, float], device: str) -> list[dict]:
    """One row per way of training (seconds a step of the replicates), its speed-up over one after the other."""
    apart = rates["one after the other"]
    return [dict(benchmark="replicates", case=f"{name}: {case}", value=round(seconds, 3),
                 unit="s per step of 3 replicates", ratio=round(apart / seconds, 2), target=None,
                 note="aim >= 1.5x" if case.startswith("together") else None,
                 setup=f"{setup}; on {device}" + (" (bf16 autocast)" if device.startswith("cuda") else ""))
            for case, seconds in rates.items()]


def _s0_case(k: int, steps: int, device: str) -> tuple[str, str, dict]:
    """S0's scratch model on its turtle chains: k replicates one after the other and stacked."""
    from lmlab.studies.latent.config import Config
    from lmlab.studies.latent.measure import collate_for, lm_loss
    from lmlab.studies.latent.recipe import prepare

    config = Config(model="scratch", profile="demo", n_train=200, n_test=10, seeds=k, device="cpu")  # (moved below)
    prep = prepare(config)
    collate = collate_for(prep.vocab.pad)
    items = [(ex.prompt, ex.chain + ex.answer) for ex in prep.train]
    bs = config.size("batch_size")
    batches = {1: [_to(collate(items[r * bs:(r + 1) * bs]), device) for r in range(k)],
               k: _to(collate(items[:k * bs]), device)}
    setup = (f"{config.size('n_layers')} layers x {config.size('d_model')}, batch {bs} turtle chains (~107 tokens) "
             "per replicate")
    rates = _time_cases(_pair(prep.initial, lambda r, n: batches[1][r] if n == 1 else batches[k], lm_loss, k, device),
                        steps, device)
    return "S0 scratch model", setup, rates


def _toy_cases(k: int, steps: int, device: str) -> list[tuple[str, str, dict]]:
    """S4's toy, dense and under sparse post-training (the sampled edge gate): k replicates apart and stacked."""
    import torch

    from lmlab.interventions import SparseAttention, intervene
    from lmlab.interventions.core import keyed_examples
    from lmlab.studies.sparse_circuits.toy import model as toy

    data = toy.addition_data(seed=0)
    models = [toy.build_toy(seed=s, d_model=64).model.train() for s in range(k)]
    tb = 64
    toy_batches = {1: [_to(toy.collate(data.train[r * tb:(r + 1) * tb]), device) for r in range(k)],
                   k: _to(toy.collate(data.train[:k * tb]), device)}

    def toy_batch(r, n):
        return toy_batches[1][r] if n == 1 else toy_batches[k]

    def sparse_loss(model, batch):
        from lmlab.train.ensemble import replicas

        gate = SparseAttention(sample=True, keyed=True, replicas=replicas(model))
        with intervene(model, gate), keyed_examples(torch.arange(len(batch["input_ids"]), device="cpu")):
            ce = toy.answer_loss(model, batch)
            return ce + 1e-3 * gate.expected_per
    dense = _time_cases(_pair(models, toy_batch, toy.answer_loss, k, device), steps, device)
    sparse = _time_cases(_pair(models, toy_batch, sparse_loss, k, device), steps, device)
    return [("S4 toy, dense", f"4 layers x 64, batch {tb} sequences of 46 tokens per replicate", dense),
            ("S4 toy, sparse post-training", f"the same toy with the sampled edge gate, batch {tb}", sparse)]


def _to(batch, device: str):
    return {key: value.to(device) for key, value in batch.items()} if isinstance(batch, dict) else batch.to(device)
