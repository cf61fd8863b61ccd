"""lmlab compare: the overlap arithmetic against plain Python, the rule on synthetic rankings (yes, no, open; like for
like where the old bar kept a half-replaced circuit; two replicates), the head permutation against the model's own
head outputs, the variants it reads, its options, the placebo end to end on a tiny model with a planted circuit (its
heads moved: does not keep; half of them moved: never keeps), and the controls on the embedded SmolLM2 (a variant
equal to the original keeps every circuit; the original with its circuit zeroed keeps none, and the tool says so)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from helpers import check_declared_columns
from lmlab.errors import LmlabError
from lmlab import circuit_overlap
from lmlab.studies.compare import analysis
from lmlab.studies.compare.config import Config
from lmlab.studies.compare.recipe import expand


def _top(scores: np.ndarray, k: int) -> set[int]:
    return set(sorted(range(len(scores)), key=lambda i: -abs(scores[i]))[:k])


def test_top_k_overlap_matches_plain_sets():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(10, 40)), rng.normal(size=(10, 40))
    ones = np.ones((1, 10))
    for k in (1, 3, 7, 20):
        want_a, want_b = _top(a.mean(0), k), _top(b.mean(0), k)
        want = len(want_a & want_b) / len(want_a | want_b)
        got = circuit_overlap.jaccard(circuit_overlap.top_masks(a, ones, k), circuit_overlap.top_masks(b, ones, k))[0]
        assert got == pytest.approx(want)
    # a resample's weights are item counts: the same as the mean over the drawn items
    idx = rng.integers(0, 10, 10)
    weights = np.bincount(idx, minlength=10)[None].astype(float)
    assert set(np.flatnonzero(circuit_overlap.top_masks(a, weights, 5)[0])) == _top(a[idx].mean(0), 5)


def test_the_overlap_is_read_at_the_circuits_size_within_bounds():
    from lmlab.studies.compare.config import circuit_k

    assert circuit_k(57.0, 270, 5) == 57
    assert circuit_k(2.0, 270, 5) == 5  # at least min_k
    assert circuit_k(220.0, 270, 5) == 135  # at most half the heads
    assert circuit_k(float("nan"), 270, 5) == 5  # a curve that never stays at the threshold


def test_chance_level_is_the_expected_jaccard_of_random_sets():
    rng = np.random.default_rng(1)
    total, k = 60, 9
    draws = [len(set(rng.choice(total, k, replace=False)) & set(rng.choice(total, k, replace=False))) for _ in
             range(4000)]
    simulated = np.mean([d / (2 * k - d) for d in draws])
    assert circuit_overlap.chance(k, total) == pytest.approx(simulated, abs=0.01)


def _table(original: np.ndarray, variants: dict[str, list[np.ndarray]], needed: int = 6,
           layers: int = 4) -> pd.DataFrame:
    """A recipe's rows for one task: per-prompt attribution arrays (prompts, heads), clean metrics of 1."""
    heads = original.shape[1] // layers
    rows = []
    models = [("original", "original", 0, original)] + [(f"{cell}#{r}", cell, r, a) for cell, reps in variants.items()
                                                         for r, a in enumerate(reps)]
    for key, cell, rep, per in models:
        rows.append({"kind": "model", "model_key": key, "cell": cell, "replicate": rep, "task": "ioi",
                     "heads_needed": float(needed), "total_heads": per.shape[1], "has_effect": True,
                     "verify_rho": 0.9, "n_heads": heads, "n_layers": layers})
        rows += [{"kind": "attribution", "model_key": key, "cell": cell, "replicate": rep, "task": "ioi", "idx": i,
                  "scores": json.dumps(list(map(float, p)))} for i, p in enumerate(per)]
        for n in (0, per.shape[1]):
            rows.append({"kind": "per_prompt", "model_key": key, "cell": cell, "replicate": rep, "task": "ioi",
                         "n_heads": n, "values": json.dumps([float(n > 0)] * per.shape[0])})
    return pd.DataFrame(rows)


def _circuit(rng, n_prompts=40, total=64, circuit=(3, 17, 22, 40, 51, 60), noise=0.3):
    base = np.zeros(total)
    base[list(circuit)] = np.linspace(3.0, 1.5, len(circuit))
    return base + noise * rng.normal(size=(n_prompts, total))


def _decisions(table) -> dict[str, str]:
    claims, _ = analysis.claims_of(table, Config(model="m", seed=0, min_k=5))
    return {c.group.partition(" / ")[0]: c.decision for c in claims if c.name == "keeps the circuit"}


def test_the_rule_says_yes_no_and_open_where_it_should():
    rng = np.random.default_rng(2)
    original = _circuit(rng)
    same_circuit = [_circuit(rng) for _ in range(3)]  # replicates: the same heads, other noise
    other = [_circuit(rng, circuit=(5, 9, 30, 33, 44, 58)) for _ in range(3)]  # another circuit: the effect absent
    flat = [0.3 * rng.normal(size=original.shape) for _ in range(3)]  # no circuit at all
    decided = _decisions(_table(original, {"kept": same_circuit, "moved": other, "none": flat}))
    assert decided["kept"] == "yes"
    assert decided["moved"] == "no"
    assert decided["none"] == "no"
    # half the circuit shared, measured on 8 noisy prompt pairs: the interval spans the bar, so it cannot tell
    rng = np.random.default_rng(3)
    noisy = _circuit(rng, n_prompts=8, noise=1.5)
    half = [_circuit(rng, n_prompts=8, circuit=(3, 17, 22, 40, 9, 30), noise=1.5)]
    assert _decisions(_table(noisy, {"half": half}))["half"] == "open"


def _drawn_table(originals: list[np.ndarray], variants: dict[str, list[np.ndarray]], needed: int = 6) -> pd.DataFrame:
    """A recipe's rows for one task measured on several prompt draws: the original on each draw (key "original",
    then "original#d"), replicate r of each variant on draw r (the recipe's pairing)."""
    parts = []
    for d, original in enumerate(originals):
        part = _table(original, {cell: [reps[d]] for cell, reps in variants.items() if d < len(reps)}, needed)
        key = lambda k, d=d: ("original" if d == 0 else f"original#{d}") if k == "original" else k.replace("#0", f"#{d}")
        part = part.assign(model_key=part["model_key"].map(key), replicate=d, draw=d)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def test_an_answer_must_hold_across_the_draws_of_prompt_pairs():
    """Each replicate is its own draw of prompt pairs, read against the original on that draw: a variant that keeps
    the circuit in one replicate of three (its other two carry another circuit) is open, not "keeps"; one that keeps
    it on every draw keeps; one that never does does not. The interval counts the prompt pairs' part once."""
    rng = np.random.default_rng(4)
    originals = [_circuit(rng) for _ in range(3)]  # each draw: other prompt pairs, the same circuit
    kept = [_circuit(rng) for _ in range(3)]
    other = (5, 9, 30, 33, 44, 58)
    once = [_circuit(rng)] + [_circuit(rng, circuit=other) for _ in range(2)]
    moved = [_circuit(rng, circuit=other) for _ in range(3)]
    claims, _ = analysis.claims_of(_drawn_table(originals, {"kept": kept, "once": once, "moved": moved}),
                                   Config(model="m", seed=0, min_k=5))
    found = {c.group.partition(" / ")[0]: c for c in claims if c.name == "keeps the circuit"}
    assert found["kept"].decision == "yes" and found["moved"].decision == "no"
    assert found["once"].decision == "open"
    assert found["once"].replicate_estimates[0] > 0 > max(found["once"].replicate_estimates[1:])
    assert found["once"].replicates == 3 and found["once"].df < 10  # the replicates' spread sets its width
    assert "drawn per replicate" in found["once"].method and found["kept"].extra["draws"] == 3
    # every replicate read against the original on its own draw: a copy of the original on each draw has V = R there
    copies = _drawn_table(originals, {"copy": [o.copy() for o in originals]})
    copy = next(c for c in analysis.claims_of(copies, Config(model="m", seed=0, min_k=5))[0]
                if c.name == "keeps the circuit")
    assert copy.extra["overlap"] == pytest.approx(copy.extra["self_overlap"])
    assert copy.decision == "yes"


def _noisy(rng, circuit, shared, n_prompts=32, total=64, noise=1.5):
    """Attribution with the prompts' own noise (`shared`, the same for every model on the same prompt pairs) and each
    model's own."""
    base = np.zeros(total)
    base[list(circuit)] = np.linspace(3.0, 1.5, len(circuit))
    return base + shared + noise * rng.normal(size=(n_prompts, total))


def test_like_for_like_a_half_replaced_circuit_the_old_bar_kept_is_not_kept():
    """Prompt noise both models share (the same prompt pairs) inflates an overlap of rankings made on every prompt
    pair, while the old bar's R, a re-measurement on halves, has none of it: there a variant with half its circuit
    replaced came out "keeps". On the same half-splits it does not."""
    from lmlab.claims import Bar
    from lmlab.resampling import Resampler

    circuit, half = (3, 17, 22, 40, 51, 60), (3, 22, 51, 9, 30, 44)  # every other head replaced
    rng = np.random.default_rng(2)
    shared = 2.5 * rng.normal(size=(32, 64))
    original, variant = _noisy(rng, circuit, shared), _noisy(rng, half, shared)
    copy = [original.copy()]
    # the old rule: the full-prompt Jaccard's interval against (R on halves + C) / 2
    k = 6
    old_bar = (circuit_overlap.self_overlap(original, k, 0).mean() + circuit_overlap.chance(k, 64)) / 2
    old = Resampler(32, 1, n_boot=1000, seed=0).weighted_claim(
        "old", lambda r, w: circuit_overlap.jaccard(circuit_overlap.top_masks(original, w, k), circuit_overlap.top_masks(variant, w, k)),
        Bar(">=", old_bar))
    assert old.decide(0.975) == "yes"  # the defect: half the circuit replaced, "keeps"
    claims, _ = analysis.claims_of(_table(original, {"half": [variant], "copy": copy}), Config(model="m", seed=0, min_k=5))
    found = {c.group.partition(" / ")[0]: c for c in claims if c.name == "keeps the circuit"}
    assert found["half"].decision != "yes"
    assert found["half"].extra["overlap"] < old.estimate  # no shared prompt noise left in V
    # a copy of the original: V equals R on the same splits, so D is half the distance from chance to R
    e = found["copy"].extra
    assert e["overlap"] == pytest.approx(e["self_overlap"])
    assert found["copy"].estimate == pytest.approx((e["self_overlap"] - e["chance"]) / 2)
    assert found["copy"].decision == "yes"
    # R's own uncertainty is in the interval: wider than a fixed R would give
    assert found["copy"].se > 0 and e["self_lo"] < e["self_overlap"] < e["self_hi"]


def test_two_replicates_that_differ_say_why_they_stay_open():
    """Two replicates give the between-replicate spread one degree of freedom: where they differ more than the prompt
    pairs let each vary, the interval's degrees of freedom fall toward 1 and "no", read at the Bonferroni level of a
    run of four comparisons, needs a t quantile past 20; the open claim says so. Three replicates of the same kind
    decide it."""
    rng = np.random.default_rng(4)
    original = _circuit(rng)
    flat = [0.3 * rng.normal(size=original.shape) for _ in range(3)]  # no circuit at all
    claims, _ = analysis.claims_of(_table(original, {"two": flat[:2], "three": flat, "b": flat[1:], "c": flat[:1]}),
                                   Config(model="m", seed=0, min_k=5))
    found = {c.group.partition(" / ")[0]: c for c in claims if c.name == "keeps the circuit"}
    assert found["three"].decision == "no"
    two = found["two"]
    assert two.decision == "open" and two.high < 0 and two.df < 2  # below 0 at 95%, not at the level of "no"
    assert "degrees of freedom" in two.reason and "two replicates" in two.reason


def test_an_original_whose_circuit_does_not_replicate_holds_every_comparison_open():
    rng = np.random.default_rng(6)
    original = rng.normal(size=(16, 64))  # no head stands out on every prompt pair
    claims, _ = analysis.claims_of(_table(original, {"any": [rng.normal(size=(16, 64))]}), Config(model="m", seed=0, min_k=5))
    keep = next(c for c in claims if c.name == "keeps the circuit")
    assert keep.decision == "open" and "does not replicate" in keep.reason


def test_a_ranking_activation_patching_does_not_confirm_holds_the_claim_open():
    rng = np.random.default_rng(3)
    table = _table(_circuit(rng), {"moved": [_circuit(rng, circuit=(5, 9, 30, 33, 44, 58))]})
    table.loc[(table["kind"] == "model") & (table["model_key"] == "moved#0"), "verify_rho"] = 0.1
    claims, _ = analysis.claims_of(table, Config(model="m", seed=0, min_k=5))
    keep = next(c for c in claims if c.name == "keeps the circuit")
    assert keep.decision == "open" and "activation patching" in keep.reason


def test_the_self_overlap_of_identical_prompts_is_one_and_falls_with_noise():
    rng = np.random.default_rng(4)
    clean = np.tile(np.linspace(5, 0, 30), (20, 1))
    assert circuit_overlap.self_overlap(clean, 5, 0).min() == 1.0
    noisy = clean[:, rng.permutation(30)] * 0 + rng.normal(size=(20, 30))
    assert circuit_overlap.self_overlap(noisy, 5, 0).mean() < 0.5


def test_variants_expand_from_files_and_run_folders(tmp_path):
    assert [(v.cell, v.kind) for v in expand("same")] == [("same", "same")]
    assert [(v.cell, v.kind) for v in expand("ablate:3")] == [("ablate:3", "ablate")]
    assert [(v.cell, v.kind) for v in expand("swap:half")] == [("swap:half", "swap")]
    run = tmp_path / "quantize-run"
    (run / "packed").mkdir(parents=True)
    for name in ("2bit-A-rep0", "2bit-A-rep1", "1bit-A-rep0"):
        (run / "packed" / f"{name}.safetensors").write_bytes(b"")
    got = sorted((v.cell, v.replicate, v.kind) for v in expand(str(run)))
    assert got == [("1bit-A", 0, "packed"), ("2bit-A", 0, "packed"), ("2bit-A", 1, "packed")]
    sparse = tmp_path / "sparse-run"
    for r in (0, 1):
        (sparse / "post_training" / f"rep{r}" / "sparse_model").mkdir(parents=True)
    assert [(v.cell, v.replicate) for v in expand(str(sparse))] == [("sparse", 0), ("sparse", 1)]
    (tmp_path / "empty" / "packed").mkdir(parents=True)
    with pytest.raises(LmlabError, match="no student"):
        expand(str(tmp_path / "empty"))


@pytest.mark.parametrize("given, message", [
    ({}, "give a variant"),
    ({"variant": ["ablate:x"]}, "how many top heads"),
    ({"variant": ["swap:3"]}, "'swap' .* and 'swap:half'"),
    ({"variant": ["missing.safetensors"]}, "no such file"),
    ({"make": ["quantized:3"]}, "each one of 8, 4, 2, 1"),
    ({"make": ["pruned:2"]}, "unknown method"),
    ({"variant": ["same"], "tasks": ["nope"]}, "unknown circuit task"),
])
def test_bad_inputs_are_one_sentence(given, message):
    with pytest.raises(LmlabError, match=message):
        Config(model="tiny-llama", **given).check_inputs()


@pytest.mark.parametrize("name, perms", [
    ("tiny-llama", {0: [1, 0, 3, 2], 2: [2, 3, 1, 0]}),  # 4 heads, 2 KV groups: within groups, then groups exchanged
    ("tiny-gpt2", {0: [3, 2, 1, 0], 1: [1, 0, 2, 3]}),  # fused c_attn: every head its own key and value
])
def test_permuting_heads_moves_each_heads_output_and_nothing_else(name, perms):
    """The independent computation: the permuted model's head outputs z are the original's, heads reordered (captured
    on the same prompts), the layers not named are untouched, and the logits are unchanged."""
    import copy
    import dataclasses

    import torch

    from lmlab.interventions import Capture, intervene
    from lmlab.interventions.permute import permute_heads
    from lmlab.models import layout_of, load_model

    lm = load_model(name, dtype=torch.float32)
    moved = dataclasses.replace(lm, model=copy.deepcopy(lm.model))
    moved.layout = layout_of(moved.model)
    batch = lm.encode(["When Mary and John went to the store, John gave a drink to", "The war lasted from the year"])
    with torch.no_grad(), intervene(lm, Capture("z")) as before:
        logits = lm.model(**batch).logits
    permute_heads(moved, perms)
    with torch.no_grad(), intervene(moved, Capture("z")) as after:
        logits_after = moved.model(**batch).logits
    for layer in range(lm.layout.n_layers):
        want = before["z", layer][:, :, perms[layer]] if layer in perms else before["z", layer]
        torch.testing.assert_close(after["z", layer], want, rtol=1e-5, atol=1e-5)
        if layer in perms:  # it did move something
            assert not torch.allclose(after["z", layer], before["z", layer], atol=1e-4)
    torch.testing.assert_close(logits_after, logits, rtol=1e-4, atol=1e-4)


def test_a_permutation_that_splits_a_kv_group_is_refused_before_any_weight_moves():
    import torch

    from lmlab.interventions.permute import permute_heads
    from lmlab.models import load_model

    lm = load_model("tiny-llama", dtype=torch.float32)  # heads 0-1 share a key and value, heads 2-3 another
    weights = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    with pytest.raises(LmlabError, match="share one key and value"):
        permute_heads(lm, {0: [1, 0, 3, 2], 1: [2, 1, 0, 3]})  # layer 0 fine, layer 1 splits both groups
    with pytest.raises(LmlabError, match="every head"):
        permute_heads(lm, {0: [0, 0, 1, 2]})
    assert all(torch.equal(p, weights[n]) for n, p in lm.model.named_parameters())


def test_the_swap_moves_each_chosen_head_off_the_top_and_keeps_the_rest_in_place():
    """moves(): on random top-k sets over layouts with and without grouped-query attention, every permutation keeps
    each KV group's heads together, the top heads not moved stay where they are, a moved head leaves the top-k
    positions unless reported stuck, and with one head a group (no GQA) exactly the heads a layer cannot hold are
    stuck. swap:half moves half of them, the top head first."""
    import random

    from lmlab.interventions.permute import group_map
    from lmlab.studies.compare.placebo import HALF, moved_heads, moves, where_now

    rng = random.Random(0)
    for _ in range(400):
        n_kv, size, layers = rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 3]), rng.randint(1, 3)
        n = n_kv * size
        heads = [(layer, h) for layer in range(layers) for h in range(n)]
        top = rng.sample(heads, rng.randint(1, max(1, len(heads) // 2)))
        how = rng.choice(["", HALF])
        moved = moved_heads(top, how, n, n_kv)
        assert len(moved) == (len(top) if how == "" else (len(top) + 1) // 2)
        perms, stuck = moves(top, moved, n, n_kv)
        for perm in perms.values():
            group_map(perm, n, n_kv)  # raises where a group is split
        for head in set(top) - set(moved):
            assert where_now(perms, head) == head
        for head in moved:
            assert (where_now(perms, head) in set(top)) == (head in stuck)
        if size == 1:
            for layer in range(layers):
                in_top = sum(h[0] == layer for h in top)
                to_move = sum(h[0] == layer for h in moved)
                assert sum(h[0] == layer for h in stuck) == max(0, to_move - (n - in_top))
    assert moved_heads([(0, 1), (0, 2), (1, 0)], HALF) == [(0, 1), (1, 0)]


def test_make_reads_every_bit_once():
    """--make read once into its methods' widths (methods.parse_make): each width once, in the order given; the
    refusals and the help come from the methods' registry."""
    from lmlab.studies.compare.methods import METHODS

    made = Config(model="tiny-llama", make=["quantized:2,1", "quantized:2", "rtn:8,3", "rtn:3,2"])
    assert made.made().bits("quantized") == (2, 1) and made.made().bits("rtn") == (8, 3, 2)
    assert [(m.name, b) for m, b in made.made().post_training()] == [("rtn", 8), ("rtn", 3), ("rtn", 2)]
    assert all(f"{m.name}:" in Config.model_fields["make"].description for m in METHODS.values())
    with pytest.raises(LmlabError, match=r"^--make rtn:9: give the bits, each one of 8, 7, 6, 5, 4, 3, 2"):
        Config(model="tiny-llama", make=["rtn:9"]).check_inputs(models=False)
    with pytest.raises(LmlabError, match=r"^--make int4:4: unknown method 'int4'; use quantized:BITS .* or sparse "):
        Config(model="tiny-llama", make=["int4:4"]).check_inputs(models=False)
    assert Config(model="tiny-llama", make=["gptq:8,4,3,2"]).made().bits("gptq") == (8, 4, 3, 2)
    for kind in ("gptq", "awq"):  # a width the method lacks: one line, before any work
        with pytest.raises(LmlabError, match=rf"^--make {kind}:5: give the bits, each one of 8, 4, 3, 2 \(e.g. "
                                             rf"{kind}:8,2\)$"):
            Config(model="tiny-llama", make=[f"{kind}:5"]).check_inputs(models=False)
    assert Config(model="tiny-llama", make=["bnb:4,8", "bnb:4"]).made().bits("bnb") == (4, 8)
    both = Config(model="tiny-llama", make=["sparse", "rtn:4"])
    assert both.made().sparse and both.made().bits("rtn") == (4,)
    assert not Config(model="tiny-llama", make=["rtn:4"]).made().sparse
    with pytest.raises(LmlabError, match=r"^--make bnb:3: give the bits, each one of 8, 4"):
        Config(model="tiny-llama", make=["bnb:3"]).check_inputs(models=False)
    assert Config(model="tiny-llama", make=["hqq:4,1", "rtn:4"]).made().bits("hqq") == (4, 1)
    with pytest.raises(LmlabError, match=r"^--make hqq:6: give the bits, each one of 8, 4, 3, 2, 1"):
        Config(model="tiny-llama", make=["hqq:6"]).check_inputs(models=False)
    with pytest.raises(LmlabError, match=r"^--make rtn:4 4: give the bits"):  # a space where a comma belongs
        Config(model="tiny-llama", make=["rtn:4 4"]).check_inputs(models=False)
    with pytest.raises(LmlabError, match=r"^--make torchao:2: give the bits, each one of 8, 4"):
        Config(model="tiny-llama", make=["torchao:2"]).check_inputs(models=False)
    from lmlab.studies.compare.methods import EXTRA_CHECKS, METHODS

    assert {m.needs for m in METHODS.values() if m.needs} <= set(EXTRA_CHECKS)  # every extra checked before work


def test_a_missing_torchao_is_one_line_before_any_work(monkeypatch):
    """--make torchao without the torchao extra: its install line, from the inputs' check (no model loaded)."""
    import builtins

    real = builtins.__import__

    def without_torchao(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_torchao)
    with pytest.raises(LmlabError, match=r"^--make torchao needs PyTorch's torchao package .*lmlab\[torchao\]'$"):
        Config(model="tiny-llama", make=["torchao:8"]).check_inputs(models=False)


def test_make_rtn_rounds_the_original_into_model_folders_compared_as_variants(tiny_smol_folder, tmp_path):
    """--make rtn:8,2 (and hqq:4): each a model folder in the run (loadable as any, its recipe and perplexity beside it) compared
    like a variant given as a folder; 8 bits moves the perplexity less than 2 bits; a second run reads the
    finished folders back."""
    import importlib.util

    import lmlab
    from lmlab.interventions.quant import torchao_group
    from lmlab.models import load_model

    # the extras' methods beside them where installed: HQQ's 4 bits (hqq), NF4 (bnb), torchao's int4 (torchao)
    extra = [m for m, package in (("hqq", "hqq"), ("bnb", "bitsandbytes"), ("torchao", "torchao"))
             if importlib.util.find_spec(package)]
    kw = dict(profile="demo", out=tmp_path / "runs", make=["rtn:8,2", *[f"{m}:4" for m in extra]], tasks=["ioi"],
              n_prompts=4, verify_heads=3)
    result = lmlab.run("compare", str(tiny_smol_folder), **kw)
    made = result.table("made").set_index("cell")
    assert list(made.index) == ["rtn-8bit", "rtn-2bit", *[f"{m}-4bit" for m in extra]] and (made.n_text == 64).all()
    original = float(made.original_perplexity.iloc[0])
    moved = {cell: abs(made.loc[cell, "perplexity"] - original) for cell in made.index}
    assert 0 < moved["rtn-8bit"] < moved["rtn-2bit"]  # (a random model's perplexity: the vocabulary's size)
    for cell, row in made.iterrows():
        recipe = json.loads((result.path / "made" / cell / "lmlab-recipe.json").read_text())
        assert recipe["method"] == row.method == cell.split("-")[0] and recipe["bits"] == row.bits
        weight = load_model(row.folder).model.model.layers[0].self_attn.q_proj.weight
        # rtn: a row; hqq, NF4: 64 weights; torchao's int4: its group (32 on this model's 32 inputs)
        size = {"rtn": weight.shape[1], "torchao": torchao_group(weight.shape[1])}.get(row.method, 64)
        groups = weight.reshape(-1, size)
        assert all(len(set(r.tolist())) <= 2 ** row.bits for r in groups)
    comparison, models = result.table("comparison"), result.table("model")
    assert {"rtn-8bit", "rtn-2bit"} <= set(comparison["cell"])
    for row in comparison.itertuples():  # a variant whose clean metric is at or below its corrupted one lost the task
        own = models[(models["cell"] == row.cell) & (models["task"] == row.task)]
        assert row.task_lost == bool(own["clean_metric"].mean() <= own["corrupted_metric"].mean())
        assert (f"{row.cell} / {row.task}: " in result.verdict.summary)
    said = result.verdict.summary.count("and it has lost the task itself")
    assert said == int(comparison["task_lost"].sum())
    titles = [ax.get_title() for ax in analysis.figure(result).axes]  # a fourth panel: D against bits
    assert "ioi: the circuit against bits" in titles and len([t for t in titles if t.startswith("ioi")]) == 4
    assert result.table("variant").set_index("cell").loc["rtn-2bit", "made"]
    check_declared_columns(result)
    again = lmlab.run("compare", str(tiny_smol_folder), **kw)
    assert again.path == result.path and again.table("made").equals(result.table("made"))


def test_make_gptq_and_awq_calibrate_on_shipped_text_into_model_folders(tiny_smol_folder, tmp_path, monkeypatch):
    """--make gptq:4 (and awq:4 where the autoround extra is installed): a loadable model folder each, its recipe
    saying the method, the grid, the calibration text (standard-library docstrings, none of those the perplexity is
    read on) and the library; the rounded layers on 2^4 levels a row (the tiny model's rows are narrower than a group of
    128); the layers AutoRound leaves in full precision named in the recipe and unchanged. Without the extra, --make
    awq is refused in one sentence before any work."""
    import importlib.util

    import torch

    import lmlab
    from lmlab.data.generated.selftext import stdlib_docstrings
    from lmlab.models import load_model
    from lmlab.studies.compare.recipe import _calibration

    awq = importlib.util.find_spec("auto_round") is not None
    kw = dict(profile="demo", out=tmp_path / "runs", make=["gptq:4", *(["awq:4"] if awq else [])], tasks=["ioi"],
              n_prompts=4, verify_heads=3, seeds=2)
    result = lmlab.run("compare", str(tiny_smol_folder), **kw)
    made = result.table("made")
    # a calibrated method: one model per replicate, each calibrated on its own draw of text, read on its own draw
    assert list(zip(made["cell"], made["replicate"].astype(int))) == [(c, r) for c in ["gptq-4bit", *(["awq-4bit"] if awq else [])]
                                                          for r in (0, 1)]
    assert set(result.table("model").query("cell == 'gptq-4bit'")["model_key"]) == {"gptq-4bit#0", "gptq-4bit#1"}
    original = load_model(str(tiny_smol_folder))
    for _, row in made.iterrows():
        recipe = json.loads((result.path / "made" / row.folder.rsplit("/", 1)[-1] / "lmlab-recipe.json").read_text())
        assert f"replicate {int(row.replicate)}'s draw" in recipe["calibration"]
        assert recipe["method"] == row.method and recipe["bits"] == 4 and recipe["group_size"] == 128
        assert recipe["calibration_tokens"] == 256 * recipe["calibration_texts"] == 256 * 32  # (demo's)
        assert "standard-library docstrings" in recipe["calibration"] and "none of the 64" in recipe["calibration"]
        assert recipe["library"].startswith("auto-round 0.16.1" if row.method == "awq" else "none: lmlab's own GPTQ")
        model, kept = load_model(row.folder).model, recipe.get("left_full_precision", [])
        assert row.perplexity != row.original_perplexity
        for layer in range(2):
            for path in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj"):
                weight = model.model.layers[layer].get_submodule(path).weight
                before = original.model.model.layers[layer].get_submodule(path).weight
                if f"layers.{layer}.{path}" in kept:
                    assert torch.equal(weight, before)
                else:
                    assert all(len(set(r.tolist())) <= 16 for r in weight) and not torch.equal(weight, before)
        if row.method == "awq":  # (the tiny model's k and v have 16 outputs: not a multiple of 32, AutoRound's unit)
            assert kept == [f"layers.{i}.self_attn.{p}" for i in range(2) for p in ("k_proj", "v_proj")]
    first, second = (load_model(f).model for f in made[made["cell"] == "gptq-4bit"]["folder"])
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(first.state_dict()[weight], second.state_dict()[weight])  # other calibration, other model
    texts = stdlib_docstrings(original.tokenizer, 64, seed=0)
    chunks, _ = _calibration(original, Config(model=str(tiny_smol_folder)), texts)
    flat = "," + ",".join(str(t) for c in chunks for t in c.tolist()) + ","
    assert not any("," + ",".join(map(str, ids)) + "," in flat for ids in texts if len(ids) > 8)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "auto_round" else real(name, *a))
    with pytest.raises(LmlabError, match=r"^--make awq needs Intel's AutoRound package \(its AWQ\): pip install "
                                         r"'lmlab\[autoround\]'$"):
        lmlab.run("compare", str(tiny_smol_folder), **{**kw, "make": ["awq:4"], "out": tmp_path / "other"})
    assert not (tmp_path / "other").exists()


def test_repeatable_options_keep_each_value_whole(monkeypatch):
    from typer.testing import CliRunner

    import lmlab.studies as studies
    from lmlab.cli import _register_study_commands, app

    _register_study_commands()
    seen = {}

    def fake(spec, settings, out):
        seen.update(variant=settings.variant, make=settings.make)
        raise SystemExit(0)
    monkeypatch.setattr(studies, "run_study", fake, raising=False)
    CliRunner().invoke(app, ["compare", "--model", "tiny-llama", "--variant", "same", "--variant", "ablate:2",
                             "--make", "quantized:2,1"])
    assert seen == {"variant": ["same", "ablate:2"], "make": ["quantized:2,1"]}


def test_reproduce_leaves_compare_out():
    from lmlab.reproduce import reproduce, reproduced_studies

    assert "compare" not in reproduced_studies()
    with pytest.raises(LmlabError, match="not part of reproduce"):
        reproduce("unused", only=["compare"])


PLANTED = [(0, 0), (0, 2), (1, 1), (1, 3)]  # one head of each KV group of the tiny model


@pytest.fixture
def planted_folder(tiny_smol_folder, tmp_path):
    """The file's tiny Llama (2 layers of 4 heads, 2 KV groups, SmolLM2's tokenizer) with a circuit planted: the heads
    PLANTED attend evenly to the whole prompt (their queries zeroed) and write minus a projection of what they read
    into the residual (their value and output maps -c U^T, U), so every prompt pair's corrupted name moves the logit
    difference the same way through them; every other head's output is scaled down. Its ranking then replicates
    across prompt pairs, as a real model's circuit does and a random model's does not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_smol_folder, dtype=torch.float32)
    d, width = model.config.head_dim, model.config.hidden_size
    per_group = model.config.num_attention_heads // model.config.num_key_value_heads
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for block in model.model.layers:
            block.self_attn.o_proj.weight.mul_(0.1)
        for layer, head in PLANTED:
            attn = model.model.layers[layer].self_attn
            u, _ = torch.linalg.qr(torch.randn(width, d, generator=generator))
            attn.q_proj.weight[head * d:(head + 1) * d] = 0.0
            group = head // per_group
            attn.v_proj.weight[group * d:(group + 1) * d] = u.T
            attn.o_proj.weight[:, head * d:(head + 1) * d] = -4.0 * u
    folder = tmp_path / "planted"
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_smol_folder).save_pretrained(folder)
    return folder


def test_placebo_a_working_model_whose_circuit_moved_does_not_keep_it(planted_folder, tmp_path, monkeypatch):
    """--placebo end to end: the variants become the original with its circuit's heads moved to other heads of their
    layers in the weights (`swap`: all of them; `swap:half`: half), chosen on other prompt pairs. The model answers
    exactly as before, and the claim must find the circuit gone: `swap` does not keep it, `swap:half` never keeps it."""
    import lmlab

    result = lmlab.run("compare", str(planted_folder), profile="demo", out=tmp_path / "runs", placebo=True,
                       tasks=["ioi"], n_prompts=16, verify_heads=3)
    table = result.table("comparison").set_index("cell")
    assert set(table.index) == {"swap", "swap:half"}  # the treatment replaced: no variant was given
    assert table.loc["swap", "decision"] == "no"
    assert table.loc["swap:half", "decision"] != "yes"
    assert table.loc["swap:half", "decision"] == "no"  # here, where half the heads of a clean circuit moved
    # the original's circuit replicates (the claim could tell), and the planted heads are the ones moved
    assert table.loc["swap", "self_overlap"] > 0.9
    moved = result.table("placebo").set_index("cell")
    assert set(moved.loc["swap", "heads"].split(", ")) == {f"L{l}.H{h}" for l, h in PLANTED}
    assert int(moved.loc["swap", "stuck"]) == 0 and int(moved.loc["swap:half", "moved"]) == 2
    assert bool(moved.loc["swap", "chosen_on_other_pairs"])
    # a working model: its answers and its clean metric are the original's, prompt by prompt
    assert table["metric_change"].abs().max() < 1e-5
    models = result.table("model").set_index("model_key")
    assert models.loc["swap#0", "clean_metric"] == pytest.approx(models.loc["original", "clean_metric"], abs=1e-6)
    verdict = result.verdict
    assert verdict.summary.startswith("PLACEBO") and verdict.status != "reproduced"
    assert "swap / ioi: does not keep the circuit" in verdict.summary
    check_declared_columns(result)
    _rejudged_under_another_rule_is_whole(result, monkeypatch)


def _rejudged_under_another_rule_is_whole(result, monkeypatch):
    """`lmlab verdict RUN` under a changed rule (the mark moved from the midpoint to chance): the comparison table
    on disk, the figure's bar and the verdict all follow the new rule together (the derived tables made again from
    the measurements), and the measurements stay as they were."""
    import pandas as pd

    from lmlab.studies.compare import analysis
    from lmlab.studies.runner import rejudge

    tables = result.path / "tables"
    measured = (tables / "attribution.parquet").read_bytes()
    before = pd.read_parquet(tables / "comparison.parquet").set_index("cell")
    figure = (result.path / "figure.png").read_bytes()
    monkeypatch.setattr(analysis, "KEEP", 0.0)
    again = rejudge(result.path)
    after = pd.read_parquet(tables / "comparison.parquet").set_index("cell")
    assert (after["midpoint"] < before["midpoint"]).all()  # R > C: the mark at chance sits lower
    assert after["midpoint"].to_numpy() == pytest.approx(after["chance"].to_numpy())
    lines = next(p["lines"] for p in again.verdict.parts if p["kind"] == "compare_lines")
    said = {p["group"]: p["decision"] for p in lines if p["kind"] == "compare_keep"}
    assert said == {f"{cell} / ioi": row["decision"] for cell, row in after.iterrows()}
    assert (result.path / "figure.png").read_bytes() != figure  # the bar's tick moved with the table
    assert (tables / "attribution.parquet").read_bytes() == measured


@pytest.fixture(scope="module")
def controls(embedded_smollm, tmp_path_factory):
    """The two controls on the embedded SmolLM2, one run: IOI, 16 prompt pairs, two draws of them (two replicates)."""
    import lmlab

    out = tmp_path_factory.mktemp("compare")
    return lmlab.run("compare", embedded_smollm, profile="demo", out=out, variant=["same", "ablate"], tasks=["ioi"],
                     n_prompts=16, verify_heads=4, seeds=2)


def test_positive_control_a_copy_of_the_original_keeps_its_circuit(controls):
    table = controls.table("comparison").set_index("cell")
    same = table.loc["same"]
    assert same["decision"] == "yes"
    assert same["jaccard"] == 1.0  # the same top-k on every prompt pair
    assert same["overlap"] == pytest.approx(same["self_overlap"])  # half against half: a re-measurement, exactly
    # its measurements are the original's, prompt by prompt (the same model, copied)
    attr = controls.table("attribution")
    a = attr[attr["model_key"] == "original"].sort_values("idx")["scores"].map(json.loads).tolist()
    b = attr[attr["model_key"] == "same#0"].sort_values("idx")["scores"].map(json.loads).tolist()
    assert a == b  # recorded once: the original's unit on the same draw (a second pass gives the same numbers)
    # its second replicate is the second draw of prompt pairs, the original measured on it too
    c = attr[attr["model_key"] == "original#1"].sort_values("idx")["scores"].map(json.loads).tolist()
    d = attr[attr["model_key"] == "same#1"].sort_values("idx")["scores"].map(json.loads).tolist()
    assert c == d
    assert not np.allclose(np.array(a), np.array(c))
    assert same["replicates"] == 2


def test_negative_control_the_original_without_its_circuit_does_not_keep_it(controls):
    table = controls.table("comparison").set_index("cell")
    ablated = table.loc["ablate"]
    assert ablated["decision"] == "no"
    assert ablated["hi"] < ablated["bar"] == 0 < table.loc["same", "lo"]
    # its heads were ranked on other prompt pairs, so the zeroed set is not exactly the set read: most of the
    # original's circuit is gone from the ablated model's top-k, not necessarily all of it
    heads = controls.table("heads").set_index("cell")
    kept = [h for h in heads.loc["ablate", "kept"].split(", ") if h]
    lost = [h for h in heads.loc["ablate", "lost"].split(", ") if h]
    assert len(lost) > len(kept)
    assert bool(controls.table("selection")["other_pairs"].all())
    verdict = controls.verdict
    assert "ablate / ioi: does not keep the circuit" in verdict.summary
    assert "same / ioi: keeps the circuit" in verdict.summary
    # no paper's claim: never "reproduced"; "answered", its first line counting the comparisons
    assert verdict.status == "answered"
    assert verdict.summary.startswith("answered: of 2 comparisons, 1 keep the original's circuit, 1 do not, 0 open")
    # the figure draws from the tables alone (as the report draws it from a run folder)
    import matplotlib.pyplot as plt

    from lmlab.studies.compare.analysis import figure

    fig = figure(controls)
    assert len(fig.axes) == 3
    plt.close("all")


def test_attribution_ranks_as_activation_patching_on_the_top_heads(controls):
    models = controls.table("model")
    assert (models["verify_rho"] >= 0.5).all(), models[["model_key", "verify_rho"]]
    comp = controls.table("verify_component")
    assert set(comp["model_key"]) == {"original", "original#1", "same#0", "same#1", "ablate#0", "ablate#1"}


def test_compare_runs_in_bf16_on_the_cpu_and_on_the_emulated_gpu(tiny_smol_folder, tmp_path):
    """Every tensor on the model's device and in its dtype: a tiny random Llama speaking SmolLM2's tokenizer."""
    import torch

    import lmlab

    from transformers import AutoModelForCausalLM, AutoTokenizer

    # a user's pair of folders: the original and a fine-tune of it (here: its weights nudged), saved as folders
    tuned = tmp_path / "tuned"
    model = AutoModelForCausalLM.from_pretrained(tiny_smol_folder)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tuned)
    AutoTokenizer.from_pretrained(tiny_smol_folder).save_pretrained(tuned)
    sizes = dict(variant=["same", "ablate:2", str(tuned)], tasks=["ioi"], n_prompts=4, verify_heads=3, seeds=1)
    result = lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "bf16", device="cpu",
                       dtype="bfloat16", **sizes)
    assert set(result.table("model")["model_key"]) == {"original", "same#0", "ablate:2#0", f"{tuned.name}#0"}
    check_declared_columns(result)
    if torch.cuda.is_available():
        return
    from emulated_gpu import DEVICE, emulated_gpu

    with emulated_gpu():
        result = lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "gpu", **sizes)
    assert str(DEVICE) in str(result.info.get("environment", {}).get("device", str(DEVICE)))
    comparison = result.table("comparison").set_index("cell")
    assert comparison.loc["same", "jaccard"] == 1.0  # the copy on the device measures as the original does


def _pathway_rows(original, variants):
    rows = [{"kind": "pathway", "model_key": "original", "cell": "original", "replicate": 0, "dataset": "geo",
             "estimate": original[0], "se": original[1], "df": 40.0, "lo": original[0] - 2 * original[1],
             "hi": original[0] + 2 * original[1], "decision": original[2], "questions": 128}]
    for cell, reps in variants.items():
        rows += [{"kind": "pathway", "model_key": f"{cell}#{r}", "cell": cell, "replicate": r, "dataset": "geo",
                  "estimate": e, "se": se, "df": 40.0, "lo": e - 2 * se, "hi": e + 2 * se,
                  "decision": "yes" if e + 2 * se < 0 else "open", "questions": 128} for r, (e, se) in enumerate(reps)]
    return pd.DataFrame(rows)


def test_the_pathway_claim_keeps_loses_and_waits_for_the_original():
    from lmlab.claims import declared
    from lmlab.studies.compare.pathways import pathway_claims

    spec = declared(analysis.CLAIMS, "keeps the pathway")
    table = _pathway_rows((-30.0, 2.0, "yes"), {"kept": [(-25.0, 2.0), (-28.0, 2.5)], "lost": [(1.0, 1.0), (2.0, 1.0)],
                                                "unsure": [(-15.0, 5.0)]})
    found = {c.group.partition(" / ")[0]: c for c in pathway_claims(table, spec)}
    for c in found.values():
        c.decide()
    assert found["kept"].decision == "yes" and not found["kept"].reported
    assert found["lost"].decision == "no"
    assert found["unsure"].decision == "open"
    assert found["kept"].extra["original"] == -30.0
    # two replicate models that disagree widen the interval beyond either model's own
    spread = pathway_claims(_pathway_rows((-30.0, 2.0, "yes"), {"split": [(-20.0, 1.0), (5.0, 1.0)]}), spec)[0]
    assert spread.se > 5
    # where the original has no pathway there is nothing to keep: reported, never decisive
    none = pathway_claims(_pathway_rows((-1.0, 2.0, "open"), {"lost": [(1.0, 1.0)]}), spec)[0]
    assert none.reported


def test_pathways_compose_the_knockout_study_per_model(tiny_smol_folder, tmp_path, monkeypatch):
    """--pathways runs lmlab knockout on the original and each variant (its own run folders under pathways/), and
    the comparison reads each model's S1 claim back."""
    import lmlab
    import lmlab.studies.knockout.recipe as s1_recipe

    # a tiny random model answers nothing right: label its answers by a rule, as S1's own tiny tests do
    monkeypatch.setattr(s1_recipe, "alias_match", lambda text, aliases, exact=False: aliases[0][0] < "M")
    result = lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path, variant=["same", "ablate"],
                       tasks=["ioi"], n_prompts=4, verify_heads=3, pathways=True, pathway_datasets=["geo-capital"],
                       pathway_questions=48)
    paths = result.table("pathway")
    assert set(paths["model_key"]) == {"original", "same#0", "ablate#0"} and set(paths["dataset"]) == {"geo-capital"}
    by_model = paths.set_index("model_key")["estimate"]
    assert by_model["same#0"] == by_model["original"]  # the copy is the original: its S1 run is the original's
    runs = list((result.path / "pathways").glob("knockout-*/verdict.json"))
    assert len(runs) == 2  # the original's and the ablated model's
    comparison = result.table("pathway_comparison").set_index("cell")
    assert comparison.loc["same", "estimate"] == pytest.approx(paths.set_index("model_key").loc["original", "estimate"])
    assert "pathway: geo-capital" in set(result.report_rows()["task"])
    # a variant on which S1 measures nothing (here: too few questions for its probes) is named, with S1's reason
    few = lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "few", variant=["same"],
                    tasks=["ioi"], n_prompts=4, verify_heads=3, pathways=True, pathway_datasets=["geo-capital"],
                    pathway_questions=12)
    assert "no pathway to compare (lmlab knockout gave no E_Q claim" in few.verdict.summary
    check_declared_columns(result)


def test_a_variant_of_another_architecture_or_tokenizer_is_refused(tiny_smol_folder, tmp_path, monkeypatch, capsys):
    """Another architecture is refused from the two configs, before any weights load and before a run folder is
    made (the command line's `lmlab compare` as the API's run); another tokenizer once the variant loads."""
    import lmlab
    from lmlab.cli import main
    from lmlab.models import load_model
    from lmlab.studies.config import StudyConfig

    other = tmp_path / "other-architecture"
    lm = load_model("tiny-llama")  # 3 layers; the tiny SmolLM2-speaking folder has 2
    lm.model.save_pretrained(other)
    lm.tokenizer.save_pretrained(other)
    with monkeypatch.context() as patched:
        patched.setattr(StudyConfig, "load", lambda *a, **k: pytest.fail("a model loaded before the refusal"))
        with pytest.raises(LmlabError, match=r"^--variant .*other-architecture has 3 layers of 4 heads; the original "
                                             r"2 of 4: compare needs the same architecture$"):
            lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "runs", variant=[str(other)],
                      tasks=["ioi"], n_prompts=4, verify_heads=3)
        with pytest.raises(SystemExit) as exited:
            main(["compare", "--model", str(tiny_smol_folder), "--variant", str(other), "--profile", "demo",
                  "--out", str(tmp_path / "runs")])
        assert exited.value.code == 2 and "compare needs the same architecture" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    tokens = tmp_path / "other-tokenizer"  # the same shape, another vocabulary
    load_model(str(tiny_smol_folder)).model.save_pretrained(tokens)
    lm.tokenizer.save_pretrained(tokens)
    with pytest.raises(LmlabError, match="has another tokenizer than the original"):
        lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "runs", variant=[str(tokens)],
                  tasks=["ioi"], n_prompts=4, verify_heads=3)


def test_prompt_pairs_of_ones_own_from_a_file(tiny_smol_folder, tmp_path):
    """--tasks file:PATH: the user's pairs, one JSON object a line; a bad file is one sentence naming its line."""
    import lmlab

    names = [("Mary", "John"), ("Anna", "Tom"), ("Lucy", "Paul"), ("Emma", "Mark"), ("Sarah", "David"),
             ("Alice", "James")]
    good = tmp_path / "mine.jsonl"
    good.write_text("\n".join(json.dumps({
        "clean": f"When {a} and {b} went out, {b} gave a drink to",
        "corrupted": f"When {a} and {b} went out, {a} gave a drink to",
        "answer": f" {a}", "distractor": f" {b}"}) for a, b in names) + "\n")
    result = lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "runs", variant=["same"],
                       tasks=[f"file:{good}"], n_prompts=6, verify_heads=3)
    models = result.table("model")
    assert set(models["task"]) == {f"file:{good}"} and (models["n_prompts"] == 6).all()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"clean": "a", "corrupted": "b", "answer": " c"}) + "\n")
    with pytest.raises(LmlabError, match=r"bad.jsonl:1: .*'distractor' is missing"):
        Config(model="tiny-llama", variant=["same"], tasks=[f"file:{bad}"]).check_inputs()
    split = tmp_path / "split.jsonl"
    split.write_text(json.dumps({"clean": "When Mary and John went out, John gave a drink to",
                                 "corrupted": "When Mary and John went out, John gave a drink to",
                                 "answer": " Maryland-ish", "distractor": " John"}) + "\n")
    with pytest.raises(LmlabError, match=r"split.jsonl, pair 1: .*tokens"):
        lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "runs2", variant=["same"],
                  tasks=[f"file:{split}"], n_prompts=4, verify_heads=3)
    # refused before any variant is made: students to train (--make quantized) and copies to round alike
    with pytest.raises(LmlabError, match=r"split.jsonl, pair 1: .*tokens"):
        lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "runs3", variant=["same"],
                  make=["quantized:2", "rtn:4"], tasks=[f"file:{split}"], n_prompts=4, verify_heads=3)
    assert not list((tmp_path / "runs3").glob("*/made"))


def test_a_runs_claims_are_measured_once_and_rejudged_alike(tiny_smol_folder, tmp_path, monkeypatch):
    """derive (the comparison table) and verdict read the same rows: the claims are measured once a run, once again
    when the run is re-judged, and the re-judged verdict is the run's own; the cache never answers another run."""
    import lmlab
    from lmlab.studies.runner import rejudge

    calls = []
    measure = analysis._claims_of
    monkeypatch.setattr(analysis, "_claims_of", lambda *a, **k: calls.append(1) or measure(*a, **k))
    kw = dict(profile="demo", variant=["same"], tasks=["ioi"], n_prompts=4, verify_heads=2, seeds=1)
    result = lmlab.run("compare", str(tiny_smol_folder), out=tmp_path / "a", **kw)
    assert len(calls) == 1
    other = lmlab.run("compare", str(tiny_smol_folder), out=tmp_path / "b", **{**kw, "seed": 1})
    assert len(calls) == 2 and other.table("comparison")["estimate"].tolist() != result.table("comparison")["estimate"].tolist()
    again = rejudge(result.path)
    assert len(calls) == 3 and again.verdict.summary == result.verdict.summary
    pd.testing.assert_frame_equal(again.table("comparison"), result.table("comparison"))


def test_the_fewest_bits_that_keep_a_circuit_are_read_down_from_the_widest():
    from types import SimpleNamespace

    said = analysis.fewest_bits([
        SimpleNamespace(group=g, decision=d) for g, d in [
            ("rtn-8bit / ioi", "yes"), ("rtn-4bit / ioi", "yes"), ("rtn-3bit / ioi", "no"), ("rtn-2bit / ioi", "yes"),
            ("rtn-8bit / greater-than", "yes"), ("rtn-4bit / greater-than", "open"),
            ("rtn-8bit / docstring", "open"), ("rtn-4bit / docstring", "yes"),
            ("same / ioi", "yes"), ("rtn-8bit / ioi-long", "yes")]],  # (one width says nothing of a curve)
        {f"rtn-{b}bit": ("rtn", b) for b in (8, 4, 3, 2)})
    assert said == [{"method": "rtn", "task": "ioi", "kept": 4, "next_bits": 3, "next": "no"},
                    {"method": "rtn", "task": "greater-than", "kept": 8, "next_bits": 4, "next": "open"},
                    {"method": "rtn", "task": "docstring", "kept": None, "next_bits": 8, "next": "open"}]


def test_make_sparse_composes_the_sparse_circuits_model_half(tiny_smol_folder, tmp_path, monkeypatch):
    """--make sparse: lmlab sparse-circuits through the registry, its model half alone (no toy), at sizes set here
    to seconds; each post-trained replicate is a variant of the cell `sparse`, loaded with its sparse attention."""
    import dataclasses
    from pathlib import Path

    import lmlab
    import lmlab.studies.registry as registry

    small = dict(sparse_steps=2, sparse_batch=2, n_text=4, n_docstrings=0, text_tokens=16, n_eval_text=2,
                 eval_tokens=32, rank_draws=0, verify_heads=2, n_prompts=4)
    registered, made = registry.get_study, []

    def with_small_sizes(name):
        spec = registered(name)
        if name != "sparse-circuits":
            return spec

        def config(**kw):
            made.append(spec.config(**{**small, **kw}))
            return made[-1]
        return dataclasses.replace(spec, config=config)

    monkeypatch.setattr(registry, "get_study", with_small_sizes)
    result = lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "runs", make=["sparse"], tasks=["ioi"],
                       n_prompts=4, verify_heads=2, seeds=2)
    assert len(made) == 1 and made[0].circuits and not made[0].toy and made[0].tasks == ["ioi"]
    variants = result.table("variant")
    assert list(variants["cell"]) == ["sparse", "sparse"] and list(variants["replicate"]) == [0, 1]
    assert variants["made"].all() and (variants["variant_kind"] == "sparse").all()
    run = Path(variants["source"].iloc[0]).parents[2]  # .../made/sparse-circuits-*/post_training/rep0/sparse_model
    assert run.parent.name == "made" and not (run / "toy").exists()
    assert set(result.table("comparison")["cell"]) == {"sparse"}
    assert json.loads((Path(variants["source"].iloc[0]) / "lmlab.json").read_text())["sparse_attention"]


def test_the_top_line_says_answered_with_its_counts_or_inconclusive_where_nothing_answered():
    """compare checks no paper's claim: a run that answered at least one comparison is "answered" (never
    "reproduced"), its first line counting keep / do not / open and the fewest bits that keep per method and task;
    one whose comparisons are all open, or whose gate blocks every decision, is "inconclusive"."""
    from types import SimpleNamespace

    from lmlab.claims import Gate

    def keeps(*decisions):
        widths = [8, 4, 3, 2]
        return [SimpleNamespace(group=f"rtn-{widths[i]}bit / ioi", decision=d) for i, d in enumerate(decisions)]

    widths = {f"rtn-{b}bit": ("rtn", b) for b in (8, 4, 3, 2)}
    status, head = analysis.top_part("inconclusive", keeps("yes", "yes", "no", "open"), [], widths)
    assert status == "answered"
    assert head == {"kind": "compare_top", "answered": True, "comparisons": 4, "keep": 2, "not": 1, "open": 1,
                    "fewest": [{"method": "rtn", "task": "ioi", "kept": 4, "next_bits": 3, "next": "no"}]}
    status, head = analysis.top_part("inconclusive", keeps("open", "open"), [], widths)
    assert status == "inconclusive" and not head["answered"] and (head["comparisons"], head["keep"]) == (2, 0)
    blocked = Gate("replicates", False, why="1 training run(s)", blocks="all")
    assert analysis.top_part("inconclusive", keeps("yes", "no"), [blocked], widths)[0] == "inconclusive"
    scoped = Gate("students learned", False, blocks="all", claims=("some other claim",))
    assert analysis.top_part("inconclusive", keeps("yes", "no"), [scoped], widths)[0] == "answered"
    assert analysis.top_part("inconclusive", [], [], widths) == ("inconclusive", {
        "kind": "compare_top", "answered": False, "comparisons": 0, "keep": 0, "not": 0, "open": 0, "fewest": []})


def test_the_induction_task_reports_the_induction_score_of_the_verified_heads(tiny_smol_folder, tmp_path):
    """On the induction task each model row carries the mean induction score of the heads patching verified (the
    model's own top heads by attribution), as `circuits.induction_scores` gives it for those heads; the comparison
    table sets the original's beside the variant's; other tasks carry none."""
    import lmlab
    from lmlab import circuits
    from lmlab.data.generated.circuits import make_task
    from lmlab.models import load_model
    from lmlab.resampling import replicate_seed

    result = lmlab.run("compare", str(tiny_smol_folder), profile="demo", out=tmp_path / "runs", variant=["same"],
                       tasks=["induction", "ioi"], n_prompts=4, verify_heads=3)
    models = result.table("model").set_index(["model_key", "task"])
    lm = load_model(str(tiny_smol_folder))
    per_head = circuits.induction_scores(lm, make_task("induction", lm.tokenizer, 4, replicate_seed(0, 0)), 8)  # draw 0
    top = [(int(r.layer), int(r["index"])) for _, r in result.table("verify_component").iterrows()
           if r.model_key == "original" and r.task == "induction"]
    assert len(top) == 3
    assert models.loc[("original", "induction"), "induction_score"] == pytest.approx(
        np.mean([per_head[l, h] for l, h in top]), abs=1e-5)
    assert np.isnan(models.loc[("original", "ioi"), "induction_score"])
    row = result.table("comparison").set_index("task").loc["induction"]
    originals = result.table("model").query("cell == 'original' and task == 'induction'")
    assert len(originals) == 3  # the demo's three draws
    assert row["original_induction"] == pytest.approx(originals["induction_score"].mean())  # over the draws
    assert 0 <= row["variant_induction"] <= 1
    check_declared_columns(result)


def test_a_model_folder_variant_is_named_by_its_folder_and_two_of_one_name_are_refused(tmp_path):
    """A variant folder is named by its folder's name (no path of the machine in a run's tables or verdict); two
    folders of one name, or one folder given twice, are one sentence before any variant is made."""
    from lmlab.studies.compare import recipe

    for where in ("a", "b"):
        (tmp_path / where / "gptq-4bit").mkdir(parents=True)
    [one] = expand(str(tmp_path / "a" / "gptq-4bit"))
    assert (one.cell, one.spec, one.kind) == ("gptq-4bit", str(tmp_path / "a" / "gptq-4bit"), "model")
    assert expand("org/some-model")[0].cell == "org/some-model"  # a hub id as given
    with pytest.raises(LmlabError, match=r"are both named 'gptq-4bit' \(a variant is named by its folder\)"):
        recipe._once(expand(str(tmp_path / "a" / "gptq-4bit")) + expand(str(tmp_path / "b" / "gptq-4bit")))
    with pytest.raises(LmlabError, match="is given twice"):
        recipe._once(expand(str(tmp_path / "a" / "gptq-4bit")) * 2)


def test_a_hybrid_is_compared_on_the_heads_of_its_attention_layers(embedded_smollm, tmp_path):
    """A hybrid (LFM2: short-convolution blocks beside attention ones) is compared, not refused: its heads are scored,
    ranked and overlapped in its attention layers only (a convolution block's heads have no score and are never in a
    top-k; chance counts the attention heads), a variant made in the run rounds every block, and the verdict names
    the layers left out."""
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    import lmlab

    torch.manual_seed(0)
    config = Lfm2Config(vocab_size=len(embedded_smollm.tokenizer), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        layer_types=["conv", "full_attention", "full_attention"], tie_word_embeddings=True)
    folder = tmp_path / "tiny-lfm2"
    Lfm2ForCausalLM(config).save_pretrained(folder)
    embedded_smollm.tokenizer.save_pretrained(folder)
    result = lmlab.run("compare", str(folder), profile="demo", out=tmp_path / "runs", variant=["same", "ablate"],
                       make=["rtn:4"], tasks=["ioi"], n_prompts=8, verify_heads=3, seeds=2)
    models = result.table("model")
    assert set(models["total_heads"]) == {8}  # 2 attention layers x 4 heads, not 3 x 4
    attr = result.table("attribution")
    scores = np.array([json.loads(s) for s in attr["scores"]]).reshape(len(attr), 3, 4)
    assert np.isnan(scores[:, 0]).all() and np.isfinite(scores[:, 1:]).all()
    comparison = result.table("comparison").set_index("cell")
    assert {"same", "ablate", "rtn-4bit"} <= set(comparison.index)
    assert comparison.loc["same", "chance"] == pytest.approx(
        comparison.loc["same", "k"] / (2 * 8 - comparison.loc["same", "k"]))
    for row in result.table("heads").itertuples():
        for name in filter(None, (row.kept + ", " + row.lost + ", " + row.new).split(", ")):
            assert not name.startswith("L0."), name
    said = ("no softmax attention in layers 0 (convolution): the circuits are ranked and compared over the heads of "
            "layers 1, 2")
    assert f"a hybrid original, {said}" in result.verdict.summary and said in (result.path / "log.txt").read_text()
