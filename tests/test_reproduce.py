import json

import pandas as pd
import pytest

from lmlab.report import build_report
from lmlab.studies import load_result
from lmlab.reproduce import reproduce
from lmlab.studies import filler as filler_study
from lmlab.studies import quantize
from lmlab.studies.filler import measure as filler

from helpers import interrupt_on_call

TINY = {"knockout": "tiny-llama", "filler": "tiny-llama", "quantize": "tiny-bert"}
ONLY = ["knockout", "quantize", "filler"]  # sparse-circuits needs a real tokenizer (single-token names); it has its own end-to-end test
SMALL = {"knockout": dict(datasets=["geo-capital"], per_dataset=12),
         "filler": dict(n_test_per_level=2, n_dev_per_level=1, sweep_problems=2, profile_problems=2, max_new_tokens=4,
                        sweep_lengths=[5]),
         "quantize": dict(tasks=["fact-qnli"], n_train=16, n_eval=12, batch_size=8)}


def _tables(outcomes):
    return {o.study: load_result(o.path).long() for o in outcomes}


def test_killed_reproduce_finishes_with_the_same_tables(tmp_path, monkeypatch):
    whole = reproduce(tmp_path / "a", only=ONLY, models=TINY, overrides=SMALL, say=lambda s: None)
    assert [o.status for o in whole] == ["ok"] * len(whole)
    real = interrupt_on_call(monkeypatch, filler, "greedy_answers", 3)
    with pytest.raises(KeyboardInterrupt):
        reproduce(tmp_path / "b", only=ONLY, models=TINY, overrides=SMALL, say=lambda s: None)
    monkeypatch.setattr(filler, "greedy_answers", real)
    again = reproduce(tmp_path / "b", only=ONLY, models=TINY, overrides=SMALL, say=lambda s: None)
    assert [o.study for o in again] == ["knockout", "quantize", "filler"]
    assert [o.resumed for o in again] == [True, True, False]  # filler was killed; the two before it had finished
    for name, table in _tables(whole).items():
        pd.testing.assert_frame_equal(_tables(again)[name], table, check_dtype=False)


def test_a_failing_study_does_not_stop_the_others_and_shows_in_the_report(tmp_path):
    models = dict(TINY, knockout="no-such-model")
    outcomes = reproduce(tmp_path, only=ONLY, models=models, overrides=SMALL, say=lambda s: None)
    status = {o.study: o.status for o in outcomes}
    assert status["knockout"] == "failed" and status["filler"] == "ok" and status["quantize"] == "ok"
    assert "unknown model 'no-such-model'" in outcomes[0].reason
    summary = json.loads((tmp_path / "reproduce.json").read_text())
    assert [s["status"] for s in summary["studies"]] == ["failed", "ok", "ok"]  # knockout, quantize, filler
    page = build_report([tmp_path], tmp_path / "report.html").read_text()
    assert "unknown model &#39;no-such-model&#39;" in page and page.count('class="v failed"') >= 2
    assert "data:image/png;base64," in page and "http" not in page.split("<body>")[1].split("data:image")[0]
    assert quantize.SPEC.title in page and filler_study.SPEC.title in page
