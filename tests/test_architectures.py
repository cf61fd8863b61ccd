"""Every architecture's row of `lmlab models --architectures` checked again here (lmlab.conformance), the checks'
own negative controls, and docs/models.md equal to the table. `pytest -m architectures -k phi3` runs one type."""

import dataclasses

import pytest

from pathlib import Path

from lmlab import LmlabError, conformance as conf
from lmlab.cli import main
from lmlab.models import layout as layout_module
from lmlab.models.architectures import counts, markdown, refusal, table

ROWS = table()["types"]
CHECKED = [t for t in conf.causal_types() if t in ROWS]


@pytest.mark.architectures
@pytest.mark.parametrize("model_type", CHECKED)
def test_each_architecture_is_what_the_table_says(model_type):
    """A supported type passes every check again; a refused one is refused by lmlab with the table's reason (and,
    where the refusal came from a check, that check fails again)."""
    row = ROWS[model_type]
    if row["status"] == "refused":
        with pytest.raises(LmlabError, match="is not supported: "):
            layout_module.family_of(model_type)
        if row["reason"].startswith(("not checked", "an encoder-decoder")):
            return  # decided before any check ran: building its instance again proves nothing more
    got = conf.classify(model_type)
    assert (got["status"], got["reason"].split(" (max")[0]) == (row["status"], row["reason"].split(" (max")[0]), got
    assert got.get("blocks") == row.get("blocks"), got


@pytest.mark.architectures
@pytest.mark.parametrize("model_type", conf.ENCODERS)
def test_each_encoder_is_what_the_table_says(model_type):
    """The encoders S2 distils: each row of the encoders' table checked again (read as an encoder, its captures,
    head ablation and quantized weights against the independent computations)."""
    row = table()["encoders"][model_type]
    got = conf.classify_encoder(model_type)
    assert (got["status"], got["reason"].split(" (max")[0]) == (row["status"], row["reason"].split(" (max")[0]), got


def test_an_encoder_loads_as_one_and_a_decoder_head_as_a_decoder():
    """RoBERTa is registered both as an encoder and (with `is_decoder`) as a causal LM: its config decides which
    lmlab reads, so S2 takes the encoder path, never the decoder option, for an encoder checkpoint."""
    from transformers import AutoConfig

    from lmlab.models.layout import is_encoder

    assert is_encoder(AutoConfig.for_model("roberta")) and is_encoder(AutoConfig.for_model("bert"))
    assert not is_encoder(AutoConfig.for_model("roberta", is_decoder=True))
    assert not is_encoder(AutoConfig.for_model("llama")) and not is_encoder(AutoConfig.for_model("gpt2"))
    model, _ = conf.tiny_encoder("roberta")
    assert not layout_module.layout_of(model).causal


def test_the_quantized_weights_check_fails_where_a_linear_is_left_out(monkeypatch):
    """Negative control of S2's check: a quantizer that skips one linear layer of each block fails it."""
    import lmlab.interventions.quant as quant

    model, tokenizer = conf.tiny_model("qwen3")
    assert not conf._check_quantized(model, torch_ids())
    real = quant.block_linears
    monkeypatch.setattr(quant, "FAMILIES", {})  # every family through the per-block path
    monkeypatch.setattr(quant, "block_linears", lambda block, config: real(block, config)[1:])
    assert "not the blocks' linear layers" in conf._check_quantized(model, torch_ids())


def test_the_sparse_gate_check_fails_on_a_gate_that_keeps_everything(monkeypatch):
    """Negative control of S4's check: a gate that keeps every pair (dense attention) fails it."""
    import torch

    from lmlab.interventions.edits import SparseAttention

    model, tokenizer = conf.tiny_model("llama")
    assert not conf.run_checks(model, tokenizer)["sparse gate"]
    monkeypatch.setattr(SparseAttention, "gate", lambda self, layer, scores, allowed, ctx: allowed.to(torch.float32))
    assert conf.run_checks(model, tokenizer)["sparse gate"]


def torch_ids():
    import torch

    return torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])


def test_the_checks_fail_on_a_wrong_layout_and_a_broken_knockout(monkeypatch):
    """Negative controls of the suite itself: an output projection named wrong (the query projection, the same shape
    in a tiny llama, read before the attention computes) is refused by the head edits; a knockout that blocks nothing
    fails the knockout check, and one that leaves a hybrid's recurrent blocks uncut the recurrent one."""
    model, tokenizer = conf.tiny_model("llama")
    real = layout_module.spec_of
    monkeypatch.setattr(layout_module, "spec_of", lambda m: dataclasses.replace(real(m), o_proj="self_attn.q_proj"))
    with pytest.raises(LmlabError, match="output projection read an input .* that its attention did not compute"):
        conf.run_checks(model, tokenizer)
    monkeypatch.setattr(layout_module, "spec_of", real)
    from lmlab.interventions.edits import Knockout

    monkeypatch.setattr(Knockout, "block", lambda self, layer, ctx: None)
    broken = conf.run_checks(model, tokenizer)
    assert broken["knockout"] and not broken["head ablation"], broken
    hybrid, tokenizer = conf.tiny_model("qwen3_next")  # a knockout that leaves a hybrid's recurrent blocks uncut
    assert not conf.run_checks(hybrid, tokenizer)["recurrent knockout"]
    monkeypatch.setattr(Knockout, "hooks", lambda self, layout: [])
    assert "differs" in conf.run_checks(hybrid, tokenizer)["recurrent knockout"]


def test_the_table_counts_and_docs_models_md_carries_it(capsys):
    supported, total = counts()
    assert supported >= 150 and total >= len(conf.causal_types())  # a floor: a change that drops architectures fails
    assert refusal("llama") is None and refusal("mamba")
    main(["models", "--architectures", "--markdown"])
    printed = capsys.readouterr().out
    assert printed == markdown()
    doc = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    inside = doc.split("<!-- architectures:begin -->\n")[1].split("<!-- architectures:end -->")[0]
    assert inside == printed, "regenerate with: lmlab models --architectures --write --doc docs/models.md"


def test_lmlab_checks_one_architecture_and_refuses_a_bad_request(capsys, tmp_path):
    """`lmlab models --architectures --check TYPE` runs the conformance checks on one type and writes nothing; an
    unknown type, --check without --architectures and --doc without --write are refused with one line."""
    before = conf.TABLE.read_bytes()
    main(["models", "--architectures", "--check", "llama"])
    printed = capsys.readouterr().out
    assert "\nllama (causal): supported\n" in printed and "  knockout: ok\n" in printed, printed
    assert conf.TABLE.read_bytes() == before
    for argv, says in ((["--architectures", "--check", "no-such-type"], "--check no-such-type: not a model type"),
                       (["--check", "llama"], "go with --architectures"),
                       (["--architectures", "--doc", str(tmp_path / "models.md")], "--doc with --write")):
        with pytest.raises(SystemExit):
            main(["models", *argv])
        assert says in capsys.readouterr().err


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_discovery_finds_what_the_spelled_out_families_say(name):
    """Discovery, run on the families FAMILIES spells out, names the same parts (so dropping an entry from FAMILIES
    would change nothing for its models)."""
    from lmlab.models.tiny import build_tiny

    model, _ = build_tiny(name)
    found, listed = layout_module.discover(model), layout_module.spec_of(model)
    for part in ("attn", "o_proj", "mlp", "mlp_act", "mlp_out", "gate_proj"):
        assert getattr(found, part) == getattr(listed, part), part
    assert set(found.quant_linears) == set(listed.quant_linears)
    assert found.layers[0] in listed.layers and found.word_embeddings[0] in listed.word_embeddings


def test_attention_sinks_join_the_softmax_as_the_model_has_them():
    """GPT-OSS's per-head sinks: lmlab's pattern equals the model's own (rows summing to less than 1), and every
    check passes; with the sinks dropped from lmlab's function the forward check fails (the sinks matter)."""
    import torch

    from lmlab.interventions import Capture, attention, intervene
    from lmlab.models.load import LoadedModel

    model, tokenizer = conf.tiny_model("gpt_oss")
    with torch.no_grad():
        model.model.layers[0].self_attn.sinks.fill_(2.0)  # a sink that takes a visible share of every row
    checks = conf.run_checks(model, tokenizer)
    # its fused experts: no activation for ARM (XTC quantizes them expert by expert); its sinks: no sparse gate
    assert not any(v for k, v in checks.items() if k not in ("mlp activation", "sparse gate"))
    assert all(checks[k].startswith("unavailable") for k in ("mlp activation", "sparse gate"))
    with conf._ignoring_the_table():
        lm = LoadedModel(model=model, tokenizer=tokenizer, layout=layout_module.layout_of(model), name="gpt_oss",
                         source="tiny")
        with intervene(lm, Capture("pattern", layers=0)) as cap, torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7, 8, 9]]))
    assert float(cap["pattern", 0].sum(-1).max()) < 0.99
    real = attention.lmlab_attention

    def without_sinks(module, *args, **kwargs):
        kwargs.pop("s_aux", None)
        sinks = module.__dict__["_parameters"].pop("sinks")
        try:
            return real(module, *args, **kwargs)
        finally:
            module._parameters["sinks"] = sinks

    from transformers import AttentionInterface

    AttentionInterface.register(attention.IMPL, without_sinks)
    try:
        assert conf.run_checks(model, tokenizer)["forward"]
    finally:
        attention.register()


@pytest.mark.parametrize("layer_types", [["conv", "full_attention", "conv"], ["full_attention", "conv", "full_attention"]])
def test_a_hybrid_is_read_layer_by_layer(layer_types):
    """LFM2's checkpoints put short-convolution blocks beside attention ones, whichever comes first: the layout names
    each block's kind, the head edits act in the attention blocks (a head's ablation there equals its slice of the
    output projection's input zeroed by hand), a convolution block's heads are refused by name, and a knockout in a
    convolution block changes every position after the key and none before (the position-by-position reference is
    the conformance suite's)."""
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    from lmlab.interventions import AblateHeads, Capture, Knockout, intervene

    config = Lfm2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=layer_types)
    torch.manual_seed(0)
    model = Lfm2ForCausalLM(config).eval()
    with conf._ignoring_the_table():
        layout = layout_module.layout_of(model)
    attention = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    conv = [i for i in range(3) if i not in attention]
    assert layout.attention_layers == tuple(attention) and layout.mixing_layers == tuple(conv)
    assert [layout.kinds[i] for i in conv] == ["convolution"] * len(conv)
    assert "convolution" in layout.describe()["layer_kinds"]
    with pytest.raises(LmlabError, match=rf"^layer {conv[0]} of this lfm2 model is a convolution block, with no "
                                         rf"softmax attention heads"):
        layout.attn(conv[0])
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    layer, d = attention[-1], layout.head_dim_of(attention[-1])

    def zero(module, args):
        x = args[0].clone()
        x[..., d:2 * d] = 0
        return (x,)

    handle = layout.o_proj(layer).register_forward_pre_hook(zero)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    handle.remove()
    with intervene(model, AblateHeads({layer: [1]})), torch.no_grad():
        got = model(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-6) and not torch.allclose(got, model(input_ids=ids).logits)
    with pytest.raises(LmlabError, match=f"layer {conv[0]} of this lfm2 model is a convolution block"):
        with intervene(model, Capture("z", layers=conv[0])):
            pass
    with intervene(model, Capture("z", "resid_pre")) as cap, torch.no_grad():
        model(input_ids=ids)
    assert sorted(cap.store["z"]) == attention and sorted(cap.store["resid_pre"]) == [0, 1, 2]
    keys = torch.zeros_like(ids, dtype=torch.bool)
    keys[:, 1] = True
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    with intervene(model, Knockout(keys, layers=[conv[0]])), torch.no_grad():
        cut = model(input_ids=ids).logits
    # a convolution block's knockout: the key and what precedes it as they were, every later position changed
    assert torch.equal(cut[:, :2], plain[:, :2]) and (cut[:, 2:] - plain[:, 2:]).abs().amax(-1).min() > 0


def test_an_attention_gated_after_its_heads_is_edited_where_the_projection_reads():
    """Qwen3-Next gates its attention's output per channel before the output projection: a head patched from another
    run is the gated value the projection read there (edits act at the projection's input), not the other run's
    ungated value times this run's gate."""
    import torch

    from lmlab.interventions import AblateHeads, Capture, intervene

    model, _ = conf.tiny_model("qwen3_next")
    with conf._ignoring_the_table():
        layout = layout_module.layout_of(model)
    layer, d = layout.attention_layers[-1], layout.head_dim_of(layout.attention_layers[-1])
    a, b = torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.tensor([[11, 12, 13, 14, 15, 16]])
    seen = {}
    handle = layout.o_proj(layer).register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0].clone()))
    with torch.no_grad():
        model(input_ids=b)
    handle.remove()
    with intervene(model, Capture("z", layers=layer)) as cap, torch.no_grad():
        model(input_ids=b)
    assert torch.equal(cap["z", layer].flatten(2), seen["x"])  # z is what the projection reads
    with intervene(model, AblateHeads({layer: [1]}, mode="patch", reference={layer: cap["z", layer]})), \
            torch.no_grad():
        got = model(input_ids=a).logits

    def patch(module, args):
        x = args[0].clone()
        x[..., d:2 * d] = seen["x"][..., d:2 * d]
        return (x,)

    handle = layout.o_proj(layer).register_forward_pre_hook(patch)
    with torch.no_grad():
        expected = model(input_ids=a).logits
    handle.remove()
    assert torch.allclose(got, expected, atol=1e-6)


def test_the_legacy_attentions_the_layout_reads_are_those_lmlab_adapts():
    """The layout treats the attentions named in LEGACY_ATTENTION as reachable; each must have an adapter that
    routes it through lmlab's function (its checks are GPT-Neo's and OpenAI GPT's rows)."""
    from lmlab.interventions.legacy import ADAPTERS

    assert set(layout_module.LEGACY_ATTENTION) == set(ADAPTERS)
    import torch

    from lmlab.interventions import Capture, intervene

    model, _ = conf.tiny_model("gpt_neo")
    own, ids = model.transformer.h[0].attn.attention, torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    with conf._ignoring_the_table(), intervene(model, Capture("pattern", layers=0)):
        assert "_attn" in own.__dict__  # the adapter, on that instance only
    with torch.no_grad():  # a layer with nothing to do runs the family's own method: the same logits, bit for bit
        assert torch.equal(model(input_ids=ids).logits, before)


def test_heads_of_different_sizes_per_layer_are_read_layer_by_layer():
    """Gemma 4's full-attention layers read wider heads than its sliding ones: the layout keeps each layer's head
    size (the row's head ablation and patching act on the last layer, a full-attention one), and asking for one
    size for the whole model is refused in one sentence."""
    model, _ = conf.tiny_model("gemma4_text")
    layout = layout_module.layout_of(model)
    kinds = model.config.layer_types
    wide = {layout.head_dim_of(i) for i, kind in enumerate(kinds) if kind == "full_attention"}
    narrow = {layout.head_dim_of(i) for i, kind in enumerate(kinds) if kind != "full_attention"}
    assert len(wide) == len(narrow) == 1 and wide != narrow and kinds[-1] == "full_attention"
    assert layout.describe()["head_dim"] == sorted(wide | narrow)
    with pytest.raises(LmlabError, match=r"^this gemma4_text model's heads differ in size per layer \(\d+ and \d+\)"):
        layout.head_dim


NEW_USERS = ("gemma4", "mixtral", "qwen3_5", "qwen3_next", "nemotron_h")


@pytest.mark.parametrize("model_type", NEW_USERS)
def test_a_new_users_folder_runs_trace_and_the_knockout_demo(model_type, tmp_path, capsys):
    """The models a researcher opens in 2026, as a user would: a tiny random instance saved as a folder with a
    tokenizer, then `lmlab trace --model DIR` and `lmlab knockout --profile demo --model DIR`. Gemma 4 (its unified
    model, heads of two sizes), a mixture of experts stacked in 3-D tensors and the hybrids of softmax attention with
    linear-attention (Qwen3.5, Qwen3-Next) or state-space blocks (Nemotron-H) run both."""
    import warnings

    from helpers import run_main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tokenizer = conf.tiny_model(model_type)
    folder = tmp_path / model_type
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    def run(*args) -> tuple[int, str]:
        code, out, err = run_main(capsys, *args)
        return code, out + err

    traced = run("trace", "--model", str(folder))
    knocked = run("knockout", "--profile", "demo", "--model", str(folder), "--out", str(tmp_path / "runs"))
    assert traced[0] == 0 and "p knockout" in traced[1], traced
    assert knocked[0] == 0 and "outputs in" in knocked[1], knocked
