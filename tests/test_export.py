"""Students exported in the compressed-tensors format, loaded by transformers alone in a fresh process."""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from lmlab import LmlabError
from lmlab.cli import main
from lmlab.interventions.export import export_compressed
from lmlab.interventions.quant import load_packed, quantize_activation, quantize_model, save_packed
from lmlab.models import load_model
from lmlab.studies import quantize as s2
from lmlab.studies import run_study
from lmlab.studies.quantize.measure import collate_for
from lmlab.studies.quantize.recipe import load_task

from helpers import needs_export_extra

# Run with no lmlab module importable or imported: the folder, transformers and compressed-tensors only.
LOADER = r"""
import sys


class NoLmlab:  # lmlab cannot be imported (the venv stays on the path wherever the checkout lies)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "lmlab":
            raise ImportError("lmlab is not importable in this process")


sys.meta_path.insert(0, NoLmlab())
import json, torch
from safetensors.torch import load_file, save_file
import transformers
jobs = json.loads(sys.argv[1])
out = {}
for name, (folder, kind, inputs) in jobs.items():
    cls = transformers.AutoModelForCausalLM if kind == "causal" else transformers.AutoModelForSequenceClassification
    model = cls.from_pretrained(folder).eval()
    with torch.no_grad():
        out[name] = model(**load_file(inputs)).logits.contiguous()
assert not [m for m in sys.modules if m.split(".")[0] == "lmlab"], "lmlab was imported"
save_file(out, sys.argv[2])
print("ok", sorted(m for m in sys.modules if m.startswith("compressed_tensors"))[:1])
"""




# The switches that choose the CPU's kernels: the loading process computes with the test process's kernels, as a
# user's would on one machine. Across kernels (the test under ATEN_CPU_CAPABILITY=default, its child under AVX2) an
# activation a rounding away from an int8 step's midpoint lands on the other step and moves a logit by ~1e-3.
KERNEL_SWITCHES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
                   "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _load_elsewhere(jobs: dict, tmp_path) -> dict:
    """{name: (folder, kind, inputs.safetensors)} -> logits computed in a fresh Python process without lmlab."""
    result = tmp_path / "loaded.safetensors"
    kernels = {k: v for k, v in os.environ.items() if k in KERNEL_SWITCHES}
    proc = subprocess.run([sys.executable, "-c", LOADER, json.dumps({k: [str(a) for a in v] for k, v in jobs.items()}),
                           str(result)], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
                               **kernels})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compressed_tensors" in proc.stdout  # transformers went through compressed-tensors
    return load_file(str(result))


@needs_export_extra
def test_activation_grid_is_compressed_tensors_dynamic_token_int8():
    """Independent computation: compressed-tensors' own dynamic per-token fake quantization."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    x = torch.randn(3, 7, 40) * torch.rand(3, 7, 1) * 10
    x[0, 2] = 0  # a token of zeros
    scale, zp = compute_dynamic_scales_and_zp(x, args, module=torch.nn.Linear(1, 1))
    assert torch.equal(quantize_activation(x), fake_quantize(x, scale, zp, args))


@needs_export_extra
def test_study_students_load_in_plain_transformers_with_their_logits_and_predictions(tmp_path):
    config = s2.Config(model="tiny-bert", tasks=["fact-cola"], n_train=32, n_eval=24, batch_size=16, bits=[2, 1],
                       budgets=["A"], teacher_epochs=2, seeds=1, export="compressed-tensors")
    result = run_study(s2.SPEC, config, tmp_path / "runs")
    # the study wrote each student beside its packed file; `lmlab export` writes them again elsewhere and checks
    beside = sorted(p.name for p in (result.path / "export" / "compressed-tensors").iterdir())
    assert beside == ["fact-cola-1bit-A-rep0", "fact-cola-2bit-A-rep0"]
    main(["export", str(result.path), "--out", str(tmp_path / "exported")])
    task = load_task("fact-cola", config)
    lm = load_model("tiny-bert")
    batch = collate_for(lm.tokenizer, task, config.max_length)(list(task.test))
    batch.pop("labels")
    inputs = tmp_path / "inputs.safetensors"
    save_file({k: v.contiguous() for k, v in batch.items()}, str(inputs))
    names = ["fact-cola-1bit-A-rep0", "fact-cola-2bit-A-rep0"]
    jobs = {f"{where}/{n}": (root / n, "classifier", inputs) for n in names
            for where, root in [("cli", tmp_path / "exported"),
                                ("study", result.path / "export" / "compressed-tensors")]}
    loaded = _load_elsewhere(jobs, tmp_path)
    preds = result.long()[result.long().kind == "pred"]
    for n in names:
        student = load_model("tiny-bert", head="classifier", num_labels=2).model  # the teacher's architecture
        student = type(student).from_pretrained(result.path / "teachers" / "fact-cola")
        load_packed(student, result.path / "packed" / f"{n}.safetensors")
        with torch.no_grad():
            ours = student.eval()(**batch).logits
        bits = int(n.split("-")[2][0])
        recorded = preds[(preds.bits == bits) & (preds.budget == "A")].sort_values("idx").pred.to_numpy()
        for where in ("cli", "study"):
            theirs = loaded[f"{where}/{n}"]
            assert (theirs - ours).abs().max() <= 1e-5, (n, where, (theirs - ours).abs().max())
            assert np.array_equal(theirs.argmax(-1).numpy(), recorded), (n, where)
        meta = json.loads((tmp_path / "exported" / n / "lmlab_export.json").read_text())
        assert meta["max_logit_diff"] <= 1e-5
        # size: the packed file, plus what the format's containers cost beyond it (stated in the module):
        # the embedding's entries a byte each instead of 2 bits, and 1-bit codes in 2 bits
        packed = (result.path / "packed" / f"{n}.safetensors").stat().st_size
        extra = meta["embedding_entries"] * 3 / 4 + (meta["quantized_linear_weights"] / 8 if bits == 1 else 0)
        assert abs(meta["file_bytes"] - extra - packed) <= 0.1 * packed, (meta, packed)
        assert meta["file_bytes"] < meta["fp32_bytes"] / 3


@needs_export_extra
def test_decoder_student_with_its_untied_head_loads_as_a_causal_lm(tmp_path, tiny_smol):
    model = copy.deepcopy(tiny_smol.model).float()
    quantize_model(model, 2)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))  # a trained student's latent weights differ from the embeddings' use
    save_packed(model, tmp_path / "s.safetensors")
    student = load_packed(copy.deepcopy(tiny_smol.model).float(), tmp_path / "s.safetensors").eval()
    head = student.lm_head.weight.detach().clone()
    student.tie_weights()  # (lm-eval's HFLM calls it) the head keeps the latent table, not the quantized one
    assert torch.equal(student.lm_head.weight, head)
    assert not torch.equal(student.lm_head.weight, student.model.embed_tokens.weight)
    export_compressed(student, tmp_path / "causal", tiny_smol.tokenizer)
    ids = torch.randint(0, len(tiny_smol.tokenizer), (2, 12), generator=torch.Generator().manual_seed(0))
    save_file({"input_ids": ids}, str(tmp_path / "ids.safetensors"))
    loaded = _load_elsewhere({"d": (tmp_path / "causal", "causal", tmp_path / "ids.safetensors")}, tmp_path)["d"]
    with torch.no_grad():
        ours = student(input_ids=ids).logits
    assert (loaded - ours).abs().max() <= 1e-5
    assert json.loads((tmp_path / "causal" / "config.json").read_text())["tie_word_embeddings"] is False


@needs_export_extra
def test_four_and_eight_bit_students_export_in_their_own_widths(tmp_path):
    """4- and 8-bit students (one scale per matrix, integers -7..7 and -127..127) pack in 4 and 8 bits; loaded
    elsewhere they give the student's logits, before and after a round trip through lmlab's packed file."""
    bert = load_model("tiny-bert", head="classifier", num_labels=2)
    enc = bert.encode(["the capital of France", "Paris is a city of the north"], padding_side="right",
                      position_ids=False)
    save_file({k: v.contiguous() for k, v in enc.items()}, str(tmp_path / "in.safetensors"))
    jobs, ours = {}, {}
    for bits in (4, 8):
        student = copy.deepcopy(bert.model)
        quantize_model(student, bits)
        with torch.no_grad():
            for p in student.parameters():
                p.add_(0.01 * torch.randn_like(p))
        student.eval()
        save_packed(student, tmp_path / f"s{bits}.safetensors")
        reloaded = load_packed(copy.deepcopy(bert.model), tmp_path / f"s{bits}.safetensors").eval()
        for name, model in [("trained", student), ("reloaded", reloaded)]:
            sizes = export_compressed(model, tmp_path / f"{name}{bits}")
            config = json.loads((tmp_path / f"{name}{bits}" / "config.json").read_text())["quantization_config"]
            assert config["config_groups"]["group_0"]["weights"]["num_bits"] == bits
            with torch.no_grad():
                ours[f"{name}{bits}"] = model(**enc).logits
            jobs[f"{name}{bits}"] = (tmp_path / f"{name}{bits}", "classifier", tmp_path / "in.safetensors")
        assert sizes["file_bytes"] < sizes["fp32_bytes"] / (2 if bits == 8 else 3)
    loaded = _load_elsewhere(jobs, tmp_path)
    for name in jobs:
        assert (loaded[name] - ours[name]).abs().max() <= 1e-5, name


@needs_export_extra
def test_what_the_format_cannot_express_is_refused_in_one_sentence(tmp_path, monkeypatch):
    gpt2 = copy.deepcopy(load_model("tiny-gpt2").model)
    quantize_model(gpt2, 2)
    with pytest.raises(LmlabError, match="Conv1D, which compressed-tensors does not quantize"):
        export_compressed(gpt2, tmp_path / "g")
    bert = load_model("tiny-bert", head="classifier", num_labels=2).model
    student = copy.deepcopy(bert)
    quantize_model(student, 2)
    save_packed(student, tmp_path / "s.safetensors")
    old = load_file(str(tmp_path / "s.safetensors"))  # a file from before the int8 grid: no act_grid
    from safetensors import safe_open

    with safe_open(str(tmp_path / "s.safetensors"), framework="pt") as fh:
        meta = json.loads(fh.metadata()["lmlab"])
    meta.pop("act_grid")
    save_file(old, str(tmp_path / "old.safetensors"), metadata={"lmlab": json.dumps(meta)})
    with pytest.raises(LmlabError, match=r"earlier grid \(amax/127, -127..127\), which compressed-tensors cannot"):
        export_compressed(load_packed(copy.deepcopy(bert), tmp_path / "old.safetensors"), tmp_path / "o")
    with pytest.raises(LmlabError, match="takes a 1-, 2-, 4- or 8-bit XTC student"):
        export_compressed(copy.deepcopy(bert), tmp_path / "p")
    assert not (tmp_path / "g").exists() and not (tmp_path / "o").exists()


def test_export_command_errors_are_one_sentence(tmp_path, capsys, monkeypatch):
    def error(*args):
        with pytest.raises(SystemExit) as exc:
            main(["export", *map(str, args)])
        assert exc.value.code == 2
        return capsys.readouterr().err.strip()

    assert "is not a folder" in error(tmp_path / "none")
    (tmp_path / "knockout-x-1").mkdir()
    assert "is not a quantize run folder" in error(tmp_path / "knockout-x-1")
    run = tmp_path / "quantize-x-1"
    run.mkdir()
    (run / "config.yaml").write_text("model: tiny-bert\n")
    assert "holds no packed students yet" in error(run)
    (run / "packed").mkdir()
    (run / "packed" / "fact-cola-2bit-A-rep0.safetensors").write_bytes(b"")
    assert "unknown export format 'onnx'" in error(run, "--format", "onnx")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "compressed_tensors"
                        else real(name, *a))
    assert error(run).endswith("pip install 'lmlab[export]'")
