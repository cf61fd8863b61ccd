"""S0: data splits, latent replacement, the VQ-VAE, resume, bad input, the verdict."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from lmlab.studies.latent import codes as L
from lmlab.data.generated.reasoning import generate_problems
from lmlab.errors import LmlabError
from lmlab.studies import latent as study
from lmlab.studies import run_study
from lmlab.studies.latent.analysis import verdict
from lmlab.studies.result import from_rows

from helpers import interrupt_on_call

TINY = dict(model="scratch", rates=[4, 16], n_train=300, n_test=12, base_steps=12, finetune_steps=6, vq_steps=10,
            d_model=32, n_layers=2, batch_size=16)


def test_generated_splits_are_disjoint_and_repeatable():
    a = generate_problems(500, 60, 60, seed=1)
    keys = {s: {p.key for p in a[s]} for s in a}
    assert len(a["train"]) == 500 and len(a["test"]) == 60
    assert not keys["train"] & keys["test"] and not keys["train"] & keys["dev"] and not keys["dev"] & keys["test"]
    assert [p.question for p in generate_problems(500, 60, 60, seed=1)["test"]] == [p.question for p in a["test"]]
    p = a["train"][0]
    value = p.key[0]  # the chain really computes the answer
    for step in p.steps:
        lhs, result = step.split(" = ")
        x, op, y = lhs.split()
        assert int(x) == value
        value = int(x) + int(y) if op == "+" else int(x) - int(y)
        assert int(result) == value
    assert value == p.answer


def test_replacement_puts_m_over_r_codes_between_the_markers():
    vocab = L.Vocab.from_texts(["a b c"], n_codes=8)
    chain = list(range(100, 140))  # 40 chain tokens
    codes = [1, 2, 3, 4, 5, 6, 7, 0]
    for m, rate in ((16, 4), (32, 16), (32, 4), (0, 4)):
        out = L.replace_with_latents(vocab, chain, codes, m, chunk=16, rate=rate)
        if m == 0:
            assert out == chain
            continue
        assert out[0] == vocab.bo_latent
        end = out.index(vocab.eo_latent)
        between = out[1:end]
        assert len(between) == m // rate and all(vocab.is_code(t) for t in between)
        assert [t - vocab.first_code for t in between] == codes[:m // rate]
        assert out[end + 1:] == chain[m:]  # the rest of the trace is kept as text
    with pytest.raises(LmlabError, match="whole number of 16-token chunks"):
        L.replace_with_latents(vocab, chain, codes, 24, chunk=16, rate=4)
    assert L.chunk_options(40, 16) == [0, 16, 32]


def test_vq_vae_round_trips_a_chunk_it_was_trained_on():
    torch.manual_seed(0)
    vocab_size, chunk = 30, 8
    prompts = torch.randint(5, vocab_size, (6, 5))
    chunks = torch.randint(5, vocab_size, (6, chunk))
    mask = torch.ones_like(prompts, dtype=torch.bool)
    vq = L.ChunkVQVAE(vocab_size, chunk, rate=2, n_codes=32, dim=32, max_prompt=8)
    opt = torch.optim.Adam(vq.parameters(), lr=3e-3)
    vq.train()
    for _ in range(400):
        loss, *_ = vq(prompts, mask, chunks)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.equal(vq.reconstruct(prompts, mask, chunks), chunks)
    codes = vq.codes(prompts, mask, chunks)
    assert codes.shape == (6, chunk // 2) and int(codes.max()) < 32


def test_bad_settings_fail_before_training(tmp_path):
    with pytest.raises(LmlabError, match="rate 3 does not divide the chunk length 16"):
        run_study(study.SPEC, study.Config(**{**TINY, "rates": [3]}), tmp_path)
    with pytest.raises(LmlabError, match="codebook needs at least 2"):
        run_study(study.SPEC, study.Config(**{**TINY, "codebook": 1}), tmp_path)
    with pytest.raises(LmlabError, match="training chunks for a codebook of 100000"):
        run_study(study.SPEC, study.Config(**{**TINY, "codebook": 100000}), tmp_path)
    with pytest.raises(LmlabError, match="supports --model scratch .* or smollm2-135m, not .tiny-bert."):
        run_study(study.SPEC, study.Config(**{**TINY, "model": "tiny-bert"}), tmp_path)
    vocab = L.Vocab.from_texts(["Emma has 3 apples"], n_codes=2)
    with pytest.raises(LmlabError, match="'pears' is not in the vocabulary"):
        vocab.encode("Emma has 3 pears")


def _metrics(result):
    return result.table("variant").drop(columns=["seconds_per_problem"])


def test_resume_after_interruption_gives_the_same_metrics(tmp_path, monkeypatch):
    whole = run_study(study.SPEC, study.Config(**TINY), tmp_path / "a")
    interrupt_on_call(monkeypatch, study.recipe, "evaluate", 3)  # killed while evaluating the first latent rate
    with pytest.raises(KeyboardInterrupt):
        run_study(study.SPEC, study.Config(**TINY), tmp_path / "b")
    monkeypatch.undo()
    again = run_study(study.SPEC, study.Config(**TINY), tmp_path / "b")
    pd.testing.assert_frame_equal(_metrics(again), _metrics(whole), check_dtype=False)
    assert list(whole.table("variant")["variant"]) == ["cot", "answer-only", "r4", "r16"]
    assert (whole.path / "figure.png").is_file()


def _row(variant, rate, correct, tokens):
    c = np.array(correct, dtype=float)
    t = np.array(tokens, dtype=float)
    return [{"kind": "variant", "variant": variant, "rate": rate, "accuracy": c.mean(), "acc_lo": c.mean() - 0.05,
             "acc_hi": c.mean() + 0.05, "tokens": t.mean(), "tok_lo": t.mean() - 1, "tok_hi": t.mean() + 1,
             "latents": 0.0, "seconds_per_problem": 0.01}] + [
        {"kind": "problem", "variant": variant, "idx": i, "correct": int(x), "tokens": int(n), "latents": 0}
        for i, (x, n) in enumerate(zip(c, t))]


def _result(*rows):
    return from_rows("latent", pd.DataFrame([r for part in rows for r in part]))


def test_verdict_can_go_each_way():
    same = [1] * 150 + [0] * 50
    cot = _row("cot", 1, same, [40] * 200)
    good = _result(cot, _row("r4", 4, same, [35] * 200), _row("r16", 16, same, [25] * 200))
    assert verdict(good).status == "reproduced"
    no_saving = _result(cot, _row("r4", 4, same, [40] * 200), _row("r16", 16, same, [40] * 200))
    assert verdict(no_saving).status == "not reproduced"
    worse = [1] * 100 + [0] * 100
    accuracy_drop = _result(cot, _row("r4", 4, same, [35] * 200), _row("r16", 16, worse, [25] * 200))
    assert verdict(accuracy_drop).status == "not reproduced"
    slightly = [1] * 146 + [0] * 54  # 2 points down, interval straddles -1
    unclear = _result(cot, _row("r16", 16, slightly, [25] * 200))
    assert verdict(unclear).status == "inconclusive"


def _gsm8k_file(path, n=60, seed=3):
    """GSM8K-format rows made from generated problems (calculator annotations included, as in GSM8K)."""
    rows = []
    for p in generate_problems(n, 0, 0, seed=seed)["train"]:
        lines = []
        for step in p.steps:
            lhs, result = step.split(" = ")
            lines.append(f"She has {lhs} = <<{lhs.replace(' ', '')}={result}>>{result} now.")
        rows.append(json.dumps({"question": p.question, "answer": "\n".join(lines) + f"\n#### {p.answer}"}))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_gsm8k_reader_keeps_the_chain_and_names_bad_rows(tmp_path):
    from lmlab.data.generated.reasoning import read_gsm8k_problems, split_problems

    problems = read_gsm8k_problems(_gsm8k_file(tmp_path / "g.jsonl"))
    assert len(problems) == 60
    first = problems[0]
    assert "<<" not in first.chain and first.chain.endswith("now.")
    assert str(first.answer) in first.steps[-1]
    splits = split_problems(problems, seed=0)
    keys = {k: {p.key for p in v} for k, v in splits.items()}
    assert sum(len(v) for v in keys.values()) == 60
    assert not keys["train"] & keys["test"] and not keys["train"] & keys["dev"] and not keys["dev"] & keys["test"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "1 + 1 = 2\n#### 2"}) + "\n{not json\n")
    with pytest.raises(LmlabError, match=r"bad.jsonl:2: not a JSON object"):
        read_gsm8k_problems(bad)
    bad.write_text(json.dumps({"question": "q", "answer": "no final line"}) + "\n")
    with pytest.raises(LmlabError, match=r"bad.jsonl:1: .*'#### N'"):
        read_gsm8k_problems(bad)
    bad.write_text("\n")
    with pytest.raises(LmlabError, match="holds no problems"):
        read_gsm8k_problems(bad)
    with pytest.raises(LmlabError, match="unknown --data 'mmlu'"):
        run_study(study.SPEC, study.Config(**{**TINY, "data": "mmlu"}), tmp_path / "r")


def test_study_trains_on_a_gsm8k_file(tmp_path):
    path = _gsm8k_file(tmp_path / "g.jsonl", n=400)
    result = run_study(study.SPEC, study.Config(**{**TINY, "rates": [16], "data": f"gsm8k:{path}"}), tmp_path / "r")
    table = result.table("variant")
    assert set(table["variant"]) == {"cot", "answer-only", "r16"}
    assert (table["n_test"] > 0).all()


@pytest.mark.embedded
def test_tokenizer_vocab_on_smollm2(embedded_smollm):
    vocab = L.TokenizerVocab(embedded_smollm.tokenizer, n_codes=8)
    assert len(vocab) == len(embedded_smollm.tokenizer) + 4 + 8  # the loaded tokenizer itself is not grown
    problem = generate_problems(5, 0, 0, seed=0)["train"][0]
    ex = L.make_example(vocab, problem)
    assert ex.prompt[-1] == vocab.cot and ex.answer[0] == vocab.ans and ex.answer[-1] == vocab.eos
    assert vocab.decode(ex.chain).strip() == problem.chain
    assert vocab.parse_answer(ex.chain + ex.answer) == problem.answer
    assert vocab.parse_answer(ex.chain) is None
    out = L.replace_with_latents(vocab, ex.chain, list(range(8)), 16, chunk=16, rate=4)
    assert out[0] == vocab.bo_latent and out[5] == vocab.eo_latent and out[6:] == ex.chain[16:]
    assert all(vocab.is_code(t) for t in out[1:5])


@pytest.mark.embedded
def test_study_fine_tunes_smollm2(tmp_path, embedded_smollm):
    cfg = dict(model="smollm2-135m", rates=[16], n_train=40, n_test=3, base_steps=2, finetune_steps=1, vq_steps=4,
               batch_size=2, codebook=4, max_new=12)
    result = run_study(study.SPEC, study.Config(**cfg), tmp_path)
    table = result.table("variant")
    assert set(table["variant"]) == {"cot", "answer-only", "r16"}
    assert (table["tokens"] <= 12).all()


def test_latent_bench_rebuilds_the_runs_models(tmp_path):
    """The benchmark reloads a finished run's CoT and latent models: their token counts on the test
    split are the study's own."""
    from lmlab.benchmarks.latent import latent_bench

    result = run_study(study.SPEC, study.Config(**{**TINY, "rates": [16]}), tmp_path / "r")
    rows = {r["case"]: r for r in latent_bench(latent_run=str(result.path), rounds=1)}
    table = result.table("variant").set_index("variant")
    assert rows["CoT: generated tokens per problem"]["value"] == pytest.approx(table.loc["cot", "tokens"], abs=0.01)
    assert rows["latent r=16: generated tokens per problem"]["value"] == pytest.approx(table.loc["r16", "tokens"],
                                                                                       abs=0.01)
    assert rows["latent r=16: wall time per problem"]["ratio"] > 0
    with pytest.raises(LmlabError, match="not a run folder"):
        latent_bench(latent_run=str(tmp_path))
