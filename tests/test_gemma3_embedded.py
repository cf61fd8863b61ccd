"""The second embedded decoder, Gemma-3-270M (sliding-window layers, one KV head, its own query scaling): loaded
from its chunked GGUF, listed, and its interventions checked against eager attention as the tiny configs are."""

import pytest
import torch

import test_interventions as checks
from conftest import PROMPTS, load_embedded

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def gemma():
    return load_embedded("gemma3-270m")


@pytest.fixture(scope="module")
def gemma_batch(gemma):
    return gemma.encode(PROMPTS)


def test_gemma3_loads_with_its_layout(gemma):
    d = gemma.layout.describe()
    assert (d["family"], d["layers"], d["heads"], d["kv_heads"]) == ("gemma3", 18, 4, 1)
    assert type(gemma.model).__name__ == "Gemma3ForCausalLM"


def test_gemma3_patterns_match_eager(gemma, gemma_batch):
    checks.test_captured_patterns_match_eager_output_attentions(gemma, gemma_batch)


# 18 fp32 layers and |logits| up to ~20: the lmlab path and eager differ by float rounding (3.1e-5 measured),
# while the knockout itself moves the logits by more than 1e-3 (checked inside)
REAL_ATOL = 2e-4


def test_gemma3_knockout_matches_hand_masked_eager(gemma, gemma_batch):
    checks.test_knockout_matches_hand_masked_eager(gemma, gemma_batch, "each", atol=REAL_ATOL)


def test_gemma3_head_knockout_matches_hand_masked_eager(gemma, gemma_batch):
    checks.test_knockout_on_some_heads_matches_hand_masked_eager(gemma, gemma_batch, atol=REAL_ATOL)


def test_gemma3_z_is_the_o_proj_input(gemma, gemma_batch):
    checks.test_captured_z_is_the_o_proj_input(gemma, gemma_batch)


def test_gemma3_cached_tokenizer_encodes_as_gemmas_own_class(gemma):
    """The cache serves the tokenizer straight from tokenizer.json (the fast path of a ≤ 2 s load); Gemma's own
    class, which rebuilds it from the vocabulary, must encode and decode every text the same way."""
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    from lmlab.models.embedded import cached_model_dir

    assert type(gemma.tokenizer).__name__ == "TokenizersBackend"
    own = GemmaTokenizer.from_pretrained(str(cached_model_dir("gemma3-270m")))
    texts = ["The capital of Burkina Faso is", "  two  spaces\n\nnew lines\tand a tab", "ünïcödé, 東京, Ελλάδα 🙂",
             "<start_of_turn>user\nhi<end_of_turn>", "def f(x):\n    return x ** 2  # 12345.678", "", " lead"]
    texts += [f"{p} {q}" for p in PROMPTS for q in ("Answer:", "\\boxed{42}")]
    for text in texts:
        ids = gemma.tokenizer(text)["input_ids"]
        assert ids == own(text)["input_ids"], text
        assert gemma.tokenizer.decode(ids) == own.decode(ids)
    assert (gemma.tokenizer.bos_token_id, gemma.tokenizer.eos_token_id, gemma.tokenizer.pad_token_id) == (
        own.bos_token_id, own.eos_token_id, own.pad_token_id)
    assert len(gemma.tokenizer) == len(own)


def test_gemma3_knockout_sweep_with_retired_rows_equals_one_pass_per_layer(gemma):
    """The S1 sweep (cached prefix, one row per cut-off, each row dropped after the layer it is read at) on the
    real model, sliding-window layers included, against a full pass per cut-off."""
    from lmlab.studies.knockout.measure import naive_sweep, sweep

    ids = gemma.tokenizer("Q: What is the capital of Burkina Faso?\nA: Ouagadougou")["input_ids"]
    eq = [p for p, t in enumerate(ids) if "Burk" in gemma.tokenizer.decode([t]) or "Faso" in gemma.tokenizer.decode([t])]
    assert eq
    layers = [0, 5, 11, 17]
    fast = sweep(gemma, ids, eq, [2, 3], layers)
    slow = naive_sweep(gemma, ids, eq, layers)
    for k in layers:  # Gemma's residual grows to ~3e4 by layer 17: float rounding scales with it (1.7e-7 measured)
        assert (fast.eq[k] - slow[k]).abs().max() <= 1e-5 * slow[k].abs().max(), k
