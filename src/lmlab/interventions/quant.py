"""XTC weight and activation quantization (Wu et al., arXiv 2206.01859), and packed checkpoints.

Weights (as in the paper), per group (one group per linear matrix, one per row of the word embeddings):
    1 bit   alpha = mean|w|;                 w_b = alpha * sign(w)          (sign(0) = +1)
    2 bits  delta = 0.7 mean|w|; alpha = mean |w| over |w| > delta;  w_t = alpha * sign(w) * [|w| > delta]
    4, 8    symmetric uniform, scale = max|w| / (2^(b-1) - 1)
    32      unchanged
Activations: 8-bit symmetric, dynamic per token, at the inputs of the quantized linear layers, on the int8 grid
    -128..127 with scale amax/127.5 (DECISION: the paper says "8-bit symmetric"; DeepSpeed's code uses amax/128, our
    earlier runs amax/127 on -127..127; amax/127.5 is the int8 convention of compressed-tensors and vLLM, so a
    student exported in that format (interventions/export.py) computes exactly what was trained and measured).
Training keeps full-precision latent weights, quantized in every forward pass with a straight-through
gradient (identity). Linear matrices (nn.Linear, GPT-2's Conv1D) get a `torch.nn.utils.parametrize`
parametrization, no module swap. The word embeddings are quantized per row, so a lookup needs only its
own rows: a forward hook quantizes the looked-up rows, which gives the same values and the same gradient
as quantizing the whole table (tested), without touching the other 30k rows in every step
(`quantized_weight` gives the whole quantized table).

Packed checkpoints store each group's integers with its scale in safetensors: 1-bit weights as sign bits (8 per
byte), 2-bit as two-bit codes (4 per byte), 4-bit as nibbles (-7..7, 2 per byte), 8-bit as bytes (-127..127);
`load_packed` rebuilds the exact fake-quantized weights (`integer_weights` gives the integers and scales, which the
compressed-tensors export writes too).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from types import MethodType

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils import parametrize
from transformers.pytorch_utils import Conv1D

from lmlab.errors import LmlabError
from lmlab.models.layout import FAMILIES, block_linears, fused_experts, get_submodule, layout_of, text_config

BITS = (1, 2, 4, 8, 32)


def check_bits(bits: int) -> int:
    if bits not in BITS:
        raise LmlabError(f"{bits}-bit weights are not supported; use one of {', '.join(map(str, BITS))}")
    return bits


def _sign(w: torch.Tensor) -> torch.Tensor:
    return torch.where(w < 0, -1.0, 1.0).to(w.dtype)


def quantize_weight(w: torch.Tensor, bits: int, rowwise: bool = False) -> torch.Tensor:
    """The quantized values (same shape); one group per matrix, or per row when `rowwise`."""
    if bits == 32:
        return w
    dims = (-1,) if rowwise else tuple(range(w.dim()))
    mag = w.abs()
    if bits == 1:
        return mag.mean(dims, keepdim=True) * _sign(w)
    if bits == 2:
        keep = mag > 0.7 * mag.mean(dims, keepdim=True)
        alpha = (mag * keep).sum(dims, keepdim=True) / keep.sum(dims, keepdim=True).clamp_min(1)
        return alpha * _sign(w) * keep
    levels = 2 ** (bits - 1) - 1
    scale = uniform_scale(mag.amax(dims, keepdim=True), bits)
    return torch.round(w / scale).clamp(-levels, levels) * scale


def uniform_scale(amax: torch.Tensor, bits: int) -> torch.Tensor:
    """A 4- or 8-bit group's scale from its largest magnitude (quantize_weight and integer_weights)."""
    return amax.clamp_min(1e-12) / (2 ** (bits - 1) - 1)


def untie_config(config) -> None:
    """Record in a model's config (and its text config) that the output layer no longer shares the input
    embeddings, so that transformers' `tie_weights` (lm-eval calls it) and a saved config keep it so."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    for c in {id(c): c for c in (config, text) if c is not None}.values():
        c.tie_word_embeddings = False


class _StraightThrough(torch.autograd.Function):
    """Forward: `quantize(x)`, computed without autograd (nothing saved for a backward that never runs through
    it). Backward: the gradient reaches x unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, quantize) -> torch.Tensor:
        return quantize(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def straight_through(x: torch.Tensor, quantize) -> torch.Tensor:
    """Forward: exactly `quantize(x)`. Backward: identity with respect to x (the straight-through estimator).
    One autograd node: the quantizer's own operations are neither recorded nor differentiated, and no
    `q + (x - x)` is computed (two more passes over every weight and activation, forward and backward)."""
    if not (x.requires_grad and torch.is_grad_enabled()):
        with torch.no_grad():
            return quantize(x)
    return _StraightThrough.apply(x, quantize)


ACT_GRID = "int8"  # recorded with every quantized model and packed file: the activation grid it was trained on


def quantize_activation(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Per token (the last dimension): scale = amax / ((2^b - 1) / 2), values clamped to -2^(b-1)..2^(b-1)-1 and
    rounded; a token of zeros gets the dtype's eps as its scale (and stays zero). The operations and their order
    are compressed-tensors' dynamic token quantization, so an exported student gives the same values."""
    return straight_through(x, lambda v: _token_grid(v, bits))


def _token_grid(v: torch.Tensor, bits: int) -> torch.Tensor:
    """The clamp, the rounding and the product overwrite the quotient (one tensor the size of `v` where the
    out-of-place chain made four; the same values): run inside `straight_through`, nothing records them."""
    half = 2 ** (bits - 1)
    scale = v.abs().amax(-1, keepdim=True) / ((2 * half - 1) / 2)
    scale = torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)
    return (v / scale).clamp_(-half, half - 1).round_().mul_(scale)


class WeightQuantizer(nn.Module):
    def __init__(self, bits: int, rowwise: bool):
        super().__init__()
        self.bits, self.rowwise = check_bits(bits), rowwise

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return straight_through(w, lambda v: quantize_weight(v, self.bits, self.rowwise))


class ExpertWeightQuantizer(WeightQuantizer):
    """A 3-D tensor of experts' matrices (experts first): each expert's matrix is one group, as a linear layer's is."""

    def __init__(self, bits: int):
        super().__init__(bits, rowwise=True)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return straight_through(w, lambda v: quantize_weight(v.reshape(v.shape[0], -1), self.bits, True).view_as(v))


class RowQuantizer:
    """Forward hook of an embedding quantized per row: the looked-up rows are quantized (straight-through)."""

    def __init__(self, bits: int):
        self.bits = check_bits(bits)

    def __call__(self, module, args, output: torch.Tensor) -> torch.Tensor:
        return straight_through(output, lambda v: quantize_weight(v, self.bits, rowwise=True))


def quantized_weight(module: nn.Module) -> torch.Tensor:
    """The values a quantized module computes with: its parametrized weight, or for an embedding quantized
    per row, every row quantized."""
    bits = getattr(module, "_lmlab_row_bits", None)
    return module.weight if bits is None else quantize_weight(module.weight, bits, rowwise=True)


def quant_targets(model: nn.Module) -> dict[str, tuple[nn.Module, bool]]:
    """name -> (module, rowwise) for every linear layer and the word embeddings XTC quantizes in `model` (its own
    modules, resolved through its layout); a module type it cannot handle is named. Experts stacked in 3-D tensors
    are `expert_targets`' (checked here too, so that a model whose experts lmlab cannot reach is refused at once).

    A family spelled out in the layout table lists its linears once for every block; a discovered one has each
    block's linear layers found in that block (routers aside), so a model whose first blocks are dense and later
    ones mixtures of experts quantizes what each block has."""
    expert_targets(model)
    return _linear_targets(model)


def _linear_targets(model: nn.Module) -> dict[str, tuple[nn.Module, bool]]:
    layout = layout_of(model)
    out = {}
    discovered = layout.family not in FAMILIES
    for layer in range(layout.n_layers):
        for path in block_linears(layout.blocks[layer], text_config(model.config)) if discovered \
                else layout.spec.quant_linears:
            module = get_submodule(layout.blocks[layer], path)
            if not isinstance(module, (nn.Linear, Conv1D)):
                raise LmlabError(f"cannot quantize {path} of layer {layer}: {type(module).__name__} is not a linear layer")
            out[f"layers.{layer}.{path}"] = (module, False)
    for path in layout.spec.word_embeddings:
        try:
            emb = get_submodule(model, path)
        except AttributeError:
            continue
        if not isinstance(emb, nn.Embedding):
            raise LmlabError(f"cannot quantize {path}: {type(emb).__name__} is not an embedding")
        out["word_embeddings"] = (emb, True)
        break
    return out


def expert_targets(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """name -> (experts module, parameter) for every matrix kind of the blocks' experts stored as one 3-D tensor
    (transformers' fused experts: `gate_up_proj` or `up_proj`, and `down_proj`, experts first). XTC quantizes each
    expert's matrix as one group, as it does a linear layer. The 8-bit quantizer of a matrix's input needs the
    experts' forward: lmlab's (`xtc_experts_forward`) replaces those that transformers' experts interface
    dispatches (its flags say how the tensors are laid out); experts with a forward of their own are refused."""
    out = {}
    for layer, block in enumerate(layout_of(model).blocks):
        for name in fused_experts(block):
            path, _, param = name.rpartition(".")
            module = get_submodule(block, path)
            if not _interface_experts(module):
                raise LmlabError(f"cannot quantize the experts of layer {layer}: {type(module).__name__} stacks them "
                                 f"in 3-D tensors ({name}) and computes them in a forward of its own, where lmlab's "
                                 f"8-bit input quantizers cannot reach")
            out[f"layers.{layer}.{name}"] = (module, param)
    return out


def _interface_experts(module: nn.Module) -> bool:
    """Experts dispatched through transformers' experts interface (`use_experts_implementation`), whose flags say
    how their tensors are laid out."""
    return all(hasattr(module, a) for a in ("has_gate", "has_bias", "is_transposed", "num_experts", "down_proj")) \
        and callable(getattr(module, "_apply_gate", None))


def _expert_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    out = x @ weight if transposed else x @ weight.transpose(0, 1)
    return out if bias is None else out + bias


def xtc_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts of a mixture, one expert at a time, with XTC's 8-bit quantizer at the input of each matrix:
    the tokens (per token, so quantizing them once before routing gives each expert's rows the same values) and each
    expert's gated hidden state before its down projection. The rest is transformers' experts computation as its
    flags describe it (a gate or none, biases, transposed tensors, a norm after each expert); the weights are the
    module's (quantized by their parametrization, read once a call)."""
    bits = getattr(self, "_lmlab_act_bits", None)
    x = quantize_activation(hidden_states, bits) if bits else hidden_states
    first = self.gate_up_proj if self.has_gate else self.up_proj
    first_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) if self.has_bias else None
    down, down_bias = self.down_proj, (self.down_proj_bias if self.has_bias else None)
    out = torch.zeros_like(hidden_states, dtype=torch.promote_types(hidden_states.dtype, torch.float32))
    for expert in top_k_index.unique().tolist():
        if not 0 <= expert < self.num_experts:  # (an expert-parallel sentinel: no expert here)
            continue
        token, slot = torch.where(top_k_index == expert)
        h = _expert_linear(x[token], first[expert], None if first_bias is None else first_bias[expert],
                           self.is_transposed)
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        if bits:
            h = quantize_activation(h, bits)
        h = _expert_linear(h, down[expert], None if down_bias is None else down_bias[expert], self.is_transposed)
        if getattr(self, "has_post_expert_norm", False):
            h = self.post_expert_norm(h)
        out = out.index_add(0, token, (h * top_k_weights[token, slot, None]).to(out.dtype))
    return out.to(hidden_states.dtype)


def quantize_model(model: nn.Module, bits: int, act_bits: int | None = 8,
                   weights: bool = True) -> list[str]:
    """Quantize XTC's weights in place (parametrizations + activation pre-hooks); returns their names.
    `weights=False` adds only the activation quantizers (for weights that already hold quantized values)."""
    check_bits(bits)
    experts = expert_targets(model)  # (a model whose experts lmlab cannot reach is refused here)
    targets = _linear_targets(model)
    if any(module.weight.device.type == "meta" for module, _ in targets.values()):
        raise LmlabError("cannot quantize weights that a device map offloads to the CPU or disk (they are loaded "
                         "only during the forward pass); give the model room on its devices (--max-memory)")
    for name, (module, param) in experts.items():
        if weights:
            parametrize.register_parametrization(module, param, ExpertWeightQuantizer(bits))
        if act_bits:
            module._lmlab_act_bits = act_bits
            module.forward = MethodType(xtc_experts_forward, module)
    for name, (module, rowwise) in targets.items():
        if weights and rowwise:
            module.register_forward_hook(RowQuantizer(bits))
            module._lmlab_row_bits = bits
        elif weights:
            parametrize.register_parametrization(module, "weight", WeightQuantizer(bits, rowwise))
        if act_bits and not isinstance(module, nn.Embedding):
            module.register_forward_pre_hook(lambda m, args: (quantize_activation(args[0], act_bits), *args[1:]))
    model._lmlab_quant = {"bits": bits, "act_bits": act_bits, "act_grid": ACT_GRID, "names": sorted({**targets, **experts})}
    return sorted({**targets, **experts})


# --- packed checkpoints -------------------------------------------------------------------------------------

def _pack_codes(codes: torch.Tensor, per_byte: int) -> torch.Tensor:
    """Small non-negative integer codes -> uint8, `per_byte` codes per byte."""
    width = 8 // per_byte
    flat = codes.flatten().to(torch.uint8)
    pad = (-len(flat)) % per_byte
    flat = torch.cat([flat, torch.zeros(pad, dtype=torch.uint8, device=flat.device)]).view(-1, per_byte)
    shifts = torch.arange(per_byte, dtype=torch.uint8, device=flat.device) * width
    return (flat << shifts).sum(-1).to(torch.uint8)


def _unpack_codes(packed: torch.Tensor, per_byte: int, numel: int) -> torch.Tensor:
    width = 8 // per_byte
    shifts = torch.arange(per_byte, dtype=torch.uint8, device=packed.device) * width
    mask = (1 << width) - 1
    return ((packed[:, None] >> shifts) & mask).flatten()[:numel]


def _latent(module: nn.Module, param: str = "weight") -> torch.Tensor:
    """The full-precision tensor a quantized module trains (its parametrization's original, or the embedding's)."""
    if parametrize.is_parametrized(module, param):
        return getattr(module.parametrizations, param).original
    return getattr(module, param)


def integer_weights(module: nn.Module, rowwise: bool, bits: int, param: str = "weight") -> tuple[torch.Tensor, torch.Tensor]:
    """(integers, scales) of a quantized module's `param`: its quantized values == integers * scale exactly, one
    scale per matrix, or per row of an embedding (`rowwise`) and per expert of a 3-D experts tensor (`rowwise`:
    one group per leading index); integers as int8 in -1..1 (1, 2 bits) or -(2^(b-1)-1)..2^(b-1)-1 (4, 8 bits)."""
    q = (quantized_weight(module) if param == "weight" else getattr(module, param)).detach()

    def grouped(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(t.shape[0], -1) if rowwise else t.reshape(1, -1)

    groups = grouped(q).float()
    loaded = getattr(module, "_lmlab_group_scales", {}).get(param)
    if bits in (1, 2):  # every non-zero entry of a group has magnitude alpha
        scale = groups.abs().amax(-1)
    elif loaded is not None:  # loaded from a packed file: its exact scales
        scale = loaded.to(q.device)
    else:  # the scale quantize_weight computed from the latent weights, in their dtype (bf16 on a GPU), as it did
        scale = uniform_scale(grouped(_latent(module, param).detach()).abs().amax(-1), bits).float()
    ints = torch.round(groups / torch.where(scale == 0, 1.0, scale)[:, None])
    # exact in the weights' dtype: a bf16 weight is its integers times the scale, rounded to bf16 once
    if not torch.equal((ints * scale[:, None]).to(q.dtype), groups.to(q.dtype)):
        raise LmlabError("a quantized weight is not its integers times one scale per group")
    return ints.to(torch.int8).view_as(q), scale


CODES = {1: (8, 1), 2: (4, 1), 4: (2, 8), 8: (1, 128)}  # bits -> (codes per byte, offset added to the integers)


def _packed_targets(model: nn.Module) -> dict[str, tuple[nn.Module, str, bool]]:
    """name -> (module, parameter, one group per leading index) for everything a packed file stores as codes: the
    linear layers (a group each), the word embeddings (a group per row) and stacked experts (a group per expert)."""
    experts = expert_targets(model)
    out = {name: (m, "weight", rowwise) for name, (m, rowwise) in _linear_targets(model).items()}
    out.update({name: (m, param, True) for name, (m, param) in experts.items()})
    return out


def save_packed(model: nn.Module, path: str | Path) -> dict:
    """Write a packed safetensors checkpoint of a quantized model; returns sizes in bytes."""
    info = getattr(model, "_lmlab_quant", None)
    if info is None or info["bits"] not in CODES:
        raise LmlabError("save_packed needs a model quantized to 1, 2, 4 or 8 bits (quantize_model)")
    bits = info["bits"]
    per_byte, offset = CODES[bits]
    tensors, meta, packed_bytes, fp32_bytes = {}, {}, 0, 0
    targets = _packed_targets(model)
    for name, (module, param, rowwise) in targets.items():
        ints, scale = integer_weights(module, rowwise, bits, param)
        codes = (ints > 0).to(torch.uint8) if bits == 1 else (ints.to(torch.int16) + offset).to(torch.uint8)
        tensors[f"{name}.codes"] = _pack_codes(codes, per_byte)
        tensors[f"{name}.scale"] = scale.float().contiguous()
        meta[name] = list(ints.shape)
        packed_bytes += tensors[f"{name}.codes"].numel() + 4 * scale.numel()
        fp32_bytes += 4 * ints.numel()
    path_of = {id(m): p for p, m in model.named_modules()}
    # stored as codes above: the embeddings (not parametrized) and the experts' tensors not parametrized (loaded ones)
    coded = {f"{path_of[id(m)]}.{param}" for m, param, rowwise in targets.values() if rowwise}
    for key, value in model.state_dict().items():  # everything XTC leaves in full precision
        if "parametrizations" not in key and key not in coded:
            tensors[f"rest.{key}"] = value.detach().contiguous().clone()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"lmlab": json.dumps({"bits": bits, "act_bits": info["act_bits"],
                                                                  "act_grid": info.get("act_grid"), "shapes": meta})})
    return {"packed_bytes": packed_bytes, "fp32_bytes": fp32_bytes, "file_bytes": path.stat().st_size}


def load_packed(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a packed checkpoint into a model of the same architecture; it comes back quantized."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["lmlab"])
    tensors = load_file(str(path))
    bits = meta["bits"]
    per_byte, offset = CODES[bits]
    rest = {k[len("rest."):]: v for k, v in tensors.items() if k.startswith("rest.")}
    model.load_state_dict({k: v for k, v in rest.items() if "parametrizations" not in k}, strict=False)
    targets = _packed_targets(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, (module, param, rowwise) in targets.items():
        if param == "weight" and rowwise and head is not None and head.weight is module.weight:
            # a tied output layer computed with the latent embeddings in training: it keeps them, untied
            head.weight = nn.Parameter(module.weight.detach().clone(), requires_grad=module.weight.requires_grad)
            untie_config(model.config)
        shape = meta["shapes"][name]
        numel = math.prod(shape)
        codes = _unpack_codes(tensors[f"{name}.codes"], per_byte, numel).float()
        values = (codes * 2 - 1) if bits == 1 else (codes - offset)
        alpha = tensors[f"{name}.scale"]
        w = (values.view(len(alpha), -1) * alpha[:, None]) if rowwise else values * alpha
        with torch.no_grad():
            getattr(module, param).copy_(w.view(shape))
        module.__dict__.setdefault("_lmlab_group_scales", {})[param] = alpha.clone()  # exact (integer_weights, export)
    quantize_model(model, bits, meta["act_bits"], weights=False)  # weights hold exact quantized values
    # a file written before the int8 grid (no act_grid): its student was trained on amax/127, -127..127
    model._lmlab_quant["act_grid"] = meta.get("act_grid") or "amax/127"
    return model


RTN_BITS = (2, 3, 4, 5, 6, 7, 8)


def rtn_weight(w: torch.Tensor, bits: int, group_size: int | None = None) -> torch.Tensor:
    """Round-to-nearest of a (out, in) matrix, each row (an output channel) on its own asymmetric grid of 2^bits
    levels spanning its minimum and maximum, zero included: GPTQ's quantizer (Frantar et al., arXiv 2210.17323) and
    its RTN baseline; with `group_size`, each run of that many input columns of a row has its own grid (the last run
    may be shorter). Computed in float32; the values come back in `w`'s dtype."""
    check_rtn_bits(bits)
    x = w.detach().float()
    step = group_size or x.shape[-1]
    out = torch.empty_like(x)
    for start in range(0, x.shape[-1], step):
        cols = x[:, start:start + step]
        out[:, start:start + step] = on_grid(cols, *asymmetric_grid(cols, bits), bits)
    return out.to(w.dtype)


def check_rtn_bits(bits: int) -> int:
    if bits not in RTN_BITS:
        raise LmlabError(f"round-to-nearest takes {RTN_BITS[0]} to {RTN_BITS[-1]} bits, not {bits}")
    return bits


def asymmetric_grid(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) of each row of `x` (float32, (rows, columns)): 2^bits levels from min(min x, 0) to max(max x, 0),
    the zero point rounded to a level (GPTQ's asymmetric quantizer); an all-zero row gets the grid of -1..1."""
    top = 2 ** bits - 1
    lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
    flat = (lo == 0) & (hi == 0)  # an all-zero row: any grid keeps it zero
    lo, hi = torch.where(flat, -1.0, lo), torch.where(flat, 1.0, hi)
    scale = (hi - lo) / top
    return scale, torch.round(-lo / scale)


def on_grid(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """`x` rounded to the nearest level of the grid (scale, zero), de-quantized."""
    return scale * (torch.clamp(torch.round(x / scale) + zero, 0, 2 ** bits - 1) - zero)


HQQ_BITS = (8, 4, 3, 2, 1)
HQQ_GROUP = 64  # weights per group along the input dimension (HQQ's and transformers' HqqConfig default)


def hqq_weight(w: torch.Tensor, bits: int, group_size: int = HQQ_GROUP) -> torch.Tensor:
    """Half-Quadratic Quantization of a (out, in) matrix (Badri & Shaji, 2023; the `hqq` package's quantizer, with the
    settings its `BaseQuantizeConfig` gives that bit width: groups of `group_size` along the input dimension, each
    with its scale and zero point, the zero points found by HQQ's half-quadratic solver), returned de-quantized: the
    values a quantized layer computes with, as plain weights. Computed in float32 on the host; `w`'s dtype back."""
    from lmlab.extras import HQQ

    if bits not in HQQ_BITS:
        raise LmlabError(f"HQQ takes {', '.join(map(str, HQQ_BITS))} bits, not {bits}")
    try:
        with warnings.catch_warnings():  # (it defines TorchScript methods as it imports, which torch deprecates)
            warnings.simplefilter("ignore", DeprecationWarning)
            from hqq.core.quantize import BaseQuantizeConfig, Quantizer
    except ImportError:
        raise LmlabError(HQQ) from None
    params = BaseQuantizeConfig(nbits=bits, group_size=group_size)["weight_quant_params"]
    x = w.detach().float().cpu()
    q, meta = Quantizer.quantize(x, **params, bitpack=False, compute_dtype=torch.float32, device="cpu")
    return Quantizer.dequantize(q, meta).reshape(x.shape).to(device=w.device, dtype=w.dtype)


BNB_BITS = (8, 4)
BNB_BLOCK = 64  # NF4's block along the flattened weight (bitsandbytes' and transformers' BitsAndBytesConfig default)


def bnb_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """bitsandbytes' weight quantizers (its own functions), returned de-quantized: 4 bits is NF4 (QLoRA's 4-bit
    NormalFloat, Dettmers et al. 2023, arXiv 2305.14314: blocks of 64 consecutive weights, each scaled by its absmax
    onto the 16 quantiles of a normal), 8 bits LLM.int8()'s weights (Dettmers et al. 2022, arXiv 2208.07339: each row
    in int8 on its absmax, the weight first cast to float16 as bitsandbytes' Int8Params does). LLM.int8()'s rounding
    of the activations at inference is not part of the weights and is not applied. `w`'s dtype back."""
    from lmlab.models.quantized import bnb_functional

    if bits not in BNB_BITS:
        raise LmlabError(f"bitsandbytes quantizes to 8 (LLM.int8) or 4 (NF4) bits, not {bits}")
    F = bnb_functional()
    x = w.detach().cpu()
    if bits == 4:
        q, state = F.quantize_4bit(x.float().contiguous(), blocksize=BNB_BLOCK, quant_type="nf4")
        values = F.dequantize_4bit(q, state)
    else:
        codes, scales, _ = F.int8_vectorwise_quant(x.to(torch.float16).contiguous())
        values = F.int8_vectorwise_dequant(codes, scales)
    return values.float().reshape(x.shape).to(device=w.device, dtype=w.dtype)


TORCHAO_BITS = (8, 4)
TORCHAO_GROUPS = (128, 64, 32)  # int4's group along the input: torchao's default 128, else the largest that divides it


def torchao_group(in_features: int) -> int | None:
    """The group along the input that `torchao_weight` rounds int4 in: 128 (torchao's default), else the largest of
    64 and 32 that divides `in_features` (SmolLM2's 576 takes 64), else None (one group a row)."""
    return next((g for g in TORCHAO_GROUPS if in_features % g == 0), None)


def torchao_api():
    """torchao's quantize_ and the configs `torchao_weight` uses; one sentence where the extra is missing (its import
    notes on a machine without a GPU are dropped where lmlab is imported: extras.quiet_import_notes)."""
    from lmlab.extras import TORCHAO

    try:
        from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
        from torchao.quantization.granularity import PerAxis, PerGroup
    except ImportError:
        raise LmlabError(TORCHAO) from None
    return quantize_, Int8WeightOnlyConfig, IntxWeightOnlyConfig, PerAxis, PerGroup


def torchao_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """torchao's weight-only quantizers (its own `quantize_` on a linear layer holding `w`), returned de-quantized:
    at 8 bits `Int8WeightOnlyConfig` (each row in int8, symmetric on its absmax), at 4 bits `IntxWeightOnlyConfig`
    at int4 (symmetric, in groups of `torchao_group` weights along the input): the int4 weight-only path torchao runs
    on a CPU (its `Int4WeightOnlyConfig` needs a GPU kernel library). Computed in float32 on the host; `w`'s dtype
    back."""
    if bits not in TORCHAO_BITS:
        raise LmlabError(f"torchao's weight-only quantizers take 8 (int8) or 4 (int4) bits here, not {bits}")
    quantize_, Int8WeightOnlyConfig, IntxWeightOnlyConfig, PerAxis, PerGroup = torchao_api()
    x = w.detach().float().cpu()
    layer = nn.Linear(x.shape[1], x.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(x)
    group = torchao_group(x.shape[1])
    config = (Int8WeightOnlyConfig(set_inductor_config=False) if bits == 8 else
              IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group) if group else PerAxis(0)))
    quantize_(layer, config)
    return layer.weight.dequantize().float().reshape(x.shape).to(device=w.device, dtype=w.dtype)


def post_training_targets(model: nn.Module, method: str) -> dict[str, nn.Module]:
    """name -> module of the linear layers of the blocks a post-training method quantizes (`layers.L.path`); experts
    stacked in 3-D tensors refused by name."""
    stacked = expert_targets(model)
    if stacked:
        raise LmlabError(f"{method} quantizes linear layers; this model's experts are stacked in 3-D tensors "
                         f"({next(iter(stacked))}), which it does not quantize yet")
    return {name: m for name, (m, rowwise) in _linear_targets(model).items() if not rowwise}


def round_to_nearest(model: nn.Module, bits: int, method: str = "rtn") -> list[str]:
    """Post-training quantization, in place: every linear layer of the blocks (the ones XTC quantizes) holds its
    weights rounded by `rtn_weight` (`method` "rtn"), HQQ's quantizer (`hqq_weight`, "hqq") or bitsandbytes'
    (`bnb_weight`, "bnb": NF4 at 4 bits, LLM.int8() at 8) or torchao's (`torchao_weight`, "torchao": int8 rows, int4
    groups), as plain values a
    saved folder keeps; the embeddings and the output layer stay as they are (as GPTQ leaves them). Experts stacked
    in 3-D tensors are refused by name. Returns the layers."""
    weight = {"rtn": rtn_weight, "hqq": hqq_weight, "bnb": bnb_weight, "torchao": torchao_weight}[method]
    targets = post_training_targets(model, method)
    with torch.no_grad():
        for module in targets.values():
            if isinstance(module, Conv1D):  # (in, out): the output channels are its columns
                module.weight.copy_(weight(module.weight.t(), bits).t())
            else:
                module.weight.copy_(weight(module.weight, bits))
    return sorted(targets)


def keep_layers(model: nn.Module, keep: list[int]) -> list[int]:
    """Layer reduction: keep only the listed blocks (in order), in place; returns them.

    XTC's optional reduction keeps every other teacher layer; the KD terms then pair student block j with
    teacher block keep[j] (see train/kd.py `layer_map`).
    """
    layout = layout_of(model)
    if not keep or any(not 0 <= k < layout.n_layers for k in keep) or sorted(set(keep)) != list(keep):
        raise LmlabError(f"layers to keep must be increasing and within 0..{layout.n_layers - 1}, got {keep}")
    for path in layout.spec.layers:
        parent_path, _, attr = path.rpartition(".")
        try:
            parent = get_submodule(model, parent_path) if parent_path else model
            blocks = getattr(parent, attr)
        except AttributeError:
            continue
        setattr(parent, attr, nn.ModuleList([blocks[k] for k in keep]))
        break
    config = getattr(model.config, "text_config", None) or model.config
    config.num_hidden_layers = len(keep)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[k] for k in keep]
    return list(keep)
