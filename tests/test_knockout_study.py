import json

import numpy as np
import pandas as pd
import pytest
import torch

from lmlab import LmlabError
from lmlab.data.formats import read_qa
from lmlab.data.generated.geo_qa import RELATIONS, generate
from lmlab.data.qa import QAItem, build_prompt
from lmlab.models import load_model
from lmlab.studies.knockout.probes import group_split
from lmlab.studies import knockout as s1
import lmlab.studies.knockout.recipe  # noqa: F401  (s1.recipe, patched below, whatever ran before)
from lmlab.studies.knockout import measure as s1m
from lmlab.studies import run_study
from lmlab.studies.knockout.analysis import late_layers, verdict
from lmlab.studies.result import from_rows
from lmlab.studies.knockout.measure import naive_sweep, sweep

from helpers import interrupt_on_call, max_diff, near


def _assert_exact_alignment(lm, item):
    """The characters the E_Q tokens cover are exactly the E_Q spans' characters (white space aside:
    byte-level BPE folds a leading space into a token, WordPiece drops spaces)."""
    enc = s1m.encode_item(lm, item)
    prompt = build_prompt(item)
    offsets = lm.tokenizer(prompt.text, return_offsets_mapping=True)["offset_mapping"]
    covered = {c for p in enc["eq"] for c in range(*offsets[p])}
    wanted = {c for start, end in prompt.eq_spans for c in range(start, end) if not prompt.text[c].isspace()}
    assert wanted <= covered, (item.question, prompt.eq_spans)
    assert all(prompt.text[c].isspace() for c in covered - wanted), (item.question, sorted(covered - wanted))
    assert set(enc["eq"]) <= set(enc["question"])


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-bert"])  # byte-level BPE and WordPiece
def test_eq_spans_align_exactly_on_tiny_tokenizers(name):
    lm = load_model(name)
    for item in [i for rel in RELATIONS for i in generate(rel, 8, seed=1)]:
        _assert_exact_alignment(lm, item)


@pytest.mark.embedded
def test_eq_spans_align_exactly_on_smollm_tokenizer(embedded_smollm):
    for item in [i for rel in RELATIONS for i in generate(rel, 15, seed=2)]:
        _assert_exact_alignment(embedded_smollm, item)


def test_unalignable_subject_is_skipped_not_misaligned():
    lm = load_model("tiny-llama")
    item = QAItem(id="x", dataset="d", question="What is the capital of France?", aliases=["Paris"], subject="Spain")
    assert s1m.encode_item(lm, item) is None


def test_sweep_equals_one_forward_per_layer(decoder):
    ids = decoder.tokenizer("Q: What is the capital of France?\nA: Paris")["input_ids"]
    layers = [0, 1, 2]
    fast = sweep(decoder, ids, [5, 7], [2, 3], layers)
    slow = naive_sweep(decoder, ids, [5, 7], layers)
    for k in layers:
        assert near(fast.eq[k], slow[k], dtype=decoder.model.dtype), max_diff(fast.eq[k], slow[k])
        assert not torch.allclose(fast.eq[k], fast.clean[k], atol=1e-4)
    # every cut-off of a condition is one row read at another depth: clean, E_Q and the control, 3 rows in all
    assert {fast.rows[("eq", k)] for k in layers} == {1} and {fast.rows[("control0", k)] for k in layers} == {2}


def test_sweep_on_a_hybrid_equals_one_forward_per_layer():
    """Qwen3-Next's gated delta networks beside attention: the batched sweep (rows with their own cut-offs, retired
    rows, whole sequences without a cache) equals one full forward per cut-off, and the knockout reaches the
    recurrent blocks (the first cut-off, a linear-attention block alone, already moves the state)."""
    import warnings

    from lmlab import conformance as conf
    from lmlab.models.layout import layout_of
    from lmlab.models.load import LoadedModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tokenizer = conf.tiny_model("qwen3_next")
    with conf._ignoring_the_table():
        lm = LoadedModel(model=model, tokenizer=tokenizer, layout=layout_of(model), name="qwen3_next", source="tiny")
        assert lm.layout.kinds[0] == "linear attention" and 0 in lm.layout.mixing_layers
        ids = tokenizer("Q: What is the capital of France?\nA: Paris")["input_ids"]
        eq = [len(ids) - 3, len(ids) - 2]  # (within the short convolution's reach of the last token: the random
        layers = [0, 1, 2, 3]  # delta rule's decay forgets a token within a few steps)
        fast = sweep(lm, ids, eq, [2, 3], layers)
        slow = naive_sweep(lm, ids, eq, layers)
    for k in layers:
        assert near(fast.eq[k], slow[k], dtype=model.dtype), max_diff(fast.eq[k], slow[k])
    assert not torch.allclose(fast.eq[0], fast.clean[0], atol=1e-4)


def test_sweep_on_a_shared_prefix_cache_equals_the_sweep_alone(decoder):
    from lmlab.generation import prefix_cache

    head = decoder.tokenizer("Q: What is the capital of Spain?\nA: Madrid\nQ: What is the capital of Italy?\nA: Rome\n")["input_ids"]
    tails = ["Q: What is the capital of France?\nA: Paris", "Q: Which river flows through Cairo?\nA: the Nile"]
    seqs = [head + decoder.tokenizer(t, add_special_tokens=False)["input_ids"] for t in tails]
    eq, ctrl = [len(head) + 5, len(head) + 7], [len(head) + 2, len(head) + 3]
    limit = min(s1m.sweep_prefix(len(s), eq, ctrl) for s in seqs)
    shared = prefix_cache(decoder, [s[:limit + 1] for s in seqs])
    assert 16 <= shared[0] < limit  # some of each prefix is shared, the rest is the sample's own
    for ids in seqs:
        fast, alone = sweep(decoder, ids, eq, ctrl, [0, 2], shared=shared), sweep(decoder, ids, eq, ctrl, [0, 2])
        for k in (0, 2):
            for part in ("clean", "eq", "control"):
                assert near(getattr(fast, part)[k], getattr(alone, part)[k], dtype=decoder.model.dtype)


def test_positions_before_the_first_blocked_query_are_bit_identical(decoder):
    ids = decoder.tokenizer("Q: What is the capital of France?\nA: Paris")["input_ids"]
    eq, ctrl = [5, 7], [2, 3]
    res = sweep(decoder, ids, eq, ctrl, [0, 2], keep_positions=True)
    assert res.prefix_len == 3  # after the control's first key (2): everything before is the shared clean prefix
    for k, hidden in res.all_positions.items():
        clean = hidden[0]
        eq_rows = [res.rows[("eq", 0)], res.rows[("eq", 2)]]  # E_Q cut-offs; its first blocked query is 6 (after key 5)
        for row in eq_rows:
            assert torch.equal(hidden[row, :6 - res.prefix_len], clean[:6 - res.prefix_len])
            assert not torch.equal(hidden[row, 6 - res.prefix_len:], clean[6 - res.prefix_len:])


def test_delta_p_is_zero_when_the_blocked_span_is_empty(decoder):
    ids = decoder.tokenizer("Q: What is the capital of France?\nA: Paris")["input_ids"]
    res = sweep(decoder, ids, [], [], [0, 1, 2])
    for k in (0, 1, 2):
        assert torch.equal(res.eq[k], res.clean[k]) and torch.equal(res.control[k], res.clean[k])


def test_probe_split_never_shares_a_subject_or_question():
    groups = [f"s{i % 37}" for i in range(300)]
    train, test = group_split(groups, 0.3, seed=4)
    assert not {groups[i] for i in train} & {groups[i] for i in test}
    assert len(train) + len(test) == 300 and 0.2 < len(test) / 300 < 0.4


def test_auroc_of_many_resamples_at_once_equals_sklearn_row_by_row():
    """The detection intervals' AUROC from ranks, all 1000 resamples as one array, against roc_auc_score one
    resample at a time (ties in the scores, resamples with one class left out), and the interval it gives."""
    from sklearn.metrics import roc_auc_score

    from lmlab.stats import percentile_interval
    from lmlab.studies.knockout.probes import _auroc_interval, auroc_rows

    rng = np.random.default_rng(1)
    y = (rng.random(14) < 0.2).astype(int)  # few positives: some resamples hold one class
    score = np.round(rng.random(14) + 0.3 * y, 1)  # rounded: ties
    idx = np.random.default_rng(7).integers(0, len(y), (1000, len(y)))
    fast = auroc_rows(y[idx], score[idx])
    one_class = np.array([len(set(y[i])) < 2 for i in idx])
    assert one_class.sum() > 10 and np.isnan(fast[one_class]).all()
    slow = np.array([roc_auc_score(y[i], score[i]) for i in idx[~one_class]])
    np.testing.assert_allclose(fast[~one_class], slow, rtol=0, atol=1e-12)
    interval = _auroc_interval(y, score, 7)
    reference = percentile_interval(roc_auc_score(y, score), slow)
    assert (interval.estimate, interval.low, interval.high, interval.n) == pytest.approx(
        (reference.estimate, reference.low, reference.high, len(y)), abs=1e-12)


def test_generated_sets_are_seeded_and_spread_over_popularity():
    a, b = generate("geo-capital", 50, seed=3), generate("geo-capital", 50, seed=3)
    assert [i.subject for i in a] == [i.subject for i in b]
    pops = sorted(i.popularity for i in a)
    assert pops[0] < 1e5 and pops[-1] > 1e7  # long tail and well known both present
    assert not {s for s, _ in RELATIONS["geo-capital"].shots} & {i.subject for i in a}


def test_readers_parse_real_formats_and_name_bad_rows(tmp_path):
    (tmp_path / "pop.tsv").write_text("question\tsubj\tprop\tpossible_answers\ts_pop\n"
                                      "What is Paris the capital of?\tParis\tcapital\t[\"France\"]\t1000\n")
    items = read_qa("popqa", tmp_path / "pop.tsv")
    assert items[0].subject == "Paris" and items[0].aliases == ["France"] and items[0].popularity == 1000
    (tmp_path / "nq.jsonl").write_text('{"question": "who wrote hamlet", "answer": ["Shakespeare"]}\n{"question": "x"}\n')
    with pytest.raises(LmlabError, match=r"nq.jsonl:2: missing field 'answer'"):
        read_qa("nq", tmp_path / "nq.jsonl")
    (tmp_path / "tqa.json").write_text(json.dumps({"Data": [{"Question": "q?", "Answer": {"Value": "a", "Aliases": ["A"]}}]}))
    assert read_qa("triviaqa", tmp_path / "tqa.json")[0].aliases == ["A", "a"]
    (tmp_path / "hp.json").write_text(json.dumps([{"question": "q?", "answer": "yes"}, {"answer": "no"}]))
    with pytest.raises(LmlabError, match="item 1: missing field 'question'"):
        read_qa("hotpotqa", tmp_path / "hp.json")
    with pytest.raises(LmlabError, match="no popqa file or saved dataset folder"):
        read_qa("popqa", tmp_path / "missing.tsv")
    # valid JSON that is not an object: one sentence naming the file and line, in every reader
    (tmp_path / "nq.jsonl").write_text('{"question": "q", "answer": ["a"]}\n[1, 2, 3]\n')
    with pytest.raises(LmlabError, match=r"nq.jsonl:2: not a JSON object \(found list\)"):
        read_qa("nq", tmp_path / "nq.jsonl")
    (tmp_path / "pop.jsonl").write_text('"just a string"\n')
    with pytest.raises(LmlabError, match=r"pop.jsonl:1: not a JSON object \(found str\)"):
        read_qa("popqa", tmp_path / "pop.jsonl")
    (tmp_path / "hp.json").write_text(json.dumps([{"question": "q?", "answer": "yes"}, 7]))
    with pytest.raises(LmlabError, match=r"item 1: not a JSON object \(found int\)"):
        read_qa("hotpotqa", tmp_path / "hp.json")
    (tmp_path / "tqa.json").write_text(json.dumps({"Data": [["q?"], {"Question": "q", "Answer": "a"}]}))
    with pytest.raises(LmlabError, match=r"item 0: not a JSON object"):
        read_qa("triviaqa", tmp_path / "tqa.json")
    (tmp_path / "tqa.json").write_text(json.dumps({"Data": [{"Question": "q", "Answer": "a"}]}))
    with pytest.raises(LmlabError, match=r"item 0: field 'Answer' is not a JSON object"):
        read_qa("triviaqa", tmp_path / "tqa.json")


def test_too_few_correct_answers_is_an_inconclusive_verdict(tmp_path):
    config = s1.Config(model="tiny-llama", datasets=["geo-capital"], per_dataset=20)
    result = run_study(s1.SPEC, config, tmp_path)
    assert result.verdict.status == "inconclusive"
    assert result.verdict.summary.startswith("inconclusive: only 0 correct and 20 incorrect answers")


def test_a_finished_run_is_judged_again_from_its_tables(tmp_path):
    """`lmlab verdict RUN`: the current claims applied to a finished run's tables, verdict.json and the manifest
    rewritten, the tables untouched."""
    from lmlab.studies.runner import rejudge

    config = s1.Config(model="tiny-llama", datasets=["geo-capital"], per_dataset=20)
    result = run_study(s1.SPEC, config, tmp_path)
    saved = json.loads((result.path / "verdict.json").read_text())
    saved["overall"]["status"] = saved["models"]["tiny-llama"]["status"] = "reproduced"  # an older rule's word
    (result.path / "verdict.json").write_text(json.dumps(saved))
    before = (result.path / "tables" / "answer.parquet").read_bytes()
    again = rejudge(result.path)
    assert again.verdict.status == "inconclusive"
    assert json.loads((result.path / "verdict.json").read_text())["overall"]["status"] == "inconclusive"
    assert json.loads((result.path / "manifest.json").read_text())["verdict"] == "inconclusive"
    assert (result.path / "tables" / "answer.parquet").read_bytes() == before


class Interrupt(Exception):
    pass


TINY = dict(model="tiny-llama", datasets=["geo-capital", "geo-city-country"], per_dataset=30, sweep_every=1,
            min_per_class=3)


def _label(text, aliases, exact=False):
    return aliases[0][0] < "M"  # a labelling rule for a tiny random model, so that both classes exist


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """The study and its placebo at test sizes: a tiny model, two generated sets, the labelling rule above."""
    out = tmp_path_factory.mktemp("s1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(s1.recipe, "alias_match", _label)
        return (run_study(s1.SPEC, s1.Config(**TINY), out / "whole"),
                run_study(s1.SPEC, s1.Config(**TINY, placebo=True), out / "placebo"))


def test_pipeline_runs_end_to_end_and_resumes_to_the_same_table(tiny_runs, tmp_path, monkeypatch):
    """Every stage runs, the tables hold measurements only (the split is the analysis's, from the recorded flips),
    and a run killed in the sweep finishes with the same table as an uninterrupted one."""
    from helpers import check_declared_columns
    from lmlab.studies.knockout.analysis import grouped

    whole = tiny_runs[0]
    table = whole.long()
    check_declared_columns(whole)
    assert {"answer", "probe", "knockout", "detection", "detection_score"} <= set(table.kind)
    probes = whole.table("probe")
    assert set(probes.probe_set) <= set(TINY["datasets"])  # one probe per dataset and layer
    ko = whole.table("knockout")
    assert set(ko.condition) == {"eq", "control"}
    assert not {"group", "group_eq", "group_best"} & set(ko.columns) and "group" not in whole.table("patching")
    split = grouped(ko, probes)
    assert (split.group == np.where(split.flipped == 1, "Q", "A")).all()  # each layer's own flip
    eq = split[split.condition == "eq"]
    assert (eq.group_eq == eq.group).all() and set(eq.group_best) <= {"Q", "A"}
    assert whole.verdict.status in ("reproduced", "not reproduced", "inconclusive")
    assert (whole.path / "figure.png").stat().st_size > 1000
    patch = whole.table("patching")
    assert set(patch.condition) == {"eq", "random"}  # E_Q patching and its random-token control
    assert set(patch[patch.condition == "random"].id) <= set(patch[patch.condition == "eq"].id)

    monkeypatch.setattr(s1.recipe, "alias_match", _label)
    real = interrupt_on_call(monkeypatch, s1.recipe, "sweep", 20, Interrupt)
    with pytest.raises(Interrupt):
        run_study(s1.SPEC, s1.Config(**TINY), tmp_path / "cut")
    monkeypatch.setattr(s1.recipe, "sweep", real)
    # the probes were fit before the cut: the resumed run reads them back (their weights, their rows), never fits
    assert sorted(p.name for p in (tmp_path / "cut").glob("*/probes/*.safetensors")) == \
        [f"rep{r}.safetensors" for r in range(len(s1.Config(**TINY).replicate_seeds()))]
    monkeypatch.setattr(s1.recipe, "fit_layer_probes", lambda *a, **k: pytest.fail("a stored probe was fit again"))
    resumed = run_study(s1.SPEC, s1.Config(**TINY), tmp_path / "cut")
    pd.testing.assert_frame_equal(resumed.long().reset_index(drop=True), table.reset_index(drop=True))


def test_a_probe_read_back_from_its_weights_scores_as_the_fitted_one():
    """What a resumed run restores: the scaler's and the regression's fitted values set on a fresh pipeline give the
    fitted probe's probabilities bit for bit, through the safetensors file they are stored in."""
    from safetensors.numpy import load, save

    from lmlab.studies.knockout.probes import fit_layer_probes, probe_weights, restored_probe

    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 2, 16)) * rng.uniform(0.1, 5.0, size=16)
    y = (x[:, 0, 0] + rng.normal(size=80) > 0).astype(int)
    fitted = fit_layer_probes(x, y, np.arange(60), np.arange(60, 80), [0, 1], seed=3)
    new = rng.normal(size=(25, 16))
    for probe in fitted:
        back = restored_probe(probe.layer, load(save(probe_weights(probe))), 3, probe.cv_auroc, probe.test_auroc)
        assert np.array_equal(back.p_true(new), probe.p_true(new))
        assert (back.layer, back.cv_auroc, back.test_auroc) == (probe.layer, probe.cv_auroc, probe.test_auroc)


def test_every_control_knocks_out_exactly_as_many_tokens_as_e_q(tiny_runs):
    """On every knockout row both counts are recorded; a control row knocks out exactly |E_Q| tokens (the answer
    table's count, from the encoding); a question without a control row is one whose tokens outside E_Q are fewer
    than E_Q's, and the verdict's gate names it."""
    whole = tiny_runs[0]
    ko, answers = whole.table("knockout"), whole.table("answer").set_index("id")
    assert (ko.eq_tokens.to_numpy() == answers.eq_tokens.reindex(ko.id).to_numpy()).all()
    ctrl = ko[ko.condition == "control"]
    assert len(ctrl) and (ctrl.control_tokens == ctrl.eq_tokens).all()
    bare = set(ko.id) - set(ctrl.id)
    assert bare and (ko[ko.id.isin(bare)].control_tokens == 0).all()
    short = set(answers.index[answers.pool_tokens < answers.eq_tokens])
    assert bare == short & set(ko.id)
    gates = {g["name"]: g for g in whole.verdict.evidence["gates"]}
    named = gates["geo-capital: random-token control drawn"]["why"]
    n_short = len(short & set(answers.index[answers.dataset == "geo-capital"]))
    assert f"; {n_short} of the 30 answered have fewer tokens outside E_Q than E_Q has (" in named


def test_control_and_placebo_draws_are_exact_in_size_outside_e_q_and_independent():
    """Against the encodings themselves: every control draw and every placebo stand-in for E_Q is |E_Q| distinct
    question positions outside E_Q, or none where the question has fewer; the placebo's draw is not the control's;
    a question without a draw leaves every other question's draw what it was."""
    lm = load_model("tiny-llama")
    items = generate("geo-city-country", 30, seed=0) + generate("geo-capital", 30, seed=0)
    encoded = {i.id: s1m.encode_item(lm, i) for i in items}
    controls = s1m.control_draws(items, encoded, [11, 12])
    stand_in = s1m.placebo_eq(items, encoded, seed=0)
    drawn = same = 0
    for item, ctrl, placebo in zip(items, controls, stand_in):
        enc = encoded[item.id]
        outside = set(enc["question"]) - set(enc["eq"])
        for draw in [*ctrl, placebo]:
            if len(outside) < len(enc["eq"]):
                assert draw is None
            else:
                assert len(draw) == len(set(draw)) == len(enc["eq"]) and set(draw) <= outside
        if placebo is not None:
            drawn += 1
            same += placebo == ctrl[0]
    assert drawn >= 20 and same < drawn / 2
    # a question without a control still takes its draw from the stream: every other draw is the one a draw of
    # min(|E_Q|, pool) tokens gave (the earlier rule), so runs recorded before keep their controls where they matched
    import random

    rngs = [random.Random(s) for s in (11, 12)]
    for item, ctrl in zip(items, controls):
        enc = encoded[item.id]
        outside = [p for p in enc["question"] if p not in set(enc["eq"])]
        before = [sorted(r.sample(outside, min(len(enc["eq"]), len(outside)))) for r in rngs]
        assert ctrl == [b if len(b) == len(enc["eq"]) else None for b in before]
    assert any(c[0] is None for c in controls) and any(c[0] is not None for c in controls)


def test_the_placebo_runs_the_same_study_with_e_q_replaced_and_never_reproduces(tiny_runs):
    """The placebo end to end at test sizes: the same answers, probes, control draws and random patches as the
    study's run, E_Q's knockout and the subject swap replaced by random question tokens of E_Q's size; its verdict is
    never "reproduced", no decisive claim says "yes", and it says it is the placebo's."""
    normal, placebo = tiny_runs
    v = placebo.verdict
    assert v.status != "reproduced", v.summary
    assert not [c["name"] for c in v.evidence["claims"] if not c["reported"] and c["decision"] == "yes"], v.summary
    assert v.summary.startswith("PLACEBO (") and v.evidence["placebo"] == s1.Config.placebo_treatment
    assert placebo.path != normal.path and placebo.config.placebo is True
    for name in ("answer", "probe"):
        pd.testing.assert_frame_equal(placebo.table(name), normal.table(name))
    key = ["replicate", "id", "layer"]
    ko_n, ko_p = normal.table("knockout"), placebo.table("knockout")
    answers = normal.table("answer")
    assert set(ko_p.id) == set(answers.id[answers.pool_tokens >= answers.eq_tokens]) & set(ko_n.id)
    ctrl = ko_n[ko_n.condition == "control"].merge(ko_p[ko_p.condition == "control"], on=key)
    assert len(ctrl) == (ko_p.condition == "control").sum()
    np.testing.assert_allclose(ctrl.p_knock_x, ctrl.p_knock_y, atol=1e-4)  # the control's own draws, unchanged
    eq = ko_n[ko_n.condition == "eq"].merge(ko_p[ko_p.condition == "eq"], on=key)
    np.testing.assert_allclose(eq.p_clean_x, eq.p_clean_y, atol=1e-4)  # the same probes on the same questions
    assert (eq.eq_tokens_x == eq.eq_tokens_y).all()  # E_Q's stand-in is E_Q's size
    assert (np.abs(eq.p_knock_x - eq.p_knock_y) > 1e-4).mean() > 0.5  # what is knocked out is not E_Q
    rnd = [t[t.condition == "random"].set_index(["replicate", "id"]).flipped for t in (normal.table("patching"),
                                                                                     placebo.table("patching"))]
    assert len(rnd[1]) and (rnd[1] == rnd[0].reindex(rnd[1].index)).all()  # the random patches, draw for draw
    assert set(placebo.table("patching").condition) == {"eq", "random"}


def test_a_whole_question_dataset_gets_extracted_exact_tokens_and_a_real_control(tmp_path, monkeypatch):
    """NQ rows name no subject: E_Q is the extracted names and property word, never the whole question, so every
    question keeps tokens outside E_Q and its control is a real draw: a control row differs from the clean one."""
    from lmlab.data.qa import key_spans

    q = "What is the capital of Burkina Faso?"
    assert [q[a:b] for a, b in key_spans(q)] == ["capital", "Burkina Faso"]
    q = 'Who wrote the novel "Moby-Dick" in 1851?'
    assert [q[a:b] for a, b in key_spans(q)] == ["wrote", "Moby-Dick", "1851"]
    assert key_spans("who is it") == []  # nothing to extract: the question is skipped, not taken whole
    countries = ["France", "Japan", "Brazil", "Kenya", "Canada", "Peru", "Egypt", "India", "Chile", "Norway"]
    rows = [{"question": f"as far as the record of this quiz goes, what is the capital city of {c} in {year}",
             "answer": [c[::-1]]}
            for c in countries for year in (1990, 2000, 2010, 2020)]
    (tmp_path / "nq.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    monkeypatch.setattr(s1.recipe, "alias_match", lambda text, aliases, exact=False: aliases[0][0] < "n")
    config = s1.Config(model="tiny-llama", datasets=[f"nq:{tmp_path / 'nq.jsonl'}"], per_dataset=40, sweep_every=1,
                       min_per_class=3, seeds=2)
    result = run_study(s1.SPEC, config, tmp_path / "run")
    answers = result.table("answer")
    assert set(answers.eq_source) == {"extracted"}
    ko = result.table("knockout")
    eq, ctrl = ko[ko.condition == "eq"], ko[ko.condition == "control"]
    assert len(ctrl) == len(eq) and set(ctrl.id) == set(eq.id)  # a draw for every question and replicate
    assert (ctrl.p_knock != ctrl.p_clean).mean() > 0.5  # a knockout, not the clean row


BEST = 6  # the planted tables' best probe layer (every replicate's)


META = dict(n_layers=8, model="m")  # what the recipe would describe of these made-up runs


def _result(rows):
    return from_rows("knockout", rows, meta=META)


def _planted(n=40, q_drop=-40.0, eq_flip=0.6, ctrl_flip=0.05, seed=0, datasets=("d",), replicates=3,
             ctrl_drop=None, patch=(0.7, 0.1, 0.1), control=True):
    """Tables with a planted effect, for each replicate (its own probes and control draw): at each layer a sample's
    E_Q knockout flips its probe with probability eq_flip (ΔP q_drop when it does, about 0 otherwise); the control
    flips with ctrl_flip (ΔP ctrl_drop when it does, q_drop unless given). Token patching at the best layer: E_Q
    patching flips a sample whose E_Q knockout flips that layer's probe (the analysis's Q-Anchored) with probability
    patch[0], any other with patch[1]; random-token patching flips any sample with patch[2]. Each sample's clean
    margin is drawn apart from all of it. `control` False: no question has tokens outside E_Q to draw a control from."""
    rows = []
    rng = np.random.default_rng(seed)
    for d in datasets:
        rows += [dict(kind="answer", id=f"{d}{i}", dataset=d, correct=1, eq_tokens=2,
                      pool_tokens=5 if control else 0) for i in range(n)]
    for r in range(replicates):
        for d in datasets:
            rows += [dict(kind="probe", replicate=r, probe_set=d, layer=layer, best=int(layer == BEST),
                          cv_auroc=0.8, test_auroc=0.8) for layer in (0, 2, 4, 6, 7)]
            for i in range(n):
                margin = rng.uniform(0.5, 1.0)
                for layer in (0, 2, 4, 6, 7):
                    for cond, p_flip in (("eq", eq_flip), ("control", ctrl_flip)) if control else (("eq", eq_flip),):
                        flip = int(rng.random() < p_flip)
                        drop = q_drop if cond == "eq" or ctrl_drop is None else ctrl_drop
                        dp = rng.normal(drop, 5) if flip else rng.normal(0, 3)
                        rows.append(dict(kind="knockout", replicate=r, id=f"{d}{i}", dataset=d, probe_set=d,
                                         layer=layer, condition=cond, flipped=flip, delta_p=dp, p_clean=margin,
                                         eq_tokens=2, control_tokens=2 if control else 0))
                        if cond == "eq" and layer == BEST:
                            anchored = flip
                rows.append(dict(kind="patching", replicate=r, id=f"{d}{i}", dataset=d, condition="eq",
                                 flipped=int(rng.random() < (patch[0] if anchored else patch[1]))))
                rows.append(dict(kind="patching", replicate=r, id=f"{d}{i}", dataset=d, condition="random",
                                 flipped=int(rng.random() < patch[2])))
    return rows


def _decisions(v):
    return {(c["group"], c["name"]): c["decision"] for c in v.evidence["claims"]}


DECISIVE = ("E_Q ΔP - control ΔP", "E_Q flips - control flips", "patching flips beyond random, Q - A",
            "patching flips, E_Q - random", "patching beyond random, Q - A, like margins")


def test_the_decisive_claims_are_the_four_against_the_papers_controls():
    from lmlab.studies.knockout.analysis import CLAIMS

    assert tuple(c.name for c in CLAIMS if c.decisive) == DECISIVE
    assert {c.name for c in CLAIMS if c.decisive and c.source != "paper"} == {DECISIVE[-1]}  # the like-margin check


def test_verdict_on_planted_effects_decides_on_the_papers_controls():
    assert late_layers([0, 3, 15, 18, 29], 30) == [15, 18, 29]
    good = verdict(_result(_planted(datasets=("a", "b"))))
    assert good.status == "reproduced", good.summary
    assert good.evidence["layers_compared"] == [4, 6, 7]
    assert {c["replicates"] for c in good.evidence["claims"]} == {3}
    assert {c["name"] for c in good.evidence["claims"] if not c["reported"] and c["source"] != "paper"} == \
        {"patching beyond random, Q - A, like margins"}
    assert {n for (_, n), d in _decisions(good).items() if d == "yes"} >= set(DECISIVE)
    assert good.evidence["deciding"]["source"] == "paper" and "Scope: this run" in good.summary
    # too few samples to split: inconclusive, naming the counts, never "reproduced"
    thin = verdict(_result(_planted(n=6)))
    assert thin.status == "inconclusive" and "Q- and A-Anchored samples: FAILED" in thin.summary
    # one set without probes is named with its counts, and leaves the set that has them to decide (a gate blocks
    # what it is about: a set the run cannot read does not silence the others)
    rows = _planted() + [dict(kind="probe_skipped", probe_set="e", correct_train=3, incorrect_train=40, needed=10)]
    skipped = verdict(_result(rows))
    assert skipped.status == "reproduced" and "e: probes: FAILED (3 correct / 40 incorrect" in skipped.summary
    # a mixture of probes left untrained in two of three replicates: one clause for the set, not one a replicate
    notes = [dict(kind="detection", replicate=r, probe_set="d", method=method, layer=4, n_test=20,
                  note=f"not trained: each pathway group needs 10 ({r} correct)" if r and method != "probe" else None)
             for r in range(3) for method in ("probe", "mixture of probes")]
    mixed = verdict(_result(_planted() + notes))
    assert mixed.summary.count("mixture of probes for d") == 1, mixed.summary
    assert "needs 10 (1 correct) (replicate 1; not trained in 2 of 3 replicates)" in mixed.summary


def test_detection_auroc_and_its_interval_are_computed_from_the_recorded_scores():
    """The recipe records each test sample's score; the AUROC is the analysis's, equal to scikit-learn's."""
    from sklearn.metrics import roc_auc_score

    from lmlab.studies.knockout.analysis import detection_table

    rng = np.random.default_rng(3)
    y = (rng.random(60) < 0.5).astype(int)
    score = rng.random(60) + 0.4 * y
    rows = _planted() + [dict(kind="detection", replicate=0, probe_set="d", method="probe", layer=BEST, n_test=60)]
    rows += [dict(kind="detection_score", replicate=0, probe_set="d", method="probe", layer=BEST, id=f"t{i}",
                  correct=int(y[i]), score=float(score[i])) for i in range(60)]
    det = detection_table(_result(rows))
    (row,) = det.itertuples()
    assert row.auroc == pytest.approx(roc_auc_score(y, score)) and row.low < row.auroc < row.high


def test_the_knockout_claims_say_no_or_open_where_e_q_is_no_different_from_the_control():
    """E_Q's knockout no different from random tokens' (ΔP and flips alike): neither E_Q claim says "yes"; the Q-A
    gap still does (the split builds it in), which is why it is reported and never decides."""
    null = verdict(_result(_planted(n=300, eq_flip=0.3, ctrl_flip=0.3, patch=(0.2, 0.2, 0.2))))
    got = _decisions(null)
    for name in ("E_Q ΔP - control ΔP", "E_Q flips - control flips"):
        assert got[("d", name)] in ("no", "open"), (name, null.summary)
    assert got[("d", "Q-A gap")] == "yes" and null.status != "reproduced"
    # the control moves the probe more than E_Q: the paper's claim fails, "not reproduced"
    worse = verdict(_result(_planted(n=300, eq_flip=0.1, ctrl_flip=0.5)))
    assert _decisions(worse)[("d", "E_Q flips - control flips")] == "no" and worse.status == "not reproduced"
    assert worse.evidence["deciding"]["source"] == "paper"
    # patching flips A-Anchored samples more than Q-Anchored ones: "no"
    swapped = verdict(_result(_planted(n=300, patch=(0.1, 0.6, 0.1))))
    assert _decisions(swapped)[("d", "patching flips beyond random, Q - A")] == "no"
    assert swapped.status == "not reproduced"
    # a far smaller E_Q effect than the old +10-point margin, but clear of 0: the paper's direction holds
    small = verdict(_result(_planted(n=400, eq_flip=0.12, ctrl_flip=0.07)))
    assert _decisions(small)[("d", "E_Q flips - control flips")] == "yes", small.summary


def _near_margin(n=300, replicates=3, seed=0, anchored=0.0, eq_patch=1.0, random_patch=1.0, width=0.08):
    """Tables as the pipeline makes them where nothing is anchored (its placebo, simulated): each question's
    best-layer probe has a clean margin (its confidence, 0.5-1), and every intervention, the E_Q knockout that splits
    Q from A as well as both patches, flips it with a chance that falls with the margin (exp(-(margin-0.5)/width),
    times eq_patch for E_Q patching and random_patch for random patching), each drawn independently. With
    `anchored` > 0 that share of the questions (drawn apart from the margin) is anchored on E_Q: its knockout flips
    the probe (chance 0.8) and so does its E_Q patching (0.6), never its random patching beyond the margin's chance."""
    rng = np.random.default_rng(seed)
    rows = []
    rows += [dict(kind="answer", id=f"q{i}", dataset="d", correct=1, eq_tokens=2, pool_tokens=5) for i in range(n)]
    for r in range(replicates):
        rows += [dict(kind="probe", replicate=r, probe_set="d", layer=layer, best=int(layer == BEST), cv_auroc=0.8,
                      test_auroc=0.8) for layer in (4, 6, 7)]
        margin = rng.uniform(0.5, 1.0, n)
        near = np.exp(-(margin - 0.5) / width)
        hooked = rng.random(n) < anchored
        for i in range(n):
            for layer in (4, 6, 7):
                for cond in ("eq", "control"):
                    flip = int(rng.random() < near[i] or (cond == "eq" and hooked[i] and rng.random() < 0.8))
                    rows.append(dict(kind="knockout", replicate=r, id=f"q{i}", dataset="d", probe_set="d", layer=layer,
                                     condition=cond, flipped=flip, delta_p=-30.0 * flip, p_clean=margin[i],
                                     eq_tokens=2, control_tokens=2))
            flip_eq = rng.random() < eq_patch * near[i] or (hooked[i] and rng.random() < 0.6)
            rows.append(dict(kind="patching", replicate=r, id=f"q{i}", dataset="d", condition="eq", flipped=int(flip_eq)))
            rows.append(dict(kind="patching", replicate=r, id=f"q{i}", dataset="d", condition="random",
                             flipped=int(rng.random() < random_patch * near[i])))
    return rows


def test_patching_q_minus_a_holds_no_anchoring_by_construction_yet_the_claim_that_decides_does_not():
    """The pipeline's own null for token patching: both patches random, so every flip is a near-margin probe's. The
    E_Q knockout's flips pick the near-margin questions as Q-Anchored, so the plain Q - A of patching flips says
    "yes" with no anchoring at all (why it is reported only); the decisive difference of differences (each question's
    E_Q patch against its random patch) does not, at three seeds. A planted pathway (questions whose knockout and E_Q
    patching flip the probe whatever its margin) says "yes". What the decisive claim cannot tell apart: a subject swap
    that is only a larger perturbation (it flips near-margin probes three times as often as the random patch) says
    "yes" there too; the like-margin check reported beside it does not, and so shows the two disagree."""
    like = "patching beyond random, Q - A, like margins"
    for seed in range(3):
        null = verdict(_result(_near_margin(seed=seed)))
        got = _decisions(null)
        assert got[("d", "patching flips, Q - A")] == "yes", null.summary  # the old claim: yes by construction
        assert got[("d", "patching flips beyond random, Q - A")] in ("open", "no"), null.summary
        assert got[("d", "patching flips, E_Q - random")] in ("open", "no"), null.summary
        assert got[("d", like)] in ("open", "no") and null.status != "reproduced"
    planted = _decisions(verdict(_result(_near_margin(anchored=0.4, seed=5))))
    assert planted[("d", "patching flips beyond random, Q - A")] == "yes" and planted[("d", like)] == "yes"
    bigger = _decisions(verdict(_result(_near_margin(eq_patch=1.0, random_patch=0.35, seed=4))))
    assert bigger[("d", "patching flips beyond random, Q - A")] == "yes" and bigger[("d", like)] != "yes"


def test_the_patching_difference_of_differences_equals_a_plain_computation_per_replicate():
    """Each replicate's decisive estimate against pandas on the same tables: the split from the E_Q knockout's flip
    at the best layer, then mean (E_Q flip - random flip) over Q-Anchored questions minus over A-Anchored ones; the
    like-margin check against the same within tercile strata of the clean margin."""
    from lmlab.studies.knockout.analysis import patching_claims, split_at_best

    result = _result(_near_margin(n=120, anchored=0.3, seed=2))
    ko, patch = result.table("knockout"), result.table("patching")
    claims, thin = patching_claims(patch, split_at_best(ko, result.table("probe")), "d")
    got = {c.name: c.replicate_estimates for c in claims}
    assert thin == (0, 3)
    for r in range(3):
        at = ko[(ko.replicate == r) & (ko.condition == "eq") & (ko.layer == BEST)].set_index("id")
        flips = patch[patch.replicate == r].pivot(index="id", columns="condition", values="flipped")
        d = (flips["eq"] - flips["random"]).rename("d").to_frame().join(at[["flipped", "p_clean"]])
        plain = d[d.flipped == 1].d.mean() - d[d.flipped == 0].d.mean()
        assert got["patching flips beyond random, Q - A"][r] == pytest.approx(plain)
        d["stratum"] = pd.qcut(d.p_clean, 3, labels=False)
        num = den = 0.0
        for _, part in d.groupby("stratum"):
            nq, na = (part.flipped == 1).sum(), (part.flipped == 0).sum()
            if nq and na:
                h = nq * na / (nq + na)
                num += h * (part[part.flipped == 1].d.mean() - part[part.flipped == 0].d.mean())
                den += h
        assert got["patching beyond random, Q - A, like margins"][r] == pytest.approx(num / den)


def _one_sided(rows, replicates):
    """Every patched question of these replicates Q-Anchored (the E_Q knockout flips the best-layer probe on each)."""
    for row in rows:
        if row["kind"] == "knockout" and row["replicate"] in replicates and row["condition"] == "eq" and \
                row["layer"] == BEST:
            row["flipped"] = 1
    return rows


def test_a_replicate_whose_patched_questions_sit_on_one_side_is_counted_at_its_worst():
    """One replicate of three with every patched question Q-Anchored: Q - A is undefined there. It is counted and
    shown, and the Q - A claim's answer stands only if it stands with that replicate at its worst (-200 points):
    at three replicates it does not, so the claim is open and says why; the other claims still decide. Two of three
    without both groups fail the gate, which sets aside the Q - A claims alone; a paper claim read nowhere keeps the
    verdict from "reproduced"."""
    thin = verdict(_result(_one_sided(_planted(), {1})))
    claims = {c["name"]: c for c in thin.evidence["claims"]}
    qa = claims["patching flips beyond random, Q - A"]
    assert qa["failed"] == 1 and qa["replicates"] == 2 and qa["decision"] == "open" and "worst" in qa["reason"]
    assert claims["E_Q ΔP - control ΔP"]["decision"] == "yes" and thin.status == "inconclusive", thin.summary
    gates = {g["name"]: g for g in thin.evidence["gates"]}
    assert gates["d: patched Q- and A-Anchored samples"]["passed"] is True
    assert "in 1 of 3 replicates the questions patched both ways hold no Q- or no A-Anchored sample" in \
        gates["d: patched Q- and A-Anchored samples"]["why"]
    two = verdict(_result(_one_sided(_planted(), {1, 2})))
    claims = {c["name"]: c for c in two.evidence["claims"]}
    assert claims["patching flips beyond random, Q - A"]["set_aside"] == "d: patched Q- and A-Anchored samples"
    assert claims["patching flips, E_Q - random"]["set_aside"] == "" and two.status == "inconclusive", two.summary
    assert "not read in any group (a gate set it aside): patching flips beyond random, Q - A" in two.summary
    gates = {g["name"]: g["passed"] for g in verdict(_result(_planted())).evidence["gates"]}
    assert gates["d: patched Q- and A-Anchored samples"] is True


def test_no_control_draw_is_never_the_clean_row_and_leaves_the_verdict_open():
    """A set whose questions have no token outside E_Q has no control rows: its claims against the control cannot be
    computed, and a failed gate says why (never E_Q's flip rate read as 'E_Q minus control')."""
    bare = verdict(_result(_planted(control=False)))
    assert bare.status == "inconclusive", bare.summary
    assert "random-token control drawn: FAILED (0 of 40 questions" in bare.summary
    assert bare.evidence["deciding"]["kind"] == "gate"


def test_a_control_smaller_than_e_q_is_left_out_and_named_never_compared():
    """Questions with fewer tokens outside E_Q than E_Q has: the control gate names them, and a control row of another
    size (as a run recorded before the exact draw could hold) is left out of the E_Q-vs-control claims; too few
    questions left with a control fail the gate. A run without the per-row counts cannot be checked: it fails."""
    from lmlab.studies.knockout.analysis import matched_control

    rows = _planted(n=40)
    small = {f"d{i}" for i in range(8)}
    for row in rows:
        if row.get("id") in small:
            if row["kind"] == "answer":
                row["pool_tokens"] = 1
            elif row["kind"] == "knockout":
                row["control_tokens"] = 1 if row["condition"] == "control" else 0
                if row["condition"] == "control":
                    row["flipped"], row["delta_p"] = 1, -80.0  # a smaller control: were it compared, it would show
    result = _result(rows)
    ko = matched_control(result.table("knockout"))
    assert not set(ko[ko.condition == "control"].id) & small and set(ko[ko.condition == "eq"].id) >= small
    v = verdict(result)
    gate = next(g for g in v.evidence["gates"] if g["name"] == "d: random-token control drawn")
    assert gate["passed"] and gate["why"] == (
        "32 of 40 questions have a control of E_Q's size (as many question tokens outside E_Q as E_Q has; needs 5); "
        "8 of the 40 answered have fewer tokens outside E_Q than E_Q has (d0, d1, d2, d3, d4, ...) and are left out "
        "of the E_Q-vs-control claims")
    assert v.status == "reproduced", v.summary  # the eight left out, the rest decide
    assert _decisions(v)[("d", "E_Q flips - control flips")] == "yes"
    fewer = [r for r in rows if not (r["kind"] == "knockout" and r["condition"] == "control"
                                     and int(r["id"][1:]) >= 12)]
    for r in fewer:
        if r["kind"] == "answer" and int(r["id"][1:]) >= 12:
            r["pool_tokens"] = 1
    v = verdict(_result(fewer))
    assert "d: random-token control drawn: FAILED (4 of 40 questions have a control" in v.summary
    old = [{k: x for k, x in r.items() if k != "control_tokens"} for r in rows]
    gate = next(g for g in verdict(_result(old)).evidence["gates"]
                if g["name"] == "d: random-token control drawn")
    assert not gate["passed"] and "no token counts" in gate["why"]


def test_replicates_that_disagree_leave_the_knockout_verdict_open():
    """Two replicates (probe splits) show the effect, one shows none: the claims cannot decide, whatever each
    replicate's own interval says."""
    rows = _planted(replicates=2, n=60) + [
        dict(r, replicate=2) for r in _planted(replicates=1, n=60, q_drop=-2.0, eq_flip=0.06, seed=5)
        if r["kind"] == "knockout"]
    split = verdict(_result(rows))
    assert split.status == "inconclusive", split.summary
    assert "the replicates disagree" in split.summary and "seeds" in split.summary


def test_sweep_with_several_control_draws_equals_each_draw_alone(decoder):
    """S1's replicates share one sweep: E_Q and every replicate's control draw as rows of one batch; each draw's
    hidden states equal a sweep with that draw alone."""
    ids = decoder.tokenizer("Q: What is the capital of France?\nA: Paris")["input_ids"]
    draws = [[2, 3], [1, 4], None]
    both = sweep(decoder, ids, [5, 7], draws, [0, 2])
    for draw, got in zip(draws, both.controls):
        alone = sweep(decoder, ids, [5, 7], draw, [0, 2])
        for k in (0, 2):
            assert near(got[k], (alone.control or alone.clean)[k], dtype=decoder.model.dtype)
            assert near(both.eq[k], alone.eq[k], dtype=decoder.model.dtype)


def test_sweep_equals_hand_masked_eager_that_blocks_each_key_from_later_queries(decoder):
    """The fast sweep (shared prefix, batched cut-offs) against an independent eager attention that sets
    scores (q, e) to -inf for every E_Q key e and every query q > e, in layers 0..k."""
    from test_interventions import HAND, using

    ids = decoder.tokenizer("Q: What is the capital of France?\nA: Paris")["input_ids"]
    eq = [3, 5, 6]
    res = sweep(decoder, ids, eq, None, [0, 1, 2])
    n = len(ids)
    block = torch.zeros(1, 1, n, n, dtype=torch.bool, device=decoder.device)
    for e in eq:
        block[0, 0, e + 1:, e] = True
    attn = [decoder.layout.attn(l) for l in range(decoder.layout.n_layers)]
    for k in (0, 1, 2):
        seen = {}
        handle = decoder.layout.block(k).register_forward_hook(
            lambda m, a, out: seen.setdefault("h", out[0] if isinstance(out, tuple) else out))
        for l in range(k + 1):
            attn[l]._test_block = block
        try:
            with using(decoder.model, HAND), torch.no_grad():
                decoder.model(input_ids=torch.tensor([ids], device=decoder.device))
        finally:
            handle.remove()
            for l in range(k + 1):
                attn[l].__dict__.pop("_test_block", None)
        hand = seen["h"][0, -1].float().to(res.eq[k].device)  # the sweep returns its states on the host
        assert near(res.eq[k], hand, atol=1e-4, dtype=decoder.model.dtype), (k, max_diff(res.eq[k], hand))
    span = sweep(decoder, ids, eq, None, [2], scope="span")
    assert not torch.allclose(span.eq[2], res.eq[2], atol=1e-4)  # token 6 still reads 5 and 3 under "span"


@pytest.mark.embedded
def test_embedded_model_answers_some_capitals_right_and_some_wrong(embedded_smollm):
    from lmlab.data.scoring import alias_match
    from lmlab.generation import greedy_answers

    items = generate("geo-capital", 30, seed=0)
    prompts = [s1m.encode_item(embedded_smollm, i)["ids"] for i in items]
    answers = greedy_answers(embedded_smollm, prompts, max_new_tokens=6)
    right = sum(alias_match(embedded_smollm.tokenizer.decode(a), i.aliases) for a, i in zip(answers, items))
    assert 3 <= right <= 27  # both classes exist, so probes can be trained


def _two_pathway_model(monkeypatch, n, question_anchored, device):
    """A tiny llama built so that the paper's two pathways exist by construction (the positive control).

    Every query attends evenly to the keys it may see (q_proj = 0), MLPs are off, and only subject tokens
    and two answer tokens have embeddings. For a question-anchored item the answer is a constant,
    embedding-less token, and the label ("correct") is the sign of a fixed direction u on what layer 0's
    attention carries from the subject: the last token knows it only by reading E_Q. For an
    answer-anchored item the label is a coin, written into the answer as one of two opposite tokens:
    knocking E_Q out cannot touch it. Answers are planted (the model is not asked to generate them). Built in
    float32 on the test's device (a construction of the method's positive case, not a test of bf16)."""
    lm = device.load("tiny-llama", dtype=torch.float32)
    model, tok = lm.model, lm.tokenizer
    items = [i for i in generate("geo-capital", n, seed=0) if s1m.encode_item(lm, i)]
    encs = {i.id: s1m.encode_item(lm, i) for i in items}
    prop = set(tok(" capital", add_special_tokens=False)["input_ids"])
    subject = {encs[i.id]["ids"][p] for i in items for p in encs[i.id]["eq"]} - prop
    emb = model.get_input_embeddings().weight
    constant, yes, no = [t for t in range(10, emb.shape[0]) if t not in subject][:3]
    layer0 = model.model.layers[0]
    cfg = model.config
    head_dim, rep = cfg.hidden_size // cfg.num_attention_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    with torch.no_grad():
        keep = torch.zeros(emb.shape[0], dtype=torch.bool, device=emb.device)
        keep[sorted(subject | {yes})] = True
        emb[~keep] = 0
        emb[yes] *= 0.1  # the answer pathway about as strong as the question pathway at the last token
        emb[no] = -emb[yes]
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()

        def carried(ids):  # what layer 0's attention writes from these keys (before the 1/n of the average)
            v = layer0.self_attn.v_proj(layer0.input_layernorm(emb[ids])).view(len(ids), -1, head_dim)
            return layer0.self_attn.o_proj(v.repeat_interleave(rep, dim=1).reshape(len(ids), -1)).sum(0)

        u = torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(0), device="cpu").to(emb.device)
        score = {i.id: float(carried([encs[i.id]["ids"][p] for p in encs[i.id]["eq"]]) @ u) for i in items}
    median = float(np.median(list(score.values())))
    coins = np.random.default_rng(0).random(len(items)) < 0.5
    label, answer, anchored = {}, {}, set()
    for n_item, item in enumerate(items):
        key = tuple(encs[item.id]["ids"])
        if question_anchored and n_item % 2 == 0:
            anchored.add(item.id)
            label[item.aliases[0]], answer[key] = score[item.id] > median, [constant, constant]
        else:
            label[item.aliases[0]], answer[key] = bool(coins[n_item]), [constant, yes if coins[n_item] else no]
    monkeypatch.setattr(s1.recipe, "alias_match", lambda text, aliases, exact=False: label[aliases[0]])
    monkeypatch.setattr(s1.recipe, "greedy_answers", lambda lm_, prompts, *a, **k: [answer[tuple(p)] for p in prompts])
    lm.name = "tiny-two-pathways" if question_anchored else "tiny-answer-only"
    return lm, anchored


def test_positive_control_a_model_with_both_pathways_reproduces_and_one_without_does_not(tmp_path, monkeypatch,
                                                                                         device):
    """End to end through answers, probes, the knockout sweep, the per-layer split and the verdict: where half
    the items' truthfulness is read from E_Q, the E_Q knockout flips the probe far more often than the control
    and drops the flipped items' confidence; where every item's truthfulness is in its answer, it cannot."""
    config = s1.Config(model="tiny", datasets=["geo-capital"], per_dataset=160, sweep_every=1, min_per_class=5,
                       seeds=5)
    lm, anchored = _two_pathway_model(monkeypatch, 160, question_anchored=True, device=device)
    both = run_study(s1.SPEC, config, tmp_path, lm=lm)
    assert both.verdict.status == "reproduced", both.verdict.summary
    ko = both.table("knockout")
    late = ko[ko.layer >= 1]
    # on the questions that have a control (exactly as many tokens as E_Q; blocking them also reweights the uniform
    # attention over the keys left, so it flips a few near-margin probes too)
    paired = late[late.id.isin(set(late[late.condition == "control"].id))]
    flips = paired.groupby("condition").flipped.mean()
    assert flips["eq"] > 0.15 and flips["eq"] > 3 * flips["control"], flips  # about half the anchored half
    eq = late[late.condition == "eq"]
    assert set(eq[eq.flipped == 1].id) <= anchored  # only question-anchored items flip (the Q-Anchored ones)
    lm, _ = _two_pathway_model(monkeypatch, 160, question_anchored=False, device=device)
    answer_only = run_study(s1.SPEC, config, tmp_path, lm=lm)
    assert answer_only.verdict.status in ("inconclusive", "not reproduced"), answer_only.verdict.summary
    assert answer_only.table("knockout").query("condition == 'eq'").flipped.sum() == 0


def test_random_token_patching_replaces_only_question_tokens_outside_eq():
    """The patching control keeps the prompt's length and changes only question tokens outside E_Q, at most as many
    as asked, each to a token of the donor's question outside its E_Q; both conditions reach the features."""
    import random

    lm = load_model("tiny-llama")
    items = generate("geo-capital", 6, seed=3)
    own, donor = s1m.encode_item(lm, items[0]), s1m.encode_item(lm, items[1])
    pool = set(own["question"]) - set(own["eq"])
    allowed = {donor["ids"][p] for p in set(donor["question"]) - set(donor["eq"])}
    for seed in range(20):
        ids = s1m.random_patch(own, donor, 2, random.Random(seed))
        changed = [p for p, (a, b) in enumerate(zip(ids, own["ids"])) if a != b]
        assert len(ids) == len(own["ids"]) and set(changed) <= pool and len(changed) <= 2
        assert {ids[p] for p in changed} <= allowed
    assert s1m.random_patch(dict(own, eq=own["question"]), donor, 2, random.Random(0)) is None  # no pool: no draw
    assert s1m.random_patch(own, donor, len(pool) + 1, random.Random(0)) is None  # exactly `count`, or none
    ids = s1m.random_patch(own, donor, len(pool), random.Random(0))
    assert sum(a != b for a, b in zip(ids, own["ids"])) <= len(pool)
    answers = {i.id: [5, 6] for i in items}
    jobs, feats = s1m.patching_features(lm, items, answers, np.ones(len(items), int), s1.Config(model="tiny-llama"),
                                        [0, 1])
    assert feats.shape[:2] == (len(jobs), 2) and {c for *_, c in jobs} == {"eq", "random"}


def test_the_fact_sets_check_their_gold_answers_and_swap_only_subjects_whose_answer_differs():
    """A continent answer counts only when it is the continent; a capital is known by its other spellings but never
    by the question's own country name; each item's question is one of its relation's forms and names the property;
    a subject swap takes a donor of the same relation whose gold answers share none with the item's."""
    from lmlab.data.scoring import alias_match
    from lmlab.data.generated.geo_qa import MIXED, available

    continent = generate("geo-continent", 40, seed=0)
    asia = next(i for i in continent if i.aliases == ["Asia"])
    assert asia.exact and alias_match("Asia", asia.aliases, asia.exact)
    assert not alias_match("South Asia", asia.aliases, asia.exact) and alias_match("South Asia", asia.aliases)
    capitals = {i.subject: i.aliases for i in generate("geo-capital", 400, seed=0)}
    assert "Kiev" in capitals["Ukraine"] and "Mexico" not in capitals["Mexico"]
    mixed = generate("geo-facts", 70, seed=4)
    assert {i.relation for i in mixed} == set(MIXED["geo-facts"]) and len({i.id for i in mixed}) == 70
    for item in mixed:
        forms = RELATIONS[item.relation].forms
        assert any(item.question == t.format(s=item.subject) and p == item.prop for t, p in forms), item
        assert item.prop in item.question and item.dataset == "geo-facts"
    assert available("geo-facts") == sum(available(r) for r in MIXED["geo-facts"]) > 1000
    same = [i for i in generate("geo-continent", 60, seed=1)]
    for item in same[:10]:
        donors = s1m.donors_for(item, same)
        assert donors and all(not set(d.aliases) & set(item.aliases) for d in donors)


def test_a_property_the_question_words_otherwise_leaves_e_q_the_subject():
    """PopQA's "place of birth" asked as "In what city was X born?": E_Q is the subject alone, not a skipped row."""
    item = QAItem(id="p", dataset="popqa", question="In what city was Ada Lovelace born?", aliases=["London"],
                  subject="Ada Lovelace", prop="place of birth")
    prompt = build_prompt(item)
    assert prompt.eq_source == "subject" and len(prompt.eq_spans) == 1
    assert prompt.text[slice(*prompt.eq_spans[0])] == "Ada Lovelace"
