"""Greedy generation with a shared prefix and rows leaving the batch, against `generate` on each prompt alone."""

import copy
import dataclasses

import pytest
import torch

from helpers import tolerance
from lmlab.generation import _generate, greedy_answers, shared_prefix_length, stop_tokens


@pytest.fixture(scope="module")
def sharp(decoder):
    """The tiny decoder with larger weights: at the default init its next token hardly depends on the context
    or the positions, so a wrong position or mask would go unnoticed."""
    model = copy.deepcopy(decoder.model)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:  # drawn on the host from a host generator, then written on the model's device
                draw = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), device="cpu")
                p.copy_(0.3 * draw)
    return dataclasses.replace(decoder, model=model)


def _prompts(lm) -> list[list[int]]:
    head = lm.tokenizer("Please reason step by step, and put the final answer in a box.",
                        add_special_tokens=False)["input_ids"]
    tails = ["\nWhat is 3 plus 4?", "\nHow many", "\nMary had 12 apples and gave 5 of them to John. How many", "\n7"]
    return [head + lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in tails]


def _alone(lm, prompt: list[int], new: int, stop: set[int]) -> list[int]:
    """The independent reference: transformers' own generate on one unpadded prompt, cut at a stop token."""
    ids = torch.tensor([prompt], device=lm.device)
    with torch.no_grad():
        out = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                do_sample=False, pad_token_id=lm.tokenizer.pad_token_id, eos_token_id=None)
    gen = out[0, len(prompt):].tolist()
    cut = next((i for i, t in enumerate(gen) if t in stop), len(gen))
    return gen[:cut]


def test_greedy_answers_equal_generating_each_prompt_alone(sharp):
    prompts = _prompts(sharp)
    assert shared_prefix_length(prompts) >= 16  # the shared path is the one exercised
    expected = [_alone(sharp, p, 7, stop_tokens(sharp)) for p in prompts]
    assert len({tuple(e) for e in expected}) == len(expected)  # the rows really differ
    for share in (True, False):
        got = greedy_answers(sharp, prompts, max_new_tokens=7, batch_size=3, stop_at_newline=False,
                             share_prefix=share)
        assert got == expected, share


def test_a_row_that_stops_leaves_the_batch_and_the_others_go_on(sharp):
    prompts = _prompts(sharp)
    free = _generate(sharp, prompts, 8, stop=set(), share_prefix=True, batch_size=len(prompts))  # nothing stops: 8 tokens each
    assert all(len(row) == 8 for row in free)
    token = free[0][2]  # row 0 stops at its third token; any row generating it earlier stops there too
    got = _generate(sharp, prompts, 8, stop={token}, share_prefix=True, batch_size=len(prompts))
    for row, full in zip(got, free):
        cut = full.index(token) if token in full else len(full)
        assert row == full[:cut]
    assert len(got[0]) <= 2


def test_shared_prefix_leaves_every_prompt_a_token_and_ignores_short_ones():
    assert shared_prefix_length([[1] * 20, [1] * 20]) == 19
    assert shared_prefix_length([[1] * 20 + [2], [1] * 20 + [3, 4]]) == 20
    assert shared_prefix_length([[1] * 10 + [2], [1] * 10 + [3]]) == 0  # below the minimum: not worth a pass
    assert shared_prefix_length([[5] * 30, [6] * 30]) == 0


def test_sampling_is_seeded_and_stays_in_the_nucleus():
    from lmlab.generation import next_token

    logits = torch.tensor([[4.0, 3.9, 0.0, -2.0]] * 2000)
    greedy = next_token(logits)
    assert (greedy == 0).all()
    a = next_token(logits, 1.0, 1.0, torch.Generator().manual_seed(5))
    b = next_token(logits, 1.0, 1.0, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and set(a.tolist()) >= {0, 1, 2}
    nucleus = next_token(logits, 1.0, 0.9, torch.Generator().manual_seed(5))
    assert set(nucleus.tolist()) == {0, 1}  # p(0) + p(1) = 0.96 >= 0.9: the tail is never drawn


def test_waiting_prompts_join_the_running_batch_and_match_generating_alone(sharp, monkeypatch):
    """Rows that end early make room; waiting prompts join the running batch, their cache aligned to it by masked
    columns (or the running rows' to theirs, when theirs is longer). Every answer still equals `generate` alone."""
    import lmlab.generation as generation

    tok = sharp.tokenizer
    head = tok("Please reason step by step, and put the final answer in a box.", add_special_tokens=False)["input_ids"]
    # row 0 ends at once, so the long third prompt joins the second early (the running rows get the gap);
    # row 1 ends at its fourth token, so short prompts join the long one (they get it)
    tails = ["\n7", "\nWhat is 3 plus 4?", "\nMary had 12 apples and gave 5 of them to John, who ate two of them and "
             "gave the rest to his sister. How many", "\nHow many", "\n2 + 2 =", "\nA farmer has 17 sheep; all but "
             "nine run away. How many are left?", "\nx", "\nThe answer is"]
    prompts = [head + tok(t, add_special_tokens=False)["input_ids"] for t in tails]
    free = [_alone(sharp, p, 9, set()) for p in prompts]
    stop = {free[0][0], free[1][3]}
    expected = [_alone(sharp, p, 9, stop) for p in prompts]
    assert len({len(e) for e in expected}) >= 3, expected  # rows end at different steps
    calls, gaps = [], set()
    real = generation._insert_gap

    def spy(cache, mask, at, width):  # called for the joining rows, then for the running ones
        if width > 0:
            gaps.add("joining" if len(calls) % 2 == 0 else "running")
        calls.append(width)
        return real(cache, mask, at, width)

    monkeypatch.setattr(generation, "_insert_gap", spy)
    for share in (True, False):
        got = _generate(sharp, prompts, 9, stop=stop, share_prefix=share, batch_size=2)
        assert got == expected, share
    assert gaps == {"joining", "running"}, gaps  # both alignments were exercised



def test_a_roomy_cache_layer_holds_what_transformers_growing_layer_holds(monkeypatch):
    """The in-place layer against transformers' own: the same updates (prefill, steps past its room, rows leaving,
    keys replaced from outside as rows joining do) leave the same keys and values, and return them."""
    import lmlab.generation as generation
    from transformers.cache_utils import DynamicLayer

    monkeypatch.setattr(generation, "ROOM", 4)
    g = torch.Generator().manual_seed(0)
    plain, roomy = DynamicLayer(), DynamicLayer()
    roomy.__class__ = generation._RoomyLayer

    def both(k, v):
        a, b = plain.update(k, v), roomy.update(k.clone(), v.clone())
        assert all(torch.equal(x, y) for x, y in zip(a, b))

    both(torch.randn(5, 2, 7, 3, generator=g), torch.randn(5, 2, 7, 3, generator=g))  # a prefill
    for step in range(15):
        both(torch.randn(len(plain.keys), 2, 1, 3, generator=g), torch.randn(len(plain.keys), 2, 1, 3, generator=g))
        if step == 6:
            keep = torch.tensor([0, 2, 4])
            plain.batch_select_indices(keep)
            roomy.batch_select_indices(keep)
        if step == 9:  # a join: keys and values replaced by longer tensors from outside
            extra = torch.randn(len(plain.keys), 2, 2, 3, generator=g)
            plain.keys = roomy.keys = torch.cat([extra, plain.keys], dim=-2)
            plain.values = roomy.values = torch.cat([extra, plain.values], dim=-2)
        assert torch.equal(plain.keys, roomy.keys) and torch.equal(plain.values, roomy.values)
    assert roomy.keys.data_ptr() == roomy._buffers[0].data_ptr()  # a view of its buffer, not a copy


def test_finished_rows_wait_in_the_batch_and_every_answer_still_equals_generating_alone(sharp, monkeypatch):
    """At a large batch a finished row stays (its tokens dropped) until an eighth of the batch has finished, and
    the cache grows in place through its room many times: the answers still equal `generate` on each prompt."""
    import lmlab.generation as generation

    monkeypatch.setattr(generation, "ROOM", 3)
    tok = sharp.tokenizer
    head = tok("Please reason step by step, and put the final answer in a box.", add_special_tokens=False)["input_ids"]
    tails = [f"\nWhat is {a} plus {b}?" for a, b in [(3, 4), (10, 7), (1, 1), (25, 17), (6, 9), (40, 2)]]
    tails += ["\nHow many", "\n7", "\nThe answer is", "\nx", "\nMary had 12 apples. How many", "\n2 + 2 ="]
    prompts = [head + tok(t, add_special_tokens=False)["input_ids"] for t in tails]
    free = [_alone(sharp, p, 16, set()) for p in prompts]
    # stop tokens each row alone generates (at its earliest such step), so rows end one at a time
    own = {}
    for i, row in enumerate(free):
        others = {t for j, r in enumerate(free) if j != i for t in r}
        step = next((k for k, t in enumerate(row[1:12], 1) if t not in others and t not in row[:k]), None)
        if step is not None and step not in own.values():
            own[row[step]] = step
    stop = set(list(own)[:2])
    expected = [_alone(sharp, p, 16, stop) for p in prompts]
    assert len({len(e) for e in expected}) == 3, expected  # two rows end early, at different steps
    seen = []
    real = generation._Running.drop_finished

    def spy(self, *args):
        real(self, *args)
        seen.append((len(self.rows), self.n_live, {type(layer) for layer in self.cache.layers}))

    monkeypatch.setattr(generation._Running, "drop_finished", spy)
    assert _generate(sharp, prompts, 16, stop=stop, share_prefix=True, batch_size=12) == expected
    assert any(0 < live < rows for rows, live, _ in seen), seen  # finished rows waited in the batch
    assert all(types == {generation._RoomyLayer} for _, _, types in seen)

def test_last_token_features_with_a_shared_prefix_equal_each_sequence_alone(decoder):
    from lmlab.generation import last_token_features, prefix_cache

    sharp = decoder  # (the `sharp` fixture's copied weights are not the ones the layout's hooks sit on)
    seqs = _prompts(sharp)
    assert prefix_cache(sharp, seqs)[0] >= 16  # the prefix is shared (one run, copied to every batch)
    layers = list(range(sharp.layout.n_layers))
    shared = last_token_features(sharp, seqs, layers, batch_size=3)
    alone = [last_token_features(sharp, [s], layers, share_prefix=False)[0] for s in seqs]
    tol = tolerance(sharp.model.dtype)["atol"]  # the states were computed in the model's dtype
    for got, want in zip(shared, alone):
        assert abs(got - want).max() < tol
    unshared = last_token_features(sharp, seqs, layers, batch_size=3, share_prefix=False)
    assert abs(shared - unshared).max() < tol
    assert abs(shared[0] - shared[1]).max() > 1e-2  # rows differ: a wrong mask or position would show


def test_the_generation_cache_benchmark_gives_both_loops_the_same_answers():
    """`lmlab bench --only generation-cache`: the in-place cache against transformers' copying one, the same answers."""
    import lmlab.generation as generation
    from lmlab.benchmarks.generation import generation_cache_bench

    rows = generation_cache_bench(model="tiny-llama", repeats=1, new=8)
    assert [r["case"] for r in rows] == ["S3, batch 64: copying", "S3, batch 64: in place"]
    assert all(r["value"] > 0 for r in rows) and "answers identical: 64 of 64" in rows[0]["setup"]
    assert generation.IN_PLACE and generation.LEAVE_AT == 8  # the loop is left as it runs


def test_a_generation_past_the_context_is_refused_before_it_starts():
    """tiny-gpt2's learned positions end at 256: a 250-token prompt with 8 new tokens would index past them."""
    from lmlab import LmlabError
    from lmlab.models import load_model

    lm = load_model("tiny-gpt2")
    with pytest.raises(LmlabError, match="a prompt of 250 tokens and 8 new ones are longer than tiny-gpt2's context "
                                         "of 256 tokens"):
        greedy_answers(lm, [[5] * 250], max_new_tokens=8)
    assert len(greedy_answers(lm, [[5] * 240], max_new_tokens=8, stop_at_newline=False)[0]) <= 8
