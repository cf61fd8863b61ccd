"""Checkpoints made by quantization libraries, read as plain de-quantized weights (lmlab.models.quantized), and
bitsandbytes' quantizers behind `compare --make bnb` (interventions.quant.bnb_weight).

The GPTQ checkpoint in tests/data/quantized was made by llm-compressor 0.14.0.1 (with transformers 5.17 and
compressed-tensors 0.19, in an environment of its own: tests/data/quantized/make_with_llm_compressor.py) from
`tiny-llama` (seed 0); beside it, the logits llm-compressor's quantized model gave on a fixed sequence there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from lmlab.errors import LmlabError
from lmlab.models import load_model

GPTQ = Path(__file__).parent / "data" / "quantized" / "gptq-w4g32-tiny-llama"


def _block_linears(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if ".layers." in n and n.rsplit(".", 1)[-1].endswith("proj")}


def test_a_gptq_checkpoint_made_by_llm_compressor_is_read_de_quantized():
    """Every linear layer of the blocks comes back an ordinary nn.Linear holding GPTQ's values (each group of 32
    weights along the input on at most 16 levels), and the model computes what llm-compressor's own quantized model
    computed, written by another version of compressed-tensors and transformers."""
    pytest.importorskip("compressed_tensors", reason="the export extra (compressed-tensors) is not installed")
    from safetensors.torch import load_file

    lm = load_model(str(GPTQ))
    assert lm.meta["quantized"].startswith("compressed-tensors pack-quantized: 4-bit int weights (group, groups of "
                                           "32, symmetric)")
    linears = _block_linears(lm.model)
    assert len(linears) == 3 * 7 and all(type(m) is nn.Linear for m in linears.values())
    for module in linears.values():
        groups = module.weight.detach().reshape(-1, 32)
        assert max(torch.unique(g).numel() for g in groups) <= 16
    ref = load_file(GPTQ / "reference-logits.safetensors")
    with torch.no_grad():
        got = lm.model(ref["tokens"].to(lm.device)).logits.float().cpu()
        plain = load_model("tiny-llama").model(ref["tokens"]).logits  # the original it was made from
    assert torch.allclose(got, ref["logits"], atol=1e-5, rtol=1e-5)
    assert (plain - ref["logits"]).abs().max() > 100 * (got - ref["logits"]).abs().max().clamp_min(1e-6)


def test_a_checkpoint_lmlab_cannot_read_is_refused_before_its_weights(tmp_path):
    from lmlab.models.quantized import of_folder

    folder = tmp_path / "awq-elsewhere"
    folder.mkdir()
    config = json.loads((GPTQ / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(LmlabError, match=r"^this checkpoint is quantized by 'awq', which lmlab does not read yet"):
        of_folder(str(folder))
    assert of_folder(str(tmp_path)) is None  # (no config: nothing said)


def test_a_gptq_checkpoint_is_compared_with_its_original_as_a_variant(tmp_path):
    """`compare --variant DIR` on the llm-compressor checkpoint: measured like any variant, its variant row saying
    what quantized it; a folder named at a width (`gptq-4bit`) has its perplexity read beside the original's, as
    the variants made in the run do."""
    pytest.importorskip("compressed_tensors", reason="the export extra (compressed-tensors) is not installed")
    import shutil

    import lmlab

    folder = tmp_path / "gptq-4bit"
    shutil.copytree(GPTQ, folder)

    names = [("Mary", "John"), ("Anna", "Tom"), ("John", "Mary"), ("Tom", "Anna"), ("Mary", "Tom"), ("Anna", "John")]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({
        "clean": f"When {a} and {b} went to the store, {b} gave a drink to",
        "corrupted": f"When {a} and {b} went to the store, {a} gave a drink to",
        "answer": f" {a}", "distractor": f" {b}"}) for a, b in names) + "\n")
    result = lmlab.run("compare", "tiny-llama", profile="demo", out=tmp_path / "runs", variant=[str(folder)],
                       tasks=[f"file:{pairs}"], n_prompts=6, verify_heads=3)
    variant = result.table("variant").set_index("cell").loc[folder.name]  # named by its folder, no path
    assert variant["variant_kind"] == "model" and "4-bit int weights" in variant["quantized"]
    models = result.table("model")
    assert set(models["cell"]) == {"original", folder.name} and (models["n_prompts"] == 6).all()
    clean = models.set_index("cell")["clean_metric"]
    assert clean["original"] != clean[folder.name]  # (the variant's own weights were measured)
    made = result.table("made").set_index("cell").loc[folder.name]
    assert (made["method"], made["bits"], made["origin"], made["n_text"]) == ("gptq", 4, "folder", 64)
    assert 1 < made["original_perplexity"] != made["perplexity"] > 1


def _bnb_model(folder: Path, bits: int):
    """tiny-llama quantized at load by transformers' bitsandbytes integration (the users' route), in memory."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from lmlab.models.quantized import bnb_functional

    bnb_functional()
    config = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
              if bits == 4 else BitsAndBytesConfig(load_in_8bit=True))
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, quantization_config=config,
                                                device_map="cpu")


@pytest.mark.parametrize("bits", [4, 8])
def test_bitsandbytes_weights_and_checkpoints(bits, tmp_path):
    """`bnb_weight` (what --make bnb:B stores) equals the values bitsandbytes' own layers hold when transformers
    quantizes the same original (NF4 at 4 bits, LLM.int8() at 8), and their forward on the identity reads them back;
    a folder transformers saves from such a model is read back as plain float32 layers holding exactly those values.
    (Saved before any forward: bitsandbytes' CPU kernel repacks a 4-bit weight in place at its first forward, and a
    folder saved after that holds other values, 0.04 off on tiny-llama's.)"""
    pytest.importorskip("bitsandbytes", reason="the bnb extra is not installed")
    from lmlab.interventions.quant import bnb_weight
    from lmlab.models.quantized import bnb_functional

    F = bnb_functional()
    original = load_model("tiny-llama")
    original.model.save_pretrained(tmp_path / "orig")
    original.tokenizer.save_pretrained(tmp_path / "orig")
    quantized = _bnb_model(tmp_path / "orig", bits)
    theirs, ours = _block_linears(quantized), _block_linears(original.model)
    assert set(theirs) == set(ours)
    made = {name: bnb_weight(m.weight.detach(), bits) for name, m in ours.items()}
    for name, module in theirs.items():
        held = (F.dequantize_4bit(module.weight.data, module.weight.quant_state) if bits == 4 else
                F.int8_vectorwise_dequant(module.weight.data, module.weight.SCB))
        assert torch.equal(held.float(), made[name]), name
        w = ours[name].weight.detach()
        # within half the widest gap of the grid: NF4's between its two lowest levels, -1 and -0.6962; int8's 1/127
        # (and the float16 the weight is cast to first)
        assert (made[name] - w).abs().max() <= w.abs().max() * ((1 - 0.69619) / 2 if bits == 4 else 1 / 254 + 2 ** -11)
    quantized.save_pretrained(tmp_path / "bnb")
    original.tokenizer.save_pretrained(tmp_path / "bnb")
    for name, module in theirs.items():
        with torch.no_grad():
            seen = module(torch.eye(module.in_features)).t()  # row i of W as the layer computes x @ W^T
        # its CPU kernel may round the block scales and compute in bf16 (where the CPU has avx512_bf16): two bf16
        # steps of the largest weight
        assert torch.allclose(seen, made[name], atol=2 ** -7 * ours[name].weight.abs().max().item(), rtol=0), name
    read = load_model(str(tmp_path / "bnb"))
    assert read.meta["quantized"].startswith("bitsandbytes " + ("NF4" if bits == 4 else "LLM.int8()"))
    assert read.model.config.to_dict().get("quantization_config") is None
    back = _block_linears(read.model)
    assert set(back) == set(made) and all(type(m) is nn.Linear for m in back.values())
    assert all(torch.equal(back[name].weight, made[name]) for name in back)
    with pytest.raises(LmlabError, match="bitsandbytes quantizes to 8 .LLM.int8. or 4 .NF4. bits, not 3"):
        bnb_weight(made[name], 3)
