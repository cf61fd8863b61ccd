import json

import pytest
import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, OlmoConfig, OlmoForCausalLM, Olmo2Config,
                          Olmo2ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from lmlab import LmlabError
from lmlab.interventions import AblateHeads, Capture, Knockout, intervene
from lmlab.models import load_model
from lmlab.models.layout import layout_of

SMALL = dict(vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _family_models():
    torch.manual_seed(0)
    yield "qwen2", Qwen2ForCausalLM(Qwen2Config(**SMALL))
    yield "olmo", OlmoForCausalLM(OlmoConfig(**SMALL))
    yield "olmo2", Olmo2ForCausalLM(Olmo2Config(**SMALL))
    yield "gemma3", Gemma3ForCausalLM(Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=4,
                                                       layer_types=["sliding_attention", "full_attention"]))


@pytest.mark.parametrize("family,model", list(_family_models()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_family_resolves_and_captures_match_eager(family, model):
    model.eval()
    layout = layout_of(model)
    assert (layout.family, layout.n_layers, layout.n_heads, layout.n_kv_heads) == (family, 2, 4, 2)
    ids = torch.randint(0, 120, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.set_attn_implementation("eager")
        ref = model(input_ids=ids, output_attentions=True)
        with intervene(model, Capture("pattern", "z", "mlp_act")) as cap:
            got = model(input_ids=ids).logits
    assert torch.allclose(got, ref.logits, atol=1e-5)
    for layer in range(2):  # includes Gemma-3's sliding-window layer
        assert torch.allclose(cap["pattern", layer], ref.attentions[layer], atol=1e-6)
    assert cap["z", 0].shape == (2, 10, 4, layout.head_dim)
    keys = torch.zeros(2, 10, dtype=torch.bool)
    keys[:, 2] = True
    with torch.no_grad(), intervene(model, Knockout(keys)):
        knocked = model(input_ids=ids).logits
    assert torch.allclose(knocked[:, :3], got[:, :3], atol=1e-5) and not torch.allclose(knocked, got, atol=1e-4)
    with torch.no_grad(), intervene(model, AblateHeads({1: [3]})):
        ablated = model(input_ids=ids).logits
    assert not torch.allclose(ablated, got, atol=1e-4)


def test_tiny_models_are_deterministic_per_seed():
    a, b, c = load_model("tiny-llama"), load_model("tiny-llama"), load_model("tiny-llama", seed=1)
    wa, wb, wc = (m.model.model.layers[0].self_attn.q_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_tiny_bert_is_an_encoder():
    lm = load_model("tiny-bert")
    assert lm.layout.family == "bert" and not lm.layout.causal
    enc = lm.encode(["the capital of France", "Paris"], padding_side="right")
    assert "position_ids" not in enc
    with torch.no_grad(), intervene(lm, Capture("pattern")) as cap:
        lm.model(**enc)
    pattern = cap["pattern", 0]
    assert pattern.shape[-1] == pattern.shape[-2]
    assert (pattern[0, :, 0, 1:] > 0).all()  # bidirectional: the first token reads later ones


def test_bad_model_specs_are_one_clear_sentence(tmp_path):
    with pytest.raises(LmlabError, match="unknown model 'gpt5'; embedded models: smollm2-135m"):
        load_model("gpt5")
    with pytest.raises(LmlabError, match="no such file"):
        load_model(str(tmp_path / "missing" / "model"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(LmlabError, match="not a model directory"):
        load_model(str(tmp_path / "notes.txt"))
    with pytest.raises(LmlabError, match="no GGUF file"):
        load_model(str(tmp_path / "m.gguf"))
    bad = tmp_path / "t5"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
    with pytest.raises(LmlabError, match="architecture 't5' is not supported: not a decoder-only language model among those checked"):
        load_model(str(bad))


def test_prompt_longer_than_the_context_is_refused():
    lm = load_model("tiny-gpt2")
    with pytest.raises(LmlabError, match="longer than tiny-gpt2's context of 256 tokens"):
        lm.encode("the " * 300)


def test_a_saved_model_directory_loads_back(tmp_path):
    lm = load_model("tiny-llama")
    lm.model.save_pretrained(tmp_path / "m")
    lm.tokenizer.save_pretrained(tmp_path / "m")
    again = load_model(str(tmp_path / "m"))
    enc = lm.encode("When Mary and John went")
    with torch.no_grad():
        assert torch.equal(lm.model(**enc).logits, again.model(**enc).logits)
    assert again.source.startswith("directory")
    assert list((tmp_path / "m").glob("*.safetensors"))


def test_a_new_head_on_a_saved_model_is_drawn_from_the_seed(tmp_path):
    """A pretrained encoder given a classifier head (S2's teachers): the head's weights come from `seed`, not from
    the process's random stream (torch seeds that differently in every process, so two runs of one seed had two
    teachers), and the caller's stream is left as it was."""
    lm = load_model("tiny-bert", head="base")
    lm.model.save_pretrained(tmp_path / "m")
    lm.tokenizer.save_pretrained(tmp_path / "m")
    heads = []
    for seed, stream in ((0, 1), (0, 2), (1, 1)):
        torch.manual_seed(stream)
        before = torch.get_rng_state()
        loaded = load_model(str(tmp_path / "m"), head="classifier", num_labels=3, seed=seed)
        assert torch.equal(torch.get_rng_state(), before)
        heads.append(loaded.model.classifier.weight.detach().clone())
    assert torch.equal(heads[0], heads[1]) and not torch.equal(heads[0], heads[2])


@pytest.mark.embedded
def test_embedded_smollm_loads_from_cache_and_knows_paris(embedded_smollm):
    lm = embedded_smollm
    assert lm.layout.describe() == dict(family="llama", layers=30, heads=9, kv_heads=3, head_dim=64, d_model=576)
    enc = lm.encode("The capital of France is")
    with torch.no_grad():
        p = torch.softmax(lm.model(**enc).logits[0, -1], -1)
    paris = lm.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    assert p[paris] > 0.5


@pytest.mark.embedded
def test_minilm_loads_offline_from_its_package():
    lm = load_model("minilm-l6")
    assert lm.layout.describe() == dict(family="bert", layers=6, heads=12, kv_heads=12, head_dim=32, d_model=384)


def test_resize_vocabulary_keeps_old_rows_and_the_tied_head(tiny_llama):
    import copy

    from lmlab.models import resize_vocabulary

    model = copy.deepcopy(tiny_llama.model)
    old = model.get_input_embeddings().weight.detach().clone()
    resize_vocabulary(model, old.shape[0] + 5)
    new = model.get_input_embeddings().weight
    assert new.shape == (old.shape[0] + 5, old.shape[1])
    torch.testing.assert_close(new[:old.shape[0]].detach(), old)
    assert model.get_output_embeddings().weight.shape[0] == old.shape[0] + 5
    with pytest.raises(LmlabError, match="vocabulary of 0 tokens"):
        resize_vocabulary(model, 0)


def test_last_logits_match_the_full_forward(decoder):
    """`last_logits` projects only the last position (when the model allows it): same values as slicing
    the full forward pass, on a left-padded batch of unequal lengths."""
    lm = decoder
    batch = lm.pad_batch([[5, 6, 7, 8, 9], [10, 11, 12]])
    with torch.no_grad():
        full = lm.model(**batch).logits[:, -1]
        last = lm.last_logits(batch)
    assert last.shape == full.shape
    torch.testing.assert_close(last, full, rtol=1e-5, atol=1e-5)


def test_a_hub_id_without_a_hub_is_one_sentence_and_tries_nothing(monkeypatch):
    import lmlab.models.load as load

    def no_network(*a, **k):
        raise AssertionError("must not reach for the hub")

    monkeypatch.setattr(load, "hub_reachable", lambda: False)
    monkeypatch.setattr(load, "_from_pretrained", no_network)
    with pytest.raises(LmlabError, match="no hub reachable .* 'no/such-model' is not in the local cache"):
        load_model("no/such-model")
    seen = {}

    def cached(spec, **kw):
        seen.update(kw)
        raise OSError("stop here")

    import lmlab.hub

    monkeypatch.setattr(lmlab.hub, "cached_locally", lambda repo, filename="config.json": True)
    monkeypatch.setattr(load, "_from_pretrained", cached)
    with pytest.raises(LmlabError, match="stop here"):
        load_model("some/cached-model")
    assert seen["local_files_only"] is True  # a cached model loads from the cache, without retries


def test_hub_offline_setting_answers_without_trying(monkeypatch):
    from huggingface_hub import constants

    from lmlab import hub

    hub.hub_reachable.cache_clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub.socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(AssertionError()))
    try:
        assert hub.hub_reachable() is False
    finally:
        hub.hub_reachable.cache_clear()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-bert"])
def test_the_catalog_describes_models_as_built(name):
    """`lmlab models` reads shapes without loading weights: the catalog agrees with the built model."""
    from lmlab.models.catalog import TINY_SHAPES, describe_config

    lm = load_model(name)
    built = {k: v for k, v in lm.layout.describe().items() if k in ("family", "layers", "heads", "kv_heads")}
    assert TINY_SHAPES[name] == built == describe_config(lm.model.config.to_dict())


@pytest.mark.embedded
def test_the_catalog_describes_the_embedded_models_from_their_config_files(embedded_smollm):
    from lmlab.models.catalog import describe_folder
    from lmlab.models.embedded import cached_model_dir

    built = {k: v for k, v in embedded_smollm.layout.describe().items() if k in ("family", "layers", "heads", "kv_heads")}
    assert describe_folder(cached_model_dir("smollm2-135m")) == built == dict(family="llama", layers=30, heads=9,
                                                                               kv_heads=3)


@pytest.mark.embedded
def test_a_gguf_header_is_read_once_per_load_and_handed_out_as_copies():
    """gguf_once: inside a load the reader is built once per file and the header's metadata parsed once; each caller
    gets its own copy; outside, transformers' and gguf's own functions are back."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    from lmlab.models import gguf_once
    from lmlab.models.embedded import EMBEDDED

    path = str(EMBEDDED["smollm2-135m"].source_path())
    built, original = [], gguf.GGUFReader

    class Counting(original):
        def __init__(self, *args, **kwargs):
            built.append(args[0])
            super().__init__(*args, **kwargs)

    gguf.GGUFReader = Counting
    try:
        plain = hf_gguf.load_gguf_checkpoint(path)
        assert len(built) == 1
        with gguf_once.read_once():
            first = hf_gguf.load_gguf_checkpoint(path)
            first["config"]["hidden_size"] = -1
            second = hf_gguf.load_gguf_checkpoint(path, return_tensors=False)
            assert gguf.GGUFReader(path) is gguf.GGUFReader(path)
        assert len(built) == 2  # one reader inside, however many asked
        assert second == plain and first["config"]["hidden_size"] == -1
        assert gguf.GGUFReader is Counting
    finally:
        gguf.GGUFReader = original
    assert hf_gguf.load_gguf_checkpoint.__module__ == "transformers.modeling_gguf_pytorch_utils"


def test_an_embedded_models_cache_is_shared_by_environments_with_the_same_package(tmp_path, monkeypatch):
    """The cache's stamp names the package's file by name, size and time: the same package installed in another
    environment (another folder) finds the cache made, a changed file does not."""
    import os

    from lmlab.models import embedded

    first, second = tmp_path / "venv-a" / "m.gguf", tmp_path / "venv-b" / "m.gguf"
    for f in (first, second):
        f.parent.mkdir()
        f.write_bytes(b"weights")
        os.utime(f, (1_700_000_000, 1_700_000_000))
    entry = embedded.EmbeddedModel("m", "org/m", "m_pkg", "m-pkg==1", gguf_file="m.gguf")
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded.EmbeddedModel, "source_path", lambda self: first)
    marker = embedded.cached_model_dir("m") / "lmlab-source.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps(embedded._source_stamp(entry)))
    monkeypatch.setattr(embedded.EmbeddedModel, "source_path", lambda self: second)
    assert embedded.is_cached(entry)
    second.write_bytes(b"other weights")
    assert not embedded.is_cached(entry)
