"""S4: circuit tasks, attribution vs activation patching, the sparse gate, GECO, sparse save/load, verdict."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from lmlab import circuits
from lmlab.studies.sparse_circuits.toy import model as toy
from lmlab.data.generated.circuits import TASKS, CircuitPrompt, CircuitTask, make_task, task_metric
from lmlab.errors import LmlabError
from lmlab.interventions import Capture, SparseAttention, installed, intervene
from lmlab.interventions.attention import gated_softmax
from conftest import PROMPTS
from helpers import max_diff, near
from lmlab.models import load_model, save_model
from lmlab.studies import sparse_circuits as study
from lmlab.studies.sparse_circuits.analysis import verdict
from lmlab.studies.sparse_circuits.circuit_analysis import derive
from lmlab.studies.result import from_rows
from lmlab.train import TrainConfig
from lmlab.train.geco import GECO
from lmlab.train.sparse import sparse_post_train

# --- tasks ------------------------------------------------------------------------------------------------


@pytest.mark.embedded
@pytest.mark.parametrize("name", TASKS)
def test_tasks_pair_up_and_repeat(embedded_smollm, name):
    tok = embedded_smollm.tokenizer
    task = make_task(name, tok, 12, seed=3)
    again = make_task(name, tok, 12, seed=3)
    assert [p.clean for p in task.prompts] == [p.clean for p in again.prompts]
    assert [p.clean for p in task.prompts] != [p.clean for p in make_task(name, tok, 12, seed=4).prompts]
    for p in task.prompts:
        assert len(p.clean) == len(p.corrupted) and p.clean != p.corrupted
        differing = [i for i, (a, b) in enumerate(zip(p.clean, p.corrupted)) if a != b]
        assert len(differing) <= 2  # one swapped token (two for a year's tens digit at most)
        if task.metric == "logit_diff":
            assert p.answer != p.distractor
            assert tok.decode([p.answer]).strip() in p.clean_text
        else:
            assert p.above and p.below and not set(p.above) & set(p.below)


@pytest.mark.embedded
def test_embedded_model_solves_ioi(embedded_smollm):
    task = make_task("ioi", embedded_smollm.tokenizer, 16, seed=0)
    clean = circuits.metric_values(embedded_smollm, task)
    corrupted = circuits.metric_values(embedded_smollm, task, corrupted=True)
    assert (clean > 0).mean() >= 0.9 and clean.mean() > 2
    assert corrupted.mean() < 0  # the corruption flips the answer


@pytest.mark.embedded
def test_the_induction_task_repeats_a_sequence_and_the_embedded_model_completes_it(embedded_smollm):
    """Induction: 8 words, then their first k again; the answer is the word that followed them the first time, the
    corrupted prompt's first copy is 8 other words (so nothing says what comes next), the distractor a word of
    neither copy; pairs repeat with the seed. SmolLM2-135M completes the clean repeat and not the corrupted one."""
    from lmlab.data.generated.circuits import INDUCTION_LENGTH

    tok = embedded_smollm.tokenizer
    task = make_task("induction", tok, 16, seed=0)
    assert [p.clean for p in task.prompts] == [p.clean for p in make_task("induction", tok, 16, seed=0).prompts]
    for p in task.prompts:
        assert len(p.clean) == len(p.corrupted)
        words = p.clean_text.split()
        k = len(words) - INDUCTION_LENGTH
        assert 2 <= k < INDUCTION_LENGTH and words[INDUCTION_LENGTH:] == words[:k]
        assert tok.decode([p.answer]).strip() == words[k]
        other = p.corrupted_text.split()
        assert not set(other[:INDUCTION_LENGTH]) & set(words) and other[INDUCTION_LENGTH:] == words[:k]
        assert tok.decode([p.distractor]).strip() not in words + other
    clean = circuits.metric_values(embedded_smollm, task)
    corrupted = circuits.metric_values(embedded_smollm, task, corrupted=True)
    assert (clean > 0).mean() >= 0.9 and clean.mean() > corrupted.mean() + 2


def test_induction_scores_equal_attention_weights_read_off_the_eager_model(decoder32):
    """Each head's induction score against an independent computation: every prompt run alone through the model's
    own eager attention (output_attentions), the weight from each repeated token to the one after its earlier
    occurrence averaged by hand; prompts of different lengths, so the batch pads and the targets shift."""
    lm = decoder32
    rng = np.random.default_rng(3)
    prompts = []
    for n in (5, 7, 6, 4, 8):
        first = [int(x) for x in rng.choice(np.arange(5, 200), size=n, replace=False)]
        ids = first + first[:n - 1]  # the repeat of all but the last: each repeated token's next is known
        prompts.append(CircuitPrompt(tuple(ids), tuple(ids), "", "", answer=first[-1], distractor=3))
    task = CircuitTask("rep", "logit_diff", prompts)
    got = circuits.induction_scores(lm, task, batch_size=2)
    model = lm.model
    was = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        total, count = np.zeros_like(got), 0
        for p in prompts:
            ids = torch.tensor([p.clean], device=lm.device)
            with torch.no_grad():
                att = model(input_ids=ids, output_attentions=True).attentions  # per layer (1, heads, q, k)
            n = (len(p.clean) + 1) // 2
            for t in range(n, len(p.clean)):  # the repeated token at t first stood at t - n; after it, t - n + 1
                for layer, a in enumerate(att):
                    total[layer] += a[0, :, t, t - n + 1].float().cpu().numpy()
                count += 1
    finally:
        model.set_attn_implementation(was)
    assert np.allclose(got, total / count, atol=1e-5), np.abs(got - total / count).max()
    assert circuits.induction_targets(torch.tensor([[0, 7, 8, 7, 8]]), torch.tensor([[0, 1, 1, 1, 1]])) == [(0, 3, 2),
                                                                                                            (0, 4, 3)]


@pytest.mark.embedded
def test_the_embedded_model_has_induction_heads(embedded_smollm):
    """SmolLM2-135M on the induction task: its best head pays most of its attention to the induction target, far
    above the heads' mean (a head spreading attention evenly over ~12 tokens would score about 0.08)."""
    scores = circuits.induction_scores(embedded_smollm, make_task("induction", embedded_smollm.tokenizer, 16, seed=0))
    assert np.nanmax(scores) > 0.5 and np.nanmean(scores) < 0.2, (np.nanmax(scores), np.nanmean(scores))


def test_unknown_task_lists_registered(tiny_llama):
    with pytest.raises(LmlabError, match="registered tasks: ioi, greater-than"):
        make_task("ioi-short", tiny_llama.tokenizer, 4)


def test_split_answer_token_is_named(tiny_llama):
    # the tiny test tokenizer has no single token for most names: the error names the one it split
    with pytest.raises(LmlabError, match=r"splits ' \w+' into \d+ tokens"):
        make_task("ioi", tiny_llama.tokenizer, 4)


def test_greater_than_metric_is_mass_above_minus_below():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    prompt = CircuitPrompt((1,), (1,), "", "", above=(2, 3), below=(0,))
    assert task_metric(logits, [prompt], "prob_diff").item() == pytest.approx(0.7 - 0.1)


# --- attribution vs activation patching on a model where the answer is known -----------------------------

def _one_head_model(device, seed=0):
    """tiny-llama (float32, on the test's device) with every head's o_proj slice zeroed except layer 1 head 2: only
    that head can move information between positions, so it alone carries the corruption to the last position."""
    lm = device.load("tiny-llama", seed=seed, dtype=torch.float32)
    layout = lm.layout
    d = layout.head_dim
    with torch.no_grad():
        for layer in range(layout.n_layers):
            w = layout.o_proj(layer).weight
            for head in range(layout.n_heads):
                if (layer, head) != (1, 2):
                    w[:, head * d:(head + 1) * d] = 0
    return lm


def _tiny_task(lm, n=6):
    rng = np.random.default_rng(0)
    prompts = []
    for _ in range(n):
        ids = [int(x) for x in rng.integers(5, 200, size=7)]
        corrupted = list(ids)
        corrupted[2] = int(rng.integers(5, 200))
        prompts.append(CircuitPrompt(tuple(ids), tuple(corrupted), "", "", answer=11, distractor=12))
    return CircuitTask("toy", "logit_diff", prompts)


def test_attribution_and_activation_find_the_known_head(device):
    lm = _one_head_model(device)
    task = _tiny_task(lm)
    attr = circuits.attribution_scores(lm, task, batch_size=4)
    act = circuits.activation_scores(lm, task, batch_size=4)
    assert circuits.ranking(attr)[0] == (1, 2) and circuits.ranking(act)[0] == (1, 2)
    others = np.ones_like(act, dtype=bool)
    others[1, 2] = False
    assert np.abs(act[others]).max() < 1e-5 and np.abs(attr[others]).max() < 1e-5
    assert abs(act[1, 2]) > 1e-3
    # first order: same sign and the same size within a factor (the head's effect is nearly linear here)
    assert np.sign(attr[1, 2]) == np.sign(act[1, 2]) and 0.3 < attr[1, 2] / act[1, 2] < 3


def _identical_pairs(seed: int, n: int = 4) -> CircuitTask:
    """Random 6-token prompts whose corrupted copy is the prompt itself (the tests nudge activations instead)."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(n):
        ids = tuple(int(x) for x in rng.integers(5, 200, size=6))
        prompts.append(CircuitPrompt(ids, ids, "", "", answer=11, distractor=12))
    return CircuitTask("same", "logit_diff", prompts)


def test_attribution_matches_activation_to_first_order(decoder32):
    """With a corruption that barely moves anything, gradient x delta equals the exact patch effect."""
    decoder = decoder32
    task = _identical_pairs(seed=1)
    z_clean = circuits.corrupted_z(decoder, task, 4)
    # corrupted activations = clean ones nudged by a small random direction
    gen = torch.Generator().manual_seed(0)
    z_corr = [{l: z + 1e-3 * torch.randn(z.shape, generator=gen, device="cpu").to(z.device) for l, z in zs.items()}
              for zs in z_clean]
    heads = [(0, 0), (1, 1), (0, 3)]
    attr = circuits.attribution_scores(decoder, task, 4, z_corr=z_corr)
    act = circuits.activation_scores(decoder, task, 4, z_corr=z_corr, heads=heads)
    for l, h in heads:
        assert attr[l, h] == pytest.approx(act[l, h], rel=0.05, abs=1e-6)


def test_mlp_patch_equals_a_hand_computed_last_layer(tiny_llama):
    """Patching the last MLP's output with R = recomputing the logits by hand from the last block's
    output with its MLP contribution swapped for R (final norm + lm_head applied directly)."""
    from lmlab.interventions import PatchOutput

    lm = tiny_llama
    last = lm.layout.n_layers - 1
    batch = lm.encode(["the capital of France is Paris", "John gave a drink to Mary"])
    with torch.no_grad(), intervene(lm, Capture("resid_post", "mlp_out")) as cap:
        lm.model(**batch)
    replacement = torch.randn_like(cap["mlp_out", last])
    with torch.no_grad(), intervene(lm, PatchOutput("mlp_out", {last: replacement})):
        patched = lm.model(**batch).logits
    hidden = cap["resid_post", last] - cap["mlp_out", last] + replacement
    with torch.no_grad():
        by_hand = lm.model.lm_head(lm.model.model.norm(hidden))
    assert near(patched, by_hand, atol=1e-4, rtol=1e-4), max_diff(patched, by_hand)
    with pytest.raises(LmlabError, match="patches mlp_out or attn_out"):
        PatchOutput("z", {0: replacement})


def test_mlp_components_attribution_matches_activation(decoder32):
    """MLPs as components: scores gain a column per layer, gradient x delta matches the exact patch to
    first order, and the effect curve over heads and MLPs still ends at clean / fully patched."""
    decoder = decoder32
    task = _identical_pairs(seed=3)
    clean = circuits.corrupted_z(decoder, task, 4, mlps=True)
    gen = torch.Generator().manual_seed(0)
    # small next to the MLP outputs (~0.01 here): GPT-2's first MLP is visibly curved at 1e-3
    z_corr = [{k: v + 1e-4 * torch.randn(v.shape, generator=gen, device="cpu").to(v.device) for k, v in zs.items()}
              for zs in clean]
    n_heads = decoder.layout.n_heads
    attr = circuits.attribution_scores(decoder, task, 4, z_corr=z_corr)
    assert attr.shape == (decoder.layout.n_layers, n_heads + 1)
    comps = [(0, n_heads), (1, n_heads), (1, 0)]
    act = circuits.activation_scores(decoder, task, 4, z_corr=z_corr, heads=comps)
    for l, h in comps:
        assert attr[l, h] == pytest.approx(act[l, h], rel=0.05, abs=1e-7)
    order = circuits.ranking(attr)
    curve = circuits.effect_curve(decoder, task, order, grid=[0, 2, len(order)], batch_size=4, z_corr=z_corr)
    np.testing.assert_allclose(curve.clean, circuits.metric_values(decoder, task, 4), atol=1e-5)
    with intervene(decoder, *circuits.patch_all_but(decoder, order, z_corr[0])):
        with torch.no_grad():
            every = task_metric(decoder.model(**decoder.pad_batch([list(p.clean) for p in task.prompts])).logits[:, -1],
                                task.prompts, "logit_diff")
    np.testing.assert_allclose(curve.none, every.cpu().numpy(), atol=1e-5)


def test_effect_curve_ends_at_clean_and_fully_patched(decoder32):
    lm = decoder32
    rng = np.random.default_rng(2)
    prompts = []
    for _ in range(4):
        ids = [int(x) for x in rng.integers(5, 200, size=6)]
        bad = list(ids)
        bad[1] = int(rng.integers(5, 200))
        prompts.append(CircuitPrompt(tuple(ids), tuple(bad), "", "", answer=11, distractor=12))
    task = CircuitTask("t", "logit_diff", prompts)
    order = circuits.ranking(circuits.attribution_scores(lm, task, 4))
    curve = circuits.effect_curve(lm, task, order, grid=[0, 3, len(order)], batch_size=4)
    np.testing.assert_allclose(curve.clean, circuits.metric_values(lm, task, 4), atol=1e-5)
    ee = curve.explained()
    assert ee[0] == pytest.approx(0.0) and ee[-1] == pytest.approx(1.0)
    assert circuits.heads_grid(270)[:3] == [0, 1, 2] and circuits.heads_grid(270)[-1] == 270


def test_patched_metrics_patch_any_sets_as_one_forward_per_set_does(decoder32):
    """`patched_metrics` (sets as blocks of one batch, at most max_rows rows a pass) equals one full forward pass per
    set through `patch_all_but` (the reference the effect curve is checked against), for sets no ranking's tail
    gives, and with sets split over passes."""
    lm = decoder32
    rng = np.random.default_rng(5)
    prompts = []
    for _ in range(5):
        ids = [int(x) for x in rng.integers(5, 200, size=6)]
        bad = list(ids)
        bad[2] = int(rng.integers(5, 200))
        prompts.append(CircuitPrompt(tuple(ids), tuple(bad), "", "", answer=11, distractor=12))
    task = CircuitTask("t", "logit_diff", prompts)
    z_corr = circuits.corrupted_z(lm, task, 2)
    heads = [(l, h) for l in range(lm.layout.n_layers) for h in range(lm.layout.n_heads)]
    sets = [[heads[i] for i in rng.choice(len(heads), size=k, replace=False)] for k in (0, 1, 3, len(heads) - 2)]
    got = circuits.patched_metrics(lm, task, sets, batch_size=2, z_corr=z_corr, max_rows=4)
    for row, patched in zip(got, sets):
        reference = circuits.metric_values(lm, task, 2, interventions_for=lambda i, p=patched: circuits.patch_all_but(
            lm, p, z_corr[i])) if patched else circuits.metric_values(lm, task, 2)
        np.testing.assert_allclose(row, reference, atol=1e-5)


def _planted(n_prompts=12, n_heads=12, noise=1.0, seed=0):
    """A planted circuit task without a model: each head h adds w_h x c_p to prompt p's metric when kept clean
    (so any set's explained effect is its share of sum w, the same on every prompt), and each prompt pair's
    attribution of h is w_h plus noise. (per-prompt attribution, the metric of any patched set, weights)."""
    rng = np.random.default_rng(seed)
    w = np.sort(rng.exponential(1.0, n_heads))[::-1]
    c = rng.uniform(0.5, 1.5, n_prompts)
    per = (w[None, :] + noise * rng.normal(size=(n_prompts, n_heads))).reshape(n_prompts, 2, n_heads // 2)
    heads = [(l, h) for l in range(2) for h in range(n_heads // 2)]
    weight = dict(zip(heads, w))

    def measure(sets):
        kept = [w.sum() - sum(weight[x] for x in patched) for patched in sets]
        return np.array(kept)[:, None] * c[None, :]
    return per, measure, w


def test_each_resample_ranks_the_heads_on_its_own_draw():
    """On a planted task whose explained effect is a set's share of the weights on every prompt, a ranking fixed on
    all the prompt pairs needs the same heads on every resample (an interval of width 0: the prompts' own noise
    cancels out of the ratio), while ranking again on each draw picks other heads on some draws and needs more of
    them: the selection's noise, which the fixed ranking leaves out. The draws' heads needed, read from the top down
    to the first point under 0.9 (resample.py), equal those of the whole curve measured on each draw's ranking; and a
    draw of every pair once reproduces the fixed ranking's answer."""
    from lmlab.studies.sparse_circuits.resample import heads_needed_per_draw, measure_draws, prompt_draws

    per, measure, w = _planted()
    grid = list(range(13))
    order = circuits.ranking(per.mean(0))
    values = measure([order[n:] for n in grid])
    curve = circuits.EffectCurve(grid, values, values[-1], values[0])
    draws = prompt_draws(12, 40, seed=0)
    fixed = np.array([curve.heads_needed(0.9, idx) for idx in draws], dtype=float)
    assert np.ptp(fixed) == 0  # the ranking fixed: every resample needs the same heads
    rows = measure_draws(per, curve, draws, 0.9, measure)
    again = heads_needed_per_draw(pd.DataFrame(rows), draws, curve, 0.9)
    assert np.ptp(again) > 0 and (again >= fixed).mean() > 0.5  # re-ranked: other heads on some draws
    for b in range(0, 40, 7):  # the whole curve on draw b's own ranking, by brute force
        idx = draws[b]
        mine = circuits.ranking(per[idx].mean(0))
        whole = measure([mine[n:] for n in grid])
        brute = circuits.EffectCurve(grid, whole, whole[-1], whole[0]).heads_needed(0.9, idx)
        assert again[b] == brute
    assert len(rows) < len(draws) * (len(grid) - 2)  # the points under the first miss are not measured
    everyone = np.arange(12)[None, :]
    assert heads_needed_per_draw(pd.DataFrame(measure_draws(per, curve, everyone, 0.9, measure)), everyone, curve,
                                 0.9)[0] == curve.heads_needed(0.9)


def test_the_multipliers_interval_comes_from_the_re_ranked_draws():
    """The model's multiplier claims read the re-ranked draws: with them the interval is built from those draws (a
    planted sparse model whose heads are re-ranked to need more on some draws widens it against the fixed ranking's),
    the gate says they were used; without them (a run recorded before), the interval resamples the pairs under the
    fixed ranking and the gate blocks "reproduced"."""
    good = {t: (8, 4) for t in TASKS}
    with_draws = verdict(from_rows("sparse-circuits", _table(good, 0.01, 0.02)))
    fixed = verdict(from_rows("sparse-circuits", _table(good, 0.01, 0.02, reranked=False)))
    assert with_draws.status == "reproduced" and fixed.status == "inconclusive"
    assert _decisions(with_draws)["heads re-ranked on each resample"] == (True, "yes")
    assert _decisions(fixed)["heads re-ranked on each resample"] == (False, "yes")
    mean = next(c for c in with_draws.evidence["claims"] if c["name"] == "mean log2 multiplier over the tasks")
    assert "re-ranked on each of 20 resamples" in mean["method"]

    # one task's sparse replicates re-ranked onto other heads on half the draws: 8 heads needed there, not 4
    table = _table({"ioi": (8, 4)}, 0.01, 0.02)
    rerank = (table["kind"] == "rerank") & (table["variant"] == "sparse") & (table["draw"] % 2 == 0)
    table.loc[rerank & (table["n_heads"] < 8), "value"] = 0.5
    widened = next(c for c in verdict(from_rows("sparse-circuits", table)).evidence["claims"]
                   if c["name"] == "mean log2 multiplier over the tasks")
    planted = next(c for c in verdict(from_rows("sparse-circuits", _table({"ioi": (8, 4)}, 0.01, 0.02))).evidence[
        "claims"] if c["name"] == "mean log2 multiplier over the tasks")
    assert widened["estimate"] == pytest.approx(planted["estimate"])  # the estimate ranks on every pair, as before
    assert widened["se_item"] > 5 * planted["se_item"] + 0.1


# --- the gate ---------------------------------------------------------------------------------------------

def test_gated_softmax_gradient_stays_finite_when_kept_weights_underflow():
    # the only kept edge has a score 200 below a dropped one: a plain softmax gives it weight 0 exactly,
    # and renormalising 0/0 used to poison every gradient with NaN
    scores = torch.tensor([[0.0, 200.0, -1.0]], requires_grad=True)
    gate = torch.tensor([[1.0, 0.0, 0.0]], requires_grad=True)
    w = gated_softmax(scores, gate)
    assert torch.allclose(w, torch.tensor([[1.0, 0.0, 0.0]]))
    (w * torch.tensor([[1.0, 2.0, 3.0]])).sum().backward()
    assert torch.isfinite(scores.grad).all() and torch.isfinite(gate.grad).all()


def test_gated_softmax_equals_softmax_over_kept_edges():
    scores = torch.randn(2, 3, 5)
    gate = (torch.rand(2, 3, 5) > 0.4).float()
    gate[..., 0] = 1
    expected = torch.softmax(scores.masked_fill(gate == 0, float("-inf")), -1)
    torch.testing.assert_close(gated_softmax(scores, gate), expected)


def test_expected_edges_counted_directly(decoder32):
    decoder = decoder32
    batch = decoder.encode(PROMPTS)
    gate = SparseAttention(sample=False)
    cap_scores = {}
    from lmlab.interventions import Capture

    with intervene(decoder, gate, Capture("scores")) as (_, cap):
        decoder.model(**batch)
        for layer in range(decoder.layout.n_layers):
            cap_scores[layer] = cap["scores", layer]
    # direct count over the model's own allowed (causal, non-padded) pairs
    mask = batch["attention_mask"].bool()
    n = mask.shape[1]
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=mask.device))
    allowed = causal[None] & mask[:, None, :]  # (B, Q, K)
    expected, total = 0.0, 0.0
    for layer, s in cap_scores.items():
        ok = allowed[:, None].expand_as(s)
        expected += torch.sigmoid(s[ok]).sum().item()
        total += ok.sum().item()
    assert gate.total_edges == pytest.approx(total)
    assert gate.expected_edges.item() == pytest.approx(expected, rel=1e-5)


# --- GECO ----------------------------------------------------------------------------------------------

def test_geco_multiplier_rises_when_violated_and_falls_when_held():
    g = GECO(tau=1.0, rate=0.5, alpha=0.5, initial=1.0)
    values = [g.update(2.0) for _ in range(5)]  # CE above tau: violated
    assert all(b > a for a, b in zip([1.0] + values, values))
    top = values[-1]
    falling = [g.update(0.0) for _ in range(10)]
    assert falling[-1] < top and falling[-1] < falling[3]
    loss = g.loss(torch.tensor(0.3), torch.tensor(1.5))
    assert loss.item() == pytest.approx(0.3 + g.multiplier * 0.5)
    h = GECO(tau=0.0, rate=0.5, alpha=0.5)  # hyperparameters come from the config, the state from the file
    h.load_state_dict(g.state_dict())
    assert h.update(0.7) == g.update(0.7)
    assert h.trace == g.trace and len(g.trace) == 16


def test_geco_on_a_scripted_loss_holds_the_constraint_when_it_can():
    """A scripted problem: minimise (x - 3)^2 subject to x <= 1; the optimum is x = 1 with lambda = 4. From
    lambda = 1 the multiplier must climb while the constraint is violated and settle near 4 with it held."""
    from lmlab.train.geco import sized_rate

    steps = 200
    x = torch.tensor(0.0, requires_grad=True)
    opt = torch.optim.SGD([x], lr=0.05)
    g = GECO(tau=1.0, rate=sized_rate(steps, 0.5), alpha=0.9, initial=1.0)
    xs, lams = [], []
    for _ in range(steps):
        loss = g.loss((x - 3.0) ** 2, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lams.append(g.update(float(x.detach())))
        xs.append(float(x.detach()))
    assert xs[20] > 1.5 and lams[60] > lams[20]  # violated early: lambda climbs
    assert abs(xs[-1] - 1.0) < 0.2 and np.mean(xs[-50:]) < 1.1 and 3.0 < lams[-1] < 5.0
    assert sized_rate(400, 0.1) == pytest.approx(sized_rate(100, 0.1) / 4)


def test_geco_with_a_bound_per_batch_ignores_the_spread_between_batches():
    """Noisy batches whose CE sits 0.05 under their own dense CE: with per-batch bounds the constraint holds
    at every step and lambda only falls; against one fixed tau the same CEs read as violated half the time."""
    rng = np.random.default_rng(0)
    refs = 3.4 + 0.3 * rng.standard_normal(40)
    paired, fixed = GECO(tau=3.5, rate=2.0, alpha=0.5), GECO(tau=3.5, rate=2.0, alpha=0.5)
    for ref in refs:
        paired.update(ref + 0.05, tau=ref + 0.1)
        fixed.update(ref + 0.05)
    assert all(ema < 0 for _, _, ema, _ in paired.trace)
    assert all(b[3] < a[3] for a, b in zip(paired.trace, paired.trace[1:]))
    assert any(ema > 0 for _, _, ema, _ in fixed.trace)
    assert [t[1] for t in paired.trace] == pytest.approx(list(refs + 0.1))  # each step's bound is on record
    assert paired.loss(torch.tensor(0.2), torch.tensor(3.0), tau=3.1).item() == pytest.approx(
        0.2 + paired.multiplier * -0.1)


def test_post_training_records_the_bound_a_batch_brings(tmp_path):
    data = toy.addition_data(n_test=50)
    cfg = TrainConfig(steps=3, batch_size=8, lr=1e-3, schedule="constant", checkpoint_every=10, progress=False)
    model = toy.build_toy(seed=0, d_model=32, n_layers=2, n_heads=2).model
    out = sparse_post_train(model, data.train[:40], toy.collate, lambda m, b: (toy.answer_loss(m, b), 50.0), 2.0,
                            cfg, tmp_path / "p")
    assert [t[1] for t in out.geco.trace] == [50.0] * 3
    assert out.geco.holds and out.geco.multiplier < 1.0  # CE far under its per-batch bound, whatever 2.0 says


def test_dense_reference_is_the_dense_loss_of_the_same_batch(device):
    """The per-batch bound equals the dense model's own training loss on that batch: token-weighted over
    sequences of different lengths, as the loss that post-training compares with it (in float32: rel 1e-4)."""
    from lmlab.studies.sparse_circuits.measure import reference_batch, with_dense_reference

    lm = device.load("tiny-llama", dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 12)]
    items, overall = with_dense_reference(lm, seqs, batch_size=2)
    for part in (items[:2], items[1:4], items):
        batch = reference_batch(lm, part)
        with torch.no_grad():
            loss = lm.model(**{k: v for k, v in batch.items() if k != "dense_ce"}).loss.item()
        assert batch["dense_ce"] == pytest.approx(loss, rel=1e-4)
    assert overall == pytest.approx(reference_batch(lm, items)["dense_ce"])


def test_sparse_post_training_resumes_exactly(tmp_path, monkeypatch):
    from helpers import interrupt_on_call

    import lmlab.train.loop as loop

    data = toy.addition_data(n_test=100)
    cfg = TrainConfig(steps=6, batch_size=16, lr=1e-3, schedule="constant", checkpoint_every=2, progress=False)

    def fresh():
        return toy.build_toy(seed=0, d_model=32, n_layers=2, n_heads=2).model

    whole = sparse_post_train(fresh(), data.train[:200], toy.collate, toy.answer_loss, 2.0, cfg, tmp_path / "a")
    interrupt_on_call(monkeypatch, loop, "save_checkpoint", 2)  # killed while writing the step-4 checkpoint
    with pytest.raises(KeyboardInterrupt):
        sparse_post_train(fresh(), data.train[:200], toy.collate, toy.answer_loss, 2.0, cfg, tmp_path / "b")
    monkeypatch.undo()
    resumed = sparse_post_train(fresh(), data.train[:200], toy.collate, toy.answer_loss, 2.0, cfg, tmp_path / "b")
    assert resumed.result.resumed_from == 2
    np.testing.assert_allclose(resumed.result.losses, whole.result.losses, rtol=1e-5)
    assert resumed.geco.multiplier == pytest.approx(whole.geco.multiplier, rel=1e-6)
    assert len(resumed.geco.trace) == len(resumed.history) == 6  # the record is whole across the interruption
    assert [h["step"] for h in resumed.history] == [h["step"] for h in whole.history]
    np.testing.assert_allclose([h["kept_edges"] for h in resumed.history], [h["kept_edges"] for h in whole.history],
                               rtol=1e-5)


def test_sparse_model_saves_and_loads_back(tmp_path, device):
    lm = device.load("tiny-llama", seed=1)
    enc = lm.encode(["hello there world", "a b"])
    with torch.no_grad(), intervene(lm, SparseAttention(sample=False)):
        expected = lm.model(**enc).logits
        dense = None
    with torch.no_grad():
        dense = lm.model(**enc).logits
    folder = save_model(lm, tmp_path / "sparse", sparse_attention=True)
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.bin"))
    back = device.load(str(folder))
    assert back.meta.get("sparse_attention") and installed(back) and installed(back.model) == installed(back)
    with torch.no_grad():
        got = back.model(**back.encode(["hello there world", "a b"])).logits
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got, dense)  # the gate really is on


def test_toy_data_is_disjoint_and_well_formed():
    data = toy.addition_data(n_test=500, seed=0, repeats=2)

    def problems(seqs):
        return {tuple(s[1 + 9 * j:10 + 9 * j]) for s in seqs for j in range(toy.PROBLEMS)}

    assert len(problems(data.test)) == 500 and len(problems(data.train)) == 9500  # every pair, once per split
    assert not problems(data.train) & problems(data.test)
    assert len(data.train) == 2 * 9500 // toy.PROBLEMS
    seq = toy.encode(47, 85)
    assert "".join(toy.VOCAB[i] for i in seq[1:]) == "47+85=132"
    packed = data.test[0]
    assert len(packed) == toy.SEQ_LEN == 46 and 2 / (toy.SEQ_LEN + 1) < 0.05  # one edge per query is under 5%
    text = "".join(toy.VOCAB[i] for i in packed[1:])
    for j in range(toy.PROBLEMS):
        a, b, c = text[9 * j:9 * j + 2], text[9 * j + 3:9 * j + 5], text[9 * j + 6:9 * j + 9]
        assert int(a) + int(b) == int(c)
    labels = toy.collate([packed])["labels"][0]
    assert (labels != -100).sum() == 3 * toy.PROBLEMS


def test_toy_exact_match_is_per_problem():
    data = toy.addition_data(n_test=500, seed=0)

    class Oracle(torch.nn.Module):  # predicts every next token right, except the first problem's last digit
        def forward(self, input_ids, labels=None):
            logits = torch.nn.functional.one_hot(input_ids.roll(-1, 1), len(toy.VOCAB)).float() * 10
            logits[:, toy.ANSWER_POS[2] - 1] = 0
            logits[:, toy.ANSWER_POS[2] - 1, toy.PAD] = 10  # never an answer digit
            return type("Out", (), {"logits": logits, "loss": torch.tensor(0.0)})()

    got = toy.evaluate(Oracle(), data.test[:10])
    assert got["exact_match"] == pytest.approx((toy.PROBLEMS - 1) / toy.PROBLEMS)


# --- verdict ------------------------------------------------------------------------------------------

def _curve(need: int, n_prompts: int, rng, total: int = 16) -> list:
    return [(n, (0.0 if n == 0 else (1.0 if n >= need else 0.5 * n / need)) + rng.normal(0, 0.02, n_prompts))
            for n in range(total + 1)]


def _reranked(curve: list, common: dict, kind: str = "rerank", n_draws: int = 20, seed: int = 0) -> list:
    """The re-ranked resamples' rows (resample.py) of a planted curve [(N, per-prompt values)] whose heads are
    interchangeable: any N heads kept give the curve's values at N, so each draw's ranking (on random per-prompt
    attributions) changes nothing and the draws read the planted curve over their prompts."""
    from lmlab.studies.sparse_circuits.resample import draw_rows, measure_draws, prompt_draws

    grid = [n for n, _ in curve]
    values = np.stack([np.asarray(v, float) for _, v in curve])
    total, n_prompts = grid[-1], values.shape[1]
    planted = circuits.EffectCurve(grid, values, values[-1], values[0])
    per = np.random.default_rng(seed).normal(size=(n_prompts, 2, total // 2))
    draws = prompt_draws(n_prompts, n_draws, 0)
    rows = measure_draws(per, planted, draws, 0.9,
                         lambda sets: np.stack([values[grid.index(total - len(s))] for s in sets]))
    return ([{"kind": kind, **common, **r} for r in rows]
            + [{"kind": f"{kind}_draw", **common, **r} for r in draw_rows(draws)])


def _table(heads, kept, ce_diff, converged=True, n_prompts=64, kept_trace=None, k=3, n_seq=16, reranked=True):
    """The model half's tables: per task the dense curve needing heads[task][0] and k sparse replicates needing
    heads[task][1] heads for 0.9, with their re-ranked resamples (`reranked`); held-out text with `kept` edges and a
    CE change of `ce_diff` per sequence."""
    rng = np.random.default_rng(0)
    rows = []
    for task, (nd, ns) in heads.items():
        units = [({"variant": "dense", "task": task}, _curve(nd, n_prompts, rng))]
        units += [({"variant": "sparse", "replicate": r, "task": task}, _curve(ns, n_prompts, rng)) for r in range(k)]
        for common, curve in units:
            curve = [(n, v.round(4)) for n, v in curve]
            rows += [{"kind": "per_prompt", **common, "n_heads": n, "values": json.dumps(v.tolist())} for n, v in curve]
            rows += _reranked(curve, common) if reranked else []
    for r in range(k):
        rows.append({"kind": "sparsity", "replicate": r, "variant": "sparse", "value": kept, "ce": 3.0 + ce_diff,
                     "ce_diff": ce_diff, "tau_slack": 0.1,
                     "converged": converged, "final_ema": -0.01 if converged else 0.2, "multiplier": 5.0, "steps": 40,
                     "n_prompts": n_prompts, "tokens": 256, "edges_per_query": 1.5, "fallback": 0.1})
        rows += [{"kind": "sparse_seq", "replicate": r, "idx": i, "kept": kept + rng.normal(0, 0.001),
                  "ce_diff": ce_diff + rng.normal(0, 0.02)} for i in range(n_seq)]
        trace = kept_trace if kept_trace is not None else [kept] * 40
        rows += [{"kind": "geco", "replicate": r, "step": i + 1, "ce": 3.0 if converged else 3.3,
                  "ema": -0.01 if converged else 0.2, "multiplier": 5.0, "tau": 3.1, "kept_edges": x}
                 for i, x in enumerate(trace)]
    return derive(pd.DataFrame(rows), 0.9, seed=0, n_boot=20)


def _v(*args, **kw):
    return verdict(from_rows("sparse-circuits", _table(*args, **kw)))


def test_verdict_can_go_each_way():
    good = {t: (8, 4) for t in TASKS}
    v = _v(good, 0.01, 0.02)
    assert v.status == "reproduced", v.summary
    mean = next(c for c in v.evidence["claims"] if c["name"] == "mean log2 multiplier over the tasks")
    assert 2 ** mean["estimate"] == pytest.approx(2.0, rel=0.1) and mean["replicates"] == 3
    assert _v(good, 0.30, 0.02).status == "not reproduced"  # edges not sparse
    # loss not held on the held-out text: an unfinished post-training, never evidence either way
    lossy = _v(good, 0.01, 0.50)
    assert lossy.status == "inconclusive" and "sparse models at unchanged held-out loss: FAILED" in lossy.summary
    assert "replicate 0: +0.5" in lossy.summary
    assert _v({t: (4, 8) for t in TASKS}, 0.01, 0.02).status == "not reproduced"  # the sparse model needs more
    mixed = {"ioi": (8, 4), "greater-than": (4, 8), "docstring": (6, 6), "ioi-long": (6, 6)}
    assert _v(mixed, 0.01, 0.02).status == "inconclusive"


def test_a_sparse_model_as_dense_as_its_original_never_says_yes_on_the_model_half():
    """Negative controls on the model: a post-training that kept every edge ("no" on the paper's edges claim) and a
    sparse model that needs as many heads on every task (its multiplier open, never "yes")."""
    dense = _v({t: (8, 4) for t in TASKS}, 1.0, 0.02)
    got = {c["name"]: c["decision"] for c in dense.evidence["claims"]}
    assert got["edges kept"] == "no" and dense.status == "not reproduced"
    same = _v({t: (6, 6) for t in TASKS}, 0.01, 0.02)
    mean = next(c for c in same.evidence["claims"] if c["name"] == "mean log2 multiplier over the tasks")
    assert mean["decision"] in ("no", "open") and mean["source"] == "paper" and same.status != "reproduced"


def test_verdict_waits_for_convergence_and_power():
    good = {t: (8, 4) for t in TASKS}
    # the training trace over its bound at the end (+0.2 nats): a miss does not count (GECO still pulling the loss
    # down gives edges back); a hit at unchanged held-out loss stands; a hit that lost held-out loss does not
    miss = _v(good, 0.30, 0.02, converged=False)
    assert miss.status == "inconclusive" and "post-training held its constraint: FAILED" in miss.summary
    assert "+0.200 nats over its bound on average" in miss.summary
    hit = _v(good, 0.01, 0.02, converged=False)
    assert hit.status == "reproduced" and "post-training held its constraint: FAILED" in hit.summary
    assert _v(good, 0.01, 0.50, converged=False).status == "inconclusive"
    # the constraint holds but the edges were still falling fast over the last quarter: a miss may be the unfinished
    # training's, so no "no"; a hit stands (the kept share only falls further)
    v = _v(good, 0.30, 0.02, kept_trace=list(np.linspace(0.9, 0.3, 40)))
    assert v.status == "inconclusive" and "edges kept still fell" in v.summary
    hit = _v(good, 0.01, 0.02, kept_trace=list(np.linspace(0.03, 0.01, 40)))
    assert hit.status == "reproduced" and "edges settled: FAILED" in hit.summary
    # settled at 30%: a real miss
    assert _v(good, 0.30, 0.02, kept_trace=[0.9] * 10 + [0.3] * 30).status == "not reproduced"
    # 12 prompt pairs: never "reproduced"; a sparse model that clearly needs more heads still counts against
    weak = _v(good, 0.01, 0.02, n_prompts=12)
    assert weak.status == "inconclusive" and "multiplier powered: FAILED" in weak.summary
    assert _v({t: (4, 8) for t in TASKS}, 0.01, 0.02, n_prompts=12).status == "not reproduced"
    assert _v(good, 0.01, 0.02, k=1).status == "inconclusive"  # one post-training run


def test_paper_fraction_as_edges_per_query():
    from lmlab.studies.sparse_circuits.circuit_analysis import paper_edges_per_query

    assert paper_edges_per_query(255) == pytest.approx(0.004 * 128)  # 256 causal keys per query on average / 2


def test_derive_builds_multiplier_from_per_prompt_rows():
    grid = [0, 1, 2, 4, 8]
    dense = np.array([[0.0] * 3, [0.1] * 3, [0.3] * 3, [0.95] * 3, [1.0] * 3])
    sparse = np.array([[0.0] * 3, [0.5] * 3, [0.92] * 3, [0.97] * 3, [1.0] * 3])
    rows = []
    for variant, values in (("dense", dense), ("sparse", sparse)):
        for n, v in zip(grid, values):
            rows.append({"kind": "per_prompt", "variant": variant, "task": "ioi", "n_heads": n,
                         "values": json.dumps(v.tolist()), **({"replicate": 0} if variant == "sparse" else {})})
    table = derive(pd.DataFrame(rows), 0.9, seed=0, n_boot=50)
    m = table[table["kind"] == "multiplier"].iloc[0]
    assert m["dense_heads"] == 4 and m["sparse_heads"] == 2 and m["value"] == pytest.approx(2.0)
    assert m["replicate"] == 0


# --- the study end to end, on the embedded model with tiny sizes -----------------------------------------

TINY_RUN = dict(n_prompts=2, sparse_steps=2, sparse_batch=2, n_text=6, n_docstrings=2, text_tokens=6, n_eval_text=2,
                eval_tokens=8, toy_steps=3, toy_sparse_steps=2, toy_width=32, verify_heads=4, batch_size=4,
                fine_grid=False, seeds=2, rank_draws=5, toy_rank_draws=5)


@pytest.mark.embedded
def test_study_runs_end_to_end_and_resumes(tmp_path, monkeypatch, tiny_smol):
    """Every phase (discovery, sampled text, post-training, saving and reloading the sparse model, sparsity, the
    toy, figures) on a tiny Llama that speaks SmolLM2's tokenizer (the tasks' single-token names): the pipeline's
    logic, which the 135M weights would only make slower."""
    from helpers import interrupt_on_call

    from lmlab.studies import run_study

    config = study.Config(model=tiny_smol.name, **TINY_RUN)
    interrupt_on_call(monkeypatch, circuits, "effect_curve", 6)  # killed in the sparse model's discovery
    with pytest.raises(KeyboardInterrupt):
        run_study(study.SPEC, config, tmp_path, lm=tiny_smol)
    monkeypatch.undo()
    result = run_study(study.SPEC, config, tmp_path, lm=tiny_smol)
    from helpers import check_declared_columns

    check_declared_columns(result)
    table = result.long()
    assert set(table[table["kind"] == "multiplier"]["task"]) == set(TASKS)
    assert (result.path / "figure.png").is_file() and (result.path / "toy_figure.png").is_file()
    assert (result.path / "geco_figure.png").is_file()
    sparse = table[(table["kind"] == "sparsity") & (table["variant"] == "sparse")].iloc[0]
    assert 0 <= sparse["value"] <= 1 and sparse["tokens"] >= 8 and sparse["edges_per_query"] >= 0
    geco = result.table("geco")
    assert geco.groupby("replicate").step.apply(list).tolist() == [[1, 2], [1, 2]]  # whole traces, across the resume
    assert (geco["multiplier"] > 0).all()
    assert set(table[table["kind"] == "multiplier"]["replicate"]) == {0, 1}
    back = load_model(str(result.path / "post_training" / "rep0" / "sparse_model"))
    assert back.meta.get("sparse_attention")
    assert result.verdict.status in ("reproduced", "not reproduced", "inconclusive")


def _no_decisive_yes(verdict) -> list:
    return [f"{c['name']} ({c.get('group', '')})" for c in verdict.evidence["claims"]
            if not c["reported"] and c["decision"] == "yes"]


@pytest.mark.embedded
def test_the_placebo_post_trains_without_the_edge_term_and_never_reproduces(tmp_path, monkeypatch, tiny_smol):
    """--placebo on the model's half at test sizes (the toy's half has its own test below, and is left out here):
    the same run with the edge term's weight at 0 (the record says so); its verdict is the placebo's, not
    "reproduced", and no decisive claim says "yes"."""
    from lmlab.studies import run_study
    from lmlab.studies.sparse_circuits import recipe

    monkeypatch.setattr(recipe, "run_toy", lambda config, run_dir: None)
    config = study.Config(model=tiny_smol.name, placebo=True, **dict(TINY_RUN, tasks=["ioi"]))
    result = run_study(study.SPEC, config, tmp_path, lm=tiny_smol)
    record = json.loads((result.path / "post_training" / "rep0" / "sparse_training.json").read_text())
    assert record["edge_weight"] == 0.0 and result.config.placebo
    v = result.verdict
    assert v.summary.startswith("PLACEBO (") and v.evidence["placebo"] == study.Config.placebo_treatment
    assert v.status != "reproduced" and not _no_decisive_yes(v), v.summary
    assert {c["name"]: c["decision"] for c in v.evidence["claims"]}["edges kept"] == "no"  # the gate's own share
    assert len(result.table("rerank_draw")) and len(result.table("rerank"))


def test_the_toys_placebo_never_reproduces(tmp_path, monkeypatch):
    """The demo's toy alone under --placebo, at test sizes: its post-training runs with the edge term's weight at 0;
    not "reproduced", no decisive claim "yes", and its edges are those the gate keeps with nothing pushing them
    down."""
    from lmlab.studies import run_study
    from lmlab.studies.sparse_circuits.toy import run as toy_run

    from functools import partial

    monkeypatch.setattr(toy_run, "TOY_PROMPTS", 16)  # the toy's circuits and test set at test size
    monkeypatch.setattr(toy, "addition_data", partial(toy.addition_data, n_test=300, repeats=1))
    seen, original = {}, toy_run.sparse_post_train

    def spy(*args, **kwargs):
        seen["edge_weight"] = kwargs.get("edge_weight", 1.0)
        return original(*args, **kwargs)

    monkeypatch.setattr(toy_run, "sparse_post_train", spy)
    config = study.Config(model="tiny-llama", profile="demo", placebo=True, toy_steps=3, toy_sparse_steps=2,
                          toy_width=32, toy_batch=8, toy_sparse_batch=8, seeds=2, toy_rank_draws=5, device="cpu",
                          toy_tasks=["tens"])
    result = run_study(study.SPEC, config, tmp_path)
    assert seen["edge_weight"] == 0.0
    v = result.verdict
    assert v.summary.startswith("PLACEBO (") and v.evidence.get("part") == "toy"
    assert v.status != "reproduced" and not _no_decisive_yes(v), v.summary
    kept = next(c for c in v.evidence["claims"] if c["name"] == "toy edges kept")
    assert kept["decision"] == "no", v.summary
    assert len(result.table("toy_rerank_draw")) and len(result.table("toy_rerank"))


def test_the_edge_term_at_weight_zero_moves_nothing_where_the_loss_is_held(tmp_path):
    """sparse_post_train's edge_weight: with a CE that does not depend on the weights (held under its bound), the
    edge term is the only gradient; at weight 1 it moves the query and key weights, at weight 0 nothing moves (no
    weight decay), while the gates and the multiplier still run and the edges are still counted."""
    data = toy.addition_data(n_test=20)

    def held(m, batch):  # the loss's graph, times 0, under its bound
        return toy.answer_loss(m, batch) * 0.0 + 0.5

    def run(weight, where):
        model = toy.build_toy(seed=0, d_model=32, n_layers=2, n_heads=2).model
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        out = sparse_post_train(model, data.train[:32], toy.collate, held, 1.0,
                                TrainConfig(steps=3, batch_size=8, lr=1e-2, schedule="constant", checkpoint_every=10,
                                            progress=False), tmp_path / where, edge_weight=weight)
        # the training moves the model to the GPU where there is one
        moved = [k for k, v in model.state_dict().items() if not torch.equal(v.cpu(), before[k].cpu())]
        return moved, out

    moved, pushed = run(1.0, "w1")
    assert any("q_proj" in k or "k_proj" in k or "attn" in k for k in moved), moved
    still, placebo = run(0.0, "w0")
    assert still == [] and len(placebo.history) == 3 and placebo.history[-1]["kept_edges"] > 0


def test_placebo_refuses_a_sparse_model_from_an_earlier_run():
    with pytest.raises(LmlabError, match="--placebo post-trains the model with the edge term off"):
        study.Config(model="smollm2-135m", placebo=True, sparse_model="x", circuits=True).check_inputs(models=False)


def test_the_model_half_alone_keeps_the_run_folder_of_a_run_with_the_toy():
    """--toy false (compare --make sparse's way) needs the model half; --toy left on names the run folder as before
    the option existed."""
    with pytest.raises(LmlabError, match="^--toy false leaves nothing to run without the model's half"):
        study.Config(model="smollm2-135m", toy=False, circuits=False).check_inputs(models=False)
    study.Config(model="smollm2-135m", toy=False, circuits=True).check_inputs(models=False)
    assert "toy" not in study.Config(model="smollm2-135m").identity()
    assert study.Config(model="smollm2-135m", toy=False).identity()["toy"] is False


def test_heads_needed_ignores_an_early_spike():
    values = np.array([[0.0], [0.95], [0.5], [0.92], [1.0]])
    curve = circuits.EffectCurve([0, 1, 2, 4, 8], values, values[-1], values[0])
    assert curve.heads_needed(0.9) == 4
    never = circuits.EffectCurve([0, 1, 2], np.array([[0.0], [0.5], [0.0 + 1e-9]]), np.array([1.0]), np.array([0.0]))
    assert never.heads_needed(0.9) is None


def _toy_rows(k=3, dense_em=0.99, sparse_em=0.985, kept=0.04, converged=True, heads=(8, 3), spread=0.0, n_seq=200,
              n_prompts=40, flat=False, tasks=None, falling=False, sparse_ce=0.02, reranked=True, unlearned=()):
    """Toy tables of k replicates: per sequence exact match and kept edges, a GECO trace, and explained-effect
    curves whose heads-needed at 0.9 is heads[0] (dense) and heads[1] (sparse); `spread`: replicate r's kept share
    is kept + r * spread. `tasks` {name: heads}: a curve per toy task (the record's task column); `falling`: the
    kept edges of the GECO trace still falling 30% over its last quarter; `sparse_ce`: the sparse toys' held-out
    answer CE (the dense toys' is 0.01); `reranked`: with the re-ranked resamples' rows (resample.py); `unlearned`:
    replicates whose dense toy scores 30% (did not learn addition)."""
    rng = np.random.default_rng(0)
    rows = []
    for r in range(k):
        kr = kept + r * spread
        rows += [dict(kind="toy", replicate=r, variant="dense", value=0.30 if r in unlearned else dense_em, ce=0.01, kept=1.0, edges_per_query=23.5,
                      floor=0.043),
                 dict(kind="toy", replicate=r, variant="sparse", value=sparse_em, ce=sparse_ce, kept=kr, edges_per_query=1.0,
                      fallback=0.0, floor=0.043, final_ema=-0.03 if converged else 0.05, converged=converged,
                      tau=0.04, steps=300)]
        rows += [dict(kind="toy_seq", replicate=r, idx=i, dense_em=float(rng.random() < dense_em),
                      sparse_em=float(rng.random() < sparse_em), kept=float(np.clip(kr + rng.normal(0, 0.003), 0, 1)))
                 for i in range(n_seq)]
        rows += [dict(kind="toy_geco", replicate=r, step=i + 1, ce=0.03 if converged else 0.09, tau=0.04,
                      ema=-0.01 if converged else 0.05, multiplier=1.0,
                      kept_edges=kr * (1.6 - 0.02 * i if falling else 1.0)) for i in range(40)]
        for task, task_heads in (tasks or {None: heads}).items():
            for variant, need in (("dense", task_heads[0]), ("sparse", task_heads[1])):
                curve = []
                for n in range(17):
                    base = 0.0 if n == 0 else (1.0 if n >= need else 0.5 * n / need)
                    values = (base + rng.normal(0, 0.02, n_prompts)).round(4)
                    if flat and r == 0 and variant == "sparse":  # the same metric whatever is patched: no effect
                        values = np.full(n_prompts, 0.25)
                    curve.append((n, values))
                common = dict(replicate=r, variant=variant, **({"task": task} if task else {}))
                rows += [dict(kind="toy_per_prompt", n_heads=n, values=json.dumps(v.tolist()), **common)
                         for n, v in curve]
                rows += _reranked(curve, common, kind="toy_rerank") if reranked else []
    return rows


def _decisions(v) -> dict:
    """claim name (and group, where it has one) -> its decision; gate name -> (passed, what it blocks)."""
    out = {(c["name"] if not c.get("group") or c["group"] == "addition toy" else f"{c['name']} | {c['group']}"):
           c["decision"] for c in v.evidence["claims"]}
    out.update({g["name"]: (g["passed"], g["blocks"]) for g in v.evidence["gates"]})
    return out


def test_the_toys_claims_decide_over_replicates_but_the_toy_alone_never_decides_the_study():
    """The demo's S4 runs the addition toy alone, k replicates. Every toy claim is ours (the paper's numbers are on
    GPT-2 and OLMo-7B), so the toy alone is never "reproduced" nor "not reproduced": its claims say yes when they
    hold over the replicates (<= 5% of edges, fewer heads; exact match within 2 points, reported), no when the sparse
    toys keep many edges or lose exact match; its gates say when a dense toy did not learn, a sparse toy's held-out
    loss rose past the slack, the replicates disagree, or there is one replicate; a post-training whose trace ran
    over its bound is named while a hit on the measured sparse toys at their dense toys' loss stands."""
    from lmlab.studies.result import from_rows
    from lmlab.studies.sparse_circuits.analysis import verdict as s4_verdict

    def judged(**kw):
        return s4_verdict(from_rows("sparse-circuits", _toy_rows(**kw), "toy"))

    good = judged()
    got = _decisions(good)
    assert good.status == "inconclusive" and "no claim of the paper's decides in this run" in good.summary
    assert got["toy edges kept"] == "yes" and got["toy exact match, sparse - dense"] == "yes"
    assert all(c["source"] == "lmlab" for c in good.evidence["claims"])
    mult = next(c for c in good.evidence["claims"] if c["name"].startswith("log2 multiplier"))
    assert 2 ** mult["estimate"] == pytest.approx(8 / 3, rel=0.05) and mult["decision"] == "yes"
    assert got["heads re-ranked on each resample"] == (True, "yes")
    many = judged(kept=0.20)
    assert _decisions(many)["toy edges kept"] == "no" and many.status == "inconclusive"
    assert "a claim of ours fails" in many.summary
    lost = judged(sparse_em=0.85)
    assert _decisions(lost)["toy exact match, sparse - dense"] == "no" and lost.status == "inconclusive"
    undecided = judged(dense_em=0.30)
    assert undecided.status == "inconclusive" and "dense toys learned addition: FAILED" in undecided.summary
    unsettled = judged(converged=False)  # the training trace over its bound; the measured sparse toys at the dense loss
    assert "held its constraint: FAILED" in unsettled.summary and _decisions(unsettled)["toy edges kept"] == "yes"
    assert _decisions(unsettled)["sparse post-training held its constraint"] == (False, "no")
    lossy = judged(sparse_ce=0.05)  # 0.04 nats over the dense toys' held-out answer CE, 0.03 allowed
    assert lossy.status == "inconclusive" and "unchanged held-out loss: FAILED" in lossy.summary
    assert "replicate 0: +0.0400 nats over its dense toy" in lossy.summary
    assert _decisions(judged(sparse_ce=0.039))["sparse toys at unchanged held-out loss"] == (True, "all")
    split = judged(kept=0.02, spread=0.04)  # 2%, 6%, 10%: on both sides of the 5% bar
    assert _decisions(split)["toy edges kept"] == "open" and "the replicates disagree" in split.summary
    assert _decisions(judged(k=1))["replicates"] == (False, "all")
    assert "64 prompt pairs" in good.summary  # what the model's half would take
    for kw in ({}, {"kept": 0.20}, {"sparse_em": 0.85}, {"kept": 1.0, "heads": (3, 8)}):
        assert judged(**kw).status == "inconclusive"  # no paper claim decides on the toy, either way


def test_a_toy_replicate_that_did_not_learn_is_counted_as_failed_not_blocking_the_rest():
    """One dense toy that did not learn addition among k: the gate passes while two or more learned, every claim reads
    the others and counts the failed one at its worst (lmlab.claims). Among 3, a hit on the multiplier does not stand
    with the failed replicate at -log2(heads); among 20 it does; all unlearned still blocks every decision."""
    from lmlab.studies.result import from_rows
    from lmlab.studies.sparse_circuits.analysis import verdict as s4_verdict

    def judged(**kw):
        v = s4_verdict(from_rows("sparse-circuits", _toy_rows(**kw), "toy"))
        return v, {c["name"]: c for c in v.evidence["claims"]}

    few, claims = judged(unlearned=(2,))
    got = _decisions(few)
    gate = next(g for g in few.evidence["gates"] if g["name"] == "dense toys learned addition")
    assert got["dense toys learned addition"] == (True, "all") and "replicate(s) 2 not learned" in gate["why"]
    mult = next(c for n, c in claims.items() if n.startswith("log2 multiplier"))
    assert mult["failed"] == 1 and mult["replicates"] == 2 and mult["decision"] == "open"
    assert "failed replicate" in mult["reason"]
    many, claims = judged(k=20, unlearned=(7,), n_seq=40, n_prompts=12)
    mult = next(c for n, c in claims.items() if n.startswith("log2 multiplier"))
    assert mult["failed"] == 1 and mult["replicates"] == 19 and mult["decision"] == "yes"
    assert "1 more failed" in many.summary
    # a failed replicate's post-training is not read either: its constraint over its bound fails no gate
    rows = [dict(r, ce=0.09) if r["kind"] == "toy_geco" and r["replicate"] == 2 else r
            for r in _toy_rows(unlearned=(2,))]
    assert _decisions(s4_verdict(from_rows("sparse-circuits", rows, "toy")))[
        "sparse post-training held its constraint"] == (True, "no")
    none, _ = judged(unlearned=(0, 1))
    assert _decisions(none)["dense toys learned addition"] == (False, "all") and none.status == "inconclusive"


def test_the_toys_multiplier_is_the_mean_over_its_tasks_and_each_task_is_reported():
    """Several toy tasks (the tens digit, the carry into it): each task's multiplier is reported, their mean decides;
    a task whose dense circuit is one head cannot shrink, and the mean says so by falling."""
    from lmlab.studies.result import from_rows
    from lmlab.studies.sparse_circuits.analysis import verdict as s4_verdict

    both = s4_verdict(from_rows("sparse-circuits", _toy_rows(tasks={"tens": (5, 2), "carry": (11, 4)}), "toy"))
    mults = {c["group"]: c for c in both.evidence["claims"] if "multiplier" in c["name"]}
    assert set(mults) == {"toy: tens", "toy: carry", "toy: tens, carry"}
    assert mults["toy: tens"]["reported"] and mults["toy: carry"]["reported"]
    assert not mults["toy: tens, carry"]["reported"] and mults["toy: tens, carry"]["decision"] == "yes"
    assert 2 ** mults["toy: tens, carry"]["estimate"] == pytest.approx(np.sqrt(5 / 2 * 11 / 4), rel=0.05)
    same = s4_verdict(from_rows("sparse-circuits", _toy_rows(tasks={"tens": (5, 5), "carry": (11, 11)}), "toy"))
    mean = next(c for c in same.evidence["claims"] if c.get("group") == "toy: tens, carry")
    assert mean["estimate"] == pytest.approx(0.0, abs=1e-9) and same.status != "reproduced"


def test_the_toys_convergence_gate_reads_the_kept_edges_over_the_last_quarter():
    """A post-training whose constraint holds but whose kept edges still fall (30% over the last quarter here) has not
    settled: it says which replicate and how far the edges fell, and its gate blocks "no" only (a miss may be the
    unfinished training's), while a hit stands: at 4% and falling, the kept share is under the 5% bar and only
    falls further, and its circuits came out smaller already."""
    from lmlab.studies.result import from_rows
    from lmlab.studies.sparse_circuits.analysis import verdict as s4_verdict

    def judged(**kw):
        return _decisions(s4_verdict(from_rows("sparse-circuits", _toy_rows(**kw), "toy")))

    still = s4_verdict(from_rows("sparse-circuits", _toy_rows(falling=True), "toy"))
    assert "sparse post-training's edges settled: FAILED" in still.summary and "edges kept still fell" in still.summary
    assert _decisions(still)["toy edges kept"] == "yes"
    miss = judged(falling=True, kept=0.12)
    assert miss["toy edges kept"] == "no" and miss["sparse post-training's edges settled"] == (False, "no")
    settled = judged(kept=0.12)
    assert settled["toy edges kept"] == "no" and settled["sparse post-training's edges settled"] == (True, "no")
    assert judged()["sparse post-training's edges settled"] == (True, "no")


def test_the_constraint_is_read_over_the_last_quarter_not_at_the_last_step():
    """GECO holds the CE at its bound, so its moving average at the last step falls either side of 0 by chance: a
    replicate whose last quarter sits at the bound has converged whatever that last reading; one whose last quarter
    runs above the bound by more than a tenth of the slack has not, whatever that last reading (which keeps a miss
    from counting); a record without the per-step trace falls back on it."""
    from lmlab.studies.result import from_rows
    from lmlab.studies.sparse_circuits.analysis import verdict as s4_verdict
    from lmlab.studies.sparse_circuits.declared import CONSTRAINT_TOLERANCE
    from lmlab.studies.sparse_circuits.gates import constraint_held

    rng = np.random.default_rng(1)
    tau, slack, n = 0.04, 0.03, 400
    hover = tau + rng.normal(0, 0.02, n) - 0.001  # at the bound, noisy
    trace = pd.DataFrame({"step": np.arange(1, n + 1), "ce": hover, "tau": tau})
    held, violation = constraint_held(trace, slack)
    assert held and violation == pytest.approx(float((hover[-100:] - tau).mean()))
    early = trace.assign(ce=np.where(trace["step"] <= 300, tau + 0.5, hover))  # violated early only: held
    assert constraint_held(early, slack)[0]
    late = trace.assign(ce=np.where(trace["step"] > 300, tau + 2 * CONSTRAINT_TOLERANCE * slack, tau - 0.01))
    assert constraint_held(late, slack) == (False, pytest.approx(2 * CONSTRAINT_TOLERANCE * slack))
    assert constraint_held(trace.drop(columns=["ce"]), slack)[0] is None

    def judged(last_ema, ce, drop=(), kept=0.12):  # 12% of edges kept: a miss, which an unconverged run cannot give
        rows = _toy_rows(kept=kept)
        for row in rows:
            if row["kind"] == "toy" and row["variant"] == "sparse":
                row.update(final_ema=last_ema, converged=last_ema <= 0)
            if row["kind"] == "toy_geco":
                row["ce"] = ce
                for key in drop:
                    row.pop(key)
        return s4_verdict(from_rows("sparse-circuits", rows, "toy"))

    held = "sparse post-training held its constraint"
    assert _decisions(judged(+0.02, 0.039))[held] == (True, "no")  # the last reading above 0, the quarter at the bound
    late = judged(-0.02, 0.05)  # the last reading under 0, the last quarter 0.01 nats over a bound allowing 0.003
    assert _decisions(late)[held] == (False, "no") and "held its constraint: FAILED" in late.summary
    assert "over its bound on average over the last quarter" in late.summary
    hit = _decisions(judged(-0.02, 0.05, kept=0.04))  # a hit at the measured toys' unchanged loss stands
    assert hit["toy edges kept"] == "yes" and hit["sparse toys at unchanged held-out loss"] == (True, "all")
    assert _decisions(judged(+0.02, 0.039, drop=("ce", "tau")))[held] == (False, "no")  # no trace: the last reading


def test_a_curve_with_no_effect_to_explain_gives_no_number_and_an_inconclusive_verdict_saying_why():
    """Clean and corrupted prompts scoring alike (a model that does not do the task): the explained effect is
    undefined, not a silent NaN or a multiplier of 1; the multiplier's claim is not made and the verdict says why;
    no RuntimeWarning on the way (the suite makes one an error)."""
    from lmlab.studies.result import from_rows
    from lmlab.studies.sparse_circuits.analysis import verdict as s4_verdict
    from lmlab.studies.sparse_circuits.circuit_analysis import derive

    flat = circuits.EffectCurve([0, 1, 2], np.full((3, 4), 0.5), np.full(4, 0.5), np.full(4, 0.5))
    assert not flat.has_effect() and np.isnan(flat.explained()).all() and flat.heads_needed(0.9) is None
    verdict = s4_verdict(from_rows("sparse-circuits", _toy_rows(flat=True), "toy"))
    assert verdict.status == "inconclusive"
    assert "an effect to explain: FAILED (replicate 0, sparse: no effect to explain" in verdict.summary
    assert not any(c["name"].startswith("log2 multiplier") for c in verdict.evidence["claims"])
    per_prompt = [dict(kind="per_prompt", task="ioi", variant=v, replicate=rep, n_heads=n,
                       values=json.dumps([0.5] * 4 if v == "dense" else [float(n), 2.0 * n, 0.0, 1.0]))
                  for v, rep in (("dense", None), ("sparse", 0)) for n in (0, 1, 2)]
    table = derive(pd.DataFrame(per_prompt), 0.9, seed=0, n_boot=20)
    dense_curve = table[(table.kind == "curve") & (table.variant == "dense")]
    assert dense_curve.value.isna().all() and dense_curve.note.str.startswith("no effect to explain").all()
    mult = table[table.kind == "multiplier"].iloc[0]
    assert np.isnan(mult.value) and mult.note.startswith("dense model: no effect to explain")


def test_replicates_post_trained_together_equal_each_post_trained_alone(tmp_path):
    """Sparse post-training of a stacked toy (one GECO multiplier per replicate, the gate's noise keyed per
    replicate seed) follows each replicate post-trained alone: the same CE and multiplier trajectory and edges."""
    from lmlab.train.ensemble import stack

    data = toy.addition_data(n_test=50)
    seeds = [101, 202]
    cfg = dict(steps=5, batch_size=8, lr=1e-3, schedule="constant", checkpoint_every=10, progress=False)

    def fresh(seed):
        return toy.build_toy(seed=seed, d_model=32, n_layers=2, n_heads=2).model

    alone = [sparse_post_train(fresh(s), data.train[:64], toy.collate, toy.answer_loss, 1.5 + i, TrainConfig(seed=s, **cfg),
                               tmp_path / f"a{s}", rate=0.5, clip=0.1) for i, s in enumerate(seeds)]
    together = sparse_post_train(stack([fresh(s) for s in seeds]), data.train[:64], toy.collate, toy.answer_loss,
                                 [1.5, 2.5], TrainConfig(replicate_seeds=seeds, **cfg), tmp_path / "t", rate=0.5,
                                 clip=0.1)
    for r, solo in enumerate(alone):
        np.testing.assert_allclose(np.array(together.gecos[r].trace), np.array(solo.geco.trace), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose([h["kept_edges"] for h in together.histories[r]],
                                   [h["kept_edges"] for h in solo.history], atol=1e-6)
        assert together.gecos[r].tau == solo.geco.tau


def test_geco_clip_bounds_how_fast_a_large_violation_moves_lambda():
    unbounded, bounded = GECO(tau=0.0, rate=1.0, alpha=0.0), GECO(tau=0.0, rate=1.0, alpha=0.0, clip=0.1)
    for _ in range(10):
        unbounded.update(2.0)
        bounded.update(2.0)
    assert unbounded.multiplier == pytest.approx(1e4)  # e^20, clipped at the bound
    assert bounded.multiplier == pytest.approx(np.exp(1.0), rel=1e-6)  # ten steps of e^0.1
    for _ in range(10):
        bounded.update(-2.0)
    assert bounded.multiplier == pytest.approx(1.0, rel=1e-6)


def test_toy_circuit_task_pairs_differ_in_the_first_operand_ones_digit_only():
    data = toy.addition_data(n_test=200, seed=0)
    task = toy.circuit_task(data.test_pairs, 30, seed=1)
    assert len(task) == 30 and task.metric == "logit_diff"
    for p in task.prompts:
        assert len(p.clean) == len(p.corrupted) == 9  # <bos> a b + c d = e f
        assert p.clean[1] == p.corrupted[1] and p.clean[2] != p.corrupted[2] and p.clean[4:6] == p.corrupted[4:6]
        x, y = int(p.clean_text[:2]), int(p.clean_text[3:5])
        assert (x, y) in set(data.test_pairs) and p.answer == toy.TOK[str((x + y) % 10)]
        assert p.answer != p.distractor


@pytest.mark.parametrize("profile, lr, schedule, placebo", [("demo", 2.5e-4, "cosine", False),
                                                             ("demo", 2.5e-4, "cosine", True),
                                                             ("quick", 2.5e-4, "cosine", False)])
def test_the_toys_sparse_post_training_takes_its_profiles_rate_and_schedule(tmp_path, monkeypatch, profile, lr,
                                                                          schedule, placebo):
    """Every profile's sparse post-training decays its rate to 0 (cosine) from a peak of 2.5e-4 (at a constant
    1e-3 the demo's placebo, sparsity weight zero, ended over its dense toy's held-out loss), the placebo on its
    real run's schedule. Read from the TrainConfig the toy hands the post-training."""
    from lmlab.runs import RunDir
    from lmlab.studies.sparse_circuits.toy import run as toy_run
    from lmlab.train.loop import lr_factor

    seen = {}

    def stop(model, data, collate, loss, taus, tc, *args, **kwargs):
        seen["tc"] = tc
        raise KeyboardInterrupt

    monkeypatch.setattr(toy_run, "sparse_post_train", stop)
    config = study.Config(model="smollm2-135m", profile=profile, toy_steps=2, toy_sparse_steps=8, toy_width=16,
                          toy_batch=4, seeds=2, device="cpu", placebo=placebo)
    run_dir = RunDir(tmp_path, "sparse-circuits", {})
    with pytest.raises(KeyboardInterrupt):
        toy_run._train_toys(config, run_dir, config.replicate_seeds(), toy.addition_data(seed=0))
    tc = seen["tc"]
    assert tc.lr == pytest.approx(lr) and tc.schedule == schedule and tc.steps == 8
    factors = [lr_factor(s, tc) for s in range(tc.steps)]
    assert factors[0] == 1.0 and (factors[-1] < 0.05 if schedule == "cosine" else factors[-1] == 1.0)


def test_the_toy_replicates_apart_from_the_models(tmp_path, monkeypatch):
    """The quick profile trains 5 toys (the multiplier's interval needs about 5) beside the model's 3 replicates;
    --seeds sets both where --toy-seeds does not, and replicate r draws the same seed at any count. run_toy trains
    the toy's count."""
    from lmlab.resampling import replicate_seed
    from lmlab.runs import RunDir
    from lmlab.studies.sparse_circuits.toy import run as toy_run

    def config(**kw):
        return study.Config(model="smollm2-135m", device="cpu", seed=7, **kw)

    quick = config(profile="quick")
    assert len(quick.replicate_seeds()) == 3 and len(quick.toy_replicate_seeds()) == 5
    assert quick.toy_replicate_seeds()[:3] == quick.replicate_seeds() == [replicate_seed(7, r) for r in range(3)]
    assert len(config(profile="demo").toy_replicate_seeds()) == 3
    assert len(config(profile="quick", seeds=2).toy_replicate_seeds()) == 2
    assert len(config(profile="quick", seeds=2, toy_seeds=4).toy_replicate_seeds()) == 4
    assert len(config(profile="quick", toy_seeds=1).replicate_seeds()) == 3

    seen = {}

    def stop(config, run_dir, seeds, data):
        seen["seeds"] = seeds
        raise KeyboardInterrupt

    monkeypatch.setattr(toy_run, "_train_toys", stop)
    with pytest.raises(KeyboardInterrupt):
        toy_run.run_toy(quick, RunDir(tmp_path, "sparse-circuits", {}))
    assert seen["seeds"] == quick.toy_replicate_seeds()


def test_a_spike_returns_that_replicate_alone_to_its_last_state_within_bound():
    """Rollback: replicate 1's weights and AdamW moments come back bit for bit from the state saved while its
    constraint held, its moving average with them and its multiplier doubled; replicates 0 and 2 keep theirs."""
    from lmlab.train.sparse import Rollback

    model = torch.nn.Linear(4, 4)
    model.weight = torch.nn.Parameter(torch.randn(3, 4, 4))  # a stacked weight: replicate r at [r]
    model.bias = torch.nn.Parameter(torch.randn(3, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)

    def step():
        (model.weight.square().sum() + model.bias.sum()).backward()
        opt.step()
        opt.zero_grad()

    gecos, histories = [GECO(0.0) for _ in range(3)], [[{"step": 1}] for _ in range(3)]
    for g in gecos:
        g.update(-0.1)  # holding
    back = Rollback(3, threshold=0.05, every=2)
    step()
    back(1, model, opt, gecos, histories)  # step 2: every replicate's state saved
    saved_w, saved_m = model.weight.detach().clone(), opt.state[model.weight]["exp_avg"].clone()
    step()
    moved_w, moved_m = model.weight.detach().clone(), opt.state[model.weight]["exp_avg"].clone()
    gecos[1].ema, gecos[1].multiplier = 0.3, 4.0  # replicate 1 spikes
    back(2, model, opt, gecos, histories)  # (step 3: not a saving step for the others)
    torch.testing.assert_close(model.weight[1], saved_w[1], rtol=0, atol=0)
    torch.testing.assert_close(opt.state[model.weight]["exp_avg"][1], saved_m[1], rtol=0, atol=0)
    for r in (0, 2):
        torch.testing.assert_close(model.weight[r], moved_w[r], rtol=0, atol=0)
        torch.testing.assert_close(opt.state[model.weight]["exp_avg"][r], moved_m[r], rtol=0, atol=0)
    assert not torch.equal(saved_w[1], moved_w[1])  # the step did move it
    assert gecos[1].ema == pytest.approx(-0.1) and gecos[1].multiplier == 8.0
    assert back.count == [0, 1, 0] and histories[1][-1]["rollback_to"] == 2 and "rollback_to" not in histories[0][-1]


def test_sparse_post_training_with_rollbacks_resumes_exactly(tmp_path, monkeypatch):
    """The saved states travel in the checkpoints: a run killed mid-way and resumed rolls back at the same steps
    and ends on the same weights as the run that was never stopped."""
    from helpers import interrupt_on_call

    import lmlab.train.loop as loop

    data = toy.addition_data(n_test=100)
    cfg = TrainConfig(steps=10, batch_size=16, lr=1e-2, schedule="constant", checkpoint_every=3, progress=False)

    def ce_fn(m, batch):  # a bound that some batches break by far: spikes on a schedule set by the data
        loss = toy.answer_loss(m, batch)
        return loss, float(loss.detach()) + (2.0 if int(batch["input_ids"][0, 1]) % 2 else -2.0)

    def run(where):
        return sparse_post_train(toy.build_toy(seed=0, d_model=32, n_layers=2, n_heads=2).model, data.train[:200],
                                 toy.collate, ce_fn, 2.0, cfg, tmp_path / where, alpha=0.0, rollback=0.01,
                                 rollback_every=2)

    whole = run("a")
    interrupt_on_call(monkeypatch, loop, "save_checkpoint", 3)  # killed while writing the step-9 checkpoint
    with pytest.raises(KeyboardInterrupt):
        run("b")
    monkeypatch.undo()
    resumed = run("b")
    assert resumed.result.resumed_from == 6
    # the schedule spikes at steps 7 and 9, after states within bound were saved at steps 2, 4 and 6: the first
    # spike after the resume returns to the state saved before the interruption, which the checkpoint carried
    assert [h.get("rollback_to") for h in whole.history][6:] == [6, None, 8, None]
    assert [h.get("rollback_to") for h in resumed.history] == [h.get("rollback_to") for h in whole.history]
    np.testing.assert_allclose(resumed.result.losses, whole.result.losses, rtol=1e-5)
    assert resumed.geco.multiplier == pytest.approx(whole.geco.multiplier, rel=1e-6)


@pytest.mark.parametrize("profile, given, expected", [("quick", None, 0.06), ("demo", None, 0.06), ("quick", 0, None),
                                                      ("demo", 5, 0.15)])
def test_the_toys_rollback_is_the_profiles_number_of_slacks(tmp_path, monkeypatch, profile, given, expected):
    """Every profile post-trains the toy with the rollback at 2 slacks (2 x 0.03 nats); --toy-rollback sets it
    (0: never)."""
    from types import SimpleNamespace

    from lmlab.runs import RunDir
    from lmlab.studies.sparse_circuits.toy import run as toy_run

    seen = {}

    def stop(*args, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(toy_run, "train", lambda *a, **k: SimpleNamespace(replicate_losses=[], losses=[0.0]))
    monkeypatch.setattr(toy_run, "sparse_post_train", stop)
    config = study.Config(model="smollm2-135m", device="cpu", profile=profile, toy_seeds=1, toy_width=16,
                          toy_rollback=given)
    with pytest.raises(KeyboardInterrupt):
        toy_run._train_toys(config, RunDir(tmp_path, "sparse-circuits", {}), [0], toy.addition_data(n_test=10))
    assert seen["rollback"] == (pytest.approx(expected) if expected else None)
    window, tolerance = seen["drift"]  # no profile reads a drift; its tolerance is the gate's (0.1 x 0.03 nats)
    assert window == 0 and tolerance == pytest.approx(0.003)


def test_a_drift_over_the_bound_held_for_the_window_returns_the_replicate():
    """Rollback's drift: replicate 0's CE 0.01 over its bound for 4 steps (window 4, tolerance 0.005) returns it,
    under the spike threshold; replicate 1 at 0.004 over stays; and a drift is read only over steps since a return
    (replicate 0 needs 4 fresh steps to return again)."""
    from lmlab.train.sparse import Rollback

    model = torch.nn.Linear(2, 2)
    model.weight = torch.nn.Parameter(torch.zeros(2, 2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gecos, histories = [GECO(0.0, alpha=0.0) for _ in range(2)], [[], []]
    back = Rollback(2, threshold=1.0, every=1, window=4, tolerance=0.005)

    def step(n, excess):
        for r, geco in enumerate(gecos):
            geco.update(excess[r])
            histories[r].append({"step": geco.steps})
        back(n, model, opt, gecos, histories)

    step(0, [-0.01, -0.01])  # within bound: both saved
    for n in range(1, 4):
        step(n, [0.01, 0.004])
    assert back.count == [0, 0]  # the last 4 steps average 0.005 (one within bound): not over 0.005
    step(4, [0.01, 0.004])
    assert back.count == [1, 0] and histories[0][-1]["rollback_to"] == 1 and back.since[0] == 5
    for n in range(5, 8):
        step(n, [0.01, 0.004])
    assert back.count == [1, 0]  # three steps since the return
    step(8, [0.01, 0.004])
    assert back.count == [2, 0]
    assert Rollback(2, threshold=1.0).window == 0  # off by default: spikes only


def test_on_a_gpu_the_toy_trains_more_replicates_unless_told(monkeypatch):
    cpu = study.Config(model="tiny-llama", profile="quick", device="cpu").toy_replicate_seeds()
    assert len(cpu) == 5
    monkeypatch.setattr(study.Config, "torch_device", lambda self: "cuda:0")
    gpu = study.Config(model="tiny-llama", profile="quick")
    assert len(gpu.toy_replicate_seeds()) == 15
    assert gpu.toy_replicate_seeds()[:5] == cpu  # the CPU's five are the GPU's first five
    assert len(study.Config(model="tiny-llama", profile="quick", toy_seeds=4).toy_replicate_seeds()) == 4
    assert len(study.Config(model="tiny-llama", profile="demo").toy_replicate_seeds()) == 3


def test_a_run_with_the_models_circuits_and_the_toy_is_judged_by_the_model_with_the_toy_beside_it():
    """`--circuits` runs the toy too (the quick profile): the study's verdict is the model half's, the toy's verdict
    and claims shown beside it (every toy claim reported there): a toy that keeps many edges cannot make the study
    "not reproduced", nor a toy that reproduces everything lift a model half that waits."""
    from lmlab.studies.result import from_rows

    good = {t: (8, 4) for t in TASKS}

    def judged(model_kept, toy_kept, model_ce=0.02):
        rows = pd.concat([_table(good, model_kept, model_ce), pd.DataFrame(_toy_rows(kept=toy_kept))], ignore_index=True)
        return verdict(from_rows("sparse-circuits", rows))

    both = judged(0.01, 0.02)
    assert both.status == "reproduced", both.summary
    assert "the model: reproduced" in both.summary
    assert "The addition toy (ours, shown beside; it does not decide): inconclusive: addition toy, 3 replicates:" \
        in both.summary
    toy_claims = [c for c in both.evidence["claims"] if c["name"].startswith(("toy", "log2 multiplier (dense heads"))
                  or str(c.get("group", "")).startswith("toy")]
    assert toy_claims and all(c["reported"] and c["source"] == "lmlab" for c in toy_claims)
    assert "mean log2 multiplier over the tasks" in {c["name"] for c in both.evidence["claims"]}
    assert both.evidence["toy"]["status"] == "inconclusive" and len(both.evidence["toy"]["kept_per_replicate"]) == 3
    assert both.evidence["deciding"]["name"] == "mean log2 multiplier over the tasks (docstring, greater-than, ioi, " \
                                                "ioi-long)"
    assert "64 prompt pairs a task" not in both.summary  # the model's half ran: nothing to price for it
    assert judged(0.01, 0.20).status == "reproduced"  # the toys keep many edges: shown, not deciding
    assert judged(0.30, 0.02).status == "not reproduced"  # the model keeps many edges
    lossy = judged(0.01, 0.02, model_ce=0.50)  # the model's half waits for its post-training; the toy cannot decide
    assert lossy.status == "inconclusive" and "The addition toy (ours" in lossy.summary


def test_a_sparse_toy_as_dense_as_its_original_never_says_yes():
    """Negative controls: a "sparse" toy that keeps every edge and needs as many heads as the dense one. Its edges
    claim (ours on the toy) says "no" and decides what the verdict names, which stays inconclusive (no paper claim is
    checked on the toy); the multiplier is open, never "yes"; and a multiplier at "no" is said to be ours."""
    from lmlab.studies.result import from_rows
    from lmlab.studies.sparse_circuits.analysis import verdict as s4_verdict

    dense = s4_verdict(from_rows("sparse-circuits", _toy_rows(kept=1.0, heads=(8, 8)), "toy"))
    got = {c["name"]: (c["decision"], c["source"]) for c in dense.evidence["claims"]}
    assert got["toy edges kept"] == ("no", "lmlab") and dense.status == "inconclusive"
    mult = next(v for k, v in got.items() if k.startswith("log2 multiplier"))
    assert mult == ("open", "lmlab") and dense.evidence["deciding"]["name"].startswith("toy edges kept")
    bigger = s4_verdict(from_rows("sparse-circuits", _toy_rows(heads=(3, 8)), "toy"))  # the sparse toy needs more heads
    mult = next(c for c in bigger.evidence["claims"] if c["name"].startswith("log2 multiplier"))
    assert mult["decision"] == "no" and bigger.status == "inconclusive", bigger.summary
    assert "a claim of ours fails" in bigger.summary
