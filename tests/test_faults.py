"""Faults survived, counted: every study on a tiny model killed (SIGKILL) at 20 points spread over its phases
(training steps, checkpoints and files renamed into place, units appended to partial tables, some appends torn
mid-line), resumed after each kill, and its final tables, figures and verdict compared with the same study run
once without a kill (tests/faults.py says how the points are chosen)."""

from pathlib import Path

import pandas as pd
import pytest

from helpers import launch_env
from lmlab.studies.result import load_result

pytestmark = pytest.mark.faults
KILLS = 20


def _run_folder(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if p.is_dir() and (p / "manifest.json").is_file()]
    return folder


def _untimed(summary: str) -> str:
    """A verdict's text without what it says of time (what would decide, priced at the run's own pace: a killed
    run's pace counts its lost work)."""
    import re

    return re.sub(r"\d[\d.,]* ?(s|min|h|hours?|minutes?|seconds?)\b", "T", summary.split("to decide:")[0])


def _tables_equal(a, b) -> None:
    assert sorted(a.tables) == sorted(b.tables)
    for name in a.tables:  # wall times aside
        x, y = (t.reset_index(drop=True).drop(columns=[c for c in t if str(c).startswith("seconds")])
                for t in (a.tables[name], b.tables[name]))
        pd.testing.assert_frame_equal(x, y, check_exact=False, rtol=1e-6, atol=1e-9, obj=name)


@pytest.mark.parametrize("study", ["knockout", "quantize", "filler", "sparse_circuits", "latent"])
def test_a_study_killed_at_20_points_resumes_to_the_uninterrupted_tables(tmp_path, study):
    from faults import kill_and_resume

    report = kill_and_resume(study, tmp_path, kills=KILLS, seed=0)
    print(f"\n{study}: {len(report['made'])} kills survived ({report['kinds']}; {report['torn']} torn appends) "
          f"out of {report['events']} events")
    assert not report["missed"], report["missed"]
    assert len(report["made"]) == KILLS
    assert all(report["kinds"][k] >= min(2, report["available"][k]) for k in report["kinds"]), report
    whole, killed = (_run_folder(tmp_path / name) for name in ("whole", "killed"))
    assert whole.name == killed.name
    a, b = load_result(whole), load_result(killed)
    _tables_equal(a, b)
    assert a.verdict.status == b.verdict.status
    assert _untimed(a.verdict.summary) == _untimed(b.verdict.summary)
    visible = {p.name for p in whole.iterdir() if not p.name.startswith((".", "log"))}
    assert visible == {p.name for p in killed.iterdir() if not p.name.startswith((".", "log"))}



@pytest.mark.parametrize("study", ["knockout", "quantize"])
def test_a_full_disk_stops_the_run_in_one_sentence_and_it_resumes_once_there_is_room(tmp_path, study):
    """Writes fail (ENOSPC) from a unit's append or a file's rename on: the run stops with one sentence naming
    the file, exit 2, and leaves nothing a resume takes for complete; with room again the same run finishes with
    the uninterrupted tables."""
    from faults import disk_fills

    report = disk_fills(study, tmp_path, points=3, seed=1)
    assert len(report["targets"]) == 3
    for target, said, code in zip(report["targets"], report["said"], report["codes"]):
        assert code == 2 and said is not None, (target, code)
        assert "\n" not in said and said.startswith("cannot write ") and "No space left on device" in said, said
        assert "run the same command again to resume" in said
    whole = load_result(_run_folder(tmp_path / "whole"))
    for folder in report["folders"]:
        again = load_result(_run_folder(folder))
        _tables_equal(whole, again)
        assert whole.verdict.status == again.verdict.status

# A terminal's shell starts a command with Ctrl-C at its default; a command started in the background of a script
# (as `bash .ci/run &` starts pytest) inherits SIGINT ignored, and so would the run below, finishing through the
# test's Ctrl-C with exit 0. The first line gives it the terminal's Ctrl-C whatever started the tests.
REPRODUCE = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
             "import sys\nsys.path.insert(0, sys.argv[2])\nfrom test_reproduce import ONLY, SMALL, TINY\n"
             "from lmlab.reproduce import reproduce\n"
             "reproduce(sys.argv[1], only=ONLY, models=TINY, overrides=SMALL, say=print, jobs=2)\n")


@pytest.fixture(scope="module")
def reproduced_whole(tmp_path_factory):
    """The three tiny studies of test_reproduce, one at a time, uninterrupted: {study: long table}. One thread, as
    each study process of the `--jobs 2` runs below has (launch_env; outside xdist this process has two, and a
    second thread moves a trained loss's fourth digit)."""
    import torch
    from test_reproduce import ONLY, SMALL, TINY

    from lmlab.reproduce import reproduce

    out, threads = tmp_path_factory.mktemp("whole"), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {o.study: load_result(o.path).long() for o in
                reproduce(out, only=ONLY, models=TINY, overrides=SMALL, say=lambda s: None)}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("how", ["ctrl-c", "the parent killed"])
def test_reproduce_with_two_jobs_interrupted_then_run_again_finishes_with_the_same_tables(tmp_path, how,
                                                                                          reproduced_whole):
    """`reproduce --jobs 2` stopped while both study processes work: by Ctrl-C (SIGINT to the process group, as a
    terminal sends it) or by SIGKILL to the parent alone (its studies die with it: none keeps running unseen);
    the same command again finishes, each study resuming, with the tables of an uninterrupted run."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    tests = str(Path(__file__).parent)
    env = launch_env()
    command = [sys.executable, "-c", REPRODUCE, str(tmp_path), tests]
    proc = subprocess.Popen(command, start_new_session=True, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob("*/partial/*.jsonl")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, ("finished before any interruption", proc.communicate())
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len([c for c in children if "python" in c.name().lower()]) >= 2
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGKILL)
    said = proc.communicate(timeout=60)
    assert proc.returncode != 0, ("the interrupted run finished", said[1][-2000:])
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert not alive, [p.cmdline() for p in alive]  # no study left running without its parent
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "reproduce.json").read_text())
    assert [s["status"] for s in summary["studies"]] == ["ok"] * 3
    starts = [(Path(s["path"]) / "log.txt").read_text().count(" start ") for s in summary["studies"]]
    assert max(starts) >= 2, starts  # a study cut by the interruption started again and resumed
    for s in summary["studies"]:
        table, whole = load_result(Path(s["path"])).long(), reproduced_whole[s["study"]]
        num = whole.select_dtypes("number").columns  # (one thread here, two there: the last digits may move)
        pd.testing.assert_frame_equal(table.drop(columns=num), whole.drop(columns=num), check_dtype=False)
        pd.testing.assert_frame_equal(table[num], whole[num], check_dtype=False, atol=1e-4, rtol=1e-4)


def test_a_training_study_killed_under_a_two_process_launch_resumes_under_it(tmp_path):
    """S0 (the scratch model's trainings, data-parallel) launched over two processes and killed (SIGKILL to the
    whole launch) once a checkpoint is written; the same launch again resumes every process from rank 0's
    checkpoints and writes the tables of one process (within 1e-4: DDP sums gradients in another order)."""
    import signal
    import subprocess
    import time

    from helpers import run_at_once
    from test_parallel import ENV, _command

    out = tmp_path / "two"
    proc = subprocess.Popen(_command("latent", out, tmp_path / "two.json", 2), env=ENV, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list(out.glob("*/*/checkpoints/step-*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the launch finished before it could be killed"
    # torchrun starts its workers in sessions of their own: the launcher, its workers and theirs all at once, as a
    # machine that goes down would
    import psutil

    tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    for p in tree:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=30)
    proc.wait(timeout=60)
    (run,) = out.iterdir()
    assert not (run / "manifest.json").exists()
    one, two = run_at_once([_command("latent", tmp_path / "one", tmp_path / "one.json", 1),
                            _command("latent", out, tmp_path / "two.json", 2)], ENV)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    assert (run / "log.txt").read_text().count(" start ") == 2  # the killed session and the resumed one
    a, b = load_result(_run_folder(tmp_path / "one")), load_result(run)
    assert sorted(a.tables) == sorted(b.tables)
    for name in a.tables:
        x, y = (t.reset_index(drop=True).drop(columns=[c for c in t if str(c).startswith("seconds")])
                for t in (a.tables[name], b.tables[name]))
        pd.testing.assert_frame_equal(x, y, check_exact=False, atol=1e-4, rtol=1e-4, obj=name)
    assert a.verdict.status == b.verdict.status
