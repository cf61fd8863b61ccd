"""Every intervention against an independent computation, on tiny-llama (GQA) and tiny-gpt2 (Conv1D).

The reference here is a hand-written eager attention registered under another name: it shares no
code with lmlab's attention function (own K/V repetition, own masking, own softmax).
"""

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from helpers import max_diff, near
from lmlab import LmlabError
from lmlab.conformance import using
from lmlab.interventions import (AblateHeads, Capture, EditMLPAct, Knockout, PatchResid, SparseAttention,
                                 intervene)

HAND = "test_hand_eager"


def hand_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    scores = query @ key.transpose(-1, -2) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    block = module.__dict__.get("_test_block")  # (B, H or 1, Q, K) bool
    if block is not None:
        scores = scores.masked_fill(block, torch.finfo(scores.dtype).min)
    module._test_scores = scores
    probs = scores.softmax(-1)
    return (probs @ value).transpose(1, 2), probs


AttentionInterface.register(HAND, hand_eager)
AttentionMaskInterface.register(HAND, eager_mask)


def logits(lm, enc):
    with torch.no_grad():
        return lm.model(**enc).logits


def real_rows(enc):
    return enc["attention_mask"].bool()


def test_no_intervention_is_bit_identical_to_sdpa(decoder, batch):
    with using(decoder.model, "sdpa"):
        plain = logits(decoder, batch)
    with intervene(decoder):
        routed = logits(decoder, batch)
    assert decoder.model.config._attn_implementation == "lmlab"
    assert torch.equal(plain, routed)


def test_layers_without_work_stay_bit_identical(decoder, batch):
    """Capturing the last layer's pattern (explicit attention there) leaves earlier layers bit-identical."""
    last = decoder.layout.n_layers - 1
    with intervene(decoder, Capture("resid_pre", "resid_post")) as plain:
        logits(decoder, batch)
    with intervene(decoder, Capture("resid_pre", "resid_post"), Capture("pattern", layers=last)) as (cap, _):
        logits(decoder, batch)
    for layer in range(last):
        assert torch.equal(plain["resid_post", layer], cap["resid_post", layer])
    assert torch.equal(plain["resid_pre", last], cap["resid_pre", last])


def test_captured_patterns_match_eager_output_attentions(decoder, batch):
    with intervene(decoder, Capture("pattern")) as cap:
        logits(decoder, batch)
    with using(decoder.model, "eager"), torch.no_grad():
        ref = decoder.model(**batch, output_attentions=True).attentions
    rows = real_rows(batch)[:, None, :, None]  # padded queries read nothing useful in either
    for layer, expected in enumerate(ref):
        got = cap["pattern", layer]
        assert got.shape == expected.shape
        assert near(got * rows, expected * rows, atol=1e-6), max_diff(got * rows, expected * rows)


def test_captured_z_is_the_o_proj_input(decoder, batch):
    seen = {}
    layer = 1
    handle = decoder.layout.o_proj(layer).register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0].detach()))
    try:
        with intervene(decoder, Capture("z", layers=layer)) as cap:
            logits(decoder, batch)
    finally:
        handle.remove()
    z = cap["z", layer]
    assert torch.equal(z.flatten(2), seen["x"])


def _hand_block_run(lm, enc, layers, block):
    attn = [lm.layout.attn(l) for l in range(lm.layout.n_layers)]
    for l in layers:
        attn[l]._test_block = block
    try:
        with using(lm.model, HAND):
            return logits(lm, enc)
    finally:
        for l in layers:
            attn[l].__dict__.pop("_test_block", None)


@pytest.mark.parametrize("scope", ["each", "span"])
def test_knockout_matches_hand_masked_eager(decoder, batch, scope, atol=1e-5):
    """Block the keys of tokens 2-3 of each prompt in layers 0..1: 'each' blocks every key e from every
    query q > e (the paper's knockout; token 3 no longer reads token 2), 'span' blocks both keys from the
    queries after the last one."""
    lengths = batch["attention_mask"].sum(1).tolist()
    keys = [[2, 3] for _ in lengths]
    ko = Knockout.spans(batch["attention_mask"], keys, layers=[0, 1], scope=scope)
    with intervene(decoder, ko):
        got = logits(decoder, batch)
    # the hand reference: the same (query, key) pairs, built directly from the padded indices
    seq = batch["input_ids"].shape[1]
    pad = [seq - n for n in lengths]  # left padding
    block = torch.zeros(len(lengths), 1, seq, seq, dtype=torch.bool, device=decoder.device)
    for b, p in enumerate(pad):
        for e in (p + 2, p + 3):
            block[b, 0, (e + 1 if scope == "each" else p + 4):, e] = True
    expected = _hand_block_run(decoder, batch, [0, 1], block)
    clean = logits(decoder, batch)
    rows = real_rows(batch)
    assert near(got[rows], expected[rows], atol=atol), max_diff(got[rows], expected[rows])
    assert not torch.allclose(got[rows], clean[rows], atol=1e-3)  # the knockout did something
    first = 3 if scope == "each" else 4  # positions before the first blocked query are unchanged
    for b, p in enumerate(pad):
        assert near(got[b, p:p + first], clean[b, p:p + first], atol=1e-6 if atol <= 1e-5 else atol)
        changed = not near(got[b, p + 3], clean[b, p + 3], atol=1e-4)
        assert changed == (scope == "each")  # token 3 loses token 2 in "each" only


def test_knockout_on_some_heads_matches_hand_masked_eager(decoder, batch, atol=1e-5):
    seq = batch["input_ids"].shape[1]
    keys = torch.zeros(3, seq, dtype=torch.bool, device=decoder.device)
    keys[:, seq - 3] = True
    ko = Knockout(keys, layers=[1], heads=[0, 2])
    with intervene(decoder, ko):
        got = logits(decoder, batch)
    block = torch.zeros(3, decoder.layout.n_heads, seq, seq, dtype=torch.bool, device=decoder.device)
    block[:, [0, 2], seq - 2:, seq - 3] = True
    expected = _hand_block_run(decoder, batch, [1], block)
    assert near(got[real_rows(batch)], expected[real_rows(batch)], atol=atol), \
        max_diff(got[real_rows(batch)], expected[real_rows(batch)])


def test_batched_padded_knockout_equals_one_prompt_at_a_time(decoder):
    prompts = ["When Mary and John went to the store, John gave", "the war lasted from"]
    keys = [[1, 2], [0]]
    enc = decoder.encode(prompts)
    with intervene(decoder, Knockout.spans(enc["attention_mask"], keys, layers=[0, 2])):
        together = logits(decoder, enc)
    for b, prompt in enumerate(prompts):
        one = decoder.encode(prompt)
        with intervene(decoder, Knockout.spans(one["attention_mask"], [keys[b]], layers=[0, 2])):
            alone = logits(decoder, one)
        n = one["input_ids"].shape[1]
        assert near(together[b, -n:], alone[0], atol=1e-5), max_diff(together[b, -n:], alone[0])


def test_per_example_layer_mask_equals_separate_runs(decoder):
    enc = decoder.encode(["When Mary and John went to the store"] * 2)
    keys = torch.zeros(2, enc["input_ids"].shape[1], dtype=torch.bool, device=decoder.device)
    keys[:, 1] = True
    mask = torch.tensor([[True, False, False], [True, True, True]], device=decoder.device)
    with intervene(decoder, Knockout(keys, layer_mask=mask)):
        both = logits(decoder, enc)
    with intervene(decoder, Knockout(keys[:1], layers=[0])):
        first = logits(decoder, {k: v[:1] for k, v in enc.items()})
    with intervene(decoder, Knockout(keys[:1], layers=[0, 1, 2])):
        second = logits(decoder, {k: v[:1] for k, v in enc.items()})
    assert near(both[0], first[0]) and near(both[1], second[0]), (max_diff(both[0], first[0]),
                                                                   max_diff(both[1], second[0]))


def test_empty_knockout_changes_nothing(decoder, batch):
    keys = torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
    with intervene(decoder, Knockout(keys)):
        got = logits(decoder, batch)
    rows = real_rows(batch)
    plain = logits(decoder, batch)
    assert near(got[rows], plain[rows]), max_diff(got[rows], plain[rows])


def test_knockout_positions_outside_the_prompt_are_refused(decoder):
    enc = decoder.encode(["When Mary", "the war lasted from the year"])
    with pytest.raises(LmlabError, match="outside prompt 0"):
        Knockout.spans(enc["attention_mask"], [[5], [0]])
    with pytest.raises(LmlabError, match="head 9 does not exist"):
        with intervene(decoder, Knockout.spans(enc["attention_mask"], [[0], [0]], heads=[9])):
            pass
    with pytest.raises(LmlabError, match="layer 7 does not exist"):
        with intervene(decoder, Capture("z", layers=7)):
            pass


def _o_proj_slice_run(lm, enc, layer, head, fill):
    d = lm.layout.head_dim

    def pre(module, args):
        x = args[0].clone()
        x[..., head * d:(head + 1) * d] = fill(x[..., head * d:(head + 1) * d])
        return (x,)

    handle = lm.layout.o_proj(layer).register_forward_pre_hook(pre)
    try:
        with using(lm.model, "sdpa"):
            return logits(lm, enc)
    finally:
        handle.remove()


def test_head_ablation_equals_zeroing_the_o_proj_slice(decoder, batch):
    with intervene(decoder, AblateHeads({1: [2]})):
        got = logits(decoder, batch)
    expected = _o_proj_slice_run(decoder, batch, 1, 2, torch.zeros_like)
    assert near(got, expected, atol=1e-6), max_diff(got, expected)
    assert not torch.allclose(got, logits(decoder, batch), atol=1e-4)


def test_mean_and_patch_ablation_equal_writing_the_o_proj_slice(decoder, batch):
    with intervene(decoder, Capture("z")) as cap:
        logits(decoder, batch)
    mean = {0: cap["z", 0].mean(dim=(0, 1))}
    with intervene(decoder, AblateHeads({0: [1]}, mode="mean", reference=mean)):
        got = logits(decoder, batch)
    expected = _o_proj_slice_run(decoder, batch, 0, 1, lambda x: mean[0][1].expand_as(x))
    assert near(got, expected, atol=1e-6), max_diff(got, expected)
    # patching from a corrupted run: the other run's z written into the slice by hand
    corrupted = decoder.encode(["When Mary and John went to the store, Mary gave a drink to",
                                "The war lasted from the year 1745 to the year 17", "the capital of Italy is Rome"])
    assert corrupted["input_ids"].shape == batch["input_ids"].shape
    with intervene(decoder, Capture("z")) as ccap:
        logits(decoder, corrupted)
    with intervene(decoder, AblateHeads({2: [0]}, mode="patch", reference={2: ccap["z", 2]})):
        got = logits(decoder, batch)
    d = decoder.layout.head_dim
    expected = _o_proj_slice_run(decoder, batch, 2, 0, lambda x: ccap["z", 2][..., 0, :].reshape(x.shape))
    assert near(got, expected, atol=1e-6), max_diff(got, expected)
    assert d > 0


def test_patching_a_position_from_a_corrupted_run_reproduces_that_run(decoder):
    clean = decoder.encode("When Mary and John went to the store, John gave a drink to")
    corrupt = decoder.encode("When Mary and John went to the store, Mary gave a drink to")
    diff = (clean["input_ids"] != corrupt["input_ids"])
    assert diff.sum() == 1
    with intervene(decoder, Capture("resid_pre", layers=0)) as cap:
        corrupted_logits = logits(decoder, corrupt)
    with intervene(decoder, PatchResid(0, cap["resid_pre", 0], positions=diff)):
        patched = logits(decoder, clean)
    assert near(patched, corrupted_logits), max_diff(patched, corrupted_logits)
    # and patching a later layer at that position only changes what comes after it
    with intervene(decoder, Capture("resid_pre", layers=2)) as cap2:
        logits(decoder, corrupt)
    with intervene(decoder, PatchResid(2, cap2["resid_pre", 2], positions=diff)):
        partly = logits(decoder, clean)
    first = int(diff[0].nonzero()[0])
    assert near(partly[0, :first], logits(decoder, clean)[0, :first], atol=1e-6)


def test_mlp_activation_edit_matches_the_mlp_by_hand(decoder, batch):
    layer = 0
    mlp = decoder.layout.mlp(layer)
    seen = {}
    handle = mlp.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0].detach()))
    fn = lambda act, l: act * 2.0 - 0.1  # noqa: E731
    try:
        with intervene(decoder, EditMLPAct(fn, layers=layer), Capture("mlp_out", layers=layer)) as (_, cap):
            logits(decoder, batch)
    finally:
        handle.remove()
    x = seen["x"]
    if decoder.family == "llama":
        act = torch.nn.functional.silu(mlp.gate_proj(x))
        expected = mlp.down_proj(fn(act, layer) * mlp.up_proj(x))
    else:  # gpt2: c_proj(act(c_fc(x)))
        act = decoder.layout.mlp_act(layer)(mlp.c_fc(x))
        expected = mlp.c_proj(fn(act, layer))
    assert near(cap["mlp_out", layer], expected), max_diff(cap["mlp_out", layer], expected)


def test_deterministic_sparse_gate_matches_a_hand_computation(decoder, batch):
    layer = 0
    with using(decoder.model, HAND), torch.no_grad():  # raw scores, computed by the reference
        decoder.model(**batch)
    scores = decoder.layout.attn(layer)._test_scores
    causal = scores > torch.finfo(scores.dtype).min / 2
    sparse = SparseAttention(layers=layer, sample=False)
    with intervene(decoder, sparse, Capture("pattern", layers=layer)) as (_, cap):
        logits(decoder, batch)
    gated = (scores > 0) & causal
    has_key = causal.any(-1, keepdim=True)
    empty = ~gated.any(-1, keepdim=True) & has_key
    eye = torch.eye(scores.shape[-1], dtype=torch.bool, device=scores.device)[None, None]
    kept = gated | (empty & eye)
    expected = torch.softmax(scores.masked_fill(~kept, float("-inf")), -1).nan_to_num(0.0)  # padded rows read nothing
    rows = real_rows(batch)[:, None, :, None]
    assert near(cap["pattern", layer] * rows, expected * rows, atol=1e-6)
    expected_edges = torch.sigmoid(scores.masked_fill(~causal, float("-inf")).float()).sum()
    assert near(sparse.expected_edges, expected_edges, atol=0, rtol=1e-5)
    # the self-edge fallback is counted apart, never as an edge the gate kept
    assert sparse.kept_edges == pytest.approx(float(gated.sum()))
    assert sparse.fallback_edges == pytest.approx(float(empty.sum()))
    assert sparse.queries == pytest.approx(float(has_key.sum()))
    assert sparse.edges_per_query == pytest.approx(float(gated.sum()) / float(has_key.sum()))
    assert sparse.total_edges == pytest.approx(float(causal.sum()))


def test_sampled_gate_keeps_an_edge_with_probability_sigmoid_of_its_score():
    from lmlab.interventions.attention import AttnContext

    scores = torch.tensor([[-2.0, -0.5, 0.0, 0.7, 1.5]]).expand(4000, 5)[:, None, None, :].clone()
    allowed = torch.ones_like(scores, dtype=torch.bool)
    sparse = SparseAttention(sample=True, generator=torch.Generator().manual_seed(0))
    ctx = AttnContext(layer=0, batch=4000, q_len=1, kv_len=5, n_heads=1, device=torch.device("cpu"))
    gates = sparse.gate(0, scores.requires_grad_(), allowed, ctx)
    rate = gates.detach()[:, 0, 0].mean(0)
    # rows where every edge dropped get the self edge (position 4); compare the other four
    assert torch.allclose(rate[:4], torch.sigmoid(scores[0, 0, 0, :4]).detach(), atol=0.03)
    gates.sum().backward()  # straight-through: the gradient flows into the scores
    assert scores.grad is not None and scores.grad.abs().sum() > 0


def test_keyed_gate_noise_and_counts_do_not_depend_on_the_batch_or_its_padding(decoder):
    """With keys (as the training loop gives them), an example's sampled gates are the same alone or right-padded
    beside a longer one: its logits match, and the batch's edge counts are the two examples' counts summed
    (padded query rows are not edges). Without keys the noise would differ."""
    from lmlab.interventions.core import keyed_examples

    short, long = [5, 9, 13, 17, 21], [6, 10, 14, 18, 22, 26, 30, 34]
    pad = decoder.tokenizer.pad_token_id or 0

    def run(rows, keys):
        ids = torch.tensor([r + [pad] * (8 - len(r)) for r in rows] if len(rows) > 1 else rows, device=decoder.device)
        mask = torch.tensor([[1] * len(r) + [0] * (ids.shape[1] - len(r)) for r in rows], device=decoder.device)
        gate = SparseAttention(sample=True, keyed=True)
        with keyed_examples(torch.tensor(keys)), intervene(decoder, gate), torch.no_grad():
            out = decoder.model(input_ids=ids, attention_mask=mask).logits
        return out, gate

    alone, g1 = run([short], [11])
    other, g2 = run([long], [12])
    both, g3 = run([short, long], [11, 12])
    assert near(both[0, :5], alone[0]) and near(both[1], other[0])
    for name in ("kept_edges", "fallback_edges", "queries", "total_edges"):
        assert getattr(g3, name) == pytest.approx(getattr(g1, name) + getattr(g2, name))
    assert float(g3.expected_edges) == pytest.approx(float(g1.expected_edges + g2.expected_edges), rel=1e-5)
    assert g1.total_edges == decoder.layout.n_layers * decoder.layout.n_heads * 15  # 5 tokens: 15 causal pairs
    moved, _ = run([short], [13])  # another key: other noise
    assert not torch.allclose(moved, alone, atol=1e-4)


def test_captured_residual_stream_matches_output_hidden_states(decoder, batch):
    with intervene(decoder, Capture("resid_pre")) as cap, torch.no_grad():
        hidden = decoder.model(**batch, output_hidden_states=True).hidden_states
    for layer in range(decoder.layout.n_layers):
        assert torch.equal(cap["resid_pre", layer], hidden[layer])


def test_captured_mlp_activation_matches_the_activation_by_hand(decoder, batch):
    seen = {}
    mlp = decoder.layout.mlp(1)
    handle = mlp.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0].detach()))
    try:
        with intervene(decoder, Capture("mlp_act", layers=1)) as cap:
            logits(decoder, batch)
    finally:
        handle.remove()
    x = seen["x"]
    if decoder.family == "llama":
        expected = torch.nn.functional.silu(mlp.gate_proj(x))
    else:  # GPT-2's gelu_new, written out
        h = mlp.c_fc(x)
        expected = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
    assert near(cap["mlp_act", 1], expected, atol=1e-6), max_diff(cap["mlp_act", 1], expected)


def test_knockout_during_cached_generation_equals_a_cache_free_loop(decoder):
    prompt = "When Mary and John went to the store, John gave"
    enc = decoder.encode(prompt, position_ids=False)
    keys = torch.zeros_like(enc["input_ids"], dtype=torch.bool)
    keys[:, 1:3] = True
    with intervene(decoder, Knockout(keys, layers=[0, 1])), torch.no_grad():
        out = decoder.model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=1,
                                     output_logits=True, return_dict_in_generate=True)
    ids = enc["input_ids"]
    for step in range(5):  # no cache: the whole sequence each step, span blocked from every later query
        grown = torch.zeros_like(ids, dtype=torch.bool)
        grown[:, 1:3] = True
        with intervene(decoder, Knockout(grown, layers=[0, 1])), torch.no_grad():
            last = decoder.model(input_ids=ids).logits[:, -1]
        assert near(out.logits[step], last), max_diff(out.logits[step], last)
        ids = torch.cat([ids, out.sequences[:, ids.shape[1]:ids.shape[1] + 1]], dim=1)


def test_retired_rows_leave_the_leading_rows_as_they_were(decoder, batch):
    """RetireRows drops rows from the end as the pass goes up; every row still present at a layer has the same
    residual stream there as in the full pass (with a per-row knockout acting on the leading rows), cached
    prefix included."""
    from lmlab.interventions import RetireRows

    n_layers, rows = decoder.layout.n_layers, batch["input_ids"].shape[0]
    assert rows >= 3
    keys = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
    keys[:, 2] = True
    layer_mask = torch.ones(rows, n_layers, dtype=torch.bool)
    active = [rows] + [max(1, rows - 1 - l) for l in range(1, n_layers)]
    prefix = {k: v[:, :3] for k, v in batch.items()}
    rest = {k: v[:, 3:] for k, v in batch.items() if k != "attention_mask"}
    results = []
    for retire in (False, True):
        cache = decoder.model(**prefix, use_cache=True).cache
        cap = Capture("resid_post")
        edits = [Knockout(keys, layer_mask=layer_mask), cap] + ([RetireRows(active)] if retire else [])
        with intervene(decoder, *edits):
            decoder.model(**rest, attention_mask=batch["attention_mask"], cache=cache, use_cache=True)
        results.append({l: cap["resid_post", l] for l in range(n_layers)})
    full, cut = results
    for layer in range(n_layers):
        assert cut[layer].shape[0] == active[layer]
        assert near(cut[layer], full[layer][: active[layer]]), max_diff(cut[layer], full[layer][: active[layer]])
    with pytest.raises(LmlabError, match="non-increasing"):
        RetireRows([1, 2])
