"""What a GPU run would catch, caught on the CPU (docs/gpu.md says what only a GPU run sees).

- bf16: every study at tiny sizes with `--dtype bfloat16` on the CPU, the GPU's precision path (autocast in
  training, bf16 weights in inference): a bf16 value written into a float32 parameter, a bf16 weight that is not
  its integers times its scale, a comparison of two dtypes.
- devices: every study and every intervention on the emulated GPU (tests/emulated_gpu.py: a device of its own,
  backed by the CPU, with CUDA's device rules): a tensor made on the host and mixed into the model's maths, a batch
  never moved, a host generator drawing on the device, `.numpy()` of a device tensor.
- the generator rule, read from the code.
Each lmlab bug the first GPU run met has its regression test here, named after it.
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import pytest
import torch

from conftest import PROMPTS
from lmlab.models import load_model
from lmlab.studies import get_study, run_study

# every study at tiny sizes (seconds each), on the tiny models or a scratch one
STUDIES = {
    "knockout": dict(model="tiny-llama", per_dataset=16, datasets=["geo-capital"], sweep_every=2, min_per_class=3,
                     seeds=2),
    "quantize": dict(model="tiny-bert", tasks=["fact-cola"], n_train=32, n_eval=16, batch_size=16, teacher_epochs=1,
                     bits=[2], seeds=2),
    "filler": dict(model="tiny-llama", n_test_per_level=2, n_dev_per_level=1, sweep_problems=2, profile_problems=2,
                   max_new_tokens=4, sweep_lengths=[5], arm_c=[0.13], arm_p1=[90.0]),
    "sparse-circuits": dict(model="tiny-llama", toy_steps=3, toy_sparse_steps=2, toy_width=32, seeds=2,
                            rank_draws=5, toy_rank_draws=5),
    "latent": dict(model="scratch", rates=[4], n_train=96, n_test=4, steps=3, vq_steps=21, seeds=2, d_model=32,
                   n_layers=2, batch_size=16),  # 21 VQ steps: one dead-code restart (every 20) under autocast
}


# Where a real GPU is present the emulated one is not registered (a second accelerator backend in the process
# breaks torch's autograd streams on CUDA, conftest.py): the regression tests run on the GPU itself, and the checks
# of the emulator alone skip.
REAL_GPU = torch.cuda.is_available()
if REAL_GPU:
    DEVICE = torch.device("cuda:0")

    def emulated_gpu():
        return contextlib.nullcontext(DEVICE)
else:
    from emulated_gpu import DEVICE, emulated_gpu
emulator_only = pytest.mark.skipif(REAL_GPU, reason="a real GPU is here: the emulated GPU stands in for one where "
                                   "there is none (the device-fixture tests and `make gpu-check` run on this one)")


@pytest.fixture(autouse=True)
def both_answer_classes(monkeypatch):
    """A tiny model answers no question right: S1's answers are labelled by a rule instead, so that its probes,
    sweep and split all run."""
    import lmlab.studies.knockout.recipe as s1_recipe

    monkeypatch.setattr(s1_recipe, "alias_match", lambda text, aliases, exact=False: aliases[0][0] < "M")


def _run(study: str, tmp_path: Path, **settings):
    spec = get_study(study)
    result = run_study(spec, spec.config(profile="demo", **STUDIES[study], **settings), tmp_path)
    assert result.verdict.status in ("reproduced", "not reproduced", "inconclusive")
    return result


@pytest.mark.parametrize("study", list(STUDIES))
def test_every_study_completes_in_bf16_on_the_cpu(study, tmp_path):
    result = _run(study, tmp_path, device="cpu", dtype="bfloat16")
    assert result.info.get("environment", {}).get("device", "cpu") == "cpu"


@emulator_only
@pytest.mark.parametrize("study", list(STUDIES))
def test_every_study_completes_on_the_emulated_gpu(study, tmp_path):
    with emulated_gpu():  # --device auto resolves to it; accelerate trains on it
        result = _run(study, tmp_path)
    assert str(DEVICE) in str(result.info.get("environment", {}).get("device", str(DEVICE)))


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2"])
def host_and_device(request):
    """The same tiny decoder on the CPU and on the emulated GPU, both float32 (the numbers must agree)."""
    return load_model(request.param, device="cpu"), load_model(request.param, device=DEVICE, dtype=torch.float32)


def _cases():
    from test_dispatch import CASES

    return CASES


@emulator_only
@pytest.mark.parametrize("case", list(_cases()))
def test_every_intervention_gives_the_cpu_numbers_on_the_emulated_gpu(host_and_device, case):
    from test_dispatch import _run as run_case

    host, dev = host_and_device
    with emulated_gpu():
        a, caps_a = run_case(host, _cases()[case], host.encode(PROMPTS))
        b, caps_b = run_case(dev, _cases()[case], dev.encode(PROMPTS))
        assert b.device == DEVICE
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-5)
        for ca, cb in zip(caps_a, caps_b):
            for point in ca.points:
                torch.testing.assert_close(cb.stacked(point).cpu(), ca.stacked(point), atol=1e-5, rtol=1e-5)


@emulator_only
def test_the_emulated_gpu_refuses_what_cuda_refuses():
    """The emulator's own check: CUDA's refusals, and what CUDA allows (a copy between devices, host indices,
    a host scalar)."""
    with emulated_gpu():
        x = torch.arange(6.0, device=DEVICE).reshape(2, 3)
        host = torch.ones(2, 3)
        with pytest.raises(RuntimeError, match="at least two devices"):
            x + host
        with pytest.raises(RuntimeError, match="device type for generator but found 'cpu'"):
            torch.randn(3, generator=torch.Generator().manual_seed(0), device=DEVICE)
        with pytest.raises(TypeError, match="Use Tensor.cpu"):
            x.numpy()
        assert torch.equal((x + torch.tensor(1.0)).cpu(), torch.arange(1.0, 7.0).reshape(2, 3))  # a host scalar
        assert torch.equal(x[:, torch.tensor([2, 0])].cpu(), torch.tensor([[2.0, 0.0], [5.0, 3.0]]))  # host index
        y = torch.zeros(2, 3, device=DEVICE)
        y.copy_(host)
        assert torch.equal(y.cpu(), host) and x.sum().item() == 15.0 and x[0].tolist() == [0.0, 1.0, 2.0]
        g = torch.Generator(device=DEVICE).manual_seed(0)  # a device generator draws on the device
        assert torch.randn(3, generator=g, device=DEVICE).device == DEVICE


# --- regression tests for the bugs the first GPU run met --------------------------------------------------

def test_latent_codebook_restart_under_bf16_autocast_keeps_the_codebook_float32():
    """GPU run: `Index put requires the source and destination dtypes match` (vqvae.py, the dead-code restart under
    bf16 autocast). The quantizer now searches and writes in float32 whatever the autocast."""
    from lmlab.studies.latent.vqvae import Quantizer

    torch.manual_seed(0)
    q = Quantizer(16, 8).train()
    z = torch.randn(4, 3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        quantized, idx, loss = q(z.bfloat16())  # the first call draws the codebook from z
        q.usage.zero_()
        assert q.restart_dead(z.bfloat16()) == 16
    assert q.codebook.weight.dtype == torch.float32 and quantized.dtype == torch.float32
    assert torch.isfinite(loss) and idx.shape == (4, 3)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_bf16_student_packs_to_its_integers_times_its_scales(bits, tmp_path):
    """GPU run: `a quantized weight is not its integers times one scale per group` (4/8-bit packing of a bf16
    model): the scale is the one quantize_weight used, in the weights' dtype, and the check is exact in it."""
    from lmlab.interventions.quant import load_packed, quant_targets, quantize_model, quantized_weight, save_packed

    lm = load_model("tiny-bert", head="classifier", num_labels=2, device="cpu", dtype=torch.bfloat16)
    quantize_model(lm.model, bits)
    save_packed(lm.model, tmp_path / "s.safetensors")
    fresh = load_model("tiny-bert", head="classifier", num_labels=2, device="cpu", dtype=torch.bfloat16, seed=4).model
    load_packed(fresh, tmp_path / "s.safetensors")
    for name, (module, _) in quant_targets(lm.model).items():
        assert torch.equal(quantized_weight(module), quant_targets(fresh)[name][0].weight), name


def test_kd_loss_takes_a_batch_collated_on_the_host():
    """GPU run: `index is on cpu` in train/kd.py (a batch built on the host fed to a teacher on the GPU)."""
    from lmlab.train.kd import kd_loss

    with emulated_gpu():
        teacher = load_model("tiny-bert", head="classifier", num_labels=2, device=DEVICE, dtype=torch.float32)
        student = load_model("tiny-bert", head="classifier", num_labels=2, device=DEVICE, dtype=torch.float32,
                             seed=3)
        teacher.tokenizer.padding_side = "right"
        batch = dict(teacher.tokenizer(["the capital of France", "Paris"], return_tensors="pt", padding=True))
        loss, parts = kd_loss(student.model, teacher.model, batch)
        assert loss.device.type == DEVICE.type and all(v > 0 for v in parts.values())


# --- the generator rule -----------------------------------------------------------------------------------

RANDOM = {"rand", "randn", "randint", "randperm", "normal", "bernoulli", "rand_like", "randn_like", "randint_like"}


def test_every_seeded_draw_says_where_it_draws():
    """The rule (docs/gpu.md): a generator draws where it lives. A host generator (`torch.Generator()`) draws with
    device="cpu" and the numbers move to the model's device, so the same seed gives the same numbers on any
    device; a draw on the device takes a device generator (`torch.Generator(device=...)`, generation's sampling).
    Read from the code: every torch draw given a generator names its device, save torch.multinomial, which draws
    where its probabilities are (generation.py's device generator)."""
    root = Path(__file__).parent.parent / "src" / "lmlab"
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            keywords = {k.arg for k in node.keywords}
            if "generator" in keywords and node.func.attr in RANDOM and "device" not in keywords:
                bad.append(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}")
            if node.func.attr == "Generator" and node.args:
                bad.append(f"{path.relative_to(root)}:{node.lineno} Generator(positional device)")
    assert not bad, bad


def test_the_replicates_benchmark_runs_on_the_device_it_is_given():
    """`lmlab bench --only replicates --device cuda` (the GPU check's benchmark): models and batches on the device."""
    from lmlab.benchmarks.replicates import replicates_bench

    with emulated_gpu():
        rows = replicates_bench(steps=3, device=str(DEVICE))
    assert len(rows) == 6 and all(r["value"] > 0 and f"on {DEVICE.type}" in r["setup"] for r in rows)


@emulator_only  # (on a GPU it runs larger batches too: `make gpu-check` runs it there)
def test_the_generation_benchmark_runs_on_the_device_it_is_given():
    """`lmlab bench --only generation --device cuda` (S3's throughput on a GPU): both loops on the device, the
    bandwidth measured there, the two agreeing on the greedy tokens of a tiny model."""
    from lmlab.benchmarks.generation import generation_bench

    with emulated_gpu():
        rows = generation_bench(model="tiny-llama", repeats=1, device=str(DEVICE))
    assert {r["case"].split(":")[0] for r in rows} == {"S1, batch 1", "S1, batch 16", "S3, batch 1", "S3, batch 64"}
    assert all(r["value"] > 0 and f"on {DEVICE}" in r["setup"] and "tokens agreeing 100.0%" in r["setup"]
               for r in rows)
