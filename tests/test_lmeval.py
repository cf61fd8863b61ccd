"""lmlab's lm-eval model type on a local task (YAML + JSON written here), against lmlab's own computation."""

import json

import pytest
import torch

from lmlab import LmlabError
from lmlab.interventions import Knockout, intervene
from lmlab.interventions.arm import ActivationRedistribution

lm_eval = pytest.importorskip("lm_eval", reason="the lmeval extra (make setup installs it)")
from lm_eval.tasks import TaskManager  # noqa: E402

import lmlab.lmeval  # noqa: E402  (registers "lmlab")

DOCS = [{"q": q, "choices": ["yes", "no", "maybe"], "gold": g, "answer": a} for q, g, a in [
    ("Is Paris in France?", 0, "yes"), ("Is Rome in Spain?", 1, "no"), ("Is Lima a city?", 0, "yes"),
    ("Is the sea dry?", 1, "no"), ("Is Oslo in Norway?", 0, "yes"), ("Is ice hot?", 1, "no")]]


def _tasks(tmp_path):
    data = tmp_path / "facts.json"
    data.write_text(json.dumps(DOCS))
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              "doc_to_text: \"Question: {{q}}\\nAnswer:\"\n")
    (tmp_path / "mc.yaml").write_text(
        "task: lmlab_mc\n" + common + "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: gold\nmetric_list:\n  - metric: acc\n")
    (tmp_path / "gen.yaml").write_text(
        "task: lmlab_gen\n" + common + "output_type: generate_until\ndoc_to_target: \" {{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 4\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    return TaskManager(include_path=str(tmp_path), include_defaults=False)  # our two tasks, not the index of all


def _evaluate(tmp_path, folder, model_args: str):
    return lm_eval.simple_evaluate(model="lmlab", model_args=f"model={folder},{model_args},batch_size=1",
                                   tasks=["lmlab_mc", "lmlab_gen"], task_manager=_tasks(tmp_path), log_samples=True,
                                   device="cpu")


def _edits(kind, ids):
    if kind == "arm":
        return [ActivationRedistribution(c=0.5, p1=90.0, layers=[1], seed=0)]
    if kind == "knockout":
        return [Knockout.spans(torch.ones_like(ids), [[0, 1]], layers=[0])]
    return []


def _direct(lm, kind):
    """lmlab computing the same: each choice's summed log-probability after the prompt (acc), and greedy text."""
    tok = lm.tokenizer
    fill = tok(" /", add_special_tokens=False)["input_ids"] * 5 if kind == "filler" else []

    def encode(text):
        ids = tok.encode(text)
        at = 1 if ids and tok.bos_token_id is not None and ids[0] == tok.bos_token_id else 0
        return ids[:at] + fill + ids[at:]

    correct, texts = [], []
    for doc in DOCS:
        context = f"Question: {doc['q']}\nAnswer:"
        scores = []
        for choice in doc["choices"]:
            ctx, whole = encode(context), encode(context + " " + choice)
            inp = torch.tensor([whole[:-1]])
            with torch.no_grad(), intervene(lm, *_edits(kind, inp)):
                logp = lm.model(inp).logits.log_softmax(-1)[0]
            scores.append(sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole))))
        correct.append(int(max(range(3), key=scores.__getitem__) == doc["gold"]))
        ids = encode(context)
        new = []
        for _ in range(4):  # greedy, the whole sequence each step (no cache): an independent decoding loop
            inp = torch.tensor([ids + new])
            with torch.no_grad(), intervene(lm, *_edits(kind, torch.tensor([ids]))):
                new.append(int(lm.model(inp).logits[0, -1].argmax()))
            if "\n" in tok.decode(new):
                break
        texts.append(tok.decode(new).split("\n")[0])
    return sum(correct) / len(correct), texts


@pytest.mark.parametrize("kind,args", [("none", "intervention=none"), ("filler", "intervention=filler,count=5"),
                                       ("arm", "intervention=arm,c=0.5,p1=90.0,layer=1"),
                                       ("knockout", "intervention=knockout,spans=0-1,layers=0")])
def test_lm_eval_scores_equal_lmlabs_own_computation(tmp_path, tiny_smol_folder, kind, args):
    from lmlab.models import load_model

    out = _evaluate(tmp_path, tiny_smol_folder, args)
    acc, texts = _direct(load_model(str(tiny_smol_folder)), kind)
    assert out["results"]["lmlab_mc"]["acc,none"] == pytest.approx(acc, abs=1e-9)
    got = [s["resps"][0][0].split("\n")[0] for s in sorted(out["samples"]["lmlab_gen"], key=lambda s: s["doc_id"])]
    assert got == texts


def test_interventions_change_what_lm_eval_sees(tmp_path, tiny_smol_folder):
    """The intervention reaches the forward pass: the per-choice log-likelihoods differ from the plain model's."""
    plain = _evaluate(tmp_path, tiny_smol_folder, "intervention=none")["samples"]["lmlab_mc"]
    for args in ("intervention=filler,count=5", "intervention=knockout,spans=0-1,layers=0",
                 "intervention=arm,c=0.5,p1=90.0,layer=1"):
        other = _evaluate(tmp_path, tiny_smol_folder, args)["samples"]["lmlab_mc"]
        assert [s["resps"] for s in other] != [s["resps"] for s in plain], args


def test_bad_model_args_are_one_sentence(tiny_smol_folder, tmp_path):
    with pytest.raises(LmlabError, match="unknown intervention 'prune'; use one of none, filler, arm, knockout"):
        lmlab.lmeval.LmlabLM(model=str(tiny_smol_folder), intervention="prune")
    with pytest.raises(LmlabError, match="the knockout needs spans=POSITIONS"):
        lmlab.lmeval.LmlabLM(model=str(tiny_smol_folder), intervention="knockout")
    with pytest.raises(LmlabError, match="is not a quantize run folder"):
        lmlab.lmeval.LmlabLM(intervention="student", run=str(tmp_path), student="x")
    with pytest.raises(LmlabError, match="is not a causal language model"):
        lmlab.lmeval.LmlabLM(model="tiny-bert")


@pytest.mark.parametrize("command", [["-m", "lmlab", "lm-eval"], ["-m", "lmlab.lmeval"]])
def test_the_documented_command_line_runs(tmp_path, tiny_smol_folder, command):
    """`lmlab lm-eval` and `python -m lmlab.lmeval` are lm_eval's command line with the model type registered."""
    import subprocess
    import sys

    _tasks(tmp_path)
    proc = subprocess.run([sys.executable, *command, "--model", "lmlab", "--model_args",
                           f"model={tiny_smol_folder},intervention=filler,filler=Mful,count=3", "--tasks", "lmlab_mc",
                           "--include_path", str(tmp_path), "--device", "cpu", "--output_path", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "lmlab_mc" in proc.stdout and "acc" in proc.stdout
    assert list((tmp_path / "out").rglob("results_*.json"))


def test_an_s2_decoder_student_and_an_s4_sparse_model_from_their_run_folders(tmp_path, tiny_smol_folder):
    """The student (load_packed) and the sparse model (its edge gate installed on load) are what lm-eval scores."""
    import copy
    import dataclasses

    import yaml

    from lmlab.interventions.quant import load_packed, quantize_model, save_packed
    from lmlab.models import load_model, save_model
    from lmlab.studies.quantize.config import Config as S2Config

    base = load_model(str(tiny_smol_folder))
    run = tmp_path / "quantize-tiny-smol-0123456789"
    (run / "packed").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(S2Config(model=str(tiny_smol_folder)).model_dump()))
    model = copy.deepcopy(base.model).float()
    quantize_model(model, 2)
    save_packed(model, run / "packed" / "2bit-C-rep0.safetensors")
    student = load_packed(copy.deepcopy(base.model).float(), run / "packed" / "2bit-C-rep0.safetensors").eval()
    sparse_run = tmp_path / "sparse-circuits-tiny-smol-0123456789"
    (sparse_run / "config.yaml").parent.mkdir(parents=True)
    (sparse_run / "config.yaml").write_text("model: tiny-smol\n")
    save_model(base, sparse_run / "post_training" / "rep0" / "sparse_model", sparse_attention=True)
    sparse = load_model(str(sparse_run / "post_training" / "rep0" / "sparse_model"))
    for args, lm in [(f"intervention=student,run={run},student=2bit-C-rep0", dataclasses.replace(base, model=student)),
                     (f"intervention=sparse,run={sparse_run}", sparse)]:
        out = lm_eval.simple_evaluate(model="lmlab", model_args=args, tasks=["lmlab_mc"],
                                      task_manager=_tasks(tmp_path), log_samples=True, device="cpu")
        acc, _ = _direct(lm, "none")
        assert out["results"]["lmlab_mc"]["acc,none"] == pytest.approx(acc, abs=1e-9), args
    plain = lm_eval.simple_evaluate(model="lmlab", model_args=f"model={tiny_smol_folder}", tasks=["lmlab_mc"],
                                    task_manager=_tasks(tmp_path), log_samples=True, device="cpu")
    quantized = lm_eval.simple_evaluate(model="lmlab", model_args=f"intervention=student,run={run},student=2bit-C-rep0",
                                        tasks=["lmlab_mc"], task_manager=_tasks(tmp_path), log_samples=True,
                                        device="cpu")
    assert [s["resps"] for s in quantized["samples"]["lmlab_mc"]] != [s["resps"] for s in plain["samples"]["lmlab_mc"]]


def test_without_the_extra_the_command_is_one_sentence(monkeypatch, capsys):
    import importlib.util

    from lmlab.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "lm_eval" else real(n, *a))
    with pytest.raises(SystemExit) as exc:
        main(["lm-eval", "--model", "lmlab", "--tasks", "x"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: the lm-eval model type needs lm-evaluation-harness: "
                                               "pip install 'lmlab[lmeval]'")
