"""`lmlab results`: records read from run folders, the page rendered from them, the timings reproduce reads."""

import json

import pytest
import yaml

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.results import load_records, load_timings, read_record, update


def _run(root, name, study="filler", model="smollm2-135m", profile="demo", seed=0, status="complete",
         seconds=120.0, gpu=None, **sizes):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(dict(model=model, profile=profile, seed=seed, seeds=None,
                                                            **sizes)))
    deciding = dict(kind="claim", source="paper", line="Mless - w/o: +1.0 [-7.8, +9.8] (bar > 0)",
                    where="the paper's Table 1")
    (folder / "verdict.json").write_text(json.dumps({"overall": dict(
        status="inconclusive", claim="c", summary="s", evidence=dict(deciding=deciding)), "models": {}}))
    env = dict(cpu="AMD EPYC", avx512f=True, cores=2, threads=1, load=2.04, lmlab="0.1.0", **({"gpu": gpu} if gpu else {}))
    (folder / "manifest.json").write_text(json.dumps(dict(study=study, status=status, run_seconds=seconds,
                                                          finished=f"2026-12-0{seed + 1}T10:00:00+00:00",
                                                          environment=env)))
    return folder


def test_a_run_folder_gives_its_record_and_the_page_and_timings_follow_from_the_records(tmp_path):
    root = tmp_path / "runs"
    _run(root, "filler-a", seed=0, seconds=100.0)
    _run(root, "filler-b", seed=1, seconds=300.0, n_test_per_level=20)  # a size set on the command line
    _run(root, "filler-c", seed=2, seconds=5.0, gpu="NVIDIA H100")  # a GPU's time says nothing of a CPU's
    _run(root, "knockout-a", study="knockout", model="tiny-llama", seconds=7.0)  # not the default model
    record = read_record(root / "filler-b")
    assert (record.study, record.profile, record.seed, record.verdict) == ("filler", "demo", 1, "inconclusive")
    assert record.sizes == "n_test_per_level 20" and read_record(root / "filler-a").sizes == "profile"
    _run(tmp_path / "other", "filler-bf16", dtype="bfloat16")  # a precision chosen on the command line: its own
    assert read_record(tmp_path / "other" / "filler-bf16").sizes == "profile, dtype bfloat16"
    assert record.decided.startswith("Mless - w/o: +1.0 [-7.8, +9.8] (bar > 0); the paper's claim")
    assert record.machine == "AMD EPYC with AVX-512, 2 cores (1 thread, load 2.0)"

    records, page, timings = tmp_path / "r.jsonl", tmp_path / "results.md", tmp_path / "timings.json"
    timings.write_text(json.dumps({"quantize": {"quick": {"seconds": 9}}}))
    main(["results", str(root), "--records", str(records), "--out", str(page), "--timings", str(timings)])
    assert len(load_records(records)) == 4
    table = load_timings(timings)
    assert table["filler"] == {"demo": {"seconds": 100, "machine": record.machine, "seed": 0,
                                        "finished": "2026-12-01T10:00:00+00:00"}}
    assert table["quantize"] == {"quick": {"seconds": 9}} and "knockout" not in table  # kept; not timed
    text = page.read_text()
    latest = text.split("## The latest run of each study, profile and seed")[1].split("\n## ")[0]
    assert [latest.count(f"| filler | demo | {seed} | **inconclusive** |") for seed in (0, 2)] == [1, 1]
    assert latest.count("| filler | demo (n_test_per_level 20) | 1 | **inconclusive** |") == 1  # one row a seed
    assert text.count("| 2026-12-0") == 4 and "NVIDIA H100" in text and "1 min 40 s" in text

    # read again: the same runs replace their records; a new run adds one and becomes the latest
    _run(root, "filler-d", seed=3, seconds=60.0)
    update([root], records, page, timings, "lmlab results runs")
    assert len(load_records(records)) == 5 and load_timings(timings)["filler"]["demo"]["seconds"] == 60


def test_a_folder_without_a_finished_run_is_one_sentence(tmp_path):
    _run(tmp_path, "filler-x", status="failed")
    with pytest.raises(LmlabError, match="not complete"):
        read_record(tmp_path / "filler-x")
    with pytest.raises(LmlabError, match="no run folder at"):
        update([tmp_path / "nothing-here"], tmp_path / "r.jsonl", None, None, "c")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LmlabError, match="no finished run folders"):
        update([tmp_path / "empty"], tmp_path / "r.jsonl", None, None, "c")


def test_a_size_no_profile_names_still_makes_the_runs_sizes_its_own(tmp_path):
    """The latent study's --moves and --plan are read through config.size but named in no profile: a run that set
    them is not the profile's run (its row would otherwise stand in the page for the profile's own)."""
    _run(tmp_path, "latent-a", study="latent", model="scratch", moves=12, plan=False)
    _run(tmp_path, "latent-b", study="latent", model="scratch")
    assert read_record(tmp_path / "latent-a").sizes == "moves 12, plan False"
    assert read_record(tmp_path / "latent-b").sizes == "profile"
