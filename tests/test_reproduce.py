import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmlab.report import build_report
from lmlab.studies import load_result
from lmlab.reproduce import reproduce, reproduced_studies
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
    # each study's time is its run's over every session (a reused one: what it took then), as its manifest says
    run_seconds = [json.loads((Path(o.path) / "manifest.json").read_text())["run_seconds"] for o in again]
    assert [o.seconds for o in again] == run_seconds and min(run_seconds) > 0
    for name, table in _tables(whole).items():
        pd.testing.assert_frame_equal(_tables(again)[name], table, check_dtype=False)


def test_studies_run_two_at_a_time_give_the_tables_of_one_at_a_time(tmp_path):
    one = reproduce(tmp_path / "one", only=ONLY, models=TINY, overrides=SMALL, say=lambda s: None)
    seen = []
    two = reproduce(tmp_path / "two", only=ONLY, models=TINY, overrides=SMALL, say=lambda s: None, jobs=2,
                    progress=lambda names, done, running, left: seen.append((sorted(running), len(done))))
    assert [o.study for o in two] == ONLY and all(o.status == "ok" for o in two)
    assert max(len(r) for r, _ in seen) == 2 and seen[-1] == ([], len(ONLY))  # two ran at once
    summary = json.loads((tmp_path / "two" / "reproduce.json").read_text())
    assert [s["study"] for s in summary["studies"]] == ONLY
    for name, table in _tables(one).items():
        other = _tables(two)[name]
        num = table.select_dtypes("number").columns
        pd.testing.assert_frame_equal(other.drop(columns=num), table.drop(columns=num), check_dtype=False)
        # (two studies at once: other thread counts, another float path; ΔP runs to 100 pp, so rtol too; a training
        # carries the rounding on: on an AMD EPYC with AVX-512 a teacher's mean loss over its third quarter parted
        # by 3e-4 of itself, and run outside xdist (one study on two threads against two on one each) on an Intel
        # Xeon with AMX a latent model's loss over its third quarter by 2.3e-3 of itself)
        pd.testing.assert_frame_equal(other[num], table[num], check_dtype=False, atol=1e-4, rtol=5e-3)
    with pytest.raises(Exception, match="--jobs takes a whole number of at least 1"):
        reproduce(tmp_path / "three", only=ONLY, models=TINY, overrides=SMALL, say=lambda s: None, jobs=0)


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


# --- the demo profile: every registered study has one, and `reproduce --profile demo` runs them all
def test_every_registered_study_has_a_demo_profile_that_resolves_every_size():
    from lmlab.reproduce import expected_seconds
    from lmlab.studies import STUDIES
    from lmlab.studies.config import load_profiles

    for name, spec in STUDIES.items():
        profiles = load_profiles(spec.config.__module__.rpartition(".")[0])
        assert set(profiles) >= {"demo", "quick", "full"}, name
        sized = set(profiles["quick"]) | set(profiles["full"])
        assert sized <= set(profiles["demo"]), f"{name}: demo leaves {sized - set(profiles['demo'])} to quick"
        config = spec.config(model=spec.default_model, profile="demo")
        for key in profiles["demo"]:
            assert config.size(key) == profiles["demo"][key]
        if spec.in_reproduce:  # reproduce's progress table prices what is left from them
            assert expected_seconds(name, "demo") and expected_seconds(name, "quick"), f"{name}: no measured time"
        assert "seconds" not in profiles, f"{name}: measured times live in the generated timings file"


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory):
    """`reproduce --profile demo` over every study on tiny models, and its report: (outcomes, progress, root)."""
    from lmlab.studies import STUDIES

    tmp_path = tmp_path_factory.mktemp("demo")
    models = dict(TINY, **{"sparse-circuits": "tiny-llama", "latent": "scratch"})
    small = dict(SMALL, **{"sparse-circuits": dict(toy_steps=3, toy_sparse_steps=2, toy_width=32, toy_rank_draws=5),
                           "latent": dict(rates=[16], n_train=300, n_test=12, steps=12, seeds=2,
                                          vq_steps=10, d_model=32, n_layers=2, batch_size=16)})
    small["knockout"] = dict(per_dataset=12)  # the demo's own dataset (geo-facts)
    seen = []
    outcomes = reproduce(tmp_path, profile="demo", models=models, overrides=small, say=lambda s: None,
                         progress=lambda names, done, running, left: seen.append((running, len(done), left)))
    placebo = reproduce(tmp_path, profile="demo", models=models, overrides=small, say=lambda s: None,
                        only=["knockout"], placebo=True)
    build_report([tmp_path], tmp_path / "report.html")
    assert [o.study for o in outcomes] == reproduced_studies()
    return outcomes, seen, tmp_path, placebo


def test_reproduce_demo_on_tiny_models_writes_a_report_with_every_verdict(tiny_demo):
    from lmlab.studies import STUDIES

    outcomes, seen, tmp_path, _ = tiny_demo
    names = reproduced_studies()
    assert [o.study for o in outcomes] == names and "compare" in STUDIES and "compare" not in names
    assert all(o.status == "ok" and o.verdict in ("reproduced", "not reproduced", "inconclusive") for o in outcomes)
    assert seen[0] == ([names[0]], 0, seen[0][2]) and seen[-1] == ([], len(names), 0.0)
    knockout = load_result(outcomes[0].path)
    assert sorted(knockout.table("answer").dataset.unique()) == ["geo-facts"]  # the demo's own set
    toy = load_result(outcomes[[o.study for o in outcomes].index("sparse-circuits")].path)
    assert toy.table("curve").empty and len(toy.table("toy")) == 2 * 3 and toy.verdict.evidence.get("part") == "toy"
    from helpers import check_declared_columns

    failures = []
    for o in outcomes:
        try:
            check_declared_columns(load_result(o.path))
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)
    page = (tmp_path / "report.html").read_text()
    for o in outcomes:
        assert STUDIES[o.study].title in page
    assert page.count('class="v ') >= 2 * len(outcomes)  # a badge in the table and one per section
    manifest = json.loads((Path(outcomes[0].path) / "manifest.json").read_text())
    env = manifest["environment"]
    import torch
    import transformers

    assert env["torch"] == torch.__version__.split("+")[0] or env["torch"] == torch.__version__
    assert env["transformers"] == transformers.__version__ and env["accelerate"] and env["datasets"]
    assert env["cpu"] and env["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # --device auto
    assert f"transformers {transformers.__version__}" in page
    assert isinstance(env["avx512f"], bool) and env["threads"] >= 1 and env["cores"] >= 1
    from lmlab.results import read_record

    record = read_record(Path(outcomes[0].path))  # the record `lmlab results` keeps of a real run folder
    assert (record.study, record.verdict, record.sizes) == ("knockout", outcomes[0].verdict, "per_dataset 12")


def test_time_left_scales_the_measured_shares_by_this_machines_pace():
    from lmlab.reproduce import Outcome, expected_seconds, time_left

    names = ["knockout", "quantize", "filler"]
    e = {n: expected_seconds(n, "demo") for n in names}
    assert time_left(names, [], "demo") == pytest.approx(sum(e.values()))
    slow = [Outcome("knockout", "m", "ok", seconds=2 * e["knockout"])]  # this machine runs at half the pace
    assert time_left(names, slow, "demo") == pytest.approx(2 * (e["quantize"] + e["filler"]))
    reused = [Outcome("knockout", "m", "ok", seconds=0.1, resumed=True)]  # a reused run says nothing of the pace
    assert time_left(names, reused, "demo") == pytest.approx(e["quantize"] + e["filler"])


def test_the_reports_first_table_gives_each_verdict_in_one_line():
    """The line per study: the claim that decided the verdict with its interval, or the gate that kept it open."""
    from lmlab.render import headline

    claim = dict(name="edges kept", group="", estimate=0.021, low=0.015, high=0.03, unit="%", scale=100,
                 bar=dict(direction="<=", value=0.05), decision="yes", reported=False)
    other = dict(claim, name="exact match", estimate=-0.5, low=-0.9, high=-0.1, scale=1, unit=" pts",
                 bar=dict(direction=">=", value=-2.0), decision="no")
    assert headline("reproduced", {"claims": [claim, other]}) == "edges kept: +2.10% [+1.50, +3.00] (bar <= +5%)"
    assert headline("not reproduced", {"claims": [claim, other]}).startswith("exact match: -0.50 pts [-0.90, -0.10]")
    gate = dict(name="post-training converged", passed=False, blocks="all", why="a long story")
    assert headline("inconclusive", {"claims": [claim], "gates": [gate]}).startswith("a validity check of ours failed: post-training converged")
    assert headline("inconclusive", {"claims": [], "gates": []}) == ""
    # a verdict of today names what decided it, whose claim it is, and where the paper says it
    from lmlab.claims import Bar, deciding
    from lmlab.resampling import Resampler

    c = Resampler(200, 3).mean_claim("edges kept", np.full((3, 200), 0.02), Bar("<=", 0.05), unit="%", scale=100,
                                     source="paper", where="its abstract: about 0.4%", bar_note="ours: 5%")
    c.decide()
    line = headline("reproduced", {"claims": [c.as_dict()], "deciding": deciding([c])})
    assert line.startswith("edges kept: +2.0% [+2.0, +2.0] (bar <= +5%; yes); the paper's claim (its abstract")
    assert line.endswith("bar: ours: 5%")
    ours = Resampler(200, 3).mean_claim("toy multiplier", np.full((3, 200), -1.0), Bar(">=", 0.0), source="lmlab",
                                        where="our extension")
    ours.decide()
    assert "a claim of ours (our extension)" in headline("inconclusive", {"deciding": deciding([c, ours])})


def test_each_studys_doc_carries_its_declared_claims():
    """docs/studies/*.md hold the table `lmlab claims STUDY --markdown` prints, so the doc's claims, bars and
    sources are the code's; and every declared claim says whose it is and where or why."""
    from pathlib import Path

    from lmlab.report import claims_markdown, declared_claims

    docs = Path(__file__).resolve().parents[1] / "docs" / "studies"
    for study, name in (("knockout", "knockout"), ("quantize", "quantize"), ("filler", "filler"),
                        ("sparse-circuits", "sparse-circuits"), ("latent", "latent")):
        text = (docs / f"{name}.md").read_text(encoding="utf-8")
        inside = text.split("<!-- claims:begin -->\n")[1].split("<!-- claims:end -->")[0]
        assert inside == claims_markdown(study), f"docs/studies/{name}.md: run lmlab claims {study} --markdown"
        for c in declared_claims(study):
            assert c.source in ("paper", "lmlab") and c.where, (study, c.name)
        assert any(c.source == "paper" and c.decisive for c in declared_claims(study)), study
    # compare checks no paper's claim: its doc carries its own, every one lmlab's
    text = (docs / "compare.md").read_text(encoding="utf-8")
    assert text.split("<!-- claims:begin -->\n")[1].split("<!-- claims:end -->")[0] == claims_markdown("compare")
    assert {c.source for c in declared_claims("compare")} == {"lmlab"}


def test_no_profiles_yaml_comment_carries_a_timing_or_a_machine():
    """A profile keeps its lasting reasons; run times and machines live in the generated timings and results."""
    import re
    from importlib import resources

    from lmlab.studies import STUDIES

    timing = re.compile(r"\b\d+(\.\d+)? ?(s|sec|min|h|hours?|minutes?)\b|EPYC|Xeon|H100|H200|AVX|peak RSS", re.I)
    for name, spec in STUDIES.items():
        text = resources.files(spec.config.__module__.rpartition(".")[0]).joinpath("profiles.yaml").read_text()
        comments = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
        found = [c for c in comments if timing.search(c)]
        assert not found, f"{name}: {found}"


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
CHECK = """<script>window.addEventListener("load", () => {
const rows = [...document.querySelectorAll("#verdicts tr.study")], imgs = [...document.images];
const out = {height: window.innerHeight, images: imgs.length,
             broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length,
             rows: rows.map(r => ({bottom: r.getBoundingClientRect().bottom, badge: r.cells[2].innerText.trim(),
                                   decided: r.cells[3].innerText.trim()}))};
const pre = document.createElement("pre"); pre.id = "lmlab-check"; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);});</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (`make test` installs Debian's chromium where it can)")
def test_the_report_reads_in_a_real_browser(tiny_demo):
    """Opened in headless Chromium at 1400x1000: the first screen shows one row a study with its verdict and the
    line that decided it, and every image (figures, claim plots) loads."""
    import re
    import subprocess

    outcomes, _, root, _ = tiny_demo
    page = root / "report-checked.html"
    page.write_text((root / "report.html").read_text() + CHECK)
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                          "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="lmlab-check">([^<]*)</pre>', dom)
    assert found, dom[-2000:]
    check = json.loads(found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    assert len(check["rows"]) == len(outcomes) and check["images"] >= len(outcomes) and check["broken"] == 0
    for row, o in zip(check["rows"], outcomes):
        assert row["bottom"] <= check["height"], f"{o.study}'s row is below the first screen"
        assert row["badge"] == o.verdict and row["decided"], row


def test_a_placebo_runs_beside_its_study_and_the_report_and_records_say_so(tiny_demo):
    """reproduce --placebo: the same study on the same model and sizes in a folder of its own (the flag joins the
    run's identity only when set), recorded in placebo.json, its verdict marked as the placebo's, shown beside the
    study's own verdict in the report's first table, and kept apart in the results' records and timings."""
    from lmlab.results import read_record, timings

    outcomes, _, root, placebo = tiny_demo
    (p,) = placebo
    real = next(o for o in outcomes if o.study == "knockout")
    assert p.status == "ok" and p.path != real.path
    assert json.loads((root / "placebo.json").read_text())["studies"][0]["study"] == "knockout"
    result = load_result(p.path)
    assert result.config.placebo is True and not load_result(real.path).config.placebo
    assert result.verdict.summary.startswith("PLACEBO (") and result.verdict.evidence["placebo"]
    first_table = (root / "report.html").read_text().split('<table id="verdicts">')[1].split("</table>")[0]
    row = next(r for r in first_table.split('<tr class="study">') if "S1 · Attention knockout" in r
               and "placebo" not in r.split("</td>")[0])
    assert f'href="#{Path(p.path).name}"' in row  # the placebo's badge beside the study's verdict
    record = read_record(Path(p.path))
    assert record.placebo and not read_record(Path(real.path)).placebo
    assert "knockout" not in timings([record])


def test_every_study_declares_its_placebo():
    """Every registered study says what its placebo replaces the treatment with; --placebo is refused by name where
    a study has none (none today)."""
    from lmlab.studies import STUDIES

    for name, spec in STUDIES.items():
        assert len(spec.config.placebo_treatment) > 20, f"{name}: no placebo_treatment"
        assert "placebo" in spec.config.model_fields


def test_the_usage_guides_layout_is_the_codes():
    """docs/usage.md's layout table is generated from the package (every module and package, its docstring's first
    sentence): a module added, removed or redescribed fails here until the table is written again."""
    from pathlib import Path

    from lmlab.report import layout_markdown

    text = (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text(encoding="utf-8")
    inside = text.split("<!-- layout:begin -->\n")[1].split("<!-- layout:end -->")[0]
    assert inside == layout_markdown(), "docs/usage.md: splice lmlab.report.layout_markdown() between its markers"
