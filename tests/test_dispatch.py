"""A model spread over devices with accelerate's big-model dispatch, part of it offloaded to disk: every
intervention gives the numbers it gives on the undispatched model (<= 1e-5), the inference studies run
through with the same tables, and what cannot work dispatched refuses in one sentence.

On a machine without GPUs the "devices" are the CPU and the disk; on one with a GPU (the `device` fixture) the GPU
and the disk: the offloaded layers hold no weights (meta tensors) outside their forward pass, which is what breaks
code that reads weights or their device directly. Tolerances follow the dtype (bf16 on a GPU)."""

import json

import numpy as np

import pandas as pd
import pytest
import torch

from lmlab import LmlabError
from lmlab.interventions import (AblateHeads, Capture, EditMLPAct, Knockout, PatchHeadRows, PatchOutput, PatchResid,
                                 RetireRows, SparseAttention, StartAt, intervene)
from lmlab.interventions.arm import ActivationRedistribution
from lmlab.interventions.quant import quantize_model
from lmlab.models import load_model, weights_fingerprint
from lmlab.studies import run_study

from conftest import PROMPTS

ATOL = 1e-5


def half_on_disk(name: str, device=None) -> dict:
    """accelerate's own map for `name` with room on the CPU for about half the weights: the embeddings and the
    first blocks on the CPU, the rest on disk. With a GPU `device` (the fixture's), those blocks on GPU 0."""
    from accelerate import infer_auto_device_map

    model = load_model(name, device="cpu").model
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    device_map = infer_auto_device_map(model, max_memory={"cpu": int(size * 0.55)},
                                       no_split_module_classes=model._no_split_modules)
    assert {"cpu", "disk"} <= set(device_map.values()), device_map
    on_gpu = device is not None and device.type == "cuda"
    gpu = device.torch_device.index or 0 if on_gpu else None
    return {k: (gpu if on_gpu and v == "cpu" else v) for k, v in device_map.items()}


def atol(device) -> float:
    return ATOL if device.dtype == torch.float32 else device.tol()["atol"]


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2"])
def pair(request, tmp_path_factory, device):
    """(the model as usual on the test's device, the same model half offloaded to disk), in the device's dtype."""
    if device.type not in ("cpu", "cuda"):
        pytest.skip(f"accelerate's big-model dispatch places modules on cpu, cuda and disk, not on {device.type}")
    name = request.param
    folder = tmp_path_factory.mktemp(f"offload-{name}")
    return device.load(name), load_model(name, device_map=half_on_disk(name, device), offload=folder,
                                         dtype=device.dtype)


def _run(lm, make, enc):
    with torch.no_grad(), intervene(lm, *make(lm, enc)) as ivs:
        out = lm.model(**enc).logits
    caps = [iv for iv in (ivs if isinstance(ivs, tuple) else (ivs,)) if isinstance(iv, Capture)]
    return out, caps


def _corrupted(lm, point):
    """`point` captured on the batch with its rows in reverse order (another prompt's values at every row)."""
    enc = {k: v.flip(0) for k, v in lm.encode(PROMPTS).items()}
    with torch.no_grad(), intervene(lm, Capture(point)) as cap:
        lm.model(**enc)
    return cap


def _own(lm, enc, point):
    with torch.no_grad(), intervene(lm, Capture(point)) as cap:
        lm.model(**enc)
    return cap


def _keys(enc):
    keys = torch.zeros_like(enc["attention_mask"], dtype=torch.bool)
    keys[:, -4:-2] = True
    return keys


CASES = {
    "none": lambda lm, enc: [],
    "knockout": lambda lm, enc: [Knockout(_keys(enc))],
    "knockout, some layers and heads": lambda lm, enc: [Knockout(_keys(enc), layers=[1, 2], heads=[0])],
    "head ablation": lambda lm, enc: [AblateHeads([(0, 1), (2, 0)])],
    "head patching": lambda lm, enc: [AblateHeads([(1, 0)], mode="patch",
                                                   reference={1: _corrupted(lm, "z")["z", 1]})],
    "head patching by rows": lambda lm, enc: [PatchHeadRows(1, [2], _corrupted(lm, "z")["z", 1])],
    "start at a layer": lambda lm, enc: [StartAt(2, _own(lm, enc, "resid_pre")["resid_pre", 2])],
    "residual patching": lambda lm, enc: [PatchResid(1, _corrupted(lm, "resid_pre")["resid_pre", 1])],
    "MLP output patching": lambda lm, enc: [PatchOutput("mlp_out", {2: _corrupted(lm, "mlp_out")["mlp_out", 2]})],
    "MLP activation edit": lambda lm, enc: [EditMLPAct(lambda act, layer: act * 0.5, layers=[0, 2])],
    "sparse gate": lambda lm, enc: [SparseAttention(sample=False)],
    "ARM": lambda lm, enc: [ActivationRedistribution(layers=[0, 1])],
    "retired rows": lambda lm, enc: [RetireRows([len(PROMPTS)] * (lm.layout.n_layers - 1) + [1])],
    "capture": lambda lm, enc: [Capture("resid_pre", "resid_post", "attn_out", "mlp_out", "mlp_act", "z", "scores",
                                        "pattern")],
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_intervention_gives_the_undispatched_numbers(pair, case, device):
    plain, spread = pair
    assert spread.device == plain.device and any(p.device.type == "meta" for p in spread.model.parameters())
    a, caps_a = _run(plain, CASES[case], plain.encode(PROMPTS))
    b, caps_b = _run(spread, CASES[case], spread.encode(PROMPTS))
    torch.testing.assert_close(b, a, atol=atol(device), rtol=0)
    for ca, cb in zip(caps_a, caps_b):
        for point in ca.points:
            assert ca.store[point].keys() == cb.store[point].keys()
            torch.testing.assert_close(cb.stacked(point), ca.stacked(point), atol=atol(device), rtol=0)


def test_the_dispatched_model_keeps_its_weights_and_names_its_map(pair):
    plain, spread = pair
    assert weights_fingerprint(spread) == weights_fingerprint(plain)  # the disk's weights are read back
    assert "disk" in spread.meta["device_map"].values()
    with pytest.raises(LmlabError, match="cannot quantize weights that a device map offloads"):
        quantize_model(spread.model, 2)


def test_bad_placements_are_one_sentence(tmp_path):
    with pytest.raises(LmlabError, match="give a folder for them with --offload"):
        load_model("tiny-llama", device_map=half_on_disk("tiny-llama"))
    with pytest.raises(LmlabError, match="whole model on disk"):
        load_model("tiny-llama", device_map="sequential", max_memory="cpu=1KB", offload=tmp_path)
    with pytest.raises(LmlabError, match="not DEVICE=AMOUNT"):
        load_model("tiny-llama", device_map="auto", max_memory="lots")
    (tmp_path / "map.json").write_text("[1, 2]")
    with pytest.raises(LmlabError, match="must hold an object"):
        load_model("tiny-llama", device_map=str(tmp_path / "map.json"))
    with pytest.raises(LmlabError, match="--device-map"):
        load_model("tiny-llama", device_map={"model.embed_tokens": "cpu"})  # leaves the blocks without a device


def test_a_model_placed_on_the_host_alone_loads_in_float32_where_a_gpu_would_take_bf16(tmp_path):
    """A map or a memory budget that names only the CPU and disk computes on the CPU: float32 by default even when
    the run's device is a GPU (a GPU machine ran such a map in bf16 on its CPU); one that names a GPU keeps bf16."""
    from lmlab.models.placement import Placement

    host = half_on_disk("tiny-llama")
    assert Placement.parse(host, offload=tmp_path).host_only()
    assert Placement.parse("auto", max_memory="cpu=1GiB", offload=tmp_path).host_only()
    assert not Placement.parse({**host, "model.layers.0": 0}, offload=tmp_path).host_only()
    assert not Placement.parse("auto").host_only() and not Placement.parse("auto", max_memory="0=1GiB").host_only()
    lm = load_model("tiny-llama", device="cuda", device_map=host, offload=tmp_path)  # (no GPU needed: all on the host)
    assert {p.dtype for p in lm.model.parameters()} == {torch.float32}
    assert lm.model(torch.tensor([[1, 2, 3]])).logits.dtype == torch.float32


def _s1_config(**kw):
    from lmlab.studies import knockout as s1

    return s1.SPEC, s1.Config(model="tiny-llama", datasets=["geo-continent"], per_dataset=24, sweep_every=1,
                              min_per_class=3, **kw)


def _s3_config(**kw):
    from lmlab.studies import filler as s3

    return s3.SPEC, s3.Config(model="tiny-llama", n_test_per_level=2, n_dev_per_level=1, sweep_problems=2,
                              profile_problems=2, max_new_tokens=5, sweep_lengths=[5], **kw)


@pytest.mark.parametrize("make", [_s1_config, _s3_config], ids=["knockout", "filler"])
def test_inference_studies_run_dispatched_to_the_same_tables(tmp_path, monkeypatch, make, device):
    import lmlab.studies.knockout.recipe as s1_recipe

    if device.type not in ("cpu", "cuda"):
        pytest.skip(f"accelerate's big-model dispatch places modules on cpu, cuda and disk, not on {device.type}")
    monkeypatch.setattr(s1_recipe, "alias_match", lambda text, aliases, exact=False: aliases[0][0] < "M")  # both classes
    (tmp_path / "map.json").write_text(json.dumps(half_on_disk("tiny-llama", device)))
    where = dict(device=device.type, dtype=str(device.dtype).removeprefix("torch."))
    spec, config = make(**where)
    plain = run_study(spec, config, tmp_path / "plain")
    spec, config = make(device_map=str(tmp_path / "map.json"), offload=str(tmp_path / "offload"), **where)
    spread = run_study(spec, config, tmp_path / "spread")
    assert spread.info["device_map"]["tiny-llama"] == json.loads((tmp_path / "map.json").read_text())  # recorded
    assert plain.tables.keys() == spread.tables.keys()
    for name in plain.tables:
        pd.testing.assert_frame_equal(spread.tables[name], plain.tables[name], atol=atol(device), rtol=0)
    assert spread.verdict.status == plain.verdict.status


@pytest.mark.parametrize("study", ["quantize", "sparse_circuits", "latent"])
def test_training_studies_refuse_a_device_map_in_one_sentence(study):
    import importlib

    config = importlib.import_module(f"lmlab.studies.{study}").Config
    with pytest.raises(LmlabError, match=r"^--device-map: the .* study .* one device per process \(docs/scaling.md\)"):
        config(model="tiny-llama", device_map="auto").check_inputs(models=False)


@pytest.mark.embedded
def test_sparse_circuits_measures_an_earlier_sparse_model_dispatched(tmp_path, tiny_smol_folder):
    """S4 with --sparse-model (an earlier run's post-trained model) only runs the model, so it takes a device map:
    the dense and sparse discovery, the held-out text and its sparsity on a tiny Llama (SmolLM2's tokenizer) with a
    block offloaded to disk give the tables of the run that post-trained it, within 1e-5."""
    from lmlab.studies import sparse_circuits as s4

    folder = tiny_smol_folder
    sizes = dict(model=str(folder), tasks=["ioi", "greater-than"], n_prompts=2, sparse_steps=2, sparse_batch=2,
                 n_text=6, n_docstrings=2, text_tokens=6, n_eval_text=2, eval_tokens=8, toy_steps=3,
                 toy_sparse_steps=2, toy_width=32, verify_heads=4, batch_size=4, fine_grid=False, circuits=True,
                 seeds=1, rank_draws=5, toy_rank_draws=5,  # --sparse-model measures one post-trained model: one replicate
                 device="cpu")  # the map below places every module on the host: the undispatched run computes there too
    plain = run_study(s4.SPEC, s4.Config(**sizes), tmp_path / "plain")
    earlier = plain.path / "post_training" / "rep0" / "sparse_model"
    # (the tied embeddings are most of the weights: the map names a block on disk itself)
    (tmp_path / "map.json").write_text(json.dumps({"model.embed_tokens": "cpu", "model.layers.0": "cpu",
                                                   "model.layers.1": "disk", "model.norm": "cpu",
                                                   "model.rotary_emb": "cpu", "lm_head": "cpu"}))
    spread = run_study(s4.SPEC, s4.Config(**sizes, sparse_model=str(earlier),
                                          device_map=str(tmp_path / "map.json"), offload=str(tmp_path / "off")),
                       tmp_path / "spread")
    placed = spread.info["device_map"]  # it ran spread over the devices, the dense model and the sparse one
    assert {placed[str(folder)]["model.layers.1"], placed[str(earlier)]["model.layers.1"]} == {"disk"}
    assert plain.tables.keys() == spread.tables.keys()
    for name in plain.tables:
        pd.testing.assert_frame_equal(spread.tables[name], plain.tables[name], atol=ATOL, rtol=0)
    assert spread.verdict.status == plain.verdict.status
    assert not (spread.path / "post_training").exists()
    with pytest.raises(LmlabError, match="post-trained from .*tiny-smol, not tiny-llama"):
        s4.Config(**{**sizes, "model": "tiny-llama"}, sparse_model=str(earlier)).check_inputs(
            models=False)
    with pytest.raises(LmlabError, match="is not a sparse-attention model folder"):
        s4.Config(**sizes, sparse_model=str(folder)).check_inputs(models=False)


def test_fast_activation_patching_runs_dispatched_to_the_same_scores(pair, device):
    """Every head patched from its layer's cached residual, and an effect curve's points batched, on a model half
    on disk: the undispatched numbers."""
    from lmlab.data.generated.circuits import CircuitPrompt, CircuitTask
    from lmlab import circuits

    plain, spread = pair
    ids = [plain.tokenizer(p)["input_ids"] for p in PROMPTS]
    prompts = [CircuitPrompt(tuple(i), tuple(reversed(i)), "", "", answer=11, distractor=12) for i in ids]
    task = CircuitTask("t", "logit_diff", prompts)
    a = circuits.activation_scores(plain, task, 4, max_rows=8)
    b = circuits.activation_scores(spread, task, 4, max_rows=8)
    assert np.abs(a).max() > 1e-3
    np.testing.assert_allclose(b, a, atol=atol(device), rtol=0)
    order = circuits.ranking(a)  # and the explained-effect curve, its grid points as blocks of one batch
    curves = [circuits.effect_curve(lm, task, order, grid=[0, 2, 5], batch_size=4, max_rows=8) for lm in pair]
    np.testing.assert_allclose(curves[1].values, curves[0].values, atol=atol(device), rtol=0)
