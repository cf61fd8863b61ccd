"""Training curves through accelerate's trackers (--log-with), read back from TensorBoard's event files."""

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import load_model
from lmlab.studies import quantize as s2
from lmlab.studies import run_study
from lmlab.studies.runtime import check_trackers
from lmlab.train import TrainConfig, train

pytest.importorskip("tensorboard", reason="the trackers extra (make setup installs it)")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the event files under `folder` (all of a resumed training's files)."""
    out: dict[str, list] = {}
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {k: sorted(v) for k, v in out.items()}


def test_every_step_of_a_training_is_in_its_tensorboard_events_and_a_resume_adds_the_rest(tmp_path):
    lm = load_model("tiny-llama")
    texts = [torch.randint(3, 200, (10,), generator=torch.Generator().manual_seed(i)) for i in range(12)]
    cfg = TrainConfig(steps=6, batch_size=4, lr=3e-3, checkpoint_every=2, progress=False, log_with=["tensorboard"],
                      log_dir=str(tmp_path / "logs"), description="tiny run 1")

    def stop_at_4(step, loss):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # stopped after its step-4 checkpoint; the same call resumes
        train(lm.model, texts, torch.stack, lambda m, b: m(input_ids=b, labels=b).loss, cfg, tmp_path / "w",
              on_step=stop_at_4)
    result = train(lm.model, texts, torch.stack, lambda m, b: m(input_ids=b, labels=b).loss, cfg, tmp_path / "w")
    assert result.resumed_from == 4
    logged = _scalars(tmp_path / "logs" / "tiny-run-1")
    steps = sorted({s for s, _ in logged["loss"]})
    assert steps == list(range(1, 7))  # every step once the resume has logged 5 and 6 (step 5 logged twice: kept)
    last = {s: v for s, v in logged["loss"]}
    assert [last[s] for s in steps] == pytest.approx(result.losses, rel=1e-6)
    assert [v for _, v in logged["lr"]][:2] == pytest.approx([3e-3, 3e-3 * 0.5 * (1 + __import__("math").cos(
        __import__("math").pi / 6))], rel=1e-6)


def test_a_studys_trainings_log_under_its_run_folder_which_the_option_does_not_rename(tmp_path):
    kw = dict(model="tiny-bert", tasks=["fact-cola"], n_train=32, n_eval=16, batch_size=16, bits=[2], budgets=["A"],
              teacher_epochs=2, seeds=1)
    logged = run_study(s2.SPEC, s2.Config(**kw, log_with=["tensorboard"]), tmp_path)
    assert run_study(s2.SPEC, s2.Config(**kw), tmp_path).path == logged.path  # the same run: found complete
    runs = {p.name: _scalars(p) for p in (logged.path / "logs").iterdir()}
    scores = logged.long()[logged.long().kind == "score"]
    student = scores[scores.bits == 2].iloc[0]
    assert set(runs) == {"teacher-fact-cola", "fact-cola-2-bit-Budget-A-replicate-0"}
    assert [s for s, _ in runs["fact-cola-2-bit-Budget-A-replicate-0"]["loss"]] == list(range(1, int(student.steps) + 1))
    assert len(runs["teacher-fact-cola"]["loss"]) == 2 * 2  # 2 epochs of 32 examples at batch 16


def test_an_unknown_or_missing_tracker_is_one_sentence(monkeypatch):
    with pytest.raises(LmlabError, match="unknown tracker 'tensorbored' for --log-with; use tensorboard, wandb"):
        check_trackers(["tensorbored"])
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in ("tensorboard", "wandb") else real(n, *a))
    with pytest.raises(LmlabError, match=r"--log-with tensorboard needs the tensorboard package: pip install "
                                         r"'lmlab\[trackers\]'"):
        check_trackers(["tensorboard"])
    with pytest.raises(LmlabError, match="--log-with wandb needs the wandb package: pip install wandb"):
        s2.Config(model="tiny-bert", log_with=["wandb"]).check_inputs()


def test_stacked_replicates_log_each_replicates_loss(tmp_path):
    """A stacked model (S0's and the S4 toy's trainings) logs the mean loss and every replicate's own."""
    from test_ensemble import SEEDS, _collate, _data, _loss, _models

    from lmlab.train.ensemble import stack

    cfg = TrainConfig(steps=4, batch_size=6, lr=3e-3, progress=False, replicate_seeds=SEEDS, log_with=["tensorboard"],
                      log_dir=str(tmp_path / "logs"), description="toy (3 replicates)")
    result = train(stack(_models()), _data(), _collate, _loss, cfg, tmp_path / "w")
    logged = _scalars(tmp_path / "logs" / "toy-3-replicates")
    assert [s for s, _ in logged["loss"]] == [1, 2, 3, 4]
    for r in range(3):
        assert [v for _, v in logged[f"loss_replicate_{r}"]] == pytest.approx([x[r] for x in result.replicate_losses],
                                                                               rel=1e-6)
