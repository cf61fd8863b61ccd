import copy
import importlib.util

import numpy as np
import pandas as pd
import pytest
import torch

from lmlab import LmlabError
from lmlab.data.formats import read_glue
from lmlab.data.generated.nlu import TASKS, _split_entities, generate_task
from lmlab.studies import quantize as s2
import lmlab.studies.quantize.recipe  # noqa: F401  (s2.recipe, patched below, whatever ran before)
from lmlab.studies import run_study
from lmlab.evaluation import metric_value
from lmlab.models import load_model
from lmlab.studies.quantize.analysis import verdict
from lmlab.studies.result import from_rows
from lmlab.train.kd import kd_loss

from helpers import interrupt_on_call, needs_export_extra


def _assert_killed_run_resumes(monkeypatch, module, name: str, n: int, config, out, scores):
    """Kill a run at the n-th call of module.name, run it again: the scores equal the uninterrupted ones.
    Returns the resumed run."""
    real = interrupt_on_call(monkeypatch, module, name, n)
    with pytest.raises(KeyboardInterrupt):
        run_study(s2.SPEC, config, out)
    monkeypatch.setattr(module, name, real)
    resumed = run_study(s2.SPEC, config, out)
    cols = ["task", "bits", "budget", "replicate", "score"]
    pd.testing.assert_frame_equal(resumed.long()[resumed.long().kind == "score"][cols].reset_index(drop=True),
                                  scores[cols].reset_index(drop=True))
    return resumed


def test_kd_loss_is_zero_for_a_student_identical_to_its_teacher(device):
    for regression in (False, True):
        lm = device.load("tiny-bert", head="classifier", num_labels=1 if regression else 3)
        enc = lm.encode(["the capital of France is Paris", "Paris lies in Europe"], padding_side="right")
        loss, parts = kd_loss(copy.deepcopy(lm.model), lm.model, dict(enc), regression)
        assert loss.item() == 0.0 and parts == {"logit": 0.0, "attention": 0.0, "hidden": 0.0}
        other = device.load("tiny-bert", head="classifier", num_labels=1 if regression else 3, seed=3).model
        loss, parts = kd_loss(other, lm.model, dict(enc), regression)
        assert all(v > 0 for v in parts.values())
        loss.backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in other.parameters())


def test_cached_teacher_outputs_give_the_recomputed_loss_and_gradients(device):
    """Every student reads the teacher from a TeacherCache built once; its loss and gradients must be those of
    running the teacher on the same padded batch, and an example's loss must not depend on its batch's padding."""
    from lmlab.studies.quantize.measure import collate_for
    from lmlab.train.kd import Indexed, TeacherCache, indexed_collate

    torch.manual_seed(0)
    for regression, name in ((False, "fact-mnli"), (True, "fact-stsb")):
        lm = device.load("tiny-bert", head="classifier", num_labels=1 if regression else 3)
        task = generate_task(name, 24, 4, seed=0)
        collate = collate_for(lm.tokenizer, task, 64)
        cache = TeacherCache(lm.model.eval(), task.train, collate, batch_size=5)  # other batches than training's
        data, batches = Indexed(task.train), indexed_collate(collate)
        student = device.load("tiny-bert", head="classifier", num_labels=1 if regression else 3, seed=3).model
        batch = batches([data[i] for i in (3, 17, 0, 9, 22, 11)])
        grads = []
        for use in (None, cache):
            student.zero_grad()
            loss, parts = kd_loss(student, lm.model, batch, regression, cache=use)
            loss.backward()
            grads.append(torch.cat([p.grad.flatten() for p in student.parameters() if p.grad is not None]))
            if use is None:
                first = loss.item(), parts
        assert loss.item() == pytest.approx(first[0], rel=1e-5, abs=1e-6)
        assert all(parts[k] == pytest.approx(first[1][k], rel=1e-5, abs=1e-6) for k in parts)
        assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)
        # one example alone vs padded inside a wider batch: the same loss terms
        width = [batches([data[i]])["input_ids"].shape[1] for i in range(24)]
        short, longest = int(np.argmin(width)), int(np.argmax(width))
        assert width[short] < width[longest]
        alone = kd_loss(student, lm.model, batches([data[short]]), regression)[1]
        both = kd_loss(student, lm.model, batches([data[short], data[longest]]), regression, cache=cache)[1]
        single = kd_loss(student, lm.model, batches([data[longest]]), regression)[1]
        for k in ("attention", "hidden"):  # a pair's feature terms are weighted means of each row's
            assert min(alone[k], single[k]) - 1e-6 <= both[k] <= max(alone[k], single[k]) + 1e-6


@pytest.mark.parametrize("task_name", ["fact-mnli", "fact-stsb"])
def test_predictions_batched_by_length_equal_one_example_at_a_time(task_name, device):
    from lmlab.studies.quantize.measure import collate_for, predict

    task = generate_task(task_name, 8, 40, seed=0)
    lm = device.load("tiny-bert", head="classifier", num_labels=task.num_labels)
    collate = collate_for(lm.tokenizer, task, 64)
    lengths = [len(e.text_a) + len(e.text_b or "") for e in task.test]
    assert lengths != sorted(lengths)  # the batches really are formed out of the examples' order
    batched = predict(lm.model, collate, task.test, batch_size=16)
    alone = np.array([predict(lm.model, collate, [e], batch_size=1)[0] for e in task.test])
    if task.num_labels == 1:  # scores: each example's own value, back in its place
        np.testing.assert_allclose(batched, alone, rtol=0, atol=1e-6 if device.dtype == torch.float32
                                   else device.tol(np.abs(alone).max())["atol"])
        assert np.ptp(batched) > 1e-4 and np.abs(np.diff(np.sort(batched))).max() > 1e-5  # a swap would show
    else:
        assert np.array_equal(batched, alone)


def test_tasks_hold_out_their_dev_and_test_countries():
    split = _split_entities(0)
    names = {k: {c["name"] for c in v} for k, v in split.items()}
    assert not names["train"] & names["test"] and not names["train"] & names["dev"]
    task = generate_task("fact-mnli", 200, 100)
    from lmlab.data.generated.nlu import PREMISES

    about = {part: {p.format(**c) for c in split[part] for p in PREMISES} for part in ("train", "test")}
    assert {e.text_a for e in task.train} <= about["train"] and {e.text_a for e in task.test} <= about["test"]
    for name in TASKS:
        t = generate_task(name, 50, 20)
        assert len(t.train) == 50 and len(t.test) == 20 and t.metric in ("matthews", "f1", "accuracy", "pearson")
        assert len({e.label for e in t.train}) >= 2


def test_generated_eval_sets_hold_no_example_twice_and_no_true_contradiction():
    """Dev and test are distinct examples (an interval over test examples counts each once), a size the countries
    cannot give is one sentence, and fact-mnli's labels follow the countries' facts: a contradiction states a value
    the country does not have, an entailment one it has (checked against every true sentence the templates make)."""
    from lmlab.data.generated.nlu import FACTS, PAIRS, _countries

    for name in TASKS:
        task = generate_task(name, 20, 600)
        for part in (task.dev, task.test):
            assert len({(e.text_a, e.text_b) for e in part}) == len(part) == 600
    with pytest.raises(LmlabError, match="distinct examples, fewer than --n-eval 100000"):
        generate_task("fact-mnli", 10, 100000)
    true = {t.format(**c) for c in _countries() for t in [*PAIRS, *(x for rel in FACTS.values() for x in rel)]}
    task = generate_task("fact-mnli", 3000, 1000)
    for e in task.train + task.test:
        assert (e.text_b in true) == (e.label == 0), e


def test_glue_reader_parses_and_names_bad_rows(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence1\tsentence2\tlabel\nA man.\tA person.\tentailment\n"
                                        "x\ty\tmaybe\n")
    with pytest.raises(LmlabError, match=r"train.tsv:3: bad rte row"):
        read_glue("rte", tmp_path / "train.tsv")
    (tmp_path / "cola.tsv").write_text("gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tCat the sat.\n")
    rows = read_glue("cola", tmp_path / "cola.tsv")
    assert [r.label for r in rows] == [1, 0] and rows[1].text_a == "Cat the sat."
    with pytest.raises(LmlabError, match="unknown GLUE task 'wnli2'"):
        read_glue("wnli2", tmp_path / "cola.tsv")


def test_metrics_match_their_definitions():
    y = np.array([1, 0, 1, 1, 0, 0])
    p = np.array([1, 0, 0, 1, 0, 1])
    assert metric_value("accuracy", y, p) == pytest.approx(4 / 6)
    assert metric_value("f1", y, p) == pytest.approx(2 / 3)
    assert metric_value("matthews", y, p) == pytest.approx(1 / 3)
    assert metric_value("pearson", np.array([1.0, 2, 3]), np.array([2.0, 4, 6])) == pytest.approx(1.0)


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(LmlabError, match="3-bit weights are not supported"):
        run_study(s2.SPEC, s2.Config(model="tiny-bert", bits=[3], n_train=8, n_eval=8), tmp_path)
    with pytest.raises(LmlabError, match="unknown task 'fact-xyz'"):
        run_study(s2.SPEC, s2.Config(model="tiny-bert", tasks=["fact-xyz"], n_train=8, n_eval=8), tmp_path)
    with pytest.raises(LmlabError, match="a decoder is scored on the circuit tasks .*, not 'fact-cola'"):
        run_study(s2.SPEC, s2.Config(model="tiny-llama", tasks=["fact-cola"], n_train=8, n_eval=8), tmp_path)


def test_study_runs_on_a_tiny_encoder_and_resumes_to_the_same_table(tmp_path, monkeypatch):
    config = s2.Config(model="tiny-bert", tasks=["fact-cola", "fact-stsb"], n_train=32, n_eval=24, batch_size=16,
                       teacher_epochs=6, best_dev=True, seeds=2)
    whole = run_study(s2.SPEC, config, tmp_path / "a")
    scores = whole.long()[whole.long().kind == "score"]
    # 4 cells x 2 replicates, and the undistilled reference at each width (no KD step, scored, not packed)
    assert len(scores) == 2 * (1 + 6 * 2) and set(scores.budget) == {"teacher", "A", "C", "undistilled"}
    assert sorted(scores[scores.bits < 32].replicate.unique()) == [0, 1]
    undistilled = scores[scores.budget == "undistilled"]
    assert (undistilled.steps == 0).all() and undistilled.packed_bytes.isna().all()
    assert (undistilled.weight_bits == undistilled.bits).all()  # at its own width (the placebo's 1-bit is ternary)
    sizes = scores[(scores.bits < 32) & (scores.budget != "undistilled")]
    assert ((sizes.fp32_bytes / sizes.packed_bytes) > 13).all()
    assert len(list((whole.path / "packed").glob("*.safetensors"))) == 16
    # the students' dev curves, at the budget the claims and the convergence gate read (C): its 12 steps scored
    # after 9 and 12, the rise recorded; Budget-A, which the gate does not read, is not scored on dev
    c, a = sizes[sizes.budget == "C"], sizes[sizes.budget == "A"]
    assert c.dev_rise.notna().all() and c.dev_last.notna().all() and a[["dev_rise", "dev_last"]].isna().all().all()
    # killed in the second replicate of a cell (after the undistilled reference, whose second replicate is the first
    # one's rows): the finished units are kept, the rest resumes
    _assert_killed_run_resumes(monkeypatch, s2.recipe, "run_unit", 8, config, tmp_path / "b", scores)


def _table(scores: dict, n: int = 400, task: str = "t", seed: int = 0, replicates: int = 3) -> pd.DataFrame:
    """Predictions whose accuracy is each configuration's (a value, or one per replicate); students err where the
    teacher errs, plus more (a student is its teacher quantized, so their errors are nested, as in a real run),
    each replicate on partly other examples."""
    rows, rng = [], np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    order = rng.permutation(n)  # the first k of this order are wrong for a configuration with k errors
    teacher_wrong = int(round((1 - scores[(32, "teacher")]) * n))
    for (bits, budget), acc in scores.items():
        for r in range(1 if bits == 32 else replicates):
            a = acc[r] if isinstance(acc, (list, tuple)) else acc
            wrong = np.zeros(n, bool)
            k = int(round((1 - a) * n))
            extra = np.roll(order[teacher_wrong:], 7 * r)  # beyond the teacher's errors, each replicate its own
            wrong[np.concatenate([order[:teacher_wrong], extra])[:k]] = True
            preds = np.where(wrong, 1 - labels, labels)
            rep = None if bits == 32 else r
            rows.append(dict(kind="score", task=task, metric="accuracy", bits=bits, budget=budget, replicate=rep,
                             score=100 * (preds == labels).mean(), steps=10 if bits < 32 else 0))
            rows += [dict(kind="pred", task=task, bits=bits, budget=budget, replicate=rep, idx=i, pred=float(p),
                          label=float(y)) for i, (p, y) in enumerate(zip(preds, labels))]
    return pd.DataFrame(rows)


def _decisions(v):
    return {c["name"]: c["decision"] for c in v.evidence["claims"]}


# the undistilled reference: the teacher quantized with no KD step, far below it (as quantization alone leaves
# a student), so that "close" says something of the method
FAR = {(2, "undistilled"): 0.6, (1, "undistilled"): 0.5}
# the paper's pattern: 2-bit C on the teacher, 1-bit C a point below it (within the paper's largest 1-bit gap, 2.3
# points), Budget-C above
# Budget-A at both widths, most at 1 bit
GOOD = {(32, "teacher"): 0.9, (2, "A"): 0.885, (2, "C"): 0.9, (1, "A"): 0.86, (1, "C"): 0.89, **FAR}


def test_verdict_reproduces_the_paper_pattern_and_fails_the_opposite():
    good = verdict(from_rows("quantize", _table(GOOD, n=1000)))
    assert good.status == "reproduced", good.summary
    assert {c["replicates"] for c in good.evidence["claims"]} == {3}
    bad = verdict(from_rows("quantize", _table({(32, "teacher"): 0.9, (2, "A"): 0.7, (2, "C"): 0.6, (1, "A"): 0.8,
                                                 (1, "C"): 0.65, **FAR}, n=1000)))
    assert bad.status == "not reproduced", bad.summary


def test_two_bit_close_is_decided_on_the_interval():
    base = {(1, "A"): 0.6, (1, "C"): 0.75, (2, "A"): 0.8, **FAR}
    close = verdict(from_rows("quantize", _table({(32, "teacher"): 0.9, (2, "C"): 0.899, **base}, n=2000)))
    assert _decisions(close)["teacher - 2-bit Budget-C"] == "yes"
    # half a point below the teacher on 2000 examples: past the paper's largest 2-bit gap (0.4) but not clearly
    half = verdict(from_rows("quantize", _table({(32, "teacher"): 0.9, (2, "C"): 0.895, **base}, n=2000)))
    assert _decisions(half)["teacher - 2-bit Budget-C"] == "open"
    far = verdict(from_rows("quantize", _table({(32, "teacher"): 0.9, (2, "C"): 0.84, **base}, n=2000)))
    assert _decisions(far)["teacher - 2-bit Budget-C"] == "no" and far.status == "not reproduced"
    near = verdict(from_rows("quantize", _table({(32, "teacher"): 0.9, (2, "C"): 0.885, **base}, n=150)))
    claim = next(c for c in near.evidence["claims"] if c["name"] == "teacher - 2-bit Budget-C")
    assert claim["low"] <= 0.4 < claim["high"] and claim["decision"] == "open"
    # at 150 examples the 1-bit Budget-A student sits under the learned mark: the gate sets aside the claims that
    # read it, and the 1-bit Budget-C student, 15 points from its teacher, still says "no" (as in `far`)
    assert near.status == "not reproduced"
    assert {c["name"] for c in near.evidence["claims"] if c["set_aside"]} == {"Budget-C - Budget-A at 1 bit",
                                                                             "C-A gap at 1 bit - at 2 bits"}
    # the same far students whose KD loss was still falling: no "no" from a training still learning, on the claims
    # that read their cell (2-bit Budget-C) alone; the 1-bit Budget-C students, converged and 15 points below the
    # teacher, still say "no"
    table = _table({(32, "teacher"): 0.9, (2, "C"): 0.84, **base}, n=2000)
    falling = (table.kind == "score") & (table.bits == 2) & (table.budget == "C")
    table.loc[table.kind == "score", ["loss_q3", "loss_q4"]] = [0.50, 0.48]  # 4% lower: converged
    table.loc[falling, ["loss_q3", "loss_q4"]] = [0.50, 0.40]
    still = verdict(from_rows("quantize", table))
    assert _decisions(still)["teacher - 2-bit Budget-C"] == "open"
    assert _decisions(still)["teacher - 1-bit Budget-C"] == "no" and still.status == "not reproduced"
    assert "students converged: FAILED" in still.summary and "2-bit Budget-C: mean KD loss 0.5 -> 0.4" in still.summary
    table.loc[falling, ["loss_q3", "loss_q4"]] = [0.50, 0.48]
    assert verdict(from_rows("quantize", table)).status == "not reproduced"
    assert _decisions(verdict(from_rows("quantize", table)))["teacher - 2-bit Budget-C"] == "no"
    # with a dev curve the gate reads the dev score: a loss still falling 20% under a decaying rate, the dev score
    # settled (+0.4 points over the last quarter), converged; the dev score still rising 1.5 points, still learning
    table.loc[table.kind == "score", ["loss_q3", "loss_q4", "dev_rise"]] = [0.50, 0.40, 0.4]
    assert verdict(from_rows("quantize", table)).status == "not reproduced"
    table.loc[falling, "dev_rise"] = 1.5
    rising = verdict(from_rows("quantize", table))
    assert _decisions(rising)["teacher - 2-bit Budget-C"] == "open"
    assert "2-bit Budget-C: dev score +1.5 points on average over 3 replicate(s)" in rising.summary
    # Budget-A's students still learning do not block: the short budget is under-trained by design, and no claim's
    # "no" would turn with more of it (the quick profile's 1-bit A students rose 5.6-11.6 points over their last quarter)
    table.loc[falling, "dev_rise"] = 0.4
    table.loc[(table.kind == "score") & (table.budget == "A"), "dev_rise"] = 8.0
    assert verdict(from_rows("quantize", table)).status == "not reproduced"


def test_the_convergence_gate_reads_a_cells_mean_so_more_replicates_never_decide_less():
    """One replicate of twenty whose dev score rose 3 points over its last quarter (the others +0.3) leaves the
    cell settled on average: the "no" stands. Four of four rising is a cell still learning: the "no" is open."""
    base = {(1, "A"): 0.6, (1, "C"): 0.75, (2, "A"): 0.8, **FAR}
    table = _table({(32, "teacher"): 0.9, (2, "C"): 0.84, **base}, n=2000, replicates=20)
    cell = (table.kind == "score") & (table.bits == 2) & (table.budget == "C")
    table.loc[table.kind == "score", "dev_rise"] = 0.3
    table.loc[cell & (table.replicate == 5), "dev_rise"] = 3.0
    one = verdict(from_rows("quantize", table))
    assert _decisions(one)["teacher - 2-bit Budget-C"] == "no" and one.status == "not reproduced"
    assert next(g for g in one.evidence["gates"] if "converged" in g["name"] and "Budget" in g["name"])["passed"]
    table.loc[cell, "dev_rise"] = 1.2
    every = verdict(from_rows("quantize", table))
    assert _decisions(every)["teacher - 2-bit Budget-C"] == "open"
    assert "dev score +1.2 points on average over 20 replicate(s)" in every.summary


def test_students_whose_replicates_disagree_or_did_not_learn_decide_nothing():
    # two 2-bit C students close to the teacher, one 9 points below: the replicates disagree
    split = verdict(from_rows("quantize", _table({**GOOD, (2, "C"): [0.9, 0.9, 0.81]}, n=2000)))
    assert split.status == "inconclusive" and "the replicates disagree" in split.summary
    # a student at the majority class has not learned: a gate, never evidence for "drops more" or "C >= A"
    unlearned = verdict(from_rows("quantize", _table({**GOOD, (1, "A"): 0.5}, n=1000)))
    assert unlearned.status == "inconclusive" and "students learned: FAILED" in unlearned.summary


def test_a_profile_that_runs_only_some_cells_prices_the_rest():
    result = from_rows("quantize", _table({(32, "teacher"): 0.9, (2, "C"): 0.899, (2, "undistilled"): 0.6}, n=2000),
                       meta=dict(epochs_a=1, steps_per_epoch=12))
    result.seconds = 120.0
    demo = verdict(result)
    assert _decisions(demo) == {"teacher - 2-bit Budget-C": "yes", "teacher - 2-bit undistilled (the reference)": "yes"}
    assert demo.status == "inconclusive" and "every paper claim measured: FAILED" in demo.summary
    assert "KD steps, about" in demo.summary and "--bits 2,1 --budgets A,C" in demo.summary


def test_gap_at_one_bit_is_reported_but_cannot_block():
    # C - A: +1.9 points at 2 bits, +0.5 at 1 bit: the gap is not largest at 1 bit, yet the rest holds
    v = verdict(from_rows("quantize", _table({(32, "teacher"): 0.9, (2, "A"): 0.88, (2, "C"): 0.899, (1, "A"): 0.885,
                                              (1, "C"): 0.89, **FAR}, n=2000)))
    gap = next(c for c in v.evidence["claims"] if c["name"] == "C-A gap at 1 bit - at 2 bits")
    assert gap["reported"] and gap["decision"] in ("no", "open")
    assert v.status == "reproduced" and "reported only" in v.summary


def test_a_task_whose_teacher_did_not_learn_leaves_the_average():
    unlearned = {k: 0.45 if k[0] == 32 else 0.2 for k in GOOD}  # a teacher at 45: chance-like
    table = pd.concat([_table(GOOD, n=1000), _table(unlearned, task="u", seed=1)], ignore_index=True)
    v = verdict(from_rows("quantize", table))
    assert v.evidence["excluded_tasks"] == ["u"] and v.evidence["averaged_tasks"] == ["t"]
    assert v.status == "reproduced" and "left out of the average: u" in v.summary


def test_layer_reduction_keeps_every_other_block_and_distils_from_the_kept_ones(device):
    from lmlab.interventions.quant import keep_layers

    lm = device.load("tiny-bert", head="classifier", num_labels=2)
    student = copy.deepcopy(lm.model)
    kept = keep_layers(student, [1])
    assert len(student.bert.encoder.layer) == 1 and student.config.num_hidden_layers == 1
    assert torch.equal(student.bert.encoder.layer[0].attention.self.query.weight,
                       lm.model.bert.encoder.layer[1].attention.self.query.weight)
    enc = lm.encode(["the capital of France is Paris"], padding_side="right")
    # the kept block's attention scores equal the teacher's block 1 only if its input matches: it does not
    # (block 0 was dropped), so the loss is positive, and it is finite and differentiable
    loss, parts = kd_loss(student, lm.model, dict(enc), layer_map=kept)
    loss.backward()
    assert parts["attention"] > 0 and parts["hidden"] > 0
    with pytest.raises(LmlabError, match="layers to keep must be increasing"):
        keep_layers(copy.deepcopy(lm.model), [2, 1])


def test_study_with_layer_reduction_runs(tmp_path):
    config = s2.Config(model="tiny-bert", tasks=["fact-qnli"], n_train=32, n_eval=16, batch_size=16, bits=[1],
                       layer_reduction=True)
    result = run_study(s2.SPEC, config, tmp_path)
    assert set(result.long()[result.long().kind == "score"].budget) == {"teacher", "A", "C", "undistilled"}


@pytest.mark.embedded
@needs_export_extra  # (it exports its students)
def test_decoder_option_quantizes_a_tiny_llama_and_resumes(tmp_path, monkeypatch, tiny_smol_folder):
    """KD on self-sampled text, perplexity and circuit-task accuracy per unit; a killed run resumes.
    The model is a tiny random Llama that speaks SmolLM2's tokenizer (the circuit tasks need its
    single-token names), loaded from its folder as a user's model is (on the run's device, in its dtype)."""
    from lmlab.studies.quantize.decoder import run as dec

    config = s2.Config(model=str(tiny_smol_folder), tasks=["ioi", "docstring"], bits=[2, 1], budgets=["A", "C"],
                       n_text=8, n_eval_text=8, text_tokens=12, n_prompts=6, batch_size=4, seeds=2,
                       export="compressed-tensors")
    whole = run_study(s2.SPEC, config, tmp_path / "a")
    exported = sorted(p.name for p in (whole.path / "export" / "compressed-tensors").iterdir())
    assert len(exported) == 8 and all((whole.path / "export" / "compressed-tensors" / n / "model.safetensors").exists()
                                      for n in exported)  # each student beside its packed file
    t = whole.long()
    lm = t[t.kind == "lm"]
    # the teacher, 4 cells x 2 replicates, and the undistilled reference at each width (the same in each replicate)
    assert len(lm) == 1 + 6 * 2 and (lm.perplexity > 1).all()
    steps = dict(zip(lm.budget + lm.bits.astype(int).astype(str), lm.steps))
    assert steps["C2"] == 6 * steps["A2"] == 6 * 2 and steps["undistilled2"] == 0  # 8 sequences / batch 4: 2 an epoch
    scores = t[t.kind == "score"]
    assert set(scores.task) == {"ioi", "docstring"} and len(scores) == 2 * 13
    packed = scores[scores.budget != "undistilled"]  # (the undistilled reference is not packed)
    ratio = (packed.fp32_bytes / packed.packed_bytes)[packed.bits < 32]  # 32-wide rows: scales weigh more
    assert (ratio[packed.bits == 1] > ratio[packed.bits == 2].max()).all() and (ratio > 8).all()
    assert "perplexity" in whole.verdict.evidence
    resumed = _assert_killed_run_resumes(monkeypatch, dec, "_evaluate", 3, config, tmp_path / "b", scores)
    lm2 = resumed.long()[resumed.long().kind == "lm"]
    assert np.allclose(lm.perplexity.to_numpy(), lm2.perplexity.to_numpy(), rtol=1e-5)


def test_a_teacher_that_has_not_learned_or_converged_decides_nothing():
    """The teacher's own gate: within TEACHER_MARGIN of the majority class (seed 1 of the demo: 72.2 against 67), or
    its dev score still rising over its last epoch (its loss still falling where it has no dev curve), and no claim
    decides, whatever the students show."""
    table = _table(GOOD, n=1000)
    teacher = (table.kind == "score") & (table.bits == 32)
    table.loc[table.kind == "score", ["loss_q3", "loss_q4"]] = [0.30, 0.29]
    assert verdict(from_rows("quantize", table)).status == "reproduced"
    table.loc[teacher, ["loss_q3", "loss_q4"]] = [0.30, 0.20]  # no dev curve: the loss decides
    still = verdict(from_rows("quantize", table))
    assert still.status == "inconclusive" and "teachers learned and converged: FAILED" in still.summary
    assert "the teacher's loss still fell 0.3 -> 0.2" in still.summary
    table.loc[teacher, ["loss_q3", "loss_q4", "dev_rise"]] = [0.13, 0.038, 0.4]  # a fitted teacher's loss falls on
    assert verdict(from_rows("quantize", table)).status == "reproduced"  # while its dev score has settled
    table.loc[teacher, "dev_rise"] = 2.5
    rising = verdict(from_rows("quantize", table))
    assert rising.status == "inconclusive" and "the teacher's dev score still rose 2.5 points" in rising.summary
    weak = verdict(from_rows("quantize", _table({(32, "teacher"): 0.53, (2, "A"): 0.53, (2, "C"): 0.53,
                                                 (1, "A"): 0.52, (1, "C"): 0.53}, n=1000)))
    assert weak.status == "inconclusive" and "the teacher scored" in weak.summary
    near = verdict(from_rows("quantize", _table({(32, "teacher"): 0.58, (2, "A"): 0.58, (2, "C"): 0.58,
                                                 (1, "A"): 0.58, (1, "C"): 0.58}, n=1000)))
    assert "the teacher scored 58.0" in near.summary  # 8 points above the majority: enough for a student, not it


def test_the_teachers_patience_rule_ends_it_once_its_dev_score_stops_rising():
    """DevCurve's patience rule (the teacher's): the training ends at the first reading that rose less than
    `min_rise` over the best before it, `patience` times in a row; a fall counts as not rising; its reading says how
    many readings it took and that the rule, not the cap, ended it."""
    from lmlab.studies.quantize.measure import DevCurve

    def curve(scores, patience=1, learned_above=float("-inf")):
        c = DevCurve.__new__(DevCurve)
        c.patience, c.min_rise, c.scores, c.stopped = patience, 1.0, list(scores), False
        c.learned_above = learned_above
        return c

    # a teacher still at the majority class has not begun: the rule waits for it (to the cap)
    assert not curve([50.0, 50.0, 50.0], learned_above=60.0).settled()
    assert curve([50.0, 70.0, 70.5], learned_above=60.0).settled()

    assert not curve([60.0]).settled() and not curve([60.0, 70.0]).settled()
    assert curve([60.0, 70.0, 70.5]).settled() and curve([60.0, 70.0, 65.0]).settled()
    assert not curve([60.0, 70.0, 70.5], patience=2).settled()
    assert curve([60.0, 70.0, 70.5, 69.0], patience=2).settled()
    assert not curve([60.0, 70.0, 70.5, 72.0], patience=2).settled()
    assert not curve([60.0, 61.0, 62.0], patience=0).settled()  # no rule: the cap ends it
    done = curve([60.0, 70.0, 68.5])
    done.stopped = True
    assert done.reading() == pytest.approx({"dev_last": 68.5, "dev_rise": -1.5, "dev_readings": 3, "settled": True,
                                            "dev_kept": 70.0})


def test_the_teachers_dev_curve_is_its_dev_score_each_epoch_and_survives_a_resume(monkeypatch):
    """DevCurve (the teacher gate's reading): at each epoch's end the dev score the metric gives for the model's
    predictions, in points; its state restores the curve a resumed training continues."""
    from lmlab.studies.quantize.measure import DevCurve, collate_for, predict

    lm = load_model("tiny-bert", head="classifier", num_labels=3, device="cpu")
    task = generate_task("fact-mnli", 24, 8, seed=0)
    collate = collate_for(lm.tokenizer, task, 64)
    curve = DevCurve(lm.model, collate, task, every=3)
    for step in range(7):
        curve(step, 0.0)
    assert lm.model.training  # (scoring leaves the model training)
    labels = np.array([e.label for e in task.dev])
    expected = 100 * metric_value(task.metric, labels, predict(lm.model, collate, task.dev))
    assert curve.scores == pytest.approx([expected, expected])
    assert curve.reading() == pytest.approx({"dev_last": expected, "dev_rise": 0.0})
    again = DevCurve(lm.model, collate, task, every=3)
    again.load_state_dict(curve.state_dict())
    assert again.scores == curve.scores and DevCurve(lm.model, collate, task, 3).reading() == {}
    # the patience rule ends a training at a reading under its best and goes back to the best reading's weights
    from lmlab.studies.quantize import measure

    kept = copy.deepcopy(lm.model.state_dict())
    scores = iter([0.70, 0.60])
    monkeypatch.setattr(measure, "_dev_score", lambda *a: next(scores))
    rule = DevCurve(lm.model, collate, task, every=1, patience=1, min_rise=1.0)
    assert not rule(0, 0.0) and rule.best and not rule.settled()
    with torch.no_grad():
        for p in lm.model.parameters():
            p.add_(0.5)  # a step that changes the weights, after which the score fell
    assert rule(1, 0.0) and rule.stopped and rule.reading()["dev_kept"] == pytest.approx(70.0)
    assert all(torch.equal(v, kept[k]) for k, v in lm.model.state_dict().items())
    monkeypatch.undo()
    # a student's curve: after the given step counts only, on the first `limit` dev examples
    part = DevCurve(lm.model, collate, task, at=(2, 5), limit=5)
    for step in range(7):
        part(step, 0.0)
    first = 100 * metric_value(task.metric, labels[:5], predict(lm.model, collate, task.dev[:5]))
    assert part.scores == pytest.approx([first, first]) and len(part.dev) == 5


def test_a_students_warm_up_is_one_epoch_at_most_a_third_of_budget_a_so_budget_a_decays():
    """The paper's Budget-A (3 epochs, a sixth of DeepSpeed's 18-epoch Budget-C) warms up for one epoch, a third of
    it; a 1-epoch Budget-A warms up for a third of its epoch, then decays to the end, as Budget-C does from the same
    warm-up (before, it warmed up all along and ended at its peak rate)."""
    from lmlab.studies.quantize.config import Config, student_warmup
    from lmlab.studies.quantize.measure import steps_per_epoch, train_config
    from lmlab.train.loop import lr_factor

    assert student_warmup(62, 3) == 62 and student_warmup(62, 1) == 21 and student_warmup(1, 1) == 1
    config = Config(model="tiny-bert", profile="quick")
    per_epoch = steps_per_epoch(config, 2000)
    warmup = student_warmup(per_epoch, 1)
    for budget_epochs in (1, 6):
        tc = train_config(config, budget_epochs, 2000, 2e-4, "a student", warmup=warmup)
        factors = [lr_factor(step, tc) for step in range(tc.steps)]
        assert tc.warmup_steps == warmup and max(factors) == pytest.approx(1.0)
        assert int(np.argmax(factors)) == warmup - 1  # the peak at the warm-up's end, then a linear decay
        assert factors[-1] < 1.5 / (tc.steps - warmup) and all(np.diff(factors[warmup:]) < 0)
    assert train_config(config, 4, 2000, 2e-4, "the teacher").warmup_steps == per_epoch  # the teacher: one epoch


def test_the_claims_read_the_longest_budget_that_ran():
    from lmlab.studies.quantize.config import claims_budget

    assert claims_budget(["A", "C"]) == "C" and claims_budget(["C", "B", "A"]) == "C"
    assert claims_budget(["A", "B"]) == "B" and claims_budget({"A"}) == "A" and claims_budget([]) is None


def test_each_decisive_quantize_claim_says_no_or_open_where_its_effect_is_absent():
    """Negative controls. Students equal to their teacher at both widths: 1-bit does not drop below 2-bit, so that
    claim is open, never "yes", and the verdict is not "reproduced". A 1-bit student far below its teacher, and a
    Budget-C student below Budget-A, each make their claim "no"; every decisive claim is the paper's."""
    same = verdict(from_rows("quantize", _table({(32, "teacher"): 0.9, (2, "A"): 0.9, (2, "C"): 0.9, (1, "A"): 0.9,
                                                 (1, "C"): 0.9}, n=2000)))
    assert _decisions(same)["2-bit - 1-bit, Budget-C"] == "open" and same.status != "reproduced", same.summary
    assert {c["source"] for c in same.evidence["claims"]} == {"paper"}
    far = verdict(from_rows("quantize", _table({**GOOD, (1, "A"): 0.80, (1, "C"): 0.84}, n=2000)))
    assert _decisions(far)["teacher - 1-bit Budget-C"] == "no" and far.status == "not reproduced"
    assert far.evidence["deciding"]["source"] == "paper" and "83.44" in far.evidence["deciding"]["where"]
    worse = verdict(from_rows("quantize", _table({**GOOD, (2, "A"): 0.9, (2, "C"): 0.87}, n=2000)))
    assert _decisions(worse)["Budget-C - Budget-A at 2 bit"] == "no" and worse.status == "not reproduced"


def test_closeness_decides_only_where_the_undistilled_reference_falls_short():
    """"Close to the teacher" says something of the method only where the teacher quantized with no KD step is not
    close: where it is (an easy task, a weak teacher), or where the run has no such student, a closeness claim is
    open and says why, whatever its own interval says; the same distilled students with a reference far below
    their teacher decide "yes"."""
    cells = {(32, "teacher"): 0.9, (2, "A"): 0.885, (2, "C"): 0.9, (1, "A"): 0.86, (1, "C"): 0.89}
    far = verdict(from_rows("quantize", _table({**cells, **FAR}, n=2000)))
    assert _decisions(far)["teacher - 2-bit Budget-C"] == "yes" and far.status == "reproduced", far.summary
    reference = next(c for c in far.evidence["claims"] if c["name"] == "teacher - 2-bit undistilled (the reference)")
    assert reference["reported"] and reference["source"] == "lmlab" and reference["decision"] == "yes"
    near = verdict(from_rows("quantize", _table({**cells, (2, "undistilled"): 0.895, (1, "undistilled"): 0.895},
                                                n=2000)))
    close = next(c for c in near.evidence["claims"] if c["name"] == "teacher - 2-bit Budget-C")
    assert close["decision"] == "open" and close["high"] <= 2  # its own interval alone would have said "yes"
    assert "without any distillation" in close["reason"] and near.status == "inconclusive"
    missing = verdict(from_rows("quantize", _table(cells, n=2000)))
    assert {_decisions(missing)[f"teacher - {b}-bit Budget-C"] for b in (2, 1)} == {"open"}
    assert "no undistilled 2-bit student" in missing.summary and missing.status != "reproduced"


def test_the_placebo_arms_and_their_seeds():
    """The placebo's cells: every budget trained as Budget-A, the 1-bit cells at the 2-bit width, the undistilled
    at zero epochs; its Budget-C students draw seeds that are none of the run's replicate seeds."""
    from lmlab.studies.quantize.config import UNDISTILLED, placebo_seed, student_arm

    assert student_arm(1, "C", False) == (1, 6) and student_arm(2, "A", False) == (2, 1)
    assert student_arm(1, UNDISTILLED, False) == (1, 0)
    assert student_arm(1, "C", True) == (2, 1) and student_arm(2, "C", True) == (2, 1)
    assert student_arm(1, UNDISTILLED, True) == (2, 0) and student_arm(2, "B", True) == (2, 1)
    config = s2.Config(model="tiny-bert", seeds=3, placebo=True)
    config.check_inputs(models=False)  # the study declares its placebo
    assert s2.Config.placebo_treatment and "Budget-A" in s2.Config.placebo_treatment
    c = [placebo_seed(0, "C", r, 3) for r in range(3)]
    b = [placebo_seed(0, "B", r, 3) for r in range(3)]
    assert len(set(c + b + config.replicate_seeds())) == 9


KEYWORD = ("the a of to and in is was for on with as at by from that it his her their when then after Mary John "
           "Anna Tom Berlin Germany Rome Italy Madrid Spain London capital city country store drink").split()


def _keyword_tsv(n: int, seed: int) -> str:
    """An SST-2-shaped task tiny-bert's teacher learns in a few dozen steps: label 1 where "Paris" is in the
    sentence (half the rows)."""
    import random

    rng = random.Random(seed)
    lines = ["sentence\tlabel"]
    for i in range(n):
        words = rng.sample(KEYWORD, 6)
        if i % 2:
            words[rng.randrange(6)] = "Paris"
        lines.append(" ".join(words) + f"\t{i % 2}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def placebo_run(tmp_path_factory):
    """S2's placebo end to end at test sizes (tiny-bert, 64 training sentences, 64 test ones, 3 replicates, both
    widths and budgets), on a task its teacher learns, so that its claims read students of a teacher that knows
    something. The task's folder is named relative to the working directory, so that its name, and with it every
    unit's seed, is the same in every session."""
    root = tmp_path_factory.mktemp("placebo")
    (root / "kw").mkdir()
    (root / "kw" / "train.tsv").write_text(_keyword_tsv(64, 0))
    (root / "kw" / "dev.tsv").write_text(_keyword_tsv(128, 1))
    config = s2.Config(model="tiny-bert", tasks=["glue-sst2:kw"], n_train=64, batch_size=16, teacher_epochs=8,
                       teacher_lr=2e-3, student_lr=1e-2, bits=[2, 1], budgets=["A", "C"], seeds=3, epochs_a=1,
                       placebo=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        return config, run_study(s2.SPEC, config, root / "runs")


def test_the_placebo_end_to_end_reproduces_nothing(placebo_run):
    """The placebo is the same run with the treatment replaced (Budget-C trained as Budget-A from other seeds, the
    1-bit students ternary, the closeness claims reading students never distilled): its verdict is marked as the
    placebo's, is not "reproduced", and no decisive claim says "yes"."""
    config, result = placebo_run
    v = result.verdict
    assert v.status != "reproduced" and v.evidence["placebo"] == s2.Config.placebo_treatment
    assert v.summary.startswith("PLACEBO")
    decisive = [c for c in v.evidence["claims"] if not c["reported"]]
    assert {c["name"] for c in decisive} == {"teacher - 2-bit undistilled", "teacher - 1-bit undistilled",
                                             "2-bit - 1-bit, Budget-C", "Budget-C - Budget-A at 2 bit",
                                             "Budget-C - Budget-A at 1 bit"}
    assert [c["name"] for c in decisive if c["decision"] == "yes"] == [], v.summary
    # the teacher learned its task (so the claims read students of a teacher that knows something)
    teacher = next(g for g in v.evidence["gates"] if g["name"] == "teachers learned and converged")
    assert teacher["passed"], teacher["why"]
    # the arms, as the recipe recorded them
    scores = result.long()[result.long().kind == "score"]
    students = scores[scores.bits < 32]
    a, c = (students[students.budget == b] for b in ("A", "C"))
    assert (c.steps.to_numpy() == a.steps.to_numpy()).all() and (a.steps == 4).all()  # C trained as A: 1 epoch
    assert sorted(set(a.seed)) == sorted(config.replicate_seeds()) and not set(c.seed) & set(a.seed)
    assert (students.weight_bits == 2).all()  # the 1-bit cells at the 2-bit width
    one, two = (students[(students.bits == b) & (students.budget != "undistilled")] for b in (1, 2))
    assert (one.packed_bytes.to_numpy() == two.packed_bytes.to_numpy()).all()  # measured on disk: ternary both
    preds = result.long()[result.long().kind == "pred"]
    undistilled = preds[preds.budget == "undistilled"]
    assert (students[students.budget == "undistilled"].steps == 0).all()
    per = undistilled.pivot_table(index="idx", columns=["bits", "replicate"], values="pred")
    assert per.shape[1] == 6 and (per.to_numpy() == per.to_numpy()[:, :1]).all()  # one student: the teacher quantized


def test_budget_c_equal_to_budget_a_built_by_the_placebo_is_never_yes(placebo_run):
    """C = A as the pipeline makes it (the placebo's own tables, Budget-C trained as Budget-A from other seeds, not a
    table typed in): "Budget-C - Budget-A" is not "yes" at either width, and not with the two draws' names swapped
    either (which is C and which is A is arbitrary there), while the students do differ between draws (the claim has
    a spread to judge, not a difference of zero)."""
    _, result = placebo_run
    table = result.long()
    for swap in (False, True):
        t = table.assign(budget=table.budget.replace({"A": "C", "C": "A"})) if swap else table
        res = from_rows("quantize", t)
        res.config = res.config.model_copy(update={"placebo": True})
        claims = {c["name"]: c for c in verdict(res).evidence["claims"]}
        gaps = [claims[f"Budget-C - Budget-A at {b} bit"] for b in (2, 1)]
        assert [c["decision"] for c in gaps] != ["yes", "yes"] and all(c["decision"] != "yes" for c in gaps)
        assert all(c["low"] <= 0 <= c["high"] for c in gaps), [(c["low"], c["high"]) for c in gaps]
        if not swap:
            estimates = [c["estimate"] for c in gaps]
    assert any(c["se"] > 0 for c in gaps)  # the draws differ: a null with a spread
    assert [-e for e in estimates] == pytest.approx([c["estimate"] for c in gaps])


@pytest.mark.embedded
def test_decoder_option_quantizes_a_mixture_of_experts_and_refuses_its_export_before_any_work(tmp_path,
                                                                                             embedded_smollm):
    """A tiny Mixtral (experts stacked in 3-D tensors) that speaks SmolLM2's tokenizer: its students are quantized
    expert by expert, packed, and load back quantized (the round trip is exact: test_quant); `--export
    compressed-tensors` (linear layers only) is refused before any run folder is made."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from lmlab.interventions.quant import expert_targets, load_packed

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=len(embedded_smollm.tokenizer), hidden_size=32, intermediate_size=48,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=True)
    folder = tmp_path / "tiny-mixtral"
    MixtralForCausalLM(cfg).save_pretrained(folder)
    embedded_smollm.tokenizer.save_pretrained(folder)
    sizes = dict(model=str(folder), tasks=["ioi"], bits=[2], budgets=["A"], n_text=8, n_eval_text=8, text_tokens=12,
                 n_prompts=6, batch_size=4, seeds=1, device="cpu")
    result = run_study(s2.SPEC, s2.Config(**sizes), tmp_path / "run")
    lm_rows = result.long()[result.long().kind == "lm"].set_index("budget")
    assert lm_rows.loc["A", "steps"] > 0
    packed = sorted((result.path / "packed").glob("*.safetensors"))
    assert packed
    student = load_packed(load_model(str(folder), device="cpu").model, packed[0])
    assert len(expert_targets(student)) == 4 and student._lmlab_quant["bits"] == 2
    if importlib.util.find_spec("compressed_tensors") is not None:
        with pytest.raises(LmlabError, match=r"^--export compressed-tensors: the compressed-tensors export writes "
                                             r"linear layers and embeddings, and this model's experts are stacked"):
            run_study(s2.SPEC, s2.Config(**sizes, export="compressed-tensors"), tmp_path / "exported")
        assert not any((tmp_path / "exported").glob("*/"))


def test_an_unlearned_student_sets_aside_the_claims_that_read_it_and_no_other():
    """A 1-bit Budget-A student at the majority class: the claims that read it (C - A at 1 bit, the C-A gap) are not
    read, named with the gate; the 2-bit closeness claim still decides, and its 'no' still makes 'not reproduced'."""
    unlearned = verdict(from_rows("quantize", _table({**GOOD, (1, "A"): 0.5}, n=1000)))
    claims = {c["name"]: c for c in unlearned.evidence["claims"]}
    assert claims["Budget-C - Budget-A at 1 bit"]["set_aside"] == "students learned"
    assert claims["teacher - 2-bit Budget-C"]["set_aside"] == "" and claims["teacher - 2-bit Budget-C"]["decision"] == "yes"
    far = verdict(from_rows("quantize", _table({**GOOD, (1, "A"): 0.5, (2, "C"): 0.80}, n=2000)))
    assert far.status == "not reproduced", far.summary
