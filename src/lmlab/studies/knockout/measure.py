"""S1 measurements that drive the model: prompt encoding, the knockout sweep and its control draw, ΔP and the flip
rule, token patching.

The S1 knockout sweep for one sample, re-running only what it must.

For probe layers k1 < k2 < ..., cut-off k_i blocks the keys (E_Q, or the random control tokens) in layers
0..k_i and reads the hidden state at layer k_i: with scope "each" (the paper's knockout) every key e loses
every later query q > e, so the E_Q tokens cannot read each other either; with scope "span" only the
positions after the last key lose them. The hidden state at layer k_i depends on layers 0..k_i only, all of
them blocked, so every cut-off of one condition is the *same* computation read at another depth: one row per
condition, blocked in every layer up to the deepest cut-off and read at each, gives all of them (the windows
0..k share their first k layers entirely). Those rows, plus one clean row, go through one batched forward
pass (`Knockout(layer_mask=...)`), and only over the suffix: positions before the first blocked query are
unchanged by any row, so they are computed once, clean, and their KV cache is shared by all rows. Those
positions are therefore identical to the clean run by construction. Cost per sample: (1 + conditions) rows
over the suffix and the deepest cut-off's layers, against one full forward per (condition, cut-off).

`naive_sweep` is the reference: one full forward pass per (sample, layer). The tests check that both
give the same hidden states, and `lmlab bench` times them side by side.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from lmlab.data.qa import QAItem, build_prompt
from lmlab.data.spans import token_positions
from lmlab.generation import last_token_features
from lmlab.interventions import Capture, Knockout, RetireRows, intervene
from lmlab.models import LoadedModel


def encode_item(lm: LoadedModel, item: QAItem) -> dict | None:
    """Prompt ids, E_Q and question token positions; None when E_Q cannot be aligned (counted)."""
    prompt = build_prompt(item)
    if not prompt.eq_spans:
        return None
    ids = lm.tokenizer(prompt.text)["input_ids"]
    eq = sorted({p for s, e in prompt.eq_spans for p in token_positions(lm.tokenizer, prompt.text, s, e)})
    question = token_positions(lm.tokenizer, prompt.text, *prompt.question_span)
    return dict(ids=ids, eq=eq, question=question, eq_source=prompt.eq_source)


def sweep_layers(n_layers: int, every: int, best: int) -> list[int]:
    return sorted(set(range(0, n_layers, every)) | {n_layers // 2, n_layers - 1, best})


@dataclass
class SweepResult:
    clean: dict[int, torch.Tensor]  # layer -> (d,) hidden state at the last token, clean row
    eq: dict[int, torch.Tensor]  # layer k -> (d,) hidden at layer k with E_Q blocked in layers 0..k
    controls: list[dict[int, torch.Tensor]]  # one per control draw (a replicate each), as `eq`
    prefix_len: int
    rows: dict = field(default_factory=dict)  # (condition, layer) -> its row of the batch (0 = clean)
    all_positions: dict[int, torch.Tensor] | None = None  # layer -> (rows, suffix, d), when asked

    @property
    def control(self) -> dict[int, torch.Tensor]:
        """The first control draw's hidden states (the one of a one-replicate run)."""
        return self.controls[0] if self.controls else {}


def _control_sets(ctrl_pos) -> list[list[int] | None]:
    """None, one control draw (a list of positions) or several (a list of them) -> a list of draws."""
    if ctrl_pos is None:
        return []
    if ctrl_pos and isinstance(ctrl_pos[0], (list, tuple)) or (ctrl_pos and ctrl_pos[0] is None):
        return list(ctrl_pos)
    return [ctrl_pos]


def first_changed(positions: list[int], scope: str) -> int:
    """The first position a knockout of `positions` changes: after the first key ('each') or the last ('span')."""
    return (min(positions) if scope == "each" else max(positions)) + 1


def _rows(eq_pos, ctrl_sets, layers, seq_len, n_layers, device):
    """Row 0 is clean; one row per condition that blocks something, blocked in layers 0..max(layers) and read at
    every cut-off (see the module docstring). A condition that blocks nothing *is* the clean computation, so it
    maps to row 0 (same result, exactly, and cheaper). Every row stops after the deepest layer read (`RetireRows`
    keeps one row beyond it: nothing there is read)."""
    conditions = [("eq", eq_pos)] + [(f"control{i}", c) for i, c in enumerate(ctrl_sets)]
    n_rows = 1 + sum(1 for _, positions in conditions if positions)
    deepest = max(layers)
    keys = torch.zeros(n_rows, seq_len, dtype=torch.bool, device=device)
    layer_mask = torch.zeros(n_rows, n_layers, dtype=torch.bool, device=device)
    index = {}
    row = 0
    for name, positions in conditions:
        if positions:
            row += 1
            keys[row, list(positions)] = True
            layer_mask[row, : deepest + 1] = True
        for k in layers:
            index[(name, k)] = row if positions else 0
    active = [n_rows if j <= deepest else 1 for j in range(n_layers)]
    return keys, layer_mask, index, active


def sweep_prefix(seq_len: int, eq_pos: list[int], ctrl_pos, scope: str = "each") -> int:
    """The tokens before the first position any row of a sample's sweep changes (computed once, clean); `ctrl_pos`
    one control draw or several."""
    changed = [first_changed(p, scope) for p in [eq_pos, *_control_sets(ctrl_pos)] if p]
    prefix = min(changed) if changed else seq_len - 1
    return max(1, min(prefix, seq_len - 1))


@torch.no_grad()
def sweep(lm: LoadedModel, ids: list[int], eq_pos: list[int], ctrl_pos, layers: list[int],
          keep_positions: bool = False, scope: str = "each", shared: tuple[int, object] | None = None) -> SweepResult:
    """One sample: clean row + one row per (condition, layer cut-off), prefix computed once. `ctrl_pos`: None, one
    control draw (positions) or several (one per replicate), all in the same batch. `shared`: the (length, cache) of
    a prefix this sample shares with others (`generation.prefix_cache`), computed once for all of them, no longer
    than `sweep_prefix`; it is copied and only the rest of the prefix is run."""
    device = lm.device
    seq_len = len(ids)
    ctrl_sets = _control_sets(ctrl_pos)
    prefix = sweep_prefix(seq_len, eq_pos, ctrl_sets, scope)
    keys, layer_mask, index, active = _rows(eq_pos, ctrl_sets, layers, seq_len, lm.layout.n_layers, device)
    n_rows = keys.shape[0]
    tokens = torch.tensor([ids], device=device)
    if lm.layout.mixing_layers:  # a hybrid: whole sequences, no cache (its recurrent states hold every column read)
        prefix, shared = 0, None
    n_shared = shared[0] if shared is not None and shared[0] <= prefix else 0
    if not prefix:
        cache = None
    elif n_shared:
        cache = copy.deepcopy(shared[1])
        if n_shared < prefix:  # the rest of this sample's prefix, on top of the shared one
            cache = lm.forward_last(dict(input_ids=tokens[:, n_shared:prefix], cache=cache, use_cache=True,
                                         position_ids=torch.arange(n_shared, prefix, device=device)[None])).cache
    else:
        cache = lm.forward_last(dict(input_ids=tokens[:, :prefix], use_cache=True)).cache  # the cache only
    if cache is not None:
        cache.batch_repeat_interleave(n_rows)
    suffix = tokens[:, prefix:].expand(n_rows, -1)
    mask = torch.ones(n_rows, seq_len, dtype=torch.long, device=device)
    positions = torch.arange(prefix, seq_len, device=device).expand(n_rows, -1)
    capture = Capture("resid_post", layers=sorted(set(layers)))
    edits = [Knockout(keys, scope=scope, layer_mask=layer_mask), capture]
    if not keep_positions:  # nothing beyond the deepest cut-off is read (every row kept when every position is)
        edits.append(RetireRows(active))
    with intervene(lm, *edits):
        lm.forward_last(dict(input_ids=suffix, attention_mask=mask, position_ids=positions, cache=cache,
                             use_cache=cache is not None))
    last = {k: capture["resid_post", k][:, -1].float().cpu() for k in layers}
    result = SweepResult(clean={k: last[k][0] for k in layers},
                         eq={k: last[k][index[("eq", k)]] for k in layers},
                         controls=[{k: last[k][index[(f"control{i}", k)]] for k in layers} for i in range(len(ctrl_sets))],
                         prefix_len=prefix, rows=index)
    if keep_positions:
        result.all_positions = {k: capture["resid_post", k].float().cpu() for k in layers}
    return result


@torch.no_grad()
def naive_sweep(lm: LoadedModel, ids: list[int], eq_pos: list[int], layers: list[int],
                scope: str = "each") -> dict[int, torch.Tensor]:
    """Reference: one full forward pass per layer cut-off; layer k -> hidden at layer k, last token."""
    tokens = torch.tensor([ids], device=lm.device)
    keys = torch.zeros_like(tokens, dtype=torch.bool)
    keys[0, list(eq_pos)] = True
    out = {}
    for k in layers:
        with intervene(lm, Knockout(keys, scope=scope, layers=range(k + 1)), Capture("resid_post", layers=k)) as (_, cap):
            lm.forward_last(dict(input_ids=tokens))  # as `sweep`: no logits beyond the last position
        out[k] = cap["resid_post", k][0, -1].float().cpu()
    return out


def patching_features(lm, answered, answers, correct, config, layers: list[int]) -> tuple[list, np.ndarray | None]:
    """Token patching and its control, for each correctly answered question whose set has another subject:
    - "eq": the subject is replaced by another question's subject of the same set and relation whose gold answers
      differ (`donors_for`; the model's answer kept, so it becomes false);
    - "random": as many random question tokens outside E_Q as the subject has are replaced, in place, by random
      tokens of the same donor's question outside its E_Q (the paper's comparison: patching random tokens).
    In the placebo (`config.placebo`) the "eq" arm is a second random patch of the same kind and size, drawn
    independently of the "random" arm's (which is the normal run's, draw for draw), on the same questions and donors.
    Returns the jobs (index, item, condition) and their last-token features at `layers` (jobs x layers x d): one
    forward pass per job, shared by every replicate whose probe reads one of these layers."""
    rng = random.Random(config.seed + 1)
    control_rng = random.Random(config.seed + 2)
    placebo_rng = random.Random(placebo_seed(config.seed, "patching"))
    by_set: dict[tuple, list] = {}
    for item in answered:
        if item.subject:
            by_set.setdefault(_kind(item), []).append(item)
    jobs = []
    for n, item in enumerate(answered):
        donors = donors_for(item, by_set.get(_kind(item), []))
        if not correct[n] or not item.subject or not donors:
            continue
        patched = _patched(lm, item, rng.choice(donors), config.placebo, placebo_rng, control_rng)
        jobs += [(n, item, cond, ids + answers[item.id]) for cond, ids in patched]
    if not jobs:
        return [], None
    feats = last_token_features(lm, [seq for *_, seq in jobs], layers, config.batch_size,
                                description="token patching")
    return [(n, item, cond) for n, item, cond, _ in jobs], feats


def _patched(lm, item: QAItem, donor: QAItem, placebo: bool, placebo_rng: random.Random,
             control_rng: random.Random) -> list[tuple[str, list[int]]]:
    """One question's patched prompts, (condition, token ids) each: "eq" (the subject swapped for the donor's; in
    the placebo a random patch of the subject's size, drawn from `placebo_rng`) and "random" (as many random question
    tokens patched from the donor's, from `control_rng`). Nothing where the swapped question does not encode; an arm
    is left out where its patch cannot be drawn."""
    swapped = dataclasses.replace(item, question=item.question.replace(item.subject, donor.subject),
                                  subject=donor.subject)
    enc = encode_item(lm, swapped)
    if enc is None:
        return []
    own, theirs = encode_item(lm, item), encode_item(lm, donor)
    prompt = build_prompt(item)
    at = prompt.text.rfind(item.subject, *prompt.question_span)
    count = len(token_positions(lm.tokenizer, prompt.text, at, at + len(item.subject))) if at >= 0 else 1
    out = []
    if placebo:  # the subject swap replaced by a random patch of its size (none drawn: no question)
        ids = random_patch(own, theirs, count, placebo_rng) if own is not None and theirs is not None else None
        if ids is None:
            return []
        out.append(("eq", ids))
    else:
        out.append(("eq", enc["ids"]))
    if own is None or theirs is None:
        return out
    ids = random_patch(own, theirs, count, control_rng)
    return out + ([("random", ids)] if ids is not None else [])


def _kind(item: QAItem) -> tuple:
    """The questions a subject swap may take its donor from: the same set and the same relation (the property
    asked: a country's capital is not swapped into a question about a city's state)."""
    return item.dataset, item.relation or item.prop


def donors_for(item: QAItem, same_kind: list[QAItem]) -> list[QAItem]:
    """The subjects `item`'s subject may be swapped for: another subject of its kind whose gold answers share none
    with `item`'s (normalised), so that the swap changes the true answer and the model's own answer, kept, becomes
    false (a donor on the same continent would leave it true, with nothing for the probe to flip)."""
    from lmlab.data.scoring import normalize_answer

    gold = {normalize_answer(a) for a in item.aliases}
    return [d for d in same_kind if d.subject != item.subject and not gold & {normalize_answer(a) for a in d.aliases}]


def placebo_seed(seed: int, part: str) -> int:
    """The seed of the placebo's own draws (`part`: "knockout" or "patching"): a hash of the run's seed, so that they
    share nothing with the control's draws (seeded by the replicates' seeds) or the random patch's (seed + 2)."""
    return zlib.crc32(f"lmlab|knockout|placebo|{part}|{int(seed)}".encode()) & 0x7FFFFFFF


def random_patch(own: dict, donor: dict, count: int, rng: random.Random) -> list[int] | None:
    """The prompt ids of `own` (an `encode_item` encoding) with `count` random question positions outside its E_Q
    set to random tokens of `donor`'s question outside the donor's E_Q; None when either has no such token, or `own`
    has fewer than `count` (a patch of another size is not drawn)."""
    pool = [p for p in own["question"] if p not in set(own["eq"])]
    tokens = [donor["ids"][p] for p in donor["question"] if p not in set(donor["eq"])]
    if len(pool) < count or not pool or not tokens:
        return None
    ids = list(own["ids"])
    for p in rng.sample(pool, count):
        ids[p] = rng.choice(tokens)
    return ids


def patching_rows(jobs, feats, probe, clean_feats) -> list[dict]:
    """One replicate's reading of the patched features (`feats`: jobs x d at its probe's layer): does its probe
    flip when the subject is swapped ("eq"), or when as many random question tokens are ("random")? Which pathway a
    question belongs to is not decided here: the analysis splits the questions from the knockout's recorded flips."""
    rows = []
    for (n, item, condition), f in zip(jobs, feats):
        before = probe.p_true(clean_feats[n])[0] >= 0.5
        after = probe.p_true(f)[0] >= 0.5
        rows.append(dict(kind="patching", id=item.id, dataset=item.dataset, condition=condition,
                         flipped=int(before != after)))
    return rows


def knockout_rows(item, probe_set, eq, control, clean, probes, layers, replicate: int, eq_tokens: int,
                  control_tokens: int) -> list[dict]:
    """ΔP and flips of one sample at every sweep layer under one replicate's probes and control draw: ŷ is the
    probe's clean prediction, ΔP = 100 (p_knock(ŷ) - p_clean(ŷ)), and a sample flips when p_knock(ŷ) falls below 0.5.
    `control` None: the question has no control of E_Q's size to draw (fewer question tokens outside E_Q than E_Q
    has), and it gets no control row (a control is a real draw of exactly as many tokens, never the clean row nor a
    smaller draw). Every row records how many tokens each condition knocks out (`eq_tokens`, `control_tokens`: 0
    where none was drawn). The Q/A split is the analysis's, from these flips."""
    rows = []
    for k in layers:
        probe = probes[k]
        p_clean = float(probe.p_true(clean[k].numpy())[0])
        y_hat = int(p_clean >= 0.5)
        pc = p_clean if y_hat else 1 - p_clean
        for cond, hidden in (("eq", eq), ("control", control)):
            if hidden is not None and k in hidden:  # no control draw: no row
                p = float(probe.p_true(hidden[k].numpy())[0])
                pk = p if y_hat else 1 - p
                rows.append(dict(kind="knockout", replicate=replicate, id=item.id, dataset=item.dataset,
                                 probe_set=probe_set, layer=k, condition=cond, p_clean=pc, p_knock=pk,
                                 delta_p=100 * (pk - pc), rel_change=(pk - pc) / pc, y_hat=y_hat,
                                 flipped=int(pk < 0.5), eq_tokens=eq_tokens, control_tokens=control_tokens))
    return rows


def pool(enc: dict) -> list[int]:
    """A question's positions outside its E_Q: where the control (and the placebo's stand-in for E_Q) is drawn."""
    eq = set(enc["eq"])
    return [p for p in enc["question"] if p not in eq]


def control_draws(answered, encoded, seeds) -> list[list]:
    """Per question, one control draw per replicate: exactly as many random question tokens outside E_Q as E_Q has,
    or None where the question has fewer (no control of E_Q's size exists; the analysis names these questions).
    Drawn for every question in order from each replicate's own generator, so that a resumed or sharded run draws
    the same (a question without a control still takes its draw from the stream, which keeps every other
    question's draw what it would be)."""
    rngs = [random.Random(seed) for seed in seeds]
    out = []
    for item in answered:
        enc = encoded[item.id]
        free, size = pool(enc), len(enc["eq"])
        draws = [rng.sample(free, min(size, len(free))) if free else None for rng in rngs]
        out.append([sorted(d) if d is not None and len(d) == size else None for d in draws])
    return out


def placebo_eq(answered, encoded, seed: int) -> list[list[int] | None]:
    """The placebo's stand-in for each question's E_Q: exactly |E_Q| random question tokens outside E_Q, one draw per
    question (fixed across replicates, as E_Q is) from a generator of its own; None where the question has fewer."""
    rng = random.Random(placebo_seed(seed, "knockout"))
    out = []
    for item in answered:
        enc = encoded[item.id]
        free, size = pool(enc), len(enc["eq"])
        out.append(sorted(rng.sample(free, size)) if len(free) >= size else None)
    return out
