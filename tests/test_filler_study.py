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
    renormalised = attention_profile(att, keep, renormalise=True)
    tol = tolerance(att.dtype)["atol"]  # the pattern's own precision (bf16 on a GPU): sums of a few of its entries
    tol = min(1e-6, tol) if tol <= 1e-5 else tol
    for h in range(att.shape[0]):
        for jj in range(1, len(keep)):  # key keep[jj]; the sink keep[0] is excluded
            later = [keep[ii] for ii in range(jj + 1, len(keep))]
            expected = sum(att[h, i, keep[jj]].item() for i in later) / len(later) if later else 0.0
            assert got[h, jj - 1].item() == pytest.approx(expected, abs=tol)
            # renormalised: each query's attention divided by what it gives the original tokens (sink included)
            expected = sum(att[h, i, keep[jj]].item() / sum(att[h, i, k].item() for k in keep) for i in later)
            expected = expected / len(later) if later else 0.0
            assert renormalised[h, jj - 1].item() == pytest.approx(expected, abs=4 * tol)
    # the inserted tokens took a share, which renormalising gives back: beyond the rounding of the pattern's dtype
    # (bf16 on a GPU: 2 of its steps at the largest entry; the check above's tolerance is a sum's, far coarser)
    rounding = 2 * torch.finfo(att.dtype).eps * got.abs().max().item()
    assert (renormalised.float() - got.float()).max().item() > min(tol, max(1e-6, rounding))  # float32: 1e-6 as before


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
    rows = []
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
    rows += [dict(kind="mlp", condition=c, near_zero_share=0.1) for c in ("None", "Mless", "Mful")]
    return from_rows("filler", rows, meta=dict(model="m", max_new_tokens=512))


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


def test_without_answers_the_attention_claims_are_reported_and_the_gains_are_priced(tmp_path):
    """The demo's S3 generates no answers: the attention claims are read and reported (they cannot tell the filler
    from its placebo), the gains are a failed 'every claim measured' gate with their price at a measured pace."""
    config = s3.Config(model="tiny-llama", profile="demo", profile_problems=2, max_new_tokens=6)
    result = run_study(s3.SPEC, config, tmp_path)
    t = result.long()
    assert "answer" not in set(t.kind) and {"profile", "mlp", "pace"} <= set(t.kind)
    assert result.table("pace").seconds_per_answer.iloc[0] > 0
    assert result.table("pace").batch.iloc[0] == config.size("batch_size")  # priced at the accuracy run's batch
    assert f"in batches of {config.size('batch_size')}" in result.verdict.summary
    claims = result.verdict.evidence["claims"]
    assert [c["name"] for c in claims] == ["Mless - None peak attention", "Mful - None peak attention"]
    assert all(c["reported"] for c in claims)
    assert result.verdict.status == "inconclusive"
    assert "every paper claim measured: FAILED" in result.verdict.summary and "paired problems" in result.verdict.summary
    assert "every claim holds" not in result.verdict.summary  # nothing decisive was measured: nothing holds
    assert (result.path / "figure.png").is_file()


def test_sampled_runs_are_rows_of_their_own_and_averaged_per_problem(tmp_path, lm):
    from lmlab.runs import RunDir
    from lmlab.studies.filler.analysis import accuracy
    from lmlab.studies.filler.config import Treatment

    config = s3.Config(model="tiny-llama", samples=3, max_new_tokens=4, temperature=1.0)
    items = generate_arithmetic(2, seed=0)[:4]
    run_dir = RunDir.open(tmp_path, "s3", "tiny-llama", config.model_dump())
    rows = s3m.evaluate(lm, run_dir, items, "w/o", config, Treatment.of(config))
    table = pd.DataFrame(rows)
    assert sorted(table.groupby("id")["sample"].nunique().unique()) == [3]
    again = pd.DataFrame(s3m.evaluate(lm, RunDir.open(tmp_path / "b", "s3", "tiny-llama", config.model_dump()), items,
                                      "w/o", config, Treatment.of(config)))
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


def test_a_model_that_cannot_do_the_task_never_says_no_and_identical_answers_never_say_yes():
    """A model that answers 5% of the problems without insertion is below the capability gate: even a clear loss
    under the insertion cannot say "not reproduced" about a paper whose models answer most of them. Answers left
    exactly as they were make no decisive claim "yes" (the attention claims' null is the placebo's, below)."""
    import numpy as np

    from lmlab.studies.filler.analysis import verdict
    from lmlab.studies.result import from_rows

    rng = np.random.default_rng(1)
    rows = []
    right = rng.random(200) < 0.5
    for cond in ("w/o", "Mless", "Mful", "ARM"):
        rows += [dict(kind="answer", id=f"p{i}", condition=cond, split="test", sweep="", correct=int(right[i]),
                      hit_budget=0, level=1) for i in range(200)]
    null = verdict(from_rows("filler", rows, meta=dict(model="m", max_new_tokens=256)))
    assert not any(c["decision"] == "yes" for c in null.evidence["claims"] if not c["reported"]), null.summary
    assert null.status != "reproduced" and {c["source"] for c in null.evidence["claims"]} == {"paper"}
    weak = verdict(_filler_rows({"Mless": -0.04}, n=400, base=0.05, noise=0.0))
    assert weak.status == "inconclusive", weak.summary
    assert "the model can do the task: FAILED (w/o accuracy" in weak.summary
    assert "Scope: this run: model, generated arithmetic, 512 new tokens; outside the paper's setting" in weak.summary


# --- the placebo: the filler inserted, then masked from every query (positions kept)

@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2"])
def sharp(request, device):
    """A tiny decoder of each family (rotary and learned positions) with larger weights: at the default init its
    next token hardly depends on the context or the positions, so a leaking mask or a wrong position would go
    unnoticed. A fresh load of its own, changed in place (interventions reach the model through its layout)."""
    lm = device.load(request.param)
    with torch.no_grad():
        for p in lm.model.parameters():
            if p.dim() >= 2:  # drawn on the host from a host generator, then written on the model's device
                draw = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), device="cpu")
                p.copy_(0.3 * draw)
    return lm


def _without_filler(lm, ids, inserted, new: int = 0):
    """The independent reference: the prompt with the inserted tokens removed, each remaining token at the position
    it has with them (position ids given by hand), and `new` greedy tokens by full forward passes (no cache, no
    batch, no mask); (logits at every kept token, the tokens)."""
    keep = [p for p in range(len(ids)) if p not in set(inserted)]
    seq, pos = [ids[p] for p in keep], list(keep)
    out, first = [], None
    with torch.no_grad():
        for step in range(new + 1):
            logits = lm.model(input_ids=torch.tensor([seq], device=lm.device),
                              position_ids=torch.tensor([pos], device=lm.device)).logits[0]
            if step == 0:
                first = logits
            if step == new:
                break
            tok = int(logits[-1].argmax())
            out.append(tok)
            seq, pos = seq + [tok], pos + [len(ids) + step]
    return first, out


@pytest.mark.parametrize("position", ["before", "between", "after"])
def test_a_hidden_filler_gives_the_logits_of_the_prompt_without_it_at_its_positions(sharp, position):
    """The placebo's mask, against an independent computation: with the filler masked from every query, the logits at
    the original tokens equal those of the prompt without the filler run at the positions the filler leaves (and
    nothing is NaN, though a filler at position 0 leaves its own query no key). Unmasked, or at the plain prompt's
    positions, they differ: the check sees a leak and a lost position."""
    ids, inserted = s3m.build_ids(sharp, "What is 23 + 45?", " /", 7, position)
    keep = [p for p in range(len(ids)) if p not in set(inserted)]
    with torch.no_grad():
        hidden = sharp.model(**s3m.model_inputs(sharp, ids, inserted, hide=True)).logits[0].float()
        shown = sharp.model(**s3m.model_inputs(sharp, ids, inserted)).logits[0].float()
        plain = sharp.model(input_ids=torch.tensor([[ids[p] for p in keep]], device=sharp.device)).logits[0].float()
    reference, _ = _without_filler(sharp, ids, inserted)
    tol = tolerance(hidden.dtype, float(reference.abs().max()))
    assert torch.isfinite(hidden).all()
    torch.testing.assert_close(hidden[keep], reference.float(), **tol)
    after = [i for i, p in enumerate(keep) if p > inserted[0]]  # the tokens the filler could have reached
    assert not torch.allclose(shown[keep][after], reference.float()[after], **tol)
    if position != "before":  # before: every original token moves by the same offset, which rotary positions ignore
        assert not torch.allclose(plain[after], reference.float()[after], **tol)


def test_generation_with_the_filler_hidden_equals_decoding_the_prompt_without_it(sharp, monkeypatch):
    """`greedy_answers(masked=...)`, the placebo's decoding (a shared prefix, left padding, rows joining and leaving a
    running batch), against full forward passes of each prompt without its filler at the positions it leaves."""
    from lmlab import generation
    from lmlab.generation import _generate, greedy_answers

    joins = []
    real_join = generation._join
    monkeypatch.setattr(generation, "_join", lambda *a, **k: joins.append(1) or real_join(*a, **k))

    questions = ["What is 3 plus 4?", "How many", "Mary had 12 apples and gave 5 of them to John. How many", "7"]
    built = [s3m.build_ids(sharp, q, " /", 6, position) for q, position in
             zip(questions, ["between", "after", "between", "before"])]
    prompts, hidden = [ids for ids, _ in built], [inserted for _, inserted in built]
    expected = [_without_filler(sharp, ids, inserted, new=6)[1] for ids, inserted in built]
    assert len({tuple(e) for e in expected}) == len(expected)  # the rows really differ
    stop = expected[0][1]  # row 0 stops at its second token, so the third prompt joins a running batch
    cut = [e[:e.index(stop)] if stop in e else e for e in expected]
    for share in (True, False):
        got = _generate(sharp, prompts, 6, stop={stop}, share_prefix=share, batch_size=2, masked=hidden)
        assert [g[:-1] if g and g[-1] == stop else g for g in got] == cut, share
    assert joins  # a prompt joined a running batch (its masked columns aligned by the gap after the prefix)
    assert greedy_answers(sharp, prompts, max_new_tokens=6, batch_size=2, stop_at_newline=False,
                          masked=hidden) == [e[:6] for e in expected]
    shown = greedy_answers(sharp, prompts, max_new_tokens=6, batch_size=2, stop_at_newline=False)
    assert shown != expected  # the filler, seen, changes what the sharp model writes


def test_the_placebo_runs_end_to_end_and_does_not_reproduce(tmp_path):
    """(a) The placebo on a tiny run with answers: the filler masked in every condition, ARM redistributing nothing
    (its greedy answers are w/o's, to the token), and a verdict that is not "reproduced" with no decisive claim at
    "yes", said to be the placebo's."""
    config = s3.Config(model="tiny-llama", n_test_per_level=2, n_dev_per_level=2, sweep_problems=2,
                       profile_problems=2, max_new_tokens=5, sweep_lengths=[5], placebo=True)
    result = run_study(s3.SPEC, config, tmp_path)
    from helpers import check_declared_columns

    check_declared_columns(result)
    answers = result.table("answer")
    assert set(answers.split) == {"test"}  # nothing to tune: ARM redistributes nothing
    test = answers[answers.sweep.fillna("") == ""]
    wide = test.pivot_table(index="id", columns="condition", values="new_tokens")
    assert wide.shape == (10, 4)
    arm, wo = (test[test.condition == c].set_index("id").sort_index() for c in ("ARM", "w/o"))
    assert arm.pred.fillna("").tolist() == wo.pred.fillna("").tolist()
    assert arm.new_tokens.tolist() == wo.new_tokens.tolist()
    assert not len(result.table("tuning")) and result.info["arm"].startswith("nothing redistributed")
    v = result.verdict
    assert v.status != "reproduced" and v.summary.startswith("PLACEBO")
    assert not [c["name"] for c in v.evidence["claims"] if not c["reported"] and c["decision"] == "yes"], v.summary
    long = result.table("profile")
    long = long[long.view == "long"]
    assert len(long) and float(long.attention.min()) == 0.0  # the hidden keys get nothing


def test_the_peak_claims_cannot_see_the_share_the_filler_takes(sharp, tmp_path):
    """(b) The peak claims on the pipeline's own null: the demo and its placebo (the filler masked from every query)
    on a sharp tiny decoder. The placebo's filler keys get no attention, so its raw profile on the original tokens
    is higher (the treatment's filler took a share of every query); the renormalised profile the claims read is the
    placebo's to the float (in the first layer the scores between original tokens do not depend on the filler), and
    the same whichever tokens are inserted: the share the filler takes cannot move the claims, which read the same
    in both runs, are reported, and do not say "yes" in the placebo."""
    def demo(placebo):
        config = s3.Config(model=sharp.name, profile="demo", profile_problems=4, max_new_tokens=2, placebo=placebo)
        return run_study(s3.SPEC, config, tmp_path / str(placebo), lm=sharp)

    treatment, placebo = demo(False), demo(True)
    keys = ["view", "condition", "problem", "head", "position"]
    both = treatment.table("profile").merge(placebo.table("profile"), on=keys, suffixes=("", "_placebo"))
    filled = both[(both.view == "aligned") & (both.condition != "None")]
    assert len(filled) and (filled.renormalised - filled.renormalised_placebo).abs().max() < 1e-5
    kept = filled.groupby(["condition", "problem", "head"])[["attention", "attention_placebo"]].sum()
    assert (kept.attention < kept.attention_placebo).all()  # the share the treatment's filler took, as read
    _, inserted = s3m.build_ids(sharp, "1 + 1", " /", 55)
    long = both[(both.view == "long") & (both.condition == "Mless")]
    hidden = long[long.position.isin(inserted)]  # long-view positions are prompt positions (the sink is 0)
    assert len(hidden) and float(hidden.attention_placebo.abs().max()) == 0.0 and float(hidden.attention.min()) > 0
    ours = {c["name"]: c for c in placebo.verdict.evidence["claims"]}
    theirs = {c["name"]: c for c in treatment.verdict.evidence["claims"]}
    for name in ("Mless - None peak attention", "Mful - None peak attention"):
        assert ours[name]["reported"] and ours[name]["decision"] != "yes", placebo.verdict.summary
        assert ours[name]["estimate"] == pytest.approx(theirs[name]["estimate"], abs=1e-5)
    mless, mful = (ours[f"{c} - None peak attention"]["estimate"] for c in ("Mless", "Mful"))
    assert mless == pytest.approx(mful, abs=1e-5)  # ' /' or ' he' inserted: the same reading
    assert placebo.verdict.status != "reproduced" and placebo.verdict.summary.startswith("PLACEBO")


def test_the_head_is_chosen_on_problems_it_is_not_judged_on(tmp_path):
    """(c) The head whose profile moves most is chosen on the even-numbered profiled problems and judged on the
    odd-numbered ones: a head made to move on a judged problem is not chosen, one made to move on a choosing problem
    is; a choosing problem's peaks do not enter the claims; `--head` fixes the head and judges every problem."""
    from lmlab.studies.filler.analysis import claims_and_gates, profile_head
    from lmlab.studies.result import from_rows

    config = s3.Config(model="tiny-llama", profile="demo", profile_problems=6, max_new_tokens=2)
    result = run_study(s3.SPEC, config, tmp_path)
    choice = result.verdict.evidence["profile_head"]
    assert choice["chosen_on"] == [0, 2, 4] and choice["judged_on"] == [1, 3, 5]
    rows = result.long()

    def rejudged(frame, **config):
        again = from_rows("filler", frame, model="tiny-llama")
        again.config = again.config.model_copy(update=config)
        claims, _ = claims_and_gates(again)
        return profile_head(again), {c.name: c.estimate for c in claims}

    other = next(h for h in range(4) if h != choice["head"])
    def moved(problem):
        frame = rows.copy()
        at = (frame.kind == "profile") & (frame.view == "aligned") & (frame.condition == "Mless") & \
            (frame["head"] == other) & (frame.problem == problem) & (frame.position == 3)
        frame.loc[at, "renormalised"] += 0.5
        return frame

    same, base = rejudged(rows)
    assert same["head"] == choice["head"]
    judged, _ = rejudged(moved(1))
    chosen, _ = rejudged(moved(0))
    assert judged["head"] == choice["head"] and chosen["head"] == other
    def raised(problem):  # the chosen head's Mless peak raised on one problem
        frame = rows.copy()
        at = (frame.kind == "profile") & (frame.problem == problem) & (frame.condition == "Mless") & \
            (frame["head"] == choice["head"])
        frame.loc[at, "renormalised"] += 0.3
        return rejudged(frame)[1]

    assert raised(2) == base  # a choosing problem: the claims do not move
    assert raised(3)["Mless - None peak attention"] == pytest.approx(base["Mless - None peak attention"] + 0.1)
    fixed, _ = rejudged(rows, head=other)
    assert fixed == dict(head=other, rule="--head", chosen_on=[], judged_on=[0, 1, 2, 3, 4, 5])
