"""A quantized student as a Hugging Face folder in the compressed-tensors format (`pip install 'lmlab[export]'`).

What is written (config.json's `quantization_config`, quant_method "compressed-tensors"):
- every XTC linear layer (interventions/quant.py): `pack-quantized`, its integers in 2 bits for 1- and 2-bit
  students (ternary -1/0/+1 and binary -1/+1 both fit the signed 2-bit range -2..1; there is no 1-bit container
  for +-1), in 4 or 8 bits for 4- and 8-bit ones, packed into int32s by compressed-tensors' own packer, and the one
  scale per matrix the student was trained with (strategy "tensor"); the 8-bit dynamic per-token input activations (`input_activations`, strategy "token") that
  `quantize_activation` computes with the same operations;
- the word embeddings, quantized per row in training: `naive-quantized`, the same integers one per int8 with
  one scale per row (strategy "channel"). DECISION: the format could pack them too, but transformers 5.x cannot
  load a packed nn.Embedding (its weight initialisation reads `.weight`, which a packed module no longer has), so
  they take a byte each: the file is larger than lmlab's packed one by 1 - bits/8 byte per embedding entry, and
  the export says so;
- everything XTC leaves in full precision (biases, norms, position embeddings, a classifier, an output layer
  that a decoder's latent embeddings fed in training, untied) as float32.
The integers are the student's exact values over its scale (checked: integer x scale == the student's weight),
so nothing is re-quantized; a layout the format lacks (GPT-2's Conv1D, a student from before the int8 activation
grid) is refused in one sentence.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from lmlab.errors import LmlabError
from lmlab.extras import EXPORT, EXPORT_FORMATS
from lmlab.interventions.quant import ACT_GRID, expert_targets, integer_weights, quant_targets, untie_config

FORMAT = EXPORT_FORMATS[0]


def _int_args(bits: int, strategy: str) -> dict:
    return {"num_bits": bits, "type": "int", "symmetric": True, "strategy": strategy, "dynamic": False}


def export_compressed(model: nn.Module, folder: str | Path, tokenizer=None) -> dict:
    """Write a 1-, 2-, 4- or 8-bit XTC student (`quantize_model` or `load_packed`) to `folder`; returns its sizes in
    bytes.

    The model itself is not changed. The folder loads with `AutoModel*.from_pretrained(folder)` when the
    compressed-tensors package is installed, without lmlab."""
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError:
        raise LmlabError(EXPORT) from None
    info = _exportable(model)
    tensors, linears, embeddings, counts = _quantized_tensors(model, info["bits"])
    config = _with_full_precision_rest(model, tensors)
    qconfig = _quantization_config(linears, embeddings, info)
    QuantizationConfig.model_validate({k: v for k, v in qconfig.items() if k != "quant_method"})  # the schema
    config.quantization_config = qconfig
    sizes = {"fp32_bytes": 4 * sum(p.numel() for p in model.parameters()),
             "quantized_linear_weights": counts[False], "embedding_entries": counts[True]}
    return _write_folder(Path(folder), tensors, config, tokenizer, info["bits"], sizes)


def export_refusal(model: nn.Module) -> str | None:
    """Why a model's XTC students cannot be written in the compressed-tensors format (None where they can)."""
    stacked = expert_targets(model)
    if stacked:
        return (f"the compressed-tensors export writes linear layers and embeddings, and this model's experts are "
                f"stacked in 3-D tensors ({next(iter(stacked))}); its students' packed files keep them")
    return None


def _exportable(model: nn.Module) -> dict:
    """The student's quantization record, refused in one sentence where the format cannot hold it."""
    refusal = export_refusal(model)
    if refusal:
        raise LmlabError(refusal + ": nothing was written")
    info = getattr(model, "_lmlab_quant", None)
    if info is None or info["bits"] not in (1, 2, 4, 8):
        raise LmlabError("the compressed-tensors export takes a 1-, 2-, 4- or 8-bit XTC student (quantize_model or "
                         "load_packed)")
    if info.get("act_bits") and info.get("act_grid") != ACT_GRID:
        raise LmlabError("this student's 8-bit activations were trained on lmlab's earlier grid (amax/127, -127..127), "
                         "which compressed-tensors cannot express (its int8 scale is amax/127.5); train it again "
                         "with this lmlab to export it")
    return info


def _quantized_tensors(model: nn.Module, student_bits: int) -> tuple[dict, list, list, list]:
    """Each quantized weight as compressed-tensors stores it: a linear layer's integers packed into int32 with one
    scale (pack-quantized), the word embeddings' integers one byte each with a scale per row (naive-quantized).
    (tensors, linear paths, embedding paths, [linear weights, embedding entries])."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    bits = max(2, student_bits)  # +-1 needs the signed 2-bit range
    names = {id(m): n for n, m in model.named_modules()}
    linears, embeddings, tensors, counts = [], [], {}, [0, 0]
    for module, rowwise in quant_targets(model).values():
        path = names[id(module)]
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            raise LmlabError(f"{path} is a {type(module).__name__}, which compressed-tensors does not quantize (it "
                             "takes nn.Linear and nn.Embedding); nothing was written")
        ints, scale = integer_weights(module, rowwise, student_bits)
        ints, scale = ints.cpu(), (scale.reshape(-1, 1) if rowwise else scale.reshape(1)).cpu()
        if rowwise:
            tensors[f"{path}.weight"] = ints.contiguous()
            embeddings.append(path)
        else:
            tensors[f"{path}.weight_packed"] = pack_to_int32(ints, bits).contiguous()
            tensors[f"{path}.weight_shape"] = torch.tensor(list(ints.shape), device="cpu")
            linears.append(path)
        tensors[f"{path}.weight_scale"] = scale.float().contiguous()
        counts[rowwise] += ints.numel()
    return tensors, linears, embeddings, counts


def _with_full_precision_rest(model: nn.Module, tensors: dict):
    """Everything XTC leaves in full precision added to `tensors` in float32; the model's config, untied: an output
    layer computes with the latent embedding table (XTC's row quantizer acts on looked-up rows only), so it is
    written as its own tensor whether load_packed untied it already or it still shares the table."""
    written = {key.removesuffix("_packed") for key in tensors if key.endswith((".weight", ".weight_packed"))}
    for key, value in model.state_dict().items():
        plain = key.replace(".parametrizations.weight.original", ".weight")
        if plain not in written and ".parametrizations." not in key:
            tensors[plain] = value.detach().float().cpu().contiguous()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = copy.deepcopy(model.config)
    if head is not None:
        path = next(n for n, m in model.named_modules() if m is head)
        tensors[f"{path}.weight"] = head.weight.detach().float().cpu().contiguous()
        untie_config(config)
    return config


def _quantization_config(linears: list, embeddings: list, info: dict) -> dict:
    """The config's quantization_config: the linear layers' group (with 8-bit dynamic per-token input activations)
    and the embeddings' group."""
    bits = max(2, info["bits"])
    groups = {"group_0": {"targets": linears, "weights": _int_args(bits, "tensor"), "format": "pack-quantized"}}
    if info.get("act_bits"):
        groups["group_0"]["input_activations"] = {"num_bits": info["act_bits"], "type": "int", "symmetric": True,
                                                  "strategy": "token", "dynamic": True}
    if embeddings:
        groups["group_1"] = {"targets": embeddings, "weights": _int_args(bits, "channel"), "format": "naive-quantized"}
    return {"quant_method": FORMAT, "format": "mixed-precision" if embeddings else "pack-quantized",
            "quantization_status": "compressed", "config_groups": groups, "ignore": []}


def _write_folder(final: Path, tensors: dict, config, tokenizer, bits: int, sizes: dict) -> dict:
    """The folder written to a temporary sibling and renamed into place (a killed export never leaves a folder that
    looks whole): model.safetensors, config.json, the tokenizer, lmlab_export.json with the sizes."""
    from safetensors.torch import save_file

    final.parent.mkdir(parents=True, exist_ok=True)
    folder = final.with_name(f".{final.name}.partial")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    sizes = {"file_bytes": (folder / "model.safetensors").stat().st_size, **sizes}
    (folder / "lmlab_export.json").write_text(json.dumps({"format": FORMAT, "bits": bits, **sizes}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(folder, final)
    return sizes
