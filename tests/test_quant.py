import copy
import random

import pytest
import torch

from lmlab import LmlabError
from torch.nn.utils import parametrize

from lmlab.interventions.quant import (WeightQuantizer, load_packed, quant_targets, quantize_activation, quantize_model,
                                       quantize_weight, quantized_weight, save_packed, straight_through)
from helpers import near
from lmlab.models import load_model


def test_one_bit_gives_two_values_per_group_with_the_closed_form_scale():
    w = torch.randn(16, 32)
    q = quantize_weight(w, 1)
    alpha = w.abs().mean()
    assert set(torch.unique(q).tolist()) == {float(-alpha), float(alpha)}
    assert torch.equal(torch.sign(q), torch.where(w < 0, -1.0, 1.0))
    rows = quantize_weight(w, 1, rowwise=True)
    for r in range(16):
        assert torch.unique(rows[r]).numel() == 2
        assert torch.allclose(rows[r].abs(), w[r].abs().mean().expand(32))


def test_two_bit_is_ternary_with_the_closed_form_threshold_and_scale():
    w = torch.randn(64, 48)
    q = quantize_weight(w, 2)
    delta = 0.7 * w.abs().mean()
    keep = w.abs() > delta
    alpha = w.abs()[keep].mean()
    assert torch.unique(q).numel() <= 3
    assert torch.equal(q == 0, ~keep)
    assert torch.allclose(q[keep].abs(), alpha.expand(int(keep.sum())))


def test_straight_through_forward_is_exact_and_gradient_is_identity():
    w = torch.randn(8, 8, requires_grad=True)
    q = quantize_weight(w.detach(), 1)
    out = straight_through(w, lambda v: quantize_weight(v, 1))
    assert torch.equal(out, q)
    assert out.grad_fn is not None and w.grad_fn is None  # one node: the quantizer's ops are not recorded
    g = torch.randn(8, 8)
    out.backward(g)
    assert torch.equal(w.grad, g)
    with torch.no_grad():
        assert torch.equal(straight_through(w, lambda v: quantize_weight(v, 1)), q)
    x = torch.randn(3, 5, 7, requires_grad=True)
    xq = quantize_activation(x)
    scale = x.detach().abs().amax(-1, keepdim=True) / 127.5  # the int8 grid -128..127
    assert torch.allclose(xq / scale, torch.round(xq / scale), atol=1e-4)  # on the 8-bit grid, per token
    xq.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quantizer_gives_compressed_tensors_values_and_leaves_its_input(dtype):
    """The 8-bit token grid against the out-of-place chain compressed-tensors computes (scale = amax / 127.5, a token of
    zeros scaled by eps, clamp to -128..127, round, rescale), bit for bit; the input is read, never overwritten."""
    torch.manual_seed(0)
    x = (torch.randn(4, 9, 33) * torch.logspace(-3, 2, 9)[None, :, None]).to(dtype)
    x[1, 2] = 0  # a token of zeros
    x[2, 3, 0] = -x[2, 3].abs().max() * 2  # the token's largest magnitude on its negative side
    before = x.clone()
    scale = x.abs().amax(-1, keepdim=True) / 127.5
    scale = torch.where(scale == 0, torch.finfo(dtype).eps, scale)
    expected = torch.round(torch.clamp(x / scale, -128, 127)) * scale
    got = quantize_activation(x)
    assert got.dtype == dtype and torch.equal(got.float().view(torch.int32), expected.float().view(torch.int32))
    assert torch.equal(x, before)
    assert torch.equal(got[1, 2], torch.zeros_like(got[1, 2]))
    assert got[2, 3, 0] / scale[2, 3, 0] == -128  # the negative extreme, -127.5 steps, rounds to even: the grid's floor


def test_bit_widths_and_module_types_are_checked():
    lm = load_model("tiny-bert")
    with pytest.raises(LmlabError, match="3-bit weights are not supported; use one of 1, 2, 4, 8, 32"):
        quantize_model(copy.deepcopy(lm.model), 3)
    model = copy.deepcopy(lm.model)
    model.encoder.layer[0].attention.self.query = torch.nn.Identity()
    with pytest.raises(LmlabError, match="cannot quantize attention.self.query of layer 0: Identity is not a linear"):
        quantize_model(model, 1)


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-llama", "tiny-gpt2"])
def test_quantization_covers_the_xtc_weights_of_each_family_and_leaves_the_original(name, device):
    lm = device.load(name)
    model = copy.deepcopy(lm.model)
    names = quantize_model(model, 2)
    per_block = {"tiny-bert": 6, "tiny-llama": 7, "tiny-gpt2": 4}[name]
    assert len(names) == 3 * per_block + 1 and "word_embeddings" in names
    for module, rowwise in quant_targets(model).values():
        w = quantized_weight(module)
        assert torch.unique(w).numel() <= 3 if not rowwise else all(torch.unique(row).numel() <= 3 for row in w)
    assert not any("parametrizations" in k for k in lm.model.state_dict())


@pytest.mark.parametrize("bits", [1, 2])
def test_embedding_row_quantizer_equals_quantizing_the_whole_table(bits, device):
    """The forward hook on the looked-up rows against the whole table parametrized (the plain construction):
    the same logits and the same gradient on every latent weight."""
    lm = device.load("tiny-bert", head="classifier", num_labels=2)
    enc = lm.encode(["the capital of France", "Paris is a city in France"], padding_side="right")
    grads = []
    for whole_table in (False, True):
        model = copy.deepcopy(lm.model)
        quantize_model(model, bits)
        emb = quant_targets(model)["word_embeddings"][0]
        if whole_table:
            emb._forward_hooks.clear()
            parametrize.register_parametrization(emb, "weight", WeightQuantizer(bits, rowwise=True))
        out = model(**enc).logits
        out.square().sum().backward()
        grads.append((out.detach(), {n.replace(".parametrizations.weight.original", ".weight"): p.grad
                                     for n, p in model.named_parameters()}))
    (hooked, g_hooked), (table, g_table) = grads
    assert torch.equal(hooked, table)
    assert g_hooked.keys() == g_table.keys()
    for name in g_hooked:
        assert near(g_hooked[name], g_table[name], rtol=1e-5, atol=1e-7), name
    assert g_hooked["bert.embeddings.word_embeddings.weight"].abs().sum() > 0


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-llama"])
def test_student_gradient_is_the_gradient_at_its_quantized_weights(name, device):
    """The straight-through estimator, checked against a plain model: a copy whose weights hold the student's
    quantized values, with the activation quantizers written out here as q + (x - x) (the estimator's textbook
    form, not lmlab's), gives the student's logits and, on each weight, the gradient of its latent weight."""
    lm = device.load(name, head="classifier", num_labels=2) if name == "tiny-bert" else device.load(name)
    enc = lm.encode(["the capital of France", "Paris is a city in France"], padding_side="right")
    student, plain = copy.deepcopy(lm.model), copy.deepcopy(lm.model)
    quantize_model(student, 2)
    targets, plain_targets = quant_targets(student), quant_targets(plain)

    def textbook(module, args):
        x = args[0]
        v = x.detach()
        scale = v.abs().amax(-1, keepdim=True) / 127.5
        scale = torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)
        return (torch.clamp(v / scale, -128, 127).round() * scale + (x - v), *args[1:])

    with torch.no_grad():
        for key, (module, rowwise) in targets.items():
            plain_targets[key][0].weight.copy_(quantized_weight(module))
            if not rowwise:
                plain_targets[key][0].register_forward_pre_hook(textbook)
    outs = [m(**enc).logits for m in (student, plain)]
    for out in outs:
        out.square().sum().backward()
    assert torch.equal(outs[0], outs[1])
    for key, (module, rowwise) in targets.items():
        latent = module.weight if rowwise else module.parametrizations.weight.original
        assert near(latent.grad, plain_targets[key][0].weight.grad, rtol=1e-5, atol=1e-7), key
    assert targets["word_embeddings"][0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name,bits", [("tiny-bert", 1), ("tiny-bert", 2), ("tiny-bert", 4), ("tiny-bert", 8),
                                       ("tiny-gpt2", 1)])
def test_packed_checkpoint_round_trips_bit_exactly(tmp_path, name, bits, device):
    """tiny-gpt2 ties its output layer to the quantized embeddings: the head keeps the latent values."""
    head = dict(head="classifier", num_labels=3) if name == "tiny-bert" else {}
    lm = device.load(name, **head)
    model = copy.deepcopy(lm.model)
    quantize_model(model, bits)
    with torch.no_grad():  # a training step moved the latent weights: a tied head differs from the codes
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.eval()
    enc = lm.encode(["the capital of France", "Paris is a city"], padding_side="right", position_ids=False)
    with torch.no_grad():
        before = model(**enc).logits
    info = save_packed(model, tmp_path / "m.safetensors")
    assert info["fp32_bytes"] / info["packed_bytes"] > {1: 28, 2: 14, 4: 7.5, 8: 3.8}[bits] * 0.9
    fresh = device.load(name, seed=5, **head).model  # other weights
    load_packed(fresh, tmp_path / "m.safetensors")
    fresh.eval()
    for target, (module, _) in quant_targets(model).items():
        assert torch.equal(quantized_weight(module), quant_targets(fresh)[target][0].weight), target
    with torch.no_grad():
        assert torch.equal(fresh(**enc).logits, before)


# --- experts stacked in 3-D tensors (transformers' fused experts)

def _tiny_moe(kind: str = "mixtral", seed: int = 0):
    """A tiny random mixture of experts: Mixtral's layout (gate and up concatenated, no biases) or GPT-OSS's
    (transposed tensors, biases, a gate of its own)."""
    from transformers import GptOssConfig, GptOssForCausalLM, MixtralConfig, MixtralForCausalLM

    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(seed)
    if kind == "gpt_oss":
        return GptOssForCausalLM(GptOssConfig(**common, head_dim=8,
                                              layer_types=["sliding_attention", "full_attention"])).eval()
    return MixtralForCausalLM(MixtralConfig(**common)).eval()


def _textbook_int8(x: torch.Tensor) -> torch.Tensor:
    """8-bit per-token quantization written out (amax/127.5 on -128..127), with the straight-through gradient."""
    v = x.detach()
    scale = v.abs().amax(-1, keepdim=True) / 127.5
    scale = torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)
    return torch.clamp(v / scale, -128, 127).round() * scale + (x - v)


def _ternary_per_expert(w: torch.Tensor) -> torch.Tensor:
    """XTC's 2-bit values with one group per expert's matrix: delta = 0.7 mean|w|, alpha = mean |w| above it."""
    out = torch.empty_like(w)
    for e in range(w.shape[0]):
        a = w[e].abs()
        keep = a > 0.7 * a.mean()
        out[e] = a[keep].mean() * torch.where(w[e] < 0, -1.0, 1.0) * keep
    return out


def test_stacked_experts_quantize_per_expert_with_8bit_inputs_at_both_matrices():
    """Mixtral's experts at 2 bits against a token-by-token computation written here: each expert's matrices
    ternary with their own scale, each token's input and each expert's gated hidden state on the int8 grid, the
    outputs summed with the router's weights; the same value and, through the straight-through estimator, the
    gradient at the quantized weights on the latent ones."""
    model = _tiny_moe()
    experts = model.model.layers[0].mlp.experts
    gate_up, down = experts.gate_up_proj.detach().clone(), experts.down_proj.detach().clone()
    names = quantize_model(model, 2)
    assert {"layers.0.mlp.experts.gate_up_proj", "layers.1.mlp.experts.down_proj"} <= set(names)
    assert parametrize.is_parametrized(experts, "gate_up_proj") and parametrize.is_parametrized(experts, "down_proj")
    q_gate_up, q_down = _ternary_per_expert(gate_up), _ternary_per_expert(down)
    assert near(experts.gate_up_proj, q_gate_up, rtol=1e-6, atol=0) and near(experts.down_proj, q_down, rtol=1e-6, atol=0)
    assert torch.equal(experts.gate_up_proj == 0, q_gate_up == 0)  # the same entries dropped
    assert len({float(experts.down_proj[e].detach().abs().max()) for e in range(4)}) == 4  # a scale per expert

    torch.manual_seed(1)
    h = torch.randn(6, 32, requires_grad=True)
    index = torch.stack([torch.randperm(4)[:2] for _ in range(6)])
    weights = torch.rand(6, 2)
    got = experts(h, index, weights)
    got.square().sum().backward()

    ref_gate_up, ref_down = q_gate_up.clone().requires_grad_(), q_down.clone().requires_grad_()
    rows = []
    for t in range(6):
        x = _textbook_int8(h[t])
        y = torch.zeros(32)
        for slot in range(2):
            e = int(index[t, slot])
            gate, up = (ref_gate_up[e] @ x).chunk(2)
            y = y + weights[t, slot] * (ref_down[e] @ _textbook_int8(torch.nn.functional.silu(gate) * up))
        rows.append(y)
    expected = torch.stack(rows)
    expected.square().sum().backward()
    assert near(got.detach(), expected.detach(), rtol=1e-5, atol=1e-7)
    latent = experts.parametrizations
    assert near(latent.gate_up_proj.original.grad, ref_gate_up.grad, rtol=1e-4, atol=1e-7)
    assert near(latent.down_proj.original.grad, ref_down.grad, rtol=1e-4, atol=1e-7)
    assert latent.down_proj.original.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
def test_lmlab_experts_forward_is_the_familys_own_without_activation_quantizers(kind):
    """lmlab's experts forward (which places the 8-bit quantizers) computes what the family's own computes, on its
    layout: Mixtral's, and GPT-OSS's transposed tensors with biases and its clamped gate."""
    from lmlab.interventions.quant import xtc_experts_forward

    model = _tiny_moe(kind)
    experts = model.model.layers[1].mlp.experts
    torch.manual_seed(2)
    h, index, weights = torch.randn(9, 32), torch.stack([torch.randperm(4)[:2] for _ in range(9)]), torch.rand(9, 2)
    with torch.no_grad():
        own = type(experts).forward(experts, h, index, weights)
        assert near(xtc_experts_forward(experts, h, index, weights), own, rtol=1e-5, atol=1e-8)
        quantize_model(model, 4, act_bits=None)
        own = type(experts).forward(experts, h, index, weights)  # (quantized weights, read by the family's code)
        assert near(experts(h, index, weights), own, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("bits", [2, 4])
def test_a_mixture_of_experts_student_round_trips_packed(tmp_path, bits):
    model = _tiny_moe("gpt_oss")
    quantize_model(model, bits)
    with torch.no_grad():  # a training step moved the latent weights
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    info = save_packed(model, tmp_path / "m.safetensors")
    assert info["fp32_bytes"] / info["packed_bytes"] > {2: 14, 4: 7.5}[bits] * 0.8
    fresh = _tiny_moe("gpt_oss", seed=5)
    load_packed(fresh, tmp_path / "m.safetensors")
    for layer in range(2):
        for param in ("gate_up_proj", "down_proj"):
            assert torch.equal(getattr(fresh.model.layers[layer].mlp.experts, param),
                               getattr(model.model.layers[layer].mlp.experts, param))
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, before)


def test_experts_lmlab_cannot_reach_and_their_export_are_refused_in_one_sentence(tmp_path):
    from lmlab.interventions.export import export_compressed

    model = _tiny_moe()
    quantize_model(model, 2)
    with pytest.raises(LmlabError, match=r"^the compressed-tensors export writes linear layers and embeddings, and "
                                         r"this model's experts are stacked in 3-D tensors .*nothing was written$"):
        export_compressed(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    class OwnExperts(torch.nn.Module):  # experts stacked in 3-D, computed in a forward of their own
        def __init__(self):
            super().__init__()
            self.w_experts = torch.nn.Parameter(torch.randn(4, 32, 32))

        def forward(self, x):
            return x

    model = _tiny_moe()
    model.model.layers[1].mlp.experts = OwnExperts()
    with pytest.raises(LmlabError, match=r"^cannot quantize the experts of layer 1: OwnExperts stacks them in 3-D "
                                         r"tensors \(mlp\.experts\.w_experts\) and computes them in a forward of its own"):
        quant_targets(model)


# --- round to nearest (post-training, no training)

def _gptq_rtn_by_hand(w: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ's asymmetric quantizer written out row by row (Frantar et al.: xmin = min(min x, 0), xmax = max(max x, 0),
    scale = (xmax - xmin) / (2^b - 1), zero = round(-xmin / scale), q = clamp(round(x / scale) + zero, 0, 2^b - 1))."""
    out = torch.empty_like(w)
    for r in range(w.shape[0]):
        xmin, xmax = min(float(w[r].min()), 0.0), max(float(w[r].max()), 0.0)
        if xmin == xmax == 0.0:
            xmin, xmax = -1.0, 1.0
        scale = (xmax - xmin) / (2 ** bits - 1)
        zero = round(-xmin / scale)
        q = torch.clamp(torch.round(w[r] / scale) + zero, 0, 2 ** bits - 1)
        out[r] = scale * (q - zero)
    return out


@pytest.mark.parametrize("bits", [8, 4, 3, 2])
def test_round_to_nearest_is_gptqs_quantizer_per_output_channel(bits):
    from lmlab.interventions.quant import rtn_weight

    torch.manual_seed(bits)
    w = torch.randn(12, 40) * torch.rand(12, 1)  # rows of different ranges
    w[3] = 0.0  # an all-zero row stays zero
    w[5] = w[5].abs()  # a row of one sign: zero is on its grid
    got = rtn_weight(w, bits)
    assert near(got, _gptq_rtn_by_hand(w, bits), rtol=1e-6, atol=1e-7)
    assert all(torch.unique(row).numel() <= 2 ** bits for row in got)
    assert torch.equal(got[3], w[3])
    span = (w.amax(-1).clamp(min=0) - w.amin(-1).clamp(max=0)) / (2 ** bits - 1)
    assert ((got - w).abs().amax(-1) <= span / 2 + 1e-6).all()
    with pytest.raises(LmlabError, match="round-to-nearest takes 2 to 8 bits, not 1"):
        rtn_weight(w, 1)


@pytest.mark.parametrize("bits", [8, 4, 2, 1])
def test_hqq_weights_are_what_hqqs_own_layer_computes_with(bits):
    """`hqq_weight` against the hqq package's quantized layer (`HQQLinear`, built from its default configuration for
    the width, de-quantized): the same values; each group of 64 weights along the input holds at most 2^bits of them,
    and the error falls as the bits rise."""
    pytest.importorskip("hqq", reason="the hqq extra is not installed")
    from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

    from lmlab.interventions.quant import hqq_weight

    torch.manual_seed(bits)
    layer = torch.nn.Linear(128, 24, bias=False)
    w = layer.weight.detach().clone()
    got = hqq_weight(w, bits)
    own = HQQLinear(layer, quant_config=BaseQuantizeConfig(nbits=bits, group_size=64), compute_dtype=torch.float32,
                    device="cpu", del_orig=False).dequantize()
    assert near(got, own, rtol=1e-6, atol=1e-7)
    assert all(torch.unique(group).numel() <= 2 ** bits for group in got.reshape(-1, 64))
    assert (got - w).abs().mean() < (hqq_weight(w, 1) - w).abs().mean() or bits == 1
    with pytest.raises(LmlabError, match="HQQ takes 8, 4, 3, 2, 1 bits, not 5"):
        hqq_weight(w, 5)


@pytest.mark.parametrize("bits,width", [(8, 96), (4, 256), (4, 192), (4, 40)])
def test_torchao_weights_are_what_torchaos_own_layer_computes_with(bits, width):
    """`torchao_weight` against torchao's own quantized layer (`quantize_` on an nn.Linear, its output on random
    inputs): the same product; and against an independent computation of the grid: 8 bits, each row symmetric on its
    absmax in int8 (scale absmax / 127.5); 4 bits, each group of 128 weights along the input (64 where 128 does not
    divide the input, one group a row where neither 32 does) on a symmetric int4 grid (scale absmax / 7.5)."""
    pytest.importorskip("torchao", reason="the torchao extra is not installed")
    from lmlab.interventions.quant import torchao_api, torchao_group, torchao_weight

    quantize_, Int8WeightOnlyConfig, IntxWeightOnlyConfig, PerAxis, PerGroup = torchao_api()
    torch.manual_seed(bits + width)
    layer = torch.nn.Linear(width, 24, bias=False)
    w = layer.weight.detach().clone()
    got = torchao_weight(w, bits)
    group = torchao_group(width)
    quantize_(layer, Int8WeightOnlyConfig(set_inductor_config=False) if bits == 8 else IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=PerGroup(group) if group else PerAxis(0)))
    x = torch.randn(5, width)
    assert near(layer(x), x @ got.t(), rtol=1e-5, atol=1e-6)
    assert group == {96: 32, 256: 128, 192: 64, 40: None}[width]
    size = width if bits == 8 or group is None else group
    parts = w.reshape(-1, size)
    scale = parts.abs().amax(-1, keepdim=True) / (2 ** bits - 1) * 2
    levels = 2 ** (bits - 1)
    mine = torch.round(parts / scale).clamp(-levels, levels - 1) * scale
    steps = (got.reshape(-1, size) - mine).abs() / scale  # in grid steps
    assert (steps < 1e-3).float().mean() > 0.99 and steps.max() <= 1 + 1e-3  # a tie may round the other way
    with pytest.raises(LmlabError, match="torchao's weight-only quantizers take 8 .* or 4 .* bits here, not 2"):
        torchao_weight(w, 2)


def test_torchaos_import_notes_are_dropped_and_its_other_warnings_kept():
    """transformers imports torchao wherever it is installed; its notes that GPU kernels do not load (and torch's on
    its enums) are not printed by a process that imported lmlab, while another torchao warning still is."""
    import subprocess
    import sys

    pytest.importorskip("torchao", reason="the torchao extra is not installed")
    code = ("import lmlab, logging; import transformers.quantizers.auto; "
            "logging.getLogger('torchao').warning('a warning of its own')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "Failed to load" not in err and "register_constant" not in err and "a warning of its own" in err, err


def test_round_to_nearest_rounds_the_blocks_linear_layers_by_output_channel_and_leaves_the_embeddings():
    """GPT-2's Conv1D keeps its output channels in columns: they are what is rounded; the word embeddings (and so the
    tied output layer) stay as they were."""
    from lmlab.interventions.quant import round_to_nearest, rtn_weight

    lm = load_model("tiny-gpt2")
    model = copy.deepcopy(lm.model)
    names = round_to_nearest(model, 3)
    assert len(names) == 3 * 4 and "word_embeddings" not in names
    before, after = lm.model.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].attn.c_attn.weight
    assert torch.equal(after, rtn_weight(before.t(), 3).t())
    assert all(torch.unique(col).numel() <= 8 for col in after.t())
    assert torch.equal(model.transformer.wte.weight, lm.model.transformer.wte.weight)
    with pytest.raises(LmlabError, match="experts are stacked in 3-D tensors .* which it does not quantize yet"):
        round_to_nearest(_tiny_moe(), 4)


# --- GPTQ (lmlab's own) and AWQ (AutoRound's)

def _correlated_inputs(n_in: int, tokens: int = 1024, seed: int = 0) -> torch.Tensor:
    """Inputs whose dimensions are correlated (a low-rank mix plus noise) and of different sizes, as a layer's are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 8, generator=g) @ torch.randn(8, n_in, generator=g) + 0.3 * torch.randn(tokens, n_in,
                                                                                                     generator=g)
    return (x * torch.logspace(-1, 1, n_in)).double()


def _gptq_by_hand(w: torch.Tensor, h: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """GPTQ written out plainly (float64): column by column with the OBQ update through the explicit inverse Hessian,
    which loses the quantized column's row and column after each step (Gaussian elimination; no Cholesky factor, no
    lazy batches); each group's grid (GPTQ's asymmetric min-max one, as `_gptq_rtn_by_hand`) taken when its first
    column is reached."""
    W, H = w.double().clone(), h.double().clone()
    dead = torch.diag(H) == 0
    H[dead, dead], W[:, dead] = 1, 0
    H += 0.01 * torch.diag(H).mean() * torch.eye(len(H), dtype=H.dtype)
    Hinv, Q, top = torch.linalg.inv(H), torch.zeros_like(W), 2 ** bits - 1
    for i in range(W.shape[1]):
        if i % group == 0:
            cols = W[:, i:i + group]
            lo, hi = cols.amin(1).clamp(max=0), cols.amax(1).clamp(min=0)
            scale = (hi - lo) / top
            zero = torch.round(-lo / scale)
        Q[:, i] = scale * (torch.clamp(torch.round(W[:, i] / scale) + zero, 0, top) - zero)
        W[:, i + 1:] -= ((W[:, i] - Q[:, i]) / Hinv[i, i])[:, None] * Hinv[i, i + 1:][None, :]
        Hinv = Hinv - Hinv[:, i:i + 1] @ Hinv[i:i + 1, :] / Hinv[i, i]
    return Q


@pytest.mark.parametrize("bits,group", [(4, 16), (3, 128), (2, 12)])
def test_gptq_is_the_obq_update_column_by_column(bits, group):
    from lmlab.interventions.gptq import gptq_weight

    torch.manual_seed(bits)
    x = _correlated_inputs(48)
    x[:, 7] = 0  # an input that is zero on every token: its weights are dropped
    h = 2 * x.T @ x / len(x)
    w = torch.randn(10, 48, dtype=torch.float64)
    got = gptq_weight(w, h, bits, group_size=group)
    assert near(got, _gptq_by_hand(w, h, bits, group), rtol=1e-9, atol=1e-10)
    assert (got[:, 7] == 0).all() and not torch.equal(got, _gptq_by_hand(w, torch.eye(48), bits, group))
    for start in range(0, 48, group):
        assert all(torch.unique(row).numel() <= 2 ** bits for row in got[:, start:start + group])
    assert gptq_weight(w.float(), h, bits, group_size=group).dtype == torch.float32


@pytest.mark.parametrize("bits", [4, 3, 2])
def test_gptq_has_less_output_error_than_round_to_nearest_on_the_same_grid(bits):
    from lmlab.interventions.gptq import gptq_weight
    from lmlab.interventions.quant import rtn_weight

    torch.manual_seed(bits)
    x = _correlated_inputs(256).float()
    w = torch.randn(32, 256)
    err = lambda q: float(((x @ w.T - x @ q.T) ** 2).sum())  # noqa: E731
    gptq, rtn = err(gptq_weight(w, 2 * x.T @ x / len(x), bits)), err(rtn_weight(w, bits, group_size=128))
    assert gptq < 0.7 * rtn


@pytest.mark.parametrize("bits", [8, 3])
def test_gptq_with_an_identity_hessian_is_round_to_nearest_on_its_grid(bits):
    from lmlab.interventions.gptq import gptq_weight
    from lmlab.interventions.quant import rtn_weight

    torch.manual_seed(bits)
    w = torch.randn(16, 300) * torch.rand(16, 1)
    assert torch.equal(gptq_weight(w, torch.eye(300), bits), rtn_weight(w, bits, group_size=128))
    assert torch.equal(gptq_weight(w, torch.eye(300) * 5, bits, group_size=300), rtn_weight(w, bits))
    with pytest.raises(LmlabError, match="round-to-nearest takes 2 to 8 bits, not 1"):
        gptq_weight(w, torch.eye(300), 1)


def _layer_hessians(model, targets: dict, texts: list) -> dict:
    """2 X^T X / n of each target's inputs over whole forward passes of `model` on `texts`."""
    grams = {n: [] for n in targets}
    hooks = [m.register_forward_pre_hook(lambda m, a, n=n: grams[n].append(a[0].reshape(-1, a[0].shape[-1])))
             for n, m in targets.items()]
    with torch.no_grad():
        for ids in texts:
            model(input_ids=ids[None])
    for h in hooks:
        h.remove()
    return {n: 2 * torch.cat(xs).T @ torch.cat(xs) / len(torch.cat(xs)) for n, xs in grams.items()}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_gptq_model_is_sequential_each_layer_on_the_inputs_the_quantized_layers_before_it_give(name):
    """In the made model, every linear layer's input passes only through layers quantized before it was: so each
    layer's weights are GPTQ of the original's weights on the Hessian of its inputs in the made model, read here by a
    plain hook on a whole forward pass (not the block-by-block replay the quantizer uses). Calibrating every layer on
    the original's activations would fail this past the first layers. The embeddings and the output layer stay."""
    from lmlab.interventions.gptq import gptq_model, gptq_weight
    from lmlab.interventions.quant import post_training_targets

    original = load_model(name).model.double()
    model = copy.deepcopy(original)
    texts = [torch.randint(2, 300, (n,), generator=torch.Generator().manual_seed(n)) for n in (20, 33, 41)]
    names = gptq_model(model, 3, texts, progress=False)
    targets, before = post_training_targets(model, "gptq"), post_training_targets(original, "gptq")
    assert names == sorted(targets) and len(names) == 3 * {"tiny-llama": 7, "tiny-gpt2": 4}[name]
    conv = name == "tiny-gpt2"
    weight = lambda m: m.weight.t() if conv else m.weight  # noqa: E731  (GPT-2's Conv1D: (in, out))
    made, first = _layer_hessians(model, targets, texts), _layer_hessians(original, before, texts)
    for n, m in targets.items():
        assert near(weight(m), gptq_weight(weight(before[n]), made[n], 3), rtol=1e-7, atol=1e-9), n
    on_the_original = sorted(n for n, m in targets.items()
                             if torch.equal(weight(m), gptq_weight(weight(before[n]), first[n], 3)))
    first_stage = {"tiny-llama": ["self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj"],
                   "tiny-gpt2": ["attn.c_attn"]}[name]  # (their inputs are the same either way; past them, not)
    assert on_the_original == [f"layers.0.{path}" for path in first_stage]
    embeddings = model.get_input_embeddings().weight
    assert torch.equal(embeddings, original.get_input_embeddings().weight)
    with pytest.raises(LmlabError, match="GPTQ takes 8, 4, 3, 2 bits, not 5"):
        gptq_model(model, 5, texts)


def _autoround_awq_by_its_own_entry(model, tokenizer, bits: int, texts: list):
    """AutoRound run as its documentation shows (AutoRound(model, tokenizer, scheme, alg_configs=AWQConfig(...),
    dataset=...).quantize()), in float32 on the CPU, asymmetric, groups of 128: the library's own model."""
    from auto_round import AutoRound, AWQConfig

    grid = dict(bits=bits, group_size=128, sym=False, data_type="int")
    rounder = AutoRound(model, tokenizer=tokenizer, scheme=dict(grid), alg_configs=AWQConfig(**grid),
                        dataset=[t[None] for t in texts], seqlen=len(texts[0]), nsamples=len(texts), batch_size=8,
                        device_map="cpu", enable_torch_compile=False, amp=False, format="fake", seed=0)
    rounder.quantize()
    return rounder.model


def test_awq_weights_are_autorounds_own_on_its_grid_with_the_scales_folded_in():
    """`awq_model` against AutoRound's own AWQ run on the same model and text: the same parameters, in the model's
    dtype; each quantized layer's weights on the library's grid (its scale and zero point per row and group of 128:
    integers 0..2^b-1); the random generators left as they were; the norms before q/k/v and gate/up changed (the
    scales folded in), and at 8 bits the model computes what the original did (s and 1/s cancel)."""
    pytest.importorskip("auto_round", reason="the autoround extra is not installed")
    from lmlab.interventions.awq import awq_model

    lm = load_model("tiny-llama")  # hidden 64, 2 KV heads of 16: every dimension a multiple of 32
    texts = [torch.randint(2, 300, (32,), generator=torch.Generator().manual_seed(i)) for i in range(8)]
    model = copy.deepcopy(lm.model)
    state = (torch.random.get_rng_state(), random.getstate())
    done, kept = awq_model(model, lm.tokenizer, 4, texts)
    assert kept == [] and len(done) == 21
    assert torch.equal(state[0], torch.random.get_rng_state()) and state[1] == random.getstate()  # (left as they were)
    own = _autoround_awq_by_its_own_entry(copy.deepcopy(lm.model), lm.tokenizer, 4, texts)
    for (name, p), (_, q) in zip(model.named_parameters(), own.named_parameters()):
        assert torch.equal(p, q), name
    for name, module in own.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in name:
            codes = module.weight / module.scale + module.zp
            assert near(codes, codes.round(), atol=1e-3) and codes.min() > -1e-3 and codes.max() < 15 + 1e-3, name
    block, first = model.model.layers[0], lm.model.model.layers[0]
    assert not torch.equal(block.input_layernorm.weight, first.input_layernorm.weight)
    assert torch.equal(model.model.embed_tokens.weight, lm.model.model.embed_tokens.weight)
    eight = copy.deepcopy(lm.model).to(torch.bfloat16)
    awq_model(eight, lm.tokenizer, 8, texts)
    assert all(p.dtype == torch.bfloat16 for p in eight.parameters())
    with torch.no_grad():
        ref, out = lm.model(input_ids=texts[0][None]).logits, eight.float()(input_ids=texts[0][None]).logits
    assert (out - ref).abs().max() < 0.02 * ref.abs().max()
    with pytest.raises(LmlabError, match="AWQ takes 8, 4, 3, 2 bits, not 5"):
        awq_model(model, lm.tokenizer, 5, texts)
