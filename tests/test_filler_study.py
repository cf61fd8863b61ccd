import json

import pandas as pd
import pytest
import torch

from lmlab import LmlabError
from lmlab.data.math import generate_arithmetic, read_math_file, split_arithmetic
from lmlab.interventions import Capture, intervene
from lmlab.interventions.arm import ActivationRedistribution, redistribute
from lmlab.studies import filler as s3
from lmlab.studies.filler import measure as s3m
from lmlab.studies import run_study
from lmlab.studies.filler.measure import attention_profile

from helpers import interrupt_on_call, tolerance


@pytest.fixture(scope="module")
def lm(device):
    return device.load("tiny-llama")


@pytest.mark.parametrize("position", ["before", "between", "after"])
def test_insertion_lands_exactly_where_asked(lm, position):
    question = "What is 23 + 45?"
    plain, none = s3m.build_ids(lm, question)
    ids, inserted = s3m.build_ids(lm, question, " /", 55, position)
    slash = lm.tokenizer(" /", add_special_tokens=False)["input_ids"]
    assert len(slash) == 1 and none == []
    assert len(inserted) == 55 and inserted == list(range(inserted[0], inserted[0] + 55))
    assert [ids[p] for p in inserted] == slash * 55
    rest = [t for p, t in enumerate(ids) if p not in set(inserted)]
    assert rest == plain  # removing the inserted tokens gives the prompt without them, token for token
    instr = lm.tokenizer(s3m.INSTRUCTION, add_special_tokens=False)["input_ids"]
    q = lm.tokenizer("\n" + question, add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(ids)) if ids[i:i + len(instr)] == instr)
    q_start = next(i for i in range(len(ids)) if ids[i:i + len(q)] == q)
    where = {"before": inserted[-1] < start, "between": start + len(instr) == inserted[0] and inserted[-1] + 1 == q_start,
             "after": inserted[0] == q_start + len(q)}
    assert where[position]


@pytest.mark.embedded
def test_chat_models_get_the_insertion_inside_the_user_turn(embedded_smollm):
    ids, inserted = s3m.build_ids(embedded_smollm, "What is 2 + 3?", " he", 10)
    text = embedded_smollm.tokenizer.decode(ids)
    user = text.index("<|im_start|>user")
    end = text.index("<|im_end|>", user)
    filler = embedded_smollm.tokenizer.decode([ids[p] for p in inserted])
    assert filler == " he" * 10 and user < text.index(" he he") < end


def test_attention_profile_equals_a_hand_computation(lm):
    ids, inserted = s3m.build_ids(lm, "What is 3 + 4?", " /", 5)
    enc = torch.tensor([ids], device=lm.device)
    old = lm.model.config._attn_implementation
    lm.model.set_attn_implementation("eager")
    with torch.no_grad():
        att = lm.model(input_ids=enc, output_attentions=True).attentions[0][0]  # (heads, T, T)
    lm.model.set_attn_implementation(old)
    keep = [p for p in range(len(ids)) if p not in set(inserted)]
    got = attention_profile(att, keep)
    tol = tolerance(att.dtype)["atol"]  # the pattern's own precision (bf16 on a GPU): sums of a few of its entries
    for h in range(att.shape[0]):
        for jj in range(1, len(keep)):  # key keep[jj]; the sink keep[0] is excluded
            later = [keep[ii] for ii in range(jj + 1, len(keep))]
            expected = sum(att[h, i, keep[jj]].item() for i in later) / len(later) if later else 0.0
            assert got[h, jj - 1].item() == pytest.approx(expected, abs=min(1e-6, tol) if tol <= 1e-5 else tol)


def _arm_reference(a, c, p1, p_min=0.02):
    """numpy, one group (the whole tensor): what the edit must do, apart from the random magnitudes."""
    import numpy as np

    x = a.double().numpy().ravel()
    mag = np.abs(x)
    med = np.sort(mag)[(len(mag) - 1) // 2]  # torch's median is the lower one
    mad = np.sort(np.abs(mag - med))[(len(mag) - 1) // 2]
    frac = min(max((mag < 1.4826 * mad * c).mean(), p_min), 0.25)
    k = max(1, round(frac * len(x)))
    chosen = np.zeros(len(x), bool)
    chosen[np.argsort(mag, kind="stable")[:k]] = True
    return chosen, np.percentile(x, p1), -x[x < 0].min()


@pytest.mark.parametrize("p_min", [0.02, 0.2])
def test_arm_over_the_whole_call_matches_a_numpy_reference(p_min):
    torch.manual_seed(0)
    a = torch.nn.functional.silu(torch.randn(3, 7, 200))
    out = redistribute(a, c=0.3, p1=90.0, generator=torch.Generator().manual_seed(1), p_min=p_min)
    chosen, r_pos, r_neg = _arm_reference(a, 0.3, 90.0, p_min)
    changed = (out != a).numpy().ravel()
    assert (changed <= chosen).all() and changed.sum() >= chosen.sum() - 2  # u = exact old value: vanishingly rare
    new, old = out.numpy().ravel()[chosen], a.numpy().ravel()[chosen]
    assert ((new >= 0) == (old >= 0)).all()  # signs kept, 0 counts as positive
    assert (new[old >= 0] <= r_pos + 1e-6).all() and (-new[old < 0] <= r_neg + 1e-6).all()
    assert new[old >= 0].max() > 0.5 * r_pos  # magnitudes spread over (0, R)
    again = redistribute(a, c=0.3, p1=90.0, generator=torch.Generator().manual_seed(1), p_min=p_min)
    assert torch.equal(out, again)  # seeded


def test_arm_scopes_group_the_statistics_as_named():
    torch.manual_seed(0)
    a = torch.nn.functional.silu(torch.randn(2, 5, 64))
    g = torch.Generator().manual_seed(3)
    rows = redistribute(a, 0.3, 90.0, generator=g, scope="row")
    for b in range(2):  # row scope: each sequence as a call of its own
        chosen, _, _ = _arm_reference(a[b], 0.3, 90.0)
        assert ((rows[b] != a[b]).numpy().ravel() <= chosen).all()
    tokens = redistribute(a, 0.3, 90.0, generator=torch.Generator().manual_seed(3), scope="token")
    counts = (tokens != a).sum(-1)
    assert (counts >= round(0.02 * 64)).all() and (counts <= round(0.25 * 64)).all()
    with pytest.raises(LmlabError, match="unknown ARM scope"):
        redistribute(a, 0.3, 90.0, scope="batch")


def test_arm_edits_only_the_selected_layer(lm):
    enc = lm.encode("When Mary and John went to the store")
    with intervene(lm, Capture("mlp_act", "resid_post")) as clean, torch.no_grad():
        lm.model(**enc)
    arm = ActivationRedistribution(c=0.3, p1=90.0, layers=[1])
    with intervene(lm, arm, Capture("mlp_act", "resid_post")) as (_, edited), torch.no_grad():
        lm.model(**enc)
    assert torch.equal(clean["resid_post", 0], edited["resid_post", 0])
    assert torch.equal(clean["mlp_act", 0], edited["mlp_act", 0])
    before, after = clean["mlp_act", 1], edited["mlp_act", 1]
    share = (before != after).float().mean()  # the whole call: one share over all its entries
    assert 0.02 * 0.9 <= share <= 0.25 + 1e-6
    assert not torch.equal(clean["resid_post", 2], edited["resid_post", 2])


@pytest.mark.parametrize("text,gold,boxed,fallback", [
    ("so the answer is \\boxed{\\frac{3}{4}}", "0.75", (1, "boxed"), (1, "boxed")),
    ("... = 1,234. Done", "1234", (0, "none"), (1, "last_number")),
    ("-7 is it", "-7", (0, "none"), (1, "last_number")),
    ("\\boxed{12} but later 13", "12", (1, "boxed"), (1, "boxed")),
    ("\\boxed{5} then \\boxed{6}", "6", (1, "boxed"), (1, "boxed")),
    ("no number", "3", (0, "none"), (0, "none"))])
def test_scoring_reads_the_last_box_and_falls_back_only_when_asked(text, gold, boxed, fallback):
    correct, _, source = s3m.score(text, gold)
    assert (correct, source) == boxed
    correct, _, source = s3m.score(text, gold, "boxed_or_last_number")
    assert (correct, source) == fallback


def test_generated_splits_are_disjoint_and_seeded():
    dev, test = split_arithmetic(10, 20, seed=0)
    assert not {i.question for i in dev} & {i.question for i in test}
    assert [i.question for i in generate_arithmetic(5, 3)] == [i.question for i in generate_arithmetic(5, 3)]
    assert {i.level for i in test} == {1, 2, 3, 4, 5}
    assert all(str(eval(i.question[8:-1])) == i.answer for i in test if i.level < 5)


def test_real_files_share_one_rule_a_bad_row_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    good = [{"question": "q1", "answer": "6 * 12 = <<6*12=72>>72\n#### 72"}, {"question": "q4", "answer": "so\n#### 1,000"}]
    path.write_text("\n".join(json.dumps(r) for r in good) + "\n")
    items = read_math_file("gsm8k", path)
    assert [i.answer for i in items] == ["72", "1000"]
    for n, bad in enumerate(['{"question": "q2", "answer": "no marker"}', '{"answer": "x\\n#### 3"}', "{not json",
                             '{"question": "q", "answer": "x\\n#### 2.5"}', '{"question": "q", "answer": "#### 3"}']):
        path.write_text("\n".join(json.dumps(r) for r in good) + "\n" + bad + "\n")
        with pytest.raises(LmlabError, match=r"gsm8k.jsonl:3: "):
            read_math_file("gsm8k", path)
    (tmp_path / "m.jsonl").write_text(json.dumps({"problem": "p", "answer": "\\frac{1}{2}", "level": 3}) + "\n")
    items = read_math_file("math500", tmp_path / "m.jsonl")
    assert items[0].answer == "1/2" and items[0].level == 3
    (tmp_path / "m.jsonl").write_text(json.dumps({"problem": "p"}) + "\n")
    with pytest.raises(LmlabError, match=r"m.jsonl:1: a MATH-500 row needs"):
        read_math_file("math500", tmp_path / "m.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(LmlabError, match="holds no problems"):
        read_math_file("math500", tmp_path / "empty.jsonl")


def test_study_runs_end_to_end_on_a_tiny_model_and_resumes(tmp_path, monkeypatch):
    config = s3.Config(model="tiny-llama", n_test_per_level=3, n_dev_per_level=2, sweep_problems=3,
                       profile_problems=2, max_new_tokens=6, sweep_lengths=[5])
    whole = run_study(s3.SPEC, config, tmp_path / "a")
    t = whole.long()
    assert {"answer", "tuning", "profile", "mlp"} <= set(t.kind)
    assert whole.info["max_new_tokens"] > 0  # the recipe's counts row became the metadata
    test = t[(t.kind == "answer") & (t.split == "test") & (t.sweep.fillna("") == "")]
    assert test.groupby("condition").size().to_dict() == {"ARM": 15, "Mful": 15, "Mless": 15, "w/o": 15}
    assert whole.verdict.status in ("reproduced", "not reproduced", "inconclusive")
    from helpers import check_declared_columns

    check_declared_columns(whole)

    real = interrupt_on_call(monkeypatch, s3m, "greedy_answers", 3)  # in ARM tuning, the shared call recorded
    with pytest.raises(KeyboardInterrupt):
        run_study(s3.SPEC, config, tmp_path / "b")
    monkeypatch.setattr(s3m, "greedy_answers", real)
    resumed = run_study(s3.SPEC, config, tmp_path / "b")
    pd.testing.assert_frame_equal(resumed.long(), whole.long())


def test_a_single_arm_pair_generates_no_dev_split(tmp_path):
    config = s3.Config(model="tiny-llama", n_test_per_level=1, n_dev_per_level=2, sweep_problems=1,
                       profile_problems=1, max_new_tokens=3, sweep_lengths=[5], arm_c=[0.13], arm_p1=[99.5])
    t = run_study(s3.SPEC, config, tmp_path / "one").long()
    answers = t[t.kind == "answer"]
    assert set(answers.split) == {"test"}  # nothing to choose, so no dev answers at all
    tuning = t[t.kind == "tuning"]
    assert len(tuning) == 1 and tuning.chosen.iloc[0] == 1 and tuning.note.iloc[0] == "the only pair given"
    assert len(answers[answers.condition == "ARM"]) == 5


def _filler_rows(gain: dict, n=100, base=0.5, noise=0.1, seed=0):
    """Answer rows of n paired test problems: w/o right with probability `base`; every other condition
    changes a `noise` share of answers both ways, plus wrong->right (gain > 0) or right->wrong (gain < 0)
    flips worth `gain` in expectation."""
    import numpy as np

    from lmlab.studies.result import from_rows

    rng = np.random.default_rng(seed)
    rows = [dict(kind="counts", model="m", max_new_tokens=512)]
    wo = rng.random(n) < base
    for cond in ("w/o", "Mless", "Mful", "ARM"):
        g = gain.get(cond, 0.0)
        right = wo ^ (rng.random(n) < noise)
        if g > 0:
            right = right | (~right & (rng.random(n) < g / (1 - base)))
        elif g < 0:
            right = right & ~(rng.random(n) < -g / base)
        if cond == "w/o":
            right = wo
        for i in range(n):
            rows.append(dict(kind="answer", id=f"p{i}", condition=cond, split="test", sweep="", correct=int(right[i]),
                             hit_budget=0, level=1))
    for i in range(20):  # inserted tokens attenuate peak attention, clearly
        for cond, peak in (("None", 0.8), ("Mless", 0.5), ("Mful", 0.55)):
            rows.append(dict(kind="profile", view="aligned", condition=cond, problem=i, position=0,
                             attention=peak + 0.01 * rng.normal()))
    rows += [dict(kind="mlp", condition=c, near_zero_share=0.1) for c in ("None", "Mless", "Mful")]
    return from_rows("filler", rows)


def test_power_rule_no_gain_is_inconclusive_and_a_clear_loss_is_not_reproduced():
    import pandas as pd

    from lmlab.studies.filler.analysis import _gain_claim, verdict

    def decisions(v):
        return {c["name"]: c["decision"] for c in v.evidence["claims"]}

    none = verdict(_filler_rows({"Mless": 0.0, "Mful": 0.0, "ARM": 0.0}))
    assert none.status == "inconclusive", none.summary
    assert "to decide" in none.summary and "test problems" in none.summary
    loss = verdict(_filler_rows({"Mless": -0.3, "Mful": 0.0, "ARM": 0.0}))
    assert loss.status == "not reproduced" and decisions(loss)["Mless - w/o accuracy"] == "no"
    gain = verdict(_filler_rows({"Mless": 0.3, "Mful": 0.3, "ARM": 0.3}))
    assert gain.status == "reproduced", gain.summary

    def same(n):  # n problems answered alike with and without the insertion
        rows = [dict(id=f"p{i}", condition=c, correct=1) for i in range(n) for c in ("w/o", "Mless")]
        return pd.DataFrame(rows)
    assert _gain_claim(same(100), "Mless").decide() == "open"  # 100 identical answers cannot exclude a 1 pp gain
    assert _gain_claim(same(1000), "Mless").decide() == "no"


def test_without_answers_the_attention_claims_decide_and_the_gains_are_priced(tmp_path):
    """The demo's S3 generates no answers: the attention claims are judged, the gains are a failed 'every claim
    run' gate (never 'reproduced') with their price at a measured pace."""
    config = s3.Config(model="tiny-llama", profile="demo", profile_problems=2, max_new_tokens=6)
    result = run_study(s3.SPEC, config, tmp_path)
    t = result.long()
    assert "answer" not in set(t.kind) and {"profile", "mlp", "pace"} <= set(t.kind)
    assert result.table("pace").seconds_per_answer.iloc[0] > 0
    names = [c["name"] for c in result.verdict.evidence["claims"]]
    assert names == ["Mless - None peak attention", "Mful - None peak attention"]
    assert result.verdict.status in ("inconclusive", "not reproduced")
    if result.verdict.status == "inconclusive":
        assert "every paper claim measured: FAILED" in result.verdict.summary and "paired problems" in result.verdict.summary
    assert (result.path / "figure.png").is_file()


def test_sampled_runs_are_rows_of_their_own_and_averaged_per_problem(tmp_path, lm):
    from lmlab.runs import RunDir
    from lmlab.studies.filler.analysis import accuracy

    config = s3.Config(model="tiny-llama", samples=3, max_new_tokens=4, temperature=1.0)
    items = generate_arithmetic(2, seed=0)[:4]
    run_dir = RunDir.open(tmp_path, "s3", "tiny-llama", config.model_dump())
    rows = s3m.evaluate(lm, run_dir, items, "w/o", config)
    table = pd.DataFrame(rows)
    assert sorted(table.groupby("id")["sample"].nunique().unique()) == [3]
    again = pd.DataFrame(s3m.evaluate(lm, RunDir.open(tmp_path / "b", "s3", "tiny-llama", config.model_dump()), items,
                                      "w/o", config))
    assert table.new_tokens.tolist() == again.new_tokens.tolist()  # seeded
    iv = accuracy(table)
    assert iv.n == len(items)  # the interval is over problems, not problem-runs


def test_on_a_gpu_quick_generates_what_decides_the_gains_and_the_demo_stays_small(monkeypatch):
    config = s3.Config(model="tiny-llama", profile="quick", device="cpu")
    assert config.size("n_test_per_level") == 20 and config.size("batch_size") == 64
    monkeypatch.setattr(s3.Config, "torch_device", lambda self: "cuda:0")
    gpu = s3.Config(model="tiny-llama", profile="quick")
    # 1200 a level (level 1 has 100 distinct problems): beyond the 2,940 paired problems the paper's gain needs
    assert gpu.size("n_test_per_level") == 1200 and gpu.size("batch_size") == 1024
    assert s3.Config(model="tiny-llama", profile="quick", batch_size=8).size("batch_size") == 8  # the option wins
    demo = s3.Config(model="tiny-llama", profile="demo")
    assert demo.size("batch_size") == 64 and demo.size("accuracy") is False and demo.size("n_test_per_level") == 4


def test_a_filler_that_changes_nothing_never_says_yes_and_a_model_that_cannot_do_the_task_never_says_no():
    """Negative controls: insertions that leave every answer and the attention peaks as they were make no decisive
    claim "yes". A model that answers 5% of the problems without insertion is below the capability gate: even a
    clear loss under the insertion cannot say "not reproduced" about a paper whose models answer most of them."""
    import numpy as np

    from lmlab.studies.filler.analysis import verdict
    from lmlab.studies.result import from_rows

    rng = np.random.default_rng(1)
    rows = [dict(kind="counts", model="m", max_new_tokens=256)]
    right = rng.random(200) < 0.5
    for cond in ("w/o", "Mless", "Mful", "ARM"):
        rows += [dict(kind="answer", id=f"p{i}", condition=cond, split="test", sweep="", correct=int(right[i]),
                      hit_budget=0, level=1) for i in range(200)]
    for i in range(30):
        peak = 0.6 + 0.05 * rng.normal()
        rows += [dict(kind="profile", view="aligned", condition=c, problem=i, position=0,
                      attention=peak + 0.01 * rng.normal()) for c in ("None", "Mless", "Mful")]
    null = verdict(from_rows("filler", rows))
    assert not any(c["decision"] == "yes" for c in null.evidence["claims"] if not c["reported"]), null.summary
    assert null.status != "reproduced" and {c["source"] for c in null.evidence["claims"]} == {"paper"}
    weak = verdict(_filler_rows({"Mless": -0.04}, n=400, base=0.05, noise=0.0))
    assert weak.status == "inconclusive", weak.summary
    assert "the model can do the task: FAILED (w/o accuracy" in weak.summary
    assert "Scope: this run: model, generated arithmetic, 512 new tokens; outside the paper's setting" in weak.summary
