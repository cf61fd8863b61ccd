"""Activation patching at its cost floor: each head's patch starts from the clean residual at its layer
(`StartAt`) and the heads of a layer go as blocks of one batch (`PatchHeadRows`). Checked against the one-full-
forward-per-head reference on four families (Llama with grouped KV, GPT-2's absolute positions, Gemma-3's
sliding and global layers, Qwen2's biased projections), with MLPs as components, chunked batches and left
padding; and the two interventions each against an independent computation."""

import numpy as np
import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Qwen2Config, Qwen2ForCausalLM

from lmlab.data.generated.circuits import CircuitPrompt, CircuitTask
from lmlab.interventions import AblateHeads, Capture, PatchHeadRows, StartAt, intervene
from lmlab.models import load_model
from lmlab.models.layout import layout_of
from lmlab.models.load import LoadedModel
from lmlab.models.tiny import tiny_tokenizer
from lmlab import circuits


def _from_config(name, cls, config):
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = cls(config).eval()
    return LoadedModel(model=model, tokenizer=tok, layout=layout_of(model), name=name, source="test")


def _gemma3():
    vocab = len(tiny_tokenizer())
    return _from_config("tiny-gemma3", Gemma3ForCausalLM, Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, sliding_window=4, sliding_window_pattern=2, max_position_embeddings=256,
        pad_token_id=1, bos_token_id=0, eos_token_id=0))


def _qwen2():
    vocab = len(tiny_tokenizer())
    return _from_config("tiny-qwen2", Qwen2ForCausalLM, Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=1, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=False))


MODELS = {"tiny-llama": lambda: load_model("tiny-llama"), "tiny-gpt2": lambda: load_model("tiny-gpt2"),
          "tiny-gemma3": _gemma3, "tiny-qwen2": _qwen2}


@pytest.fixture(scope="module", params=list(MODELS))
def lm(request):
    return MODELS[request.param]()


def _task(seed: int, n: int = 6) -> CircuitTask:
    """Prompts of 7-10 tokens (left padding in a batch), each corrupted at two positions."""
    rng = np.random.default_rng(seed)
    prompts = []
    for i in range(n):
        ids = [int(x) for x in rng.integers(5, 300, size=7 + i % 4)]
        bad = list(ids)
        for p in rng.choice(len(ids) - 1, 2, replace=False):
            bad[p] = int(rng.integers(5, 300))
        prompts.append(CircuitPrompt(tuple(ids), tuple(bad), "", "", answer=11, distractor=12))
    return CircuitTask("random", "logit_diff", prompts)


@pytest.mark.parametrize("mlps", [False, True])
def test_fast_activation_patching_equals_one_forward_per_component(lm, mlps):
    task = _task(seed=1)
    z_corr = circuits.corrupted_z(lm, task, 4, mlps=mlps)
    slow = circuits.activation_scores_naive(lm, task, 4, z_corr=z_corr)
    # max_rows 8: two prompts' worth of blocks in a pass of batch 4 -> the layer's heads in several passes
    fast = circuits.activation_scores(lm, task, 4, z_corr=z_corr, max_rows=8)
    whole = circuits.activation_scores(lm, task, 4, z_corr=z_corr)
    scale = np.abs(slow).max()
    assert scale > 1e-3  # the patches move the metric
    np.testing.assert_allclose(fast, slow, atol=1e-5 * max(1.0, scale), rtol=0)
    np.testing.assert_allclose(whole, slow, atol=1e-5 * max(1.0, scale), rtol=0)
    if mlps:
        assert fast.shape[1] == lm.layout.n_heads + 1 and np.abs(fast[:, -1]).max() > 1e-4


def test_a_subset_of_components_leaves_the_rest_unrun(lm):
    task = _task(seed=2, n=4)
    z_corr = circuits.corrupted_z(lm, task, 4)
    picked = [(lm.layout.n_layers - 1, 1), (0, 3), (1, 0)]
    fast = circuits.activation_scores(lm, task, 4, z_corr=z_corr, heads=picked)
    slow = circuits.activation_scores_naive(lm, task, 4, z_corr=z_corr, heads=picked)
    np.testing.assert_allclose(fast, slow, atol=1e-5, equal_nan=True)
    assert np.isnan(fast).sum() == fast.size - len(picked)


def test_start_at_a_layer_from_its_residual_is_the_full_forward(lm):
    """Independent of the patching code: the logits of a run from layer l's captured input equal the full run's,
    with the batch tiled three times; and the blocks below l do not run (their hooks see no input)."""
    batch = lm.pad_batch([[5, 9, 33, 41, 7], [12, 8, 19]])
    with torch.no_grad(), intervene(lm, Capture("resid_pre")) as cap:
        full = lm.model(**batch).logits
    layer = lm.layout.n_layers - 2
    tiled = {k: v.repeat(3, 1) for k, v in batch.items()}
    calls = []
    handle = lm.layout.mlp(0).register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad(), intervene(lm, StartAt(layer, cap["resid_pre", layer])):
            resumed = lm.model(**tiled, use_cache=False).logits
    finally:
        handle.remove()
    assert not calls  # block 0 computed nothing
    for i in range(3):
        torch.testing.assert_close(resumed[2 * i:2 * i + 2], full, atol=1e-5, rtol=0)
    with torch.no_grad():  # and the blocks are whole again afterwards
        torch.testing.assert_close(lm.model(**batch).logits, full, atol=0, rtol=0)


def test_head_rows_patch_each_block_as_its_own_head_patch(lm):
    """PatchHeadRows with heads (h0, None, h1) on a 3x tiled batch = AblateHeads patching h0, nothing, h1."""
    batch = lm.pad_batch([[5, 9, 33, 41, 7], [12, 8, 19]])
    other = lm.pad_batch([[6, 2, 30, 44, 9], [13, 70, 18]])
    with torch.no_grad(), intervene(lm, Capture("z")) as cap:
        lm.model(**other)
    layer, ref = 1, cap["z", 1]
    tiled = {k: v.repeat(3, 1) for k, v in batch.items()}
    with torch.no_grad(), intervene(lm, PatchHeadRows(layer, [0, None, 2], ref)):
        rows = lm.model(**tiled).logits
    for i, head in enumerate([0, None, 2]):
        edits = [] if head is None else [AblateHeads([(layer, head)], mode="patch", reference={layer: ref})]
        with torch.no_grad(), intervene(lm, *edits):
            alone = lm.model(**batch).logits
        torch.testing.assert_close(rows[2 * i:2 * i + 2], alone, atol=1e-5, rtol=0)


def test_the_corrupted_runs_metric_is_a_corrupted_forward_pass(lm):
    """`corrupted_run` takes the corrupted prompts' metric from the pass that records their z: the same numbers as
    a plain forward pass over the corrupted prompts (the recording changes nothing), prompt by prompt."""
    task = _task(seed=7)
    z_corr, metric = circuits.corrupted_run(lm, task, 4)
    assert len(z_corr) == 2 and set(z_corr[0]) == set(lm.layout.attention_layers)
    np.testing.assert_array_equal(metric, circuits.metric_values(lm, task, 4, corrupted=True))
    assert np.abs(metric - circuits.metric_values(lm, task, 4)).max() > 1e-3


@pytest.mark.parametrize("mlps", [False, True])
@pytest.mark.parametrize("ranked", ["random", "upper layers first"])
def test_batched_effect_curve_equals_one_forward_per_grid_point(lm, mlps, ranked):
    """The explained-effect curve with its grid points as blocks of one batch (a few passes: max_rows), each
    starting from the fully patched run's residual at the lowest layer it keeps a component clean = one forward
    per point, at every point; and it runs from clean (all kept) to fully patched. Ranked upper layers first (as
    a task's top heads often are), the small-N points start above layer 0."""
    task = _task(seed=4)
    z_corr = circuits.corrupted_z(lm, task, 4, mlps=mlps)
    width = lm.layout.n_heads + int(mlps)
    rng = np.random.default_rng(0)
    comps = [(l, h) for l in range(lm.layout.n_layers) for h in range(width)]
    order = [comps[i] for i in rng.permutation(len(comps))]
    if ranked == "upper layers first":
        order = sorted(order, key=lambda c: -c[0])
    grid = [0, 1, 3, len(order) // 2, len(order) - 1, len(order)]
    starts = circuits._start_layers([order[n:] for n in grid], lm.layout.n_layers)
    assert (ranked == "random") or starts[1] == lm.layout.n_layers - 1
    fast = circuits.effect_curve(lm, task, order, grid=grid, batch_size=4, z_corr=z_corr, max_rows=8)
    slow = circuits.effect_curve_naive(lm, task, order, grid=grid, batch_size=4, z_corr=z_corr)
    assert fast.grid == slow.grid
    np.testing.assert_allclose(fast.values, slow.values, atol=1e-5, rtol=0)
    np.testing.assert_allclose(fast.clean, circuits.metric_values(lm, task, 4), atol=1e-5, rtol=0)
    assert np.abs(fast.clean - fast.none).max() > 1e-3


def test_a_hybrids_heads_are_scored_ranked_and_patched_in_its_attention_layers_alone():
    """On a hybrid (LFM2: convolution blocks between attention ones) attribution leaves a convolution block's heads
    without a score (NaN), the ranking leaves them out, and the effect curve along it (each point from the fully
    patched run's residual) and activation patching equal one full forward per point or head."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    lm = _from_config("tiny-lfm2", Lfm2ForCausalLM, Lfm2Config(
        vocab_size=len(tiny_tokenizer()), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, layer_types=["full_attention", "conv", "full_attention", "conv"],
        max_position_embeddings=256, pad_token_id=1, bos_token_id=0, eos_token_id=0))
    task = _task(seed=3)
    z_corr = circuits.corrupted_z(lm, task, 4)
    scores = circuits.attribution_scores(lm, task, 4, z_corr=z_corr)
    assert np.isnan(scores[[1, 3]]).all() and np.isfinite(scores[[0, 2]]).all()
    order = circuits.ranking(scores)
    assert sorted(order) == [(l, h) for l in (0, 2) for h in range(4)]
    order = sorted(order, key=lambda c: -c[0])  # layer 2's heads first: the small-N points start at layer 2
    grid = [0, 1, 2, 4, 6, 8]
    fast = circuits.effect_curve(lm, task, order, grid=grid, batch_size=4, z_corr=z_corr, max_rows=8)
    slow = circuits.effect_curve_naive(lm, task, order, grid=grid, batch_size=4, z_corr=z_corr)
    np.testing.assert_allclose(fast.values, slow.values, atol=1e-5, rtol=0)
    assert np.abs(fast.clean - fast.none).max() > 1e-3
    act = circuits.activation_scores(lm, task, 4, z_corr=z_corr)
    ref = circuits.activation_scores_naive(lm, task, 4, z_corr=z_corr)
    np.testing.assert_allclose(act[[0, 2]], ref[[0, 2]], atol=1e-5, rtol=0)
    assert np.isnan(act[[1, 3]]).all()
