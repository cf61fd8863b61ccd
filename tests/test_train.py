import json
import sys
from pathlib import Path

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import load_model
from lmlab.train import TrainConfig, TrainingDiverged, train
from lmlab.train.loop import batch_indices

WORKER = Path(__file__).parent / "workers" / "train_worker.py"


def _data(lm):
    texts = ["When Mary and John went to the store", "The war lasted from the year 1732", "the capital of France",
             "def f(name, value): return value", "12 + 34 = 46", "Anna gave a drink to Tom"] * 2
    return [torch.nn.functional.pad(torch.tensor(lm.tokenizer(t)["input_ids"][:10]),
                                    (0, 10 - len(lm.tokenizer(t)["input_ids"][:10])), value=1) for t in texts]


def _loss(model, batch):
    return model(input_ids=batch, labels=batch).loss


def test_batches_depend_only_on_seed_and_cover_every_example_each_epoch():
    cfg = TrainConfig(steps=3, batch_size=4, seed=5)
    epoch = [i for s in range(3) for i in batch_indices(12, s, 0, cfg)]
    assert sorted(epoch) == list(range(12))
    assert batch_indices(12, 1, 0, cfg) == batch_indices(12, 1, 0, TrainConfig(steps=9, batch_size=4, seed=5))


def _interrupted_at(stop: int, lm, cfg, out) -> None:
    """A training of tiny-llama into `out` stopped (KeyboardInterrupt) at step `stop`."""
    def on_step(step, loss):
        if step == stop:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg, out, on_step=on_step)


def test_resume_after_interruption_gives_the_uninterrupted_curve(tmp_path):
    lm = load_model("tiny-llama")
    cfg = TrainConfig(steps=6, batch_size=4, lr=3e-3, checkpoint_every=2, progress=False)
    full = train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg, tmp_path / "full")

    _interrupted_at(3, lm, cfg, tmp_path / "cut")
    fresh = load_model("tiny-llama").model
    resumed = train(fresh, _data(lm), torch.stack, _loss, cfg, tmp_path / "cut")
    assert resumed.resumed_from == 2
    assert resumed.losses == pytest.approx(full.losses, abs=1e-6)
    assert (resumed.checkpoint / "model.safetensors").exists()
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.bin"))  # no pickles


def test_a_long_training_also_checkpoints_by_the_clock_and_resumes_from_there(tmp_path, monkeypatch):
    """Besides every `checkpoint_every` steps, a checkpoint once `checkpoint_minutes` have passed since the last (the
    clock read every 10th step): on a clock that moves 2 minutes a step, at 10 minutes, the 10th step writes one
    (none by steps), and a run stopped in its 13th step resumes from the 10th with the uninterrupted curve."""
    from types import SimpleNamespace

    from lmlab.train import loop

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(loop, "time", SimpleNamespace(monotonic=lambda: clock.now))
    lm = load_model("tiny-llama")
    cfg = TrainConfig(steps=14, batch_size=4, lr=3e-3, checkpoint_minutes=10, progress=False)
    full = train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg, tmp_path / "full")

    def tick(step, loss):
        clock.now += 2 * 60
        if step == 12:
            raise KeyboardInterrupt

    clock.now = 0.0
    with pytest.raises(KeyboardInterrupt):
        train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg, tmp_path / "cut", on_step=tick)
    assert [p.name for p in (tmp_path / "cut" / "checkpoints").glob("step-*")] == ["step-0000010"]
    resumed = train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg, tmp_path / "cut")
    assert resumed.resumed_from == 10
    assert resumed.losses == pytest.approx(full.losses, abs=1e-6)


def test_a_finished_trainings_checkpoint_keeps_no_optimizer_moments_and_resumes_past_its_end(tmp_path):
    """The last checkpoint holds the weights, losses and RNG state (what reading a finished training needs), not
    AdamW's two moments; a rerun reads it and takes no step; asking it for more steps is refused."""
    from safetensors.torch import load_file

    lm = load_model("tiny-llama")
    cfg = TrainConfig(steps=4, batch_size=4, lr=3e-3, checkpoint_every=2, progress=False)
    model = load_model("tiny-llama").model
    full = train(model, _data(lm), torch.stack, _loss, cfg, tmp_path / "run")
    after_training = torch.rand(3)
    steps = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert [p.name for p in steps] == ["step-0000002", "step-0000004"]
    assert len(load_file(steps[0] / "optimizer.safetensors")) > 1  # the moments, to continue from step 2
    assert list(load_file(steps[1] / "optimizer.safetensors")) == ["__rng__"]
    again_model = load_model("tiny-llama").model
    again = train(again_model, _data(lm), torch.stack, _loss, cfg, tmp_path / "run")
    assert again.resumed_from == 4 and again.losses == full.losses
    assert torch.equal(torch.rand(3), after_training)  # the RNG stream goes on as after the training itself
    for a, b in zip(model.state_dict().values(), again_model.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(LmlabError, match="ends a finished training of 4 steps .* cannot be continued to 6"):
        train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg.model_copy(update={"steps": 6}),
              tmp_path / "run")


def test_a_checkpoint_missing_its_state_file_is_passed_over_and_the_run_resumes_from_the_one_before(tmp_path):
    lm = load_model("tiny-llama")
    cfg = TrainConfig(steps=6, batch_size=4, lr=3e-3, checkpoint_every=2, progress=False, keep_checkpoints=3)
    full = train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg, tmp_path / "full")

    _interrupted_at(5, lm, cfg, tmp_path / "cut")
    (tmp_path / "cut" / "checkpoints" / "step-0000004" / "state.json").unlink()  # damaged after it was written
    resumed = train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg, tmp_path / "cut")
    assert resumed.resumed_from == 2
    assert resumed.losses == pytest.approx(full.losses, abs=1e-6)


def test_nan_loss_stops_clearly_and_keeps_the_last_good_checkpoint(tmp_path):
    lm = load_model("tiny-llama")
    cfg = TrainConfig(steps=5, batch_size=4, checkpoint_every=2, progress=False)

    def loss(model, batch):
        value = _loss(model, batch)
        return value * float("nan") if loss.calls >= 3 else value

    loss.calls = 0

    def count(step, value):
        loss.calls += 1

    with pytest.raises(TrainingDiverged, match="loss became nan at step 3; the last good checkpoint is .*step-0000002"):
        train(lm.model, _data(lm), torch.stack, loss, cfg, tmp_path, on_step=count)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-0000002"]


def _one_and_two(script: Path, tmp_path: Path, *extra: str) -> None:
    """`script OUT JSON` alone (OUT = a, JSON = one.json) and under torchrun with two CPU processes (gloo; b,
    two.json; `extra` arguments after), side by side, one thread each."""
    from helpers import run_at_once

    from helpers import launch_env

    env = launch_env()
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    runs = run_at_once([[sys.executable, str(script), str(tmp_path / "a"), str(tmp_path / "one.json")],
                        [*launch, str(script), str(tmp_path / "b"), str(tmp_path / "two.json"), *extra]], env, timeout=300)
    for done in runs:
        assert done.returncode == 0, done.stderr[-2000:]


def test_one_and_two_processes_follow_the_same_loss_curve(tmp_path):
    """The same curve; and every process returns the final checkpoint, though rank 1 lingers after each barrier and
    rank 0 removes the folder as soon as training returns (a study does: once a process read the folder then, and
    its listing came back short)."""
    _one_and_two(WORKER, tmp_path, "late")
    a, b = json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "two.json").read_text())
    assert len(a["losses"]) == len(b["losses"]) == 6 and a["losses"][-1] < a["losses"][0]
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-4, abs=1e-4)
    assert a["checkpoints"] == [str(tmp_path / "a" / "checkpoints" / "step-0000006")]
    assert b["checkpoints"] == [str(tmp_path / "b" / "checkpoints" / "step-0000006")] * 2
    assert not (tmp_path / "b").exists()


def test_a_studys_training_over_two_processes_follows_the_one_process_curve(tmp_path):
    """S4's toy training (the study's model, data and settings) with 2 CPU processes (gloo, torchrun) against
    one process. (`accelerate launch --cpu --num_processes 2` starts one process without mpirun: the worker
    reports how many processes it ran in.)"""
    worker = Path(__file__).parent / "workers" / "toy_worker.py"
    _one_and_two(worker, tmp_path)
    a, b = json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "two.json").read_text())
    assert (a["processes"], b["processes"]) == (1, 2)
    assert len(a["losses"]) == len(b["losses"]) == 5 and a["losses"][-1] < a["losses"][0]
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-4, abs=1e-4)


def _curves(tmp_path, worker: str) -> tuple[dict, dict]:
    """The worker's JSON alone and under torchrun with two CPU processes (gloo)."""
    script = Path(__file__).parent / "workers" / worker
    _one_and_two(script, tmp_path)
    out = [json.loads((tmp_path / f"{name}.json").read_text()) for name in ("one", "two")]
    assert (out[0]["processes"], out[1]["processes"]) == (1, 2)
    return out[0], out[1]


def test_sparse_post_training_over_two_processes_follows_the_one_process_curve(tmp_path):
    """S4's post-training (edge gates, GECO with a per-batch bound, token-weighted CE) on texts of different lengths:
    every process's slice is padded to its own length and draws its own gate noise, yet the loss, the multiplier's
    trace and the edges kept follow one process's within 1e-4 (noise keyed per example; every term reduced over the
    processes)."""
    a, b = _curves(tmp_path, "sparse_worker.py")
    assert len(a["losses"]) == len(b["losses"]) == 4
    assert a["history"][-1]["kept_edges"] < a["history"][0]["kept_edges"]  # the gates moved
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-4, abs=1e-4)
    for x, y in zip(a["geco"], b["geco"]):
        assert x == pytest.approx(y, rel=1e-4, abs=1e-4)
    for x, y in zip(a["history"], b["history"]):
        assert x == pytest.approx(y, rel=1e-4, abs=1e-4)


def test_a_quantized_student_over_two_processes_follows_the_one_process_curve(tmp_path):
    """One S2 student (2-bit, KD on logits + attention scores + hidden states, teacher cache) with two processes:
    the feature terms are token-weighted over the global batch, so the curve is one process's within 1e-4 (weighted
    per process instead, it moved by 2.7e-3)."""
    a, b = _curves(tmp_path, "kd_worker.py")
    assert len(a["losses"]) == len(b["losses"]) == 6 and a["losses"][-1] < a["losses"][0]
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-4, abs=1e-4)


def test_a_run_asked_onto_the_cpu_after_one_on_an_accelerator_trains_on_the_cpu(tmp_path):
    """accelerate keeps the processes' device for the whole process: after a run on a GPU, a run asked onto the CPU
    (`TrainConfig(cpu=True)`) got the GPU and fed its batches there while its model stayed on the CPU (the test
    below failed so on an H100, after a GPU run in the same worker). Here 'meta' stands in for the earlier device."""
    from accelerate.state import AcceleratorState, PartialState

    from lmlab.train.loop import _set_up

    lm = load_model("tiny-llama", device="cpu")
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState()
    PartialState._shared_state["device"] = torch.device("meta")
    try:
        run = _set_up(lm.model, _data(lm), TrainConfig(steps=1, batch_size=4, progress=False, cpu=True), None, tmp_path)
        assert run.acc.device.type == "cpu"
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_the_loops_parts_each_do_their_one_thing(tmp_path):
    """The loop in parts (lmlab.train.loop): set-up refuses what cannot train, resume finds nothing in a new folder and
    the newest checkpoint in an old one, one step's loss is the batch's loss before the update (which moves the
    weights), and the record keeps each step's loss."""
    import copy

    from lmlab.train.loop import TrainResult, _record, _resume, _set_up, _take_step

    lm = load_model("tiny-llama", device="cpu")  # (the parts alone, on the CPU: `train` moves the model, they do not)
    data = _data(lm)
    cfg = TrainConfig(steps=4, batch_size=4, checkpoint_every=2, progress=False, cpu=True)
    with pytest.raises(LmlabError, match="the training set is empty"):
        _set_up(lm.model, [], cfg, None, tmp_path)
    with pytest.raises(LmlabError, match="holds 1 replicate.* names 2 seed"):
        _set_up(lm.model, data, cfg.model_copy(update={"replicate_seeds": [1, 2]}), None, tmp_path)
    model = copy.deepcopy(lm.model)
    run = _set_up(model, data, cfg, None, tmp_path / "fresh")
    assert _resume(tmp_path / "fresh", model, run.optimizer, cfg, None) == (TrainResult(), None)
    before = [p.detach().clone() for p in model.parameters()]
    batch = torch.stack([data[i] for i in batch_indices(len(data), 0, 0, cfg)])
    with torch.no_grad():
        expected = _loss(model, batch).item()
    model.train()
    (loss,) = _take_step(run, model, torch.stack, _loss, cfg, 0, None)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    result = TrainResult()
    _record(run, result, [loss], cfg, 0)
    assert result.losses == [loss] and result.replicate_losses == []
    whole = train(copy.deepcopy(lm.model), data, torch.stack, _loss, cfg, tmp_path / "old")
    again, newest = _resume(tmp_path / "old", copy.deepcopy(lm.model), run.optimizer, cfg, None)
    assert again.resumed_from == 4 and newest.name == "step-0000004" and again.losses == whole.losses


class _Patience:
    """A hook and state ending the training at `stop_at` steps (as a patience rule does), its `stopped` kept in the
    checkpoint."""

    def __init__(self, stop_at: int):
        self.stop_at, self.stopped, self.calls = stop_at, False, 0

    def __call__(self, step, loss):
        self.calls += 1
        self.stopped = step + 1 >= self.stop_at
        return self.stopped

    def state_dict(self):
        return {"stopped": self.stopped}

    def load_state_dict(self, state):
        self.stopped = state["stopped"]


def test_a_hook_that_returns_true_ends_the_training_there_and_a_rerun_takes_no_step(tmp_path):
    """A patience rule (a hook returning True) ends a 10-step training at step 3: three losses, `steps_done` 3, a
    checkpoint where it ended; the same command again resumes there, takes no step and holds the same weights."""
    lm = load_model("tiny-llama")
    cfg = TrainConfig(steps=10, batch_size=4, lr=3e-3, checkpoint_every=4, progress=False)
    model = load_model("tiny-llama").model
    hook = _Patience(3)
    done = train(model, _data(lm), torch.stack, _loss, cfg, tmp_path / "run", on_step=hook, state=hook)
    assert done.steps_done == 3 and len(done.losses) == 3 and done.checkpoint.name == "step-0000003"
    again_model, again_hook = load_model("tiny-llama").model, _Patience(3)
    again = train(again_model, _data(lm), torch.stack, _loss, cfg, tmp_path / "run", on_step=again_hook,
                  state=again_hook)
    assert again.resumed_from == 3 and again.steps_done == 3 and again_hook.calls == 0
    assert again.losses == done.losses
    for a, b in zip(model.state_dict().values(), again_model.state_dict().values()):
        assert torch.equal(a, b)
    whole = train(load_model("tiny-llama").model, _data(lm), torch.stack, _loss, cfg, tmp_path / "whole")
    assert whole.steps_done == 10 and whole.losses[:3] == pytest.approx(done.losses, abs=1e-6)
