import json

import pandas as pd
import pytest

from lmlab import LmlabError
from lmlab.runs import RunDir, config_hash
from lmlab.studies import StudyConfig, StudySpec, Verdict, run_study


class ToyConfig(StudyConfig):
    n: int = 6


class Boom(Exception):
    pass


def make_spec(calls, fail_after=None):
    def run(config, run, lm=None):
        done = run.done("units")
        rows = [r for rs in done.values() for r in rs]
        for i in range(config.n):
            if str(i) in done:
                continue
            if fail_after is not None and len(calls) >= fail_after:
                raise Boom()
            calls.append(i)
            import torch

            row = {"kind": "units", "unit": i, "value": float(torch.rand(()).item() + i)}
            run.record("units", i, [row])
            rows.append(row)
        return pd.DataFrame(rows).sort_values("unit").reset_index(drop=True)

    def figure(result, fig=None):
        from lmlab.studies.figures import canvas

        table = result.table("units")
        fig, ax = canvas(fig, (4, 3))
        ax.plot(table["unit"], table["value"])
        return fig

    def verdict(result):
        table = result.table("units")
        ok = bool((table["value"].diff().dropna() > 0).all())
        return Verdict(status="reproduced" if ok else "not reproduced", claim="values rise",
                       summary=f"{len(table)} units", evidence={"n": len(table)})

    return StudySpec("toy", "Toy", "nobody 2026", "none", ToyConfig, run, figure, verdict, "tiny-llama")


def test_same_seed_same_table_and_files(tmp_path):
    a = run_study(make_spec([]), ToyConfig(model="tiny-llama", seed=3), tmp_path / "a")
    b = run_study(make_spec([]), ToyConfig(model="tiny-llama", seed=3), tmp_path / "b")
    pd.testing.assert_frame_equal(a.table("units"), b.table("units"))
    names = {p.name for p in a.path.iterdir()}
    assert {"config.yaml", "tables", "meta.json", "figure.png", "figure.svg", "verdict.json",
            "log.txt", "manifest.json"} <= names
    assert {p.name for p in (a.path / "tables").iterdir()} == {"units.csv", "units.parquet"}
    assert json.loads((a.path / "verdict.json").read_text())["overall"]["status"] == "reproduced"


def test_an_interrupted_run_resumes_without_redoing_finished_units(tmp_path):
    calls = []
    with pytest.raises(Boom):
        run_study(make_spec(calls, fail_after=3), ToyConfig(model="tiny-llama"), tmp_path)
    assert calls == [0, 1, 2]
    resumed = run_study(make_spec(calls), ToyConfig(model="tiny-llama"), tmp_path)
    assert calls == [0, 1, 2, 3, 4, 5]
    assert list(resumed.table("units")["unit"]) == list(range(6))
    again = run_study(make_spec(calls), ToyConfig(model="tiny-llama"), tmp_path)
    assert again.resumed and calls == [0, 1, 2, 3, 4, 5]


def test_a_torn_last_line_is_ignored(tmp_path):
    run = RunDir.open(tmp_path, "toy", "m", {"a": 1})
    run.record("p", "k1", [{"x": 1}])
    with open(run.path / "partial" / "p.jsonl", "a") as fh:
        fh.write('{"key": "k2", "rows": [{"x"')
    assert run.done("p") == {"k1": [{"x": 1}]}


def test_config_changes_give_a_new_folder_and_bad_dirs_are_clear(tmp_path):
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    a = RunDir.open(tmp_path, "toy", "m", {"a": 1})
    b = RunDir.open(tmp_path, "toy", "m", {"a": 2})
    assert a.path != b.path
    (a.path / "config.yaml").write_text("a: 5\n")
    with pytest.raises(LmlabError, match="different config"):
        RunDir.open(tmp_path, "toy", "m", {"a": 1})
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LmlabError, match="cannot write to the output directory"):
        RunDir.open(blocker, "toy", "m", {})


def test_unknown_config_keys_are_refused():
    with pytest.raises(Exception):
        ToyConfig(model="x", typo=1)


def test_run_time_counts_every_session_of_a_resumed_run(tmp_path):
    from lmlab.runs import RunDir

    run = RunDir.open(tmp_path, "sparse-circuits", "m", {"a": 1})
    (run.path / "log.txt").write_text(
        "2026-01-01T10:00:00Z start sparse-circuits model=m\n2026-01-01T10:05:00Z unit 1\n"  # killed after 300 s
        "2026-01-01T11:00:00Z start sparse-circuits model=m\n2026-01-01T11:02:00Z done in 120.0s\n")
    assert run.logged_seconds() == 420.0


def test_a_killed_session_that_logged_nothing_counts_up_to_its_last_unit(tmp_path):
    from lmlab.runs import RunDir

    run = RunDir.open(tmp_path, "quantize", "m", {"a": 1})
    run.record("units", "a", [{"x": 1}])  # recorded now: its time travels with the unit
    assert set(json.loads((run.path / "partial" / "units.jsonl").read_text())) == {"key", "rows", "at"}
    assert run.done("units") == {"a": [{"x": 1}]}
    (run.path / "partial" / "units.jsonl").write_text(  # S2 logs nothing between its start and its end
        '{"key": "t", "rows": [{"at": "x"}], "at": "2026-01-01T10:20:00+00:00"}\n'
        '{"key": "u", "rows": [], "at": "2026-01-01T10:30:00+00:00"}\n'
        '{"key": "old", "rows": []}\n')  # a unit written before units carried their time
    (run.path / "log.txt").write_text(
        "2026-01-01T10:00:00Z start quantize model=m\n"  # killed at about 10:40: its tail after 10:30 is lost
        "2026-01-01T11:00:00Z start quantize model=m\n2026-01-01T11:02:00Z done in 120.0s\n")
    assert run.logged_seconds() == 1800.0 + 120.0


def test_report_names_a_study_with_a_dash_in_its_name(tmp_path):
    from lmlab.report import _section
    from lmlab.runs import RunDir

    run = RunDir.open(tmp_path, "sparse-circuits", "smollm2-135m", {"model": "smollm2-135m"})
    section = _section(run.path)
    assert section["study"] == "sparse-circuits" and section["status"] == "incomplete"


def test_a_run_that_fails_before_any_result_leaves_no_folder(tmp_path):
    calls = []
    with pytest.raises(Boom):
        run_study(make_spec(calls, fail_after=0), ToyConfig(model="tiny-llama"), tmp_path)
    assert calls == [] and list(tmp_path.iterdir()) == []


def test_a_run_that_fails_after_progress_is_marked_failed_and_resumes(tmp_path):
    import dataclasses

    from lmlab.report import _section

    def boom_with_reason(calls):
        spec = make_spec(calls, fail_after=2)
        inner = spec.run

        def run(config, run_dir, lm=None):
            try:
                return inner(config, run_dir, lm)
            except Boom:
                raise LmlabError("data.jsonl:3: not a JSON object (found list)") from None

        return dataclasses.replace(spec, run=run)

    calls = []
    with pytest.raises(LmlabError):
        run_study(boom_with_reason(calls), ToyConfig(model="tiny-llama"), tmp_path)
    (folder,) = list(tmp_path.iterdir())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "not a JSON object" in manifest["reason"]
    section = _section(folder)
    assert section["status"] == "failed" and "not a JSON object" in section["summary"]
    resumed = run_study(make_spec(calls), ToyConfig(model="tiny-llama"), tmp_path)
    assert calls == [0, 1, 2, 3, 4, 5] and json.loads((folder / "manifest.json").read_text())["status"] == "complete"
    assert list(resumed.table("units")["unit"]) == list(range(6))
