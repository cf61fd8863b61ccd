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
    # a setting of the study's own set away from its default (not a size) is named too: it changed what was measured
    _run(tmp_path, "latent-c", study="latent", model="scratch", chunk=8)
    assert read_record(tmp_path / "latent-c").sizes == "chunk 8"
    _run(tmp_path, "latent-d", study="latent", model="scratch", codebook=512)  # a size the profiles name
    assert read_record(tmp_path / "latent-d").sizes == "codebook 512"
    # a size set to the profile's own value (an older run recorded the codebook before it was a size) is the profile's
    _run(tmp_path, "latent-e", study="latent", model="scratch", codebook=64)
    assert read_record(tmp_path / "latent-e").sizes == "profile"


def test_the_readme_table_takes_each_cells_latest_run_at_the_profiles_sizes(tmp_path):
    """A cell is the latest run of the study's default model at the profile's own sizes (a precision set on the
    command line allowed), the placebo in its own column, a missing run "not run"; the README between its markers is
    replaced and nothing outside them changes."""
    from lmlab.results import front_table, spliced_readme

    root = tmp_path / "runs"
    _run(root, "filler-a", seed=0)
    _run(root, "filler-later", seed=0, dtype="bfloat16")
    _run(root, "filler-sized", seed=0, n_test_per_level=20)  # its own sizes: never the profile's cell
    _run(root, "filler-p", seed=0, placebo=True)
    records = update([root], tmp_path / "r.jsonl", None, None, "lmlab results")
    days = {"filler-a": "01", "filler-later": "03", "filler-sized": "04", "filler-p": "02"}
    for r in records:
        r.finished = f"2026-12-{days[r.run]}T10:00:00+00:00"
    records.sort(key=lambda r: r.finished)
    row = next(line for line in front_table(records).splitlines() if line.startswith("| `lmlab filler`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == ("**inconclusive**: Mless - w/o: +1.0 [-7.8, +9.8] (bar > 0) (the paper's claim) "
                        "(2026-12-03, dtype bfloat16)")
    assert cells[2].endswith("(2026-12-02)") and cells[3] == "not run" and "n_test_per_level" not in row
    text = "intro\n<!-- results:begin -->\nold\n<!-- results:end -->\nmid\n<!-- sample:begin -->\n<!-- sample:end -->\n"
    made = spliced_readme(text, records)
    assert made.startswith("intro\n<!-- results:begin -->\n| study |") and "\nmid\n" in made and "old" not in made
    with pytest.raises(LmlabError, match="markers"):
        spliced_readme("no markers", records)


def test_the_readme_and_the_results_page_are_the_records():
    """README.md's results table and sample output, and docs/results.md, are what the recorded runs make (`lmlab
    results --readme README.md` writes them); no recorded placebo reads "reproduced"."""
    from pathlib import Path

    from lmlab.results import render, spliced_readme

    root = Path(__file__).resolve().parents[1]
    records = load_records(root / "docs" / "results.jsonl")
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert readme == spliced_readme(readme, records), "README.md: run lmlab results --readme README.md"
    page = (root / "docs" / "results.md").read_text(encoding="utf-8")
    command = page.split("(the last time: `", 1)[1].split("`)", 1)[0]
    assert page == render(records, command), "docs/results.md: run lmlab results to write it from the records"
    assert not [r.run for r in records if r.placebo and r.verdict == "reproduced"]
