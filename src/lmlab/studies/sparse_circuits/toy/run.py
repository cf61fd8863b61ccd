"""S4 on the addition toy of the paper's Figure 1, replicated: k toys trained from their own seeds, each
sparse-post-trained, each dissected dense and sparse.

1. k toys (model.py) are trained together as one stacked module (lmlab.train.ensemble), each drawing its batches
   from its own seed (Config.toy_replicate_seeds: k is --toy-seeds, else --seeds, else the profile's toy_seeds,
   else its seeds; the quick profile trains 5 toys beside the model's 3 replicates); the same for the sparse
   post-training, with one GECO multiplier per replicate held to that replicate's own bound (its dense answer CE +
   toy_slack). With `toy_rollback` (quick and full: 2 slacks) a replicate whose constraint's moving average goes
   that far over its bound returns to its last state within bound, its multiplier doubled (train/sparse.Rollback;
   our addition, not the paper's: its GECO has no such step): without it a replicate may end over its bound after a
   spike mid-run, the decayed rate too small to relearn what a pruned edge took. `toy_rollback_window` (off in every profile) returns a replicate on a
   drift too: its CE over its bound by more than the gate allows, on average over that many steps.
2. Each replicate is measured dense and sparse on the 200 test sequences (1000 problems): exact match per
   sequence, and the deterministic gate's kept share of causal edges per sequence.
3. Circuit discovery on each replicate, dense and sparse (the paper's figure at toy scale): the toy's circuit tasks
   (toy.circuit_task, config.TOY_TASKS: the tens digit f of `a b + c d = e f`, its corrupted prompt changing c, or b
   so that the carry flips; toy_tasks picks them), heads ranked by attribution patching and the explained-effect
   curve with the top N heads kept (lmlab.circuits, the same code as the model's discovery); heads needed for 0.9, and
   the multiplier dense / sparse; and `toy_rank_draws` resamples of the prompt pairs, each ranking the heads on its
   own draw and patching that circuit again (resample.py), for the multiplier's interval.

Under `--placebo` the sparse post-training runs with the edge term's weight at zero (recipe.py says why).

Everything is recorded as one unit per phase; the training phases checkpoint and resume on their own.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import torch
from safetensors.torch import save_file

from lmlab import parallel
from lmlab.interventions import SparseAttention, install, intervene
from lmlab.runs import RunDir
from lmlab import circuits
from lmlab.studies.sparse_circuits.toy import model as toy
from lmlab.studies.sparse_circuits.config import Config
from lmlab.studies.sparse_circuits.resample import draw_rows, measure_draws, prompt_draws
from lmlab.studies.sparse_circuits.declared import CONSTRAINT_TOLERANCE, THRESHOLD
from lmlab.train import TrainConfig, train
from lmlab.train.ensemble import stack, unstack
from lmlab.train.geco import sized_rate
from lmlab.train.sparse import qk_scale, sparse_post_train

TOY_PROMPTS = 64  # circuit-task prompt pairs per replicate (a toy forward pass costs little)


def _train_toys(config: Config, run_dir: RunDir, seeds: list[int], data):
    """The k toys, dense (trained) and sparse (post-trained): (dense state dicts, stacked sparse model, training
    record)."""
    device = config.torch_device()
    width = config.size("toy_width")
    model = stack([toy.build_toy(seed=s, d_model=width, device=device).model for s in seeds])
    steps = config.size("toy_steps")
    tc = TrainConfig(steps=steps, batch_size=config.size("toy_batch"), lr=config.toy_lr, weight_decay=0.1,
                     warmup_steps=steps // 20, schedule="cosine", checkpoint_every=200, replicate_seeds=seeds,
                     description=f"toy: addition ({len(seeds)} replicates)", **config.train_settings())
    dense_fit = train(model, data.train, toy.collate, toy.answer_loss, tc, run_dir.path / "toy_dense")
    dense_states = unstack(model)
    dense_train = toy.evaluate(model, data.train[:2000])  # every process: each replicate's tau comes from it
    ce = dense_train["ce"] if len(seeds) > 1 else [dense_train["ce"]]
    taus = [c + config.toy_slack for c in ce]
    sparse_steps = config.size("toy_sparse_steps")
    tc = TrainConfig(steps=sparse_steps, batch_size=config.size("toy_sparse_batch"), lr=config.size("toy_sparse_lr"),
                     schedule=config.size("toy_sparse_schedule"),
                     checkpoint_every=100, replicate_seeds=seeds, lr_scale=qk_scale(config.toy_qk_lr_scale),
                     description=f"toy: sparse post-training ({len(seeds)} replicates)", **config.train_settings())
    rate = config.geco_rate if config.geco_rate is not None else sized_rate(sparse_steps, config.toy_slack)
    clip = config.geco_clip * config.toy_slack if config.geco_clip else None
    spike = config.size("toy_rollback")  # in slacks; 0 or unset: never
    rollback = spike * config.toy_slack if spike else None
    drift = (config.size("toy_rollback_window") or 0, CONSTRAINT_TOLERANCE * config.toy_slack)  # the gate's tolerance
    out = sparse_post_train(model, data.train, toy.collate, toy.answer_loss, taus, tc, run_dir.path / "toy_sparse",
                            rate=rate, initial_multiplier=config.geco_initial, clip=clip, rollback=rollback,
                            drift=drift, edge_weight=0.0 if config.placebo else 1.0)
    record = {"taus": taus, "dense_losses": dense_fit.replicate_losses or [[x] for x in dense_fit.losses],
              "gecos": out.gecos, "histories": out.histories, "steps": sparse_steps, "rollbacks": out.rollbacks}
    return dense_states, model, record


def _as_lists(values, k: int) -> list:
    return values if k > 1 else [values]


def _discover(lm, task, config: Config) -> dict:
    """Ranking and explained-effect curve of one toy (dense or sparse) on the toy's circuit task, and the curve's
    points on `toy_rank_draws` resamples of the prompt pairs with the heads re-ranked on each (resample.py)."""
    z_corr = circuits.corrupted_z(lm, task, config.batch_size)
    per = circuits.attribution_scores(lm, task, config.batch_size, z_corr=z_corr, per_prompt=True)
    scores = per.mean(0)
    order = circuits.ranking(scores)
    curve = circuits.effect_curve(lm, task, order, grid=list(range(len(order) + 1)), batch_size=config.batch_size,
                                  z_corr=z_corr)
    draws = prompt_draws(len(task), config.size("toy_rank_draws") or 0, config.seed)
    reranked = measure_draws(per, curve, draws, THRESHOLD, lambda sets: circuits.patched_metrics(
        lm, task, sets, config.batch_size, z_corr=z_corr))
    return {"order": order, "curve": curve, "scores": scores, "draws": draws, "reranked": reranked}


def run_toy(config: Config, run_dir: RunDir) -> None:
    """The paper's Figure 1 toy, step by step: k toys trained dense on 2-digit addition and sparse-post-trained
    (together, stacked), both measured on the test set (exact match, edges kept), then each replicate's circuits in
    the dense and the sparse toy; one record."""
    if run_dir.done("toy"):
        return
    seeds = config.toy_replicate_seeds()
    data = toy.addition_data(seed=config.seed)
    dense_states, model, record = _train_toys(config, run_dir, seeds, data)
    if not parallel.is_main():  # every process trained its slices; rank 0 measures and records
        return
    width, device = config.size("toy_width"), config.torch_device()
    template = toy.build_toy(seed=seeds[0], d_model=width, device=device).model
    with intervene(model, SparseAttention(sample=False, replicas=len(seeds))):
        sparse = toy.evaluate(model, data.test)
    measured = {"dense": toy.evaluate(stack([_loaded(template, s) for s in dense_states]), data.test),
                "sparse": sparse, "edges": toy.sparse_edges(model, data.test)}
    tasks = [toy.circuit_task(data.test_pairs, TOY_PROMPTS, config.seed, kind) for kind in config.toy_tasks]
    rows, usage = [], {}
    for r, seed in enumerate(seeds):
        rows += _replicate_rows(r, seed, measured, record, len(seeds))
        dense_lm = toy.build_toy(seed=seed, d_model=width, device=device)
        dense_lm.model.load_state_dict(dense_states[r])
        sparse_lm = toy.build_toy(seed=seed, d_model=width, device=device)
        sparse_lm.model.load_state_dict(unstack(model)[r])
        install(sparse_lm, SparseAttention(sample=False))
        for kind, task in zip(config.toy_tasks, tasks):
            rows += _circuit_rows(r, {"dense": dense_lm, "sparse": sparse_lm}, kind, task, config)
        if r == 0:  # the edge drawing shows the first replicate
            usage = {"dense": toy.edge_usage(dense_lm.model, data.test[:200]),
                     "sparse": toy.edge_usage(sparse_lm.model, data.test[:200])}
    save_file({k_: torch.from_numpy(np.ascontiguousarray(v)) for k_, v in usage.items()},
              str(run_dir.path / "toy_edges.safetensors"))
    run_dir.record("toy", "toy", rows)


def _replicate_rows(r: int, seed: int, measured: dict, record: dict, k: int) -> list[dict]:
    """Replicate r's rows: exact match and edges of the dense and the sparse toy (with the post-training's end
    state), per test sequence, and the GECO trace with the edges kept along it."""
    dense, sparse, sparse_edges = measured["dense"], measured["sparse"], measured["edges"]
    geco, history = record["gecos"][r], record["histories"][r]
    em_d, em_s = _as_lists(dense["exact_match"], k)[r], _as_lists(sparse["exact_match"], k)[r]
    seq_d, seq_s = _as_lists(dense["per_sequence"], k)[r], _as_lists(sparse["per_sequence"], k)[r]
    common = {"replicate": r, "seed": seed, "floor": 2 / (toy.SEQ_LEN + 1)}
    rows = [{"kind": "toy", "variant": "dense", "value": em_d, "ce": _as_lists(dense["ce"], k)[r], "kept": 1.0,
             "edges_per_query": (toy.SEQ_LEN + 1) / 2, **common},
            {"kind": "toy", "variant": "sparse", "value": em_s, "ce": _as_lists(sparse["ce"], k)[r],
             "kept": float(sparse_edges["kept"][r].mean()),
             "edges_per_query": float(sparse_edges["edges_per_query"][r].mean()),
             "fallback": float(sparse_edges["fallback"][r].mean()), "lambda": geco.multiplier,
             "final_ema": geco.ema, "converged": geco.holds, "tau": record["taus"][r],
             "steps": record["steps"], "dense_final_loss": record["dense_losses"][-1][r],
             "rollbacks": record["rollbacks"][r], **common}]
    rows += [{"kind": "toy_seq", "replicate": r, "idx": i, "dense_em": float(a), "sparse_em": float(b),
              "kept": float(c), "edges_per_query": float(e)}
             for i, (a, b, c, e) in enumerate(zip(seq_d, seq_s, sparse_edges["kept"][r],
                                                  sparse_edges["edges_per_query"][r]))]
    edges = {h["step"]: h["kept_edges"] for h in history}
    rows += [{"kind": "toy_geco", "replicate": r, "step": i + 1, "ce": ce, "tau": tau, "ema": ema, "multiplier": lam,
              "kept_edges": edges.get(i + 1)} for i, (ce, tau, ema, lam) in enumerate(geco.trace)]
    return rows


def _circuit_rows(r: int, models: dict, kind: str, task, config: Config) -> list[dict]:
    """Replicate r's circuits for the toy task `kind` in each variant: the task's clean and corrupted metric, the
    explained-effect curve per prompt, and the heads' ranking."""
    rows = []
    for variant, lm in models.items():
        found = _discover(lm, task, config)
        curve = found["curve"]
        common = {"replicate": r, "variant": variant, "task": kind}
        rows.append({"kind": "toy_task", **common, "clean_metric": float(curve.clean.mean()),
                     "accuracy": float((curve.clean > 0).mean()), "corrupted_metric": float(curve.none.mean()),
                     "total_heads": len(found["order"])})
        rows += [{"kind": "toy_per_prompt", **common, "n_heads": n,
                  "values": json.dumps([round(float(v), 6) for v in values])}
                 for n, values in zip(curve.grid, curve.values)]
        rows += [{"kind": "toy_ranking", **common, "rank": i, "layer": l, "index": h,
                  "score": round(float(found["scores"][l, h]), 6)} for i, (l, h) in enumerate(found["order"], 1)]
        rows += [{"kind": "toy_rerank_draw", **common, **r} for r in draw_rows(found["draws"])]
        rows += [{"kind": "toy_rerank", **common, **r} for r in found["reranked"]]
    return rows


def _loaded(template, state):
    model = copy.deepcopy(template)
    model.load_state_dict(state)
    return model
