"""`make gpu-check`'s own plumbing (lmlab/gpucheck.py), on the CPU: what it reports of a suite cut short, and that
every study it runs has its tiny sizes for `--small`."""

import subprocess
import sys
import time

from lmlab import gpucheck


def test_a_suite_cut_short_still_names_what_failed(tmp_path):
    lines = ["[gw0] [ 10%] PASSED tests/test_a.py::test_one", "[gw1] [ 20%] FAILED tests/test_a.py::test_two[cuda]",
             "[gw0] [ 30%] SKIPPED tests/test_b.py::test_three"]
    code = f"import time\nprint({chr(10).join(lines)!r}, flush=True)\ntime.sleep(60)\n"
    log = open(tmp_path / "suite.log", "w")
    handle = (subprocess.Popen([sys.executable, "-c", code], stdout=log), log, time.perf_counter())
    time.sleep(1.5)
    row = gpucheck.finish_suite(handle, tmp_path, limit=3)
    assert row["exit"] is None and row["seconds"] < 30
    assert row["result"] == "cut short: 1 passed, 1 failed, 0 error, 1 skipped"
    assert row["failures"] == ["FAILED tests/test_a.py::test_two[cuda]"]


def test_a_finished_suite_reports_pytests_own_line_and_time(tmp_path):
    code = ("print('[gw0] [100%] FAILED tests/test_a.py::test_two')\nprint('FAILED tests/test_a.py::test_two - boom')\n"
            "print('=== 1 failed, 3 passed in 12.50s ===')\nraise SystemExit(1)\n")
    log = open(tmp_path / "suite.log", "w")
    handle = (subprocess.Popen([sys.executable, "-c", code], stdout=log), log, time.perf_counter())
    row = gpucheck.finish_suite(handle, tmp_path, limit=60)
    assert row["exit"] == 1 and row["seconds"] == 12.5 and row["result"] == "1 failed, 3 passed in 12.50s"
    assert row["failures"] == ["FAILED tests/test_a.py::test_two", "FAILED tests/test_a.py::test_two - boom"]


def test_every_study_of_the_check_has_its_tiny_sizes():
    names = [name for lane in gpucheck.LANES + [gpucheck.model_lane('m.gguf')] for name, _, _ in lane]
    assert sorted(names) == sorted(gpucheck.SMALL) and len(set(names)) == len(names)


def test_a_claim_reads_in_one_line_on_its_display_scale():
    claim = {"name": "E_Q flips - control flips", "group": "geo", "source": "paper", "estimate": 0.0116,
             "low": -0.0175, "high": 0.0407, "scale": 100.0, "unit": " pts", "replicates": 5, "decision": "open"}
    assert gpucheck.claim_line(claim) == ("E_Q flips - control flips (geo) [paper]: +1.16 pts [-1.75, +4.07] "
                                          "over 5 replicate(s): open")
