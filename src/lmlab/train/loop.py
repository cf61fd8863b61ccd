"""One training loop for every study that trains (latent, quantize, sparse-circuits), on HF accelerate.

The same call runs on CPU, one GPU, or several processes (`accelerate launch --num_processes N`, or
`torchrun`). Data order is a function of (seed, epoch) only, and each process takes its slice of every
global micro-batch, so one process and N processes see the same examples per step and, with DDP's
gradient averaging, follow the same loss curve.

A loss whose terms are token-weighted (a CE over the tokens of the batch) must weigh every process's tokens
alike, or N processes would weigh a short-sequence slice as much as a long one: such a loss returns its local
sum over the global count, `share(local_sum, local_count)` (this process's part of the global mean, whose mean
over processes, DDP's gradient average, is the global mean). Per-example randomness that must not depend on
how a batch is split (the sparse gate's noise) reads `interventions.example_keys()`: one key per example of the micro-batch,
from (seed, step, micro-step, position in the global batch). Other randomness (dropout) is drawn per
process: processes after the first offset their generator, so their dropout masks are independent draws
(the same distribution as one process, not the same masks).

Checkpoints are safetensors (model, optimizer moments, RNG state) plus a small JSON, written to a
temporary folder and renamed; `train` resumes from the newest one. A loss that turns NaN/inf stops
the run with a clear message and leaves the last good checkpoint in place.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import time
import zlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file

from lmlab.errors import LmlabError
from lmlab.parallel import all_sum, group_size
from lmlab.runs import slug


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int
    batch_size: int = 8  # global, per optimizer micro-step, over all processes
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    max_grad_norm: float | None = 1.0
    checkpoint_every: int = 0  # 0: only at the end
    # also a checkpoint once this many minutes have passed since the last one (or the start), so that an interrupted
    # long training loses minutes, not a quarter of its steps; 0: by steps only. The clock is read every 10th step
    # (under a launch that costs one all-reduce). A resume from such a checkpoint is a resume like any other (on a
    # CPU in one process the tests find the uninterrupted curve)
    checkpoint_minutes: float = Field(10.0, ge=0)
    keep_checkpoints: int = 2
    seed: int = 0
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    cpu: bool | None = None  # None: CPU when no GPU is present
    progress: bool = True
    description: str = "train"
    # parameters whose name contains a key train at lr * value (e.g. {"q_proj": 10}); others at lr
    lr_scale: dict[str, float] = {}
    # a stacked model of k replicates (lmlab.train.ensemble): one seed per replicate, each drawing its own batches
    replicate_seeds: list[int] = []
    # accelerate trackers (tensorboard, wandb, ...) that get each step's loss and learning rate, and their folder
    # (default: the study run's logs/ folder, else out_dir/logs); the tracker's run is named after `description`
    log_with: list[str] = []
    log_dir: str | None = None


class TrainingDiverged(LmlabError):
    pass


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)  # one per optimizer step, averaged over processes (and replicates)
    replicate_losses: list[list[float]] = field(default_factory=list)  # a stacked model: per step, one per replicate
    steps_done: int = 0
    resumed_from: int | None = None
    checkpoint: Path | None = None


def lr_factor(step: int, config: TrainConfig) -> float:
    if config.warmup_steps and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    if config.schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * progress))
    if config.schedule == "linear":
        return 1.0 - progress
    return 1.0


class PerReplicate:
    """A training set per replicate of a stacked model (each replicate's own items, e.g. its own VQ-VAE's codes),
    all of one length: replicate r's batches are drawn from `datasets[r]`."""

    def __init__(self, datasets: Sequence[Sequence]):
        self.datasets = list(datasets)
        if len({len(d) for d in self.datasets}) > 1:
            raise LmlabError("every replicate's training set must have the same length")

    def __len__(self) -> int:
        return len(self.datasets[0]) if self.datasets else 0


def batch_indices(n_examples: int, step: int, micro: int, config: TrainConfig, seed: int | None = None) -> list[int]:
    """The global micro-batch for (step, micro): a per-epoch permutation seeded by (seed, epoch); `seed` defaults
    to the config's (a replicate of a stacked model passes its own)."""
    seed = config.seed if seed is None else seed
    flat = (step * config.grad_accum + micro) * config.batch_size
    out: list[int] = []
    while len(out) < config.batch_size:
        epoch, offset = divmod(flat + len(out), n_examples)
        perm = torch.randperm(n_examples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch),
                              device="cpu")
        take = min(config.batch_size - len(out), n_examples - offset)
        out.extend(perm[offset:offset + take].tolist())
    return out


# --- checkpoints: safetensors only ------------------------------------------------------------------------

CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "state.json")
STATE_TENSORS = "__state__."  # the prefix of a training state's own tensors in optimizer.safetensors


def _checkpoints(out_dir: Path) -> list[Path]:
    """The complete checkpoints, oldest first. One missing a file (damaged after it was written: each is renamed
    into place whole) is passed over, so a resume starts from the last complete one."""
    root = out_dir / "checkpoints"
    found = sorted(root.glob("step-*"), key=lambda p: int(p.name.split("-")[1])) if root.exists() else []
    return [p for p in found if all((p / name).is_file() for name in CHECKPOINT_FILES)]


def checkpoint_path(out_dir: Path, step: int) -> Path:
    """Where the checkpoint of step `step` lies once it is complete."""
    return out_dir / "checkpoints" / f"step-{step:07d}"


def save_checkpoint(out_dir: Path, step: int, model, optimizer, losses: list[float], keep: int = 2,
                    extra: dict | None = None, replicate_losses: list | None = None, final: bool = False,
                    extra_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """A checkpoint folder, written under a temporary name and renamed (a half-written one is never read).
    `final`: the training's last step; nothing will take another step from it, so the optimizer's moments
    (twice the model's size under AdamW) are not written: the weights, losses, RNG state and `extra` are, which is
    all a resume past the end reads."""
    root = out_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".step-", dir=root))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(_dedup_shared(state), tmp / "model.safetensors")
    tensors, meta = {}, None
    if not final:
        opt = optimizer.state_dict()
        meta = {"param_groups": opt["param_groups"], "scalars": {}}
        for pid, entry in opt["state"].items():
            for key, value in entry.items():
                if torch.is_tensor(value):
                    tensors[f"{pid}.{key}"] = value.detach().contiguous().cpu()
                else:
                    meta["scalars"][f"{pid}.{key}"] = value
    tensors["__rng__"] = torch.get_rng_state()
    if not final:  # (a training state's tensors serve only a resume that takes further steps)
        tensors.update({f"{STATE_TENSORS}{name}": value.detach().contiguous().cpu()
                        for name, value in (extra_tensors or {}).items()})
    save_file(tensors, tmp / "optimizer.safetensors")
    (tmp / "state.json").write_text(json.dumps({"step": step, "losses": losses, "optimizer": meta, "extra": extra or {},
                                                **({"replicate_losses": replicate_losses} if replicate_losses else {})}))
    final = checkpoint_path(out_dir, step)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in _checkpoints(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _dedup_shared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied embeddings): store each storage once, cloned."""
    seen, out = {}, {}
    for key, value in state.items():
        ptr = (value.data_ptr(), value.shape)
        out[key] = value.clone() if ptr in seen else value
        seen[ptr] = key
    return out


def load_checkpoint(path: Path, model, optimizer) -> dict:
    model.load_state_dict(load_file(path / "model.safetensors"), strict=True)
    info = json.loads((path / "state.json").read_text())
    tensors = load_file(path / "optimizer.safetensors")
    torch.set_rng_state(tensors.pop("__rng__"))
    info["tensors"] = {key[len(STATE_TENSORS):]: tensors.pop(key)
                       for key in list(tensors) if key.startswith(STATE_TENSORS)}
    if info["optimizer"] is None:  # a final checkpoint: no step will be taken from it
        return info
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = value
    for key, value in info["optimizer"]["scalars"].items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": info["optimizer"]["param_groups"]})
    return info


# --- what several processes must agree on ----------------------------------------------------------------

def _keyed(seeds: list[int], step: int, micro: int, positions: list[int]):
    """One key per example of this process's slice, from (seed, step, micro-step, position in the global batch);
    a stacked model's rows are each replicate's slice in turn, keyed by its own seed."""
    from lmlab.interventions.core import keyed_examples

    keys = []
    for seed in seeds:
        base = zlib.crc32(f"{seed}|{step}|{micro}".encode()) << 20
        keys += [base + p for p in positions]
    return keyed_examples(torch.tensor(keys, dtype=torch.long, device="cpu"))


def share(local_sum: torch.Tensor, local_count: float, global_count: float | None = None) -> torch.Tensor:
    """This process's part of a global mean: local_sum x processes / the count over every process (give
    `global_count` when it is known, to save a reduction). Its mean over processes is sum / count over the
    global batch; alone it is local_sum / local_count."""
    n = group_size()
    total = all_sum([local_count])[0] if global_count is None else global_count
    return local_sum * (n / max(total, 1e-12))


# --- the loop ---------------------------------------------------------------------------------------------

_LOG_ROOT: contextvars.ContextVar[Path | None] = contextvars.ContextVar("lmlab_log_root", default=None)


@contextlib.contextmanager
def log_root(path: Path):
    """Trainings inside this block log their trackers under `path` (a study run's logs/ folder)."""
    token = _LOG_ROOT.set(Path(path))
    try:
        yield
    finally:
        _LOG_ROOT.reset(token)


def train(model: torch.nn.Module, dataset: Sequence, collate: Callable[[list], Any],
          loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], config: TrainConfig, out_dir: str | Path,
          parameters: Sequence[torch.nn.Parameter] | None = None,
          on_step: Callable[[int, float], None] | None = None, state: Any = None,
          after_update: Callable[[int, torch.nn.Module, torch.optim.Optimizer], None] | None = None) -> TrainResult:
    """Train `model` in place; `loss_fn(model, batch)` returns the mean loss of the local batch.

    `state`: an object with `state_dict()` / `load_state_dict()` (e.g. a GECO multiplier) saved in every
    checkpoint's state.json and restored on resume, so a resumed run continues exactly; where it also has
    `tensors()` / `load_tensors(dict)`, those tensors travel in the checkpoint's safetensors beside the optimizer's.
    `on_step(step, loss)`: called after each step; a true return ends the training there (a patience rule), and
    `steps_done` says how many steps it took.
    `after_update(step, model, optimizer)`: called after each optimizer step (the model unwrapped), before the
    checkpoint; it may change the weights and the optimizer's state (e.g. return a replicate to an earlier state).

    A stacked model of k replicates (`config.replicate_seeds`, lmlab.train.ensemble): each step's batch is every
    replicate's own micro-batch in turn (drawn from its seed), `loss_fn` returns k losses (one per replicate, each
    that replicate's mean), their sum is differentiated (the replicates share no weight, so each gets its own
    gradient), and the gradient norm is clipped per replicate.

    In parts: `_set_up` (the accelerator, the optimizer, the replicates' data), `_resume` (the newest
    checkpoint) and `_started` (the model prepared, the trackers), then `_steps`, and per step `_take_step` (every
    micro-batch of every replicate, the update), `_record` (the losses, the trackers) and `_checkpoint`.
    """
    out_dir = Path(out_dir)
    run = _set_up(model, dataset, config, parameters, out_dir)
    result, last_good = _resume(out_dir, model, run.optimizer, config, state)
    model = _started(run, model, config)
    progress = _progress(config, run.acc.is_main_process, result.resumed_from or 0)
    try:
        # the last step's checkpoint (or the one resumed from, when none was left): by its path, not by listing the
        # folder, which rank 0 may already be removing while another process reads it
        result.checkpoint = _steps(run, model, (collate, loss_fn, on_step, after_update), config, out_dir, state,
                                   result, last_good, progress)
    finally:
        progress.close()
        if config.log_with:
            run.acc.end_training()
    model = run.acc.unwrap_model(model)
    model.eval()
    return result


def _steps(run: _Run, model, hooks: tuple, config: TrainConfig, out_dir: Path, state, result: TrainResult, last_good,
           progress) -> Path | None:
    """Every step from where the training resumes to its end, or to where `on_step` ended it (`result.steps_done`
    says which); the last good checkpoint. `hooks`: (collate, loss_fn, on_step, after_update)."""
    collate, loss_fn, on_step, after_update = hooks
    last = result.resumed_from if getattr(state, "stopped", False) else config.steps  # (a hook ended it: no step)
    for step in range(result.resumed_from or 0, last):
        _record(run, result, _take_step(run, model, collate, loss_fn, config, step, last_good), config, step)
        if after_update:
            after_update(step, run.acc.unwrap_model(model), run.optimizer)
        # (before the checkpoint: it may move `state`, which the checkpoint keeps)
        stop = bool(on_step(step, result.losses[-1])) if on_step else False
        progress.advance(result.losses[-1])
        last_good = _checkpoint(run, model, result, config, step, out_dir, state, last_good, stop)
        if stop:  # the hook says the training is done (a patience rule): the steps taken are the steps done
            result.steps_done = step + 1
            return last_good
    result.steps_done = last
    return last_good


def _started(run: _Run, model, config: TrainConfig):
    """The model (and optimizer) prepared by the accelerator and in training mode, each process's dropout stream,
    and the trackers started."""
    model, run.optimizer = run.acc.prepare(model, run.optimizer)
    if run.acc.process_index:  # independent dropout masks per process (rank 0 keeps the one-process stream)
        torch.manual_seed(zlib.crc32(torch.get_rng_state().numpy().tobytes()) + run.acc.process_index)
    model.train()
    if config.log_with:
        run.acc.init_trackers(slug(config.description),  # the tracker's run: e.g. fact-qnli-2-bit-Budget-C-replicate-0
                              config={k: v for k, v in config.model_dump().items() if isinstance(v, (int, float, str))})
    return model


@dataclass
class _Run:
    """What the steps of one training share: the accelerator, the optimizer and its parameters, and each
    replicate's seed and training set."""
    acc: Any
    optimizer: torch.optim.Optimizer
    params: list
    seeds: list[int]
    sets: list
    n_examples: int
    saved_at: float = field(default_factory=lambda: time.monotonic())  # when the last checkpoint was written (or the start)


def _set_up(model, dataset: Sequence, config: TrainConfig, parameters, out_dir: Path) -> _Run:
    """The accelerator (device, precision, processes, trackers), the inputs checked, and AdamW over `parameters`
    (default: every trainable one) in learning-rate groups."""
    from accelerate import Accelerator

    from lmlab.train.ensemble import replicas

    cpu = (not torch.cuda.is_available()) if config.cpu is None else config.cpu
    first = next(model.parameters(), None)
    if first is not None and first.device.type == "cuda" and first.device.index is not None and not _distributed():
        torch.cuda.set_device(first.device.index)  # accelerate's "cuda" is the current device: keep the model's
    _fresh_precision(config.mixed_precision, cpu)
    log_dir = Path(config.log_dir) if config.log_dir else (_LOG_ROOT.get() or out_dir / "logs")
    acc = Accelerator(cpu=cpu, mixed_precision=config.mixed_precision, gradient_accumulation_steps=config.grad_accum,
                      log_with=list(config.log_with) or None, project_dir=str(log_dir) if config.log_with else None)
    if config.batch_size % acc.num_processes:
        raise LmlabError(f"batch size {config.batch_size} is not divisible by {acc.num_processes} processes")
    if len(dataset) == 0:
        raise LmlabError("the training set is empty")
    seeds = list(config.replicate_seeds) or [config.seed]
    k = len(seeds)
    if replicas(model) != (k if config.replicate_seeds else 1):
        raise LmlabError(f"the model holds {replicas(model)} replicate(s) but the training config names {k} seed(s)")
    sets = dataset.datasets if isinstance(dataset, PerReplicate) else [dataset] * k
    if len(sets) != k:
        raise LmlabError(f"{len(sets)} training sets for {k} replicate(s)")
    params = list(parameters) if parameters is not None else [p for p in model.parameters() if p.requires_grad]
    return _Run(acc, _optimizer(model, params, config, parameters is None), params, seeds, sets, len(dataset))


def _optimizer(model, params: list, config: TrainConfig, scaled: bool) -> torch.optim.Optimizer:
    """AdamW; with `config.lr_scale` (and the model's own parameters) one group per learning-rate scale."""
    # the fused kernel: one pass over each tensor instead of a dozen ops (on a CPU, a small model's step several
    # times faster); devices it does not cover keep the default implementation
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params) or None
    groups: list = params
    if config.lr_scale and scaled:
        scale_of = {id(p): next((v for k, v in config.lr_scale.items() if k in name), 1.0)
                    for name, p in model.named_parameters()}
        by_scale: dict[float, list] = {}
        for p in params:
            by_scale.setdefault(scale_of[id(p)], []).append(p)
        groups = [{"params": ps, "lr_scale": s} for s, ps in sorted(by_scale.items())]
    return torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay, fused=fused)


def _resume(out_dir: Path, model, optimizer, config: TrainConfig, state) -> tuple[TrainResult, Path | None]:
    """The newest complete checkpoint loaded into the model, optimizer and `state` (none: a fresh result);
    (the result so far, with `resumed_from` its step, and that checkpoint)."""
    result = TrainResult()
    existing = _checkpoints(out_dir)
    if not existing:
        return result, None
    info = load_checkpoint(existing[-1], model, optimizer)
    if state is not None and info.get("extra"):
        state.load_state_dict(info["extra"])
    if info["optimizer"] is None and info["step"] < config.steps and not getattr(state, "stopped", False):
        raise LmlabError(f"{existing[-1]} ends a finished training of {info['step']} steps (no optimizer state "
                         f"kept); it cannot be continued to {config.steps}: use a new output folder")
    result.losses, result.resumed_from = list(info["losses"]), info["step"]
    result.replicate_losses = [list(x) for x in info.get("replicate_losses", [])]
    if state is not None and hasattr(state, "load_tensors"):
        state.load_tensors(info["tensors"])
    result.checkpoint = existing[-1]
    return result, existing[-1]


def _take_step(run: _Run, model, collate, loss_fn, config: TrainConfig, step: int, last_good) -> list[float]:
    """One optimizer step: this process's slice of every replicate's micro-batches, the update (gradients clipped,
    per replicate for a stacked model); each replicate's loss averaged over processes."""
    from lmlab.train.ensemble import clip_per_replicate

    acc, n_proc, k = run.acc, run.acc.num_processes, len(run.seeds)
    for group in run.optimizer.param_groups:
        group["lr"] = config.lr * lr_factor(step, config) * group.get("lr_scale", 1.0)
    total = torch.zeros(k, device=acc.device)
    for micro in range(config.grad_accum):
        items = [run.sets[r][i] for r, seed in enumerate(run.seeds)
                 for i in batch_indices(run.n_examples, step, micro, config, seed)[acc.process_index::n_proc]]
        batch = _to(collate(items), acc.device)
        positions = list(range(config.batch_size))[acc.process_index::n_proc]
        with acc.accumulate(model), _keyed(run.seeds, step, micro, positions):
            loss = loss_fn(model, batch).reshape(-1)
            if not torch.isfinite(loss).all():
                raise TrainingDiverged(
                    f"the loss became {loss.item() if loss.numel() == 1 else loss.detach().tolist()} at step "
                    f"{step}; " + (f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was kept")
                    + " (lower the learning rate or check the data)")
            acc.backward(loss.sum())
            if acc.sync_gradients and config.max_grad_norm:
                if config.replicate_seeds:
                    clip_per_replicate(run.params, k, config.max_grad_norm)
                else:
                    acc.clip_grad_norm_(run.params, config.max_grad_norm)
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        total += loss.detach() / config.grad_accum
    return acc.reduce(total, reduction="mean").tolist()


def _record(run: _Run, result: TrainResult, per_replicate: list[float], config: TrainConfig, step: int) -> None:
    """The step's losses in the result (the mean over replicates, and each replicate's) and in the trackers."""
    k = len(run.seeds)
    mean_loss = float(sum(per_replicate) / k)
    result.losses.append(mean_loss)
    if config.replicate_seeds:
        result.replicate_losses.append(per_replicate)
    if config.log_with:
        values = {"loss": mean_loss, "lr": config.lr * lr_factor(step, config)}
        values.update({f"loss_replicate_{r}": v for r, v in enumerate(per_replicate) if k > 1})
        run.acc.log(values, step=step + 1)


def _checkpoint(run: _Run, model, result: TrainResult, config: TrainConfig, step: int, out_dir: Path, state,
                last_good, stop: bool = False) -> Path | None:
    """A checkpoint when one is due (every `checkpoint_every` steps, at the end, and where the hook ended the
    training: `stop`; rank 0 writes it); the newest good checkpoint."""
    acc, done = run.acc, step + 1
    end = done == config.steps or stop
    if (config.checkpoint_every and done % config.checkpoint_every == 0) or end or (done % 10 == 0 and
                                                                                   _overdue(run, config)):
        acc.wait_for_everyone()
        if acc.is_main_process:
            save_checkpoint(out_dir, done, acc.unwrap_model(model), run.optimizer, result.losses,
                            config.keep_checkpoints, extra=state.state_dict() if state is not None else None,
                            replicate_losses=result.replicate_losses, final=end,
                            extra_tensors=state.tensors() if hasattr(state, "tensors") else None)
        last_good = checkpoint_path(out_dir, done)  # (every process: the one rank 0 wrote)
        acc.wait_for_everyone()
        run.saved_at = time.monotonic()
    return last_good


def _overdue(run: _Run, config: TrainConfig) -> bool:
    """Whether `config.checkpoint_minutes` have passed since the last checkpoint; under a launch rank 0's clock
    decides for every process (all of them must write, or wait, at the same step)."""
    if not config.checkpoint_minutes:
        return False
    late = time.monotonic() - run.saved_at >= 60 * config.checkpoint_minutes
    if group_size() == 1:
        return late
    return all_sum([late if run.acc.is_main_process else 0.0])[0] > 0


def _distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _fresh_precision(mixed_precision: str, cpu: bool) -> None:
    """accelerate keeps one process-wide state and refuses an Accelerator with another precision or device; a
    second study in the same process (a notebook, `lmlab reproduce`) may ask for one. The precision and the
    device are per-run settings, so the state is cleared before such a run. The device lives in the state of the
    processes (PartialState): after a run on a GPU, a run asked onto the CPU would otherwise get the GPU. That state
    is cleared only outside a launch, whose distributed setup it holds."""
    from accelerate.state import AcceleratorState, PartialState

    shared, device = AcceleratorState._shared_state, PartialState._shared_state.get("device")
    moved = device is not None and (device.type == "cpu") != cpu
    if moved and not _distributed():
        AcceleratorState._reset_state(reset_partial_state=True)
    elif shared and (str(shared.get("_mixed_precision", mixed_precision)) != mixed_precision or moved):
        AcceleratorState._reset_state()


def _to(batch, device):
    if torch.is_tensor(batch):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device) for v in batch)
    return batch


class _progress:
    """A rich progress bar with the loss, on the main process only."""

    def __init__(self, config: TrainConfig, main: bool, start: int):
        self.bar = None
        if config.progress and main:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(config.description, total=config.steps, completed=start, loss="-")

    def advance(self, loss: float) -> None:
        if self.bar:
            self.bar.update(self.task, advance=1, loss=f"{loss:.4f}")

    def close(self) -> None:
        if self.bar:
            self.bar.stop()
