import json

import pandas as pd
import pytest
import torch

from lmlab import LmlabError
from lmlab.data.math import generate_arithmetic, read_math_file, split_arithmetic
from lmlab.interventions import Capture, intervene
from lmlab.interventions.arm import ActivationRedistribution, redistribute
from lmlab.models import load_model
from lmlab.studies import filler as s3
from lmlab.studies.filler import measure as s3m
from lmlab.studies import run_study
from lmlab.studies.filler.measure import attention_profile

from helpers import interrupt_on_call


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama")


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
    enc = torch.tensor([ids])
    old = lm.model.config._attn_implementation
    lm.model.set_attn_implementation("eager")
    with torch.no_grad():
        att = lm.model(input_ids=enc, output_attentions=True).attentions[0][0]  # (heads, T, T)
    lm.model.set_attn_implementation(old)
    keep = [p for p in range(len(ids)) if p not in set(inserted)]
    got = attention_profile(att, keep)
    for h in range(att.shape[0]):
        for jj in range(1, len(keep)):  # key keep[jj]; the sink keep[0] is excluded
            later = [keep[ii] for ii in range(jj + 1, len(keep))]
            expected = sum(att[h, i, keep[jj]].item() for i in later) / len(later) if later else 0.0
            assert got[h, jj - 1].item() == pytest.approx(expected, abs=1e-6)


def test_arm_changes_exactly_the_selected_fraction_per_token():
    torch.manual_seed(0)
    a = torch.nn.functional.silu(torch.randn(3, 7, 200))
    out = redistribute(a, c=0.3, p1=90.0, generator=torch.Generator().manual_seed(1))
    mag = a.abs()
    med = mag.median(-1, keepdim=True).values
    eps = 1.4826 * (mag - med).abs().median(-1, keepdim=True).values * 0.3
    frac = (mag < eps).float().mean(-1).clamp(0.02, 0.25)
    changed = out != a
    assert torch.equal(changed.sum(-1), (frac * 200).round().long())
    smallest = mag.argsort(-1)[..., :1]
    assert changed.gather(-1, smallest).all()  # the smallest |a| is always among the edited
    assert (torch.sign(out[changed]) == torch.where(a[changed] < 0, -1.0, 1.0)).all()
    r_neg = (-a.min(-1, keepdim=True).values).expand_as(a)
    assert (out[changed & (a < 0)].abs() <= r_neg[changed & (a < 0)] + 1e-6).all()
    again = redistribute(a, c=0.3, p1=90.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, again)  # seeded


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
    changed = (before != after).sum(-1)
    d = before.shape[-1]
    assert ((changed >= round(0.02 * d)) & (changed <= round(0.25 * d))).all()
    assert not torch.equal(clean["resid_post", 2], edited["resid_post", 2])


@pytest.mark.parametrize("text,gold,ok", [
    ("so the answer is \\boxed{\\frac{3}{4}}", "0.75", 1), ("... = 1,234. Done", "1234", 1),
    ("-7 is it", "-7", 1), ("\\boxed{12} but later 13", "12", 1), ("no number", "3", 0)])
def test_scoring_uses_the_last_box_then_the_last_number(text, gold, ok):
    assert s3m.score(text, gold)[0] == ok


def test_generated_splits_are_disjoint_and_seeded():
    dev, test = split_arithmetic(10, 20, seed=0)
    assert not {i.question for i in dev} & {i.question for i in test}
    assert [i.question for i in generate_arithmetic(5, 3)] == [i.question for i in generate_arithmetic(5, 3)]
    assert {i.level for i in test} == {1, 2, 3, 4, 5}
    assert all(str(eval(i.question[8:-1])) == i.answer for i in test if i.level < 5)


def test_bad_rows_are_skipped_and_counted_and_empty_files_refused(tmp_path):
    rows = [{"question": "q1", "answer": "steps #### 72"}, {"question": "q2", "answer": "no marker"},
            {"answer": "#### 3"}, {"question": "q4", "answer": "#### 1,000"}]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    items, skipped = read_math_file("gsm8k", path)
    assert [i.answer for i in items] == ["72", "1000"] and skipped == 3
    (tmp_path / "m.jsonl").write_text(json.dumps({"problem": "p", "answer": "\\frac{1}{2}", "level": 3}) + "\n")
    items, _ = read_math_file("math500", tmp_path / "m.jsonl")
    assert items[0].answer == "1/2" and items[0].level == 3
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(LmlabError, match="holds no usable problems"):
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

    real = interrupt_on_call(monkeypatch, s3m, "greedy_answers", 7)
    with pytest.raises(KeyboardInterrupt):
        run_study(s3.SPEC, config, tmp_path / "b")
    monkeypatch.setattr(s3m, "greedy_answers", real)
    resumed = run_study(s3.SPEC, config, tmp_path / "b")
    pd.testing.assert_frame_equal(resumed.long(), whole.long())
