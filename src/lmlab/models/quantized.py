"""Checkpoints a quantization library made, read as plain weights.

A folder whose config carries a `quantization_config` was made by a quantizer: compressed-tensors (llm-compressor's
GPTQ, AWQ, SmoothQuant... schemes: integer weights packed with their scales and zero points) or bitsandbytes (NF4 /
FP4 in blocks, LLM.int8()'s int8 rows). lmlab studies such a model as the values its layers compute with: every
quantized linear layer comes back as an ordinary `nn.Linear` holding its de-quantized weights, in float32 (the
library's own de-quantization, done once at load), so that every intervention, capture and gradient reaches it as it
reaches any model. What is lost is what a de-quantized weight cannot hold: LLM.int8()'s rounding of the activations
(outside their outlier features) and an activation scheme of compressed-tensors (weight-only schemes, GPTQ's W4A16
and AWQ's, lose nothing). A method lmlab does not read yet is refused in one sentence, before any weights load.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from lmlab.errors import LmlabError
from lmlab.extras import BITSANDBYTES, COMPRESSED

READ = ("compressed-tensors", "bitsandbytes")  # the quant_method values lmlab reads


def method_of(config) -> str | None:
    """The `quant_method` of a config's quantization_config (a dict in a saved config, an object once parsed)."""
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return str(getattr(method, "value", method))


def load_options(config) -> dict:
    """What `from_pretrained` needs for a quantized folder (nothing for a plain one); one sentence where lmlab cannot
    read it (another method, or its library missing)."""
    method = method_of(config)
    if method is None:
        return {}
    if method not in READ:
        raise LmlabError(f"this checkpoint is quantized by '{method}', which lmlab does not read yet; it reads "
                         "compressed-tensors checkpoints (llm-compressor's GPTQ, AWQ, ...) and bitsandbytes ones "
                         "(NF4, FP4, LLM.int8)")
    if method == "compressed-tensors":
        if importlib.util.find_spec("compressed_tensors") is None:
            raise LmlabError(COMPRESSED)
        from transformers.utils.quantization_config import CompressedTensorsConfig

        # the library's own de-quantization, as the weights are read: plain Linear layers come out
        qc = config.quantization_config
        qc = dict(qc) if isinstance(qc, dict) else qc.to_dict()
        return {"quantization_config": CompressedTensorsConfig(**{**qc, "dequantize": True,
                                                                  "run_compressed": None})}
    bnb_functional()  # (imported quietly before transformers imports it)
    return {"device_map": "cpu"}  # (bitsandbytes' loader places the packed weights itself; moved once plain)


def bnb_functional():
    """bitsandbytes' functional module (one sentence if missing), imported without its note that an optional
    kernels package is absent (its CPU backend works without it)."""
    import logging

    quiet = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import bitsandbytes.functional as F
    except ImportError:
        raise LmlabError(BITSANDBYTES) from None
    finally:
        quiet.setLevel(level)
    return F


def _bnb_weight(module: nn.Module) -> torch.Tensor:
    """A bitsandbytes layer's weight as the values it computes with, in float32: NF4/FP4 blocks through the
    library's `dequantize_4bit` (its quant state asked for float32), LLM.int8()'s rows as int8 times the row's
    absmax / 127 (`int8_vectorwise_dequant`)."""
    import copy

    F = bnb_functional()
    weight = module.weight
    if type(weight).__name__ == "Params4bit":
        state = copy.copy(weight.quant_state)
        state.dtype = torch.float32
        return F.dequantize_4bit(weight.data, state).float()
    scb = getattr(weight, "SCB", None)
    scb = scb if scb is not None else module.state.SCB
    return F.int8_vectorwise_dequant(weight.data, scb).float()


def to_plain(model: nn.Module, config) -> str | None:
    """In place: a quantized model transformers loaded from a folder of `config` (as read before loading: the
    compressed-tensors route drops its quantization_config) becomes a plain one (see the module doc); returns what it
    was ("compressed-tensors pack-quantized: 4-bit int weights ..."), None for a plain model."""
    method = method_of(config)
    if method is None:
        return None
    what = describe(config)
    if method == "bitsandbytes":
        layers = [(name, m) for name, m in model.named_modules()
                  if type(m).__name__ in ("Linear4bit", "Linear8bitLt")]
        for name, module in layers:
            plain = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                              device="cpu", dtype=torch.float32)
            with torch.no_grad():
                plain.weight.copy_(_bnb_weight(module))
                if module.bias is not None:
                    plain.bias.copy_(module.bias.float())
            model.set_submodule(name, plain)
        if hasattr(model, "hf_device_map"):
            del model.hf_device_map
    # the model is plain now: nothing of the quantizer stays to stop a move, a cast or a save as plain weights
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            delattr(model, attr)
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return what


def describe(config) -> str:
    """One line for the run's record: the method and the weights' format as its config says it."""
    method = method_of(config)
    qc = config.quantization_config
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    if method == "bitsandbytes":
        if qc.get("load_in_4bit"):
            return (f"bitsandbytes {qc.get('bnb_4bit_quant_type', 'fp4').upper()} (4-bit blocks), read de-quantized")
        return "bitsandbytes LLM.int8() (int8 rows), read de-quantized (its activation rounding not kept)"
    parts = []
    for group in (qc.get("config_groups") or {}).values():
        w = (group or {}).get("weights") or {}
        if w:
            size = f", groups of {w['group_size']}" if w.get("group_size") else ""
            parts.append(f"{w.get('num_bits')}-bit {w.get('type', 'int')} weights ({w.get('strategy')}{size}, "
                         f"{'symmetric' if w.get('symmetric') else 'asymmetric'})")
        if (group or {}).get("input_activations"):
            parts.append("activations quantized (not kept de-quantized)")
    return f"compressed-tensors {qc.get('format', '')}: {'; '.join(parts) or 'no weight scheme'}, read de-quantized"


def of_folder(spec: str) -> str | None:
    """What quantized a local model folder (its config.json read, no weights: `describe`'s line), None for a plain
    one or anything else; one sentence now, before any work, where lmlab could not read it (`load_options`)."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    file = Path(spec).expanduser() / "config.json"
    if not file.is_file():
        return None
    try:
        qc = json.loads(file.read_text()).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(qc, dict):
        return None
    config = SimpleNamespace(quantization_config=qc)
    load_options(config)
    return describe(config)
