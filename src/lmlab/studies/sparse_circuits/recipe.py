"""S4 · Sparse attention post-training and circuit size (Draye et al., arXiv 2512.05865).

1. Dense circuit discovery on four generated tasks (data/generated/circuits.py): heads ranked by
   attribution patching (lmlab.circuits), explained effect EE(N) with the top N heads kept and every other
   head patched with its corrupted-run output; N needed for EE >= 0.9. The attribution ranking is checked
   against activation patching on a subset of heads (top heads plus random ones) on IOI.
2. Sparse post-training (train/sparse.py): edge gates on every layer, GECO holding the CE within tau =
   dense CE + slack, on text the dense model samples itself (its own distribution: the constraint is
   about it), mixed with docstrings from Python's stdlib for the Docstring task (DECISION: the task's
   prompts are docstrings). Sampled text plus docstrings number steps x batch: post-training is one pass and the
   constraint is always estimated on sequences the model has not trained on (DECISION: on text seen again,
   the training constraint can hold while the held-out CE rises; the paper post-trains on pretraining text
   without repeats). Each batch is held to its own bound: the dense
   model's CE on the same batch (token-weighted, as the training CE) plus the slack (DECISION, `paired_tau`;
   the same bound in expectation as the paper's fixed tau, without the spread between batches that mix
   sampled text and docstrings: that spread can exceed a slack of
   a tenth of a nat and drive the multiplier down before the gates have moved). The multiplier starts at 1
   and its rate is sized to the step budget (train/geco.sized_rate); its trajectory (CE, the constraint's moving average, lambda, edges kept) is a table and geco_figure.
   The sparse model is saved as an HF folder (safetensors) and loaded back through `load_model`, which
   re-installs the deterministic gate, so step 3 treats it like any model.
   Sparsity is measured on held-out sampled text of `eval_tokens` tokens (quick 256; full: the model's
   context), one sequence at a time, as the fraction of causal edges kept and as edges per query, the
   self-edge fallback of a query that kept nothing not counted (it is reported apart).
3. The same discovery on the sparse model; multiplier = heads the dense model needs / heads the
   sparse model needs at 0.9 (> 1: the sparse model needs fewer). Its interval resamples the prompt pairs with the
   whole procedure on each draw (resample.py): each prompt pair's attribution is recorded, each of `rank_draws`
   draws ranks the heads on its own pairs, and the circuit that ranking keeps is patched again, from the grid's
   top down to the first point under the threshold (its mean metric over the draw's pairs recorded); the heads'
   choice, made on the pairs, is resampled with them. Cost: about a quarter of a curve's forward passes per draw.
4. The toy of the paper's Figure 1 (toy/model.py, toy/run.py): 4 layers trained from scratch on 2-digit addition,
   five problems to a sequence (so one edge per query is 4.3% of the edges), then sparse-post-trained, k times
   (`--seeds`), the replicates trained together as one stacked module; each replicate's circuit for the ones
   digit is found dense and sparse, which draws the paper's figure at toy scale (explained effect vs heads kept,
   the multiplier over replicates); its attention edges are drawn dense above, sparse below.

The placebo (`--placebo`, Config.placebo_treatment): the same run with the edge term's weight at zero in the
post-training objective of the model and of the toy (train/sparse.py `edge_weight`): the same gates, GECO loop, text,
steps and seeds, so the "sparse" model is the dense one post-trained the same way with nothing pushing its edges
down; the gate stays (sampled in training, s_ij > 0 at evaluation), so what the gate does alone stays in it. Its
verdict must not be "reproduced", and none of its decisive claims should say "yes".

Under a launch (`torchrun -m lmlab sparse-circuits`, docs/scaling.md) discovery is shared out by task (the
attribution check is one more unit), rank 0 samples the text and measures sparsity, and every process
post-trains (and trains the toy) data-parallel: the gate's noise is keyed per example and the constraint and
edge terms are reduced over the processes (train/sparse.py), so N processes follow one process's curve.

Verdict (analysis.py): inconclusive while a post-training's constraint was violated over its last quarter
(the CE's mean excess over its bound above a tenth of the slack); edges kept still falling by > 10% over the last
quarter keep it from "not reproduced" only (a sparse model still getting sparser can only understate the paper's
effect); with fewer than 64 prompt pairs the multiplier is called underpowered and cannot make the claim
"reproduced".

`--sparse-model DIR` (an earlier run's sparse_model/ folder, post-trained from the same model) skips sampling the
post-training text and post-training: that model is measured, with the earlier run's record of its training
(sparse_training.json beside it). Nothing then trains the model, so the study takes a device map (the toy,
a model of its own, still trains on one device).

DECISIONS for CPU minutes: quick post-trains 20 steps of 16 sequences x 128 tokens (a step of SmolLM2-135M
takes seconds on a CPU), 12 prompt pairs per task (underpowered, said so) and a coarse N grid; the
toy is 64 wide. The q/k projections train at 10x the learning rate (the gates read only them).
The full profile (GPU) uses 64 prompts, 2000 steps of 16 sequences, held-out text at the model's context.
"""

from __future__ import annotations

import copy
import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from lmlab import parallel
from lmlab.data.generated.circuits import TASKS, make_task
from lmlab.data.generated.selftext import sample_text, stdlib_docstrings
from lmlab.errors import LmlabError
from lmlab.evaluation import causal_lm_ce_edges
from lmlab.files import atomic_write
from lmlab.models import LoadedModel, save_model
from lmlab.runs import RunDir, sparse_model_folder
from lmlab.stats import bootstrap
from lmlab.studies.sparse_circuits.toy.run import run_toy
from lmlab.studies.sparse_circuits.config import Config
from lmlab.studies.sparse_circuits.measure import (discover, reference_batch, text_batches, verify,
                                                    with_dense_reference)
from lmlab.train import TrainConfig
from lmlab.train.geco import sized_rate
from lmlab.train.sparse import qk_scale, sparse_post_train


def _eval_tokens(lm, config: Config) -> int:
    tokens = config.size("eval_tokens")
    if tokens:
        return tokens
    context = getattr(lm.model.config, "max_position_embeddings", None) or 2048
    return int(context) - 8  # the model's context, less room for the opener


def _text(lm, config: Config, run_dir: RunDir) -> dict:
    """Post-training text (sampled, plus docstrings; none with --sparse-model) and held-out sampled text of exactly
    eval_tokens (its own seed: the same either way), cached."""
    data_file = run_dir.path / "post_training_text.json"
    if data_file.is_file():
        return json.loads(data_file.read_text())
    text, docs = [], []
    if not config.sparse_model:
        text = sample_text(lm, config.size("n_text"), config.text_tokens, seed=config.seed, batch_size=64)
        docs = stdlib_docstrings(lm.tokenizer, config.size("n_docstrings"), max_tokens=config.text_tokens,
                                 seed=config.seed)
    held_out = sample_text(lm, config.size("n_eval_text"), _eval_tokens(lm, config), seed=config.seed + 7919,
                           batch_size=8, exact=True)
    data = {"train": text + docs, "eval": held_out}
    atomic_write(data_file, json.dumps(data))
    return data


def _post_train(lm, config: Config, run_dir: RunDir, replicate: int = 0, seed: int | None = None):
    """Sample text, measure tau, sparse-post-train replicate `replicate` (its gate noise and batch order from
    `seed`), save; returns the folder of its sparse model and its training record (beside the folder)."""
    seed = config.seed if seed is None else seed
    folder = sparse_model_folder(run_dir.path, replicate)
    where = folder.parent
    if (folder / "lmlab.json").is_file() and (where / "sparse_training.json").is_file():  # (lmlab.json is written last)
        return folder, json.loads((where / "sparse_training.json").read_text())
    data = _text(lm, config, run_dir)
    train_seqs = data["train"]
    items, dense_ce = with_dense_reference(lm, train_seqs, config.batch_size)
    tau = dense_ce + config.slack

    def ce_fn(model, batch):  # (CE, its bound, the tokens it is a mean over)
        loss = model(**{k: v for k, v in batch.items() if k != "dense_ce"}).loss
        tokens = float((batch["labels"][:, 1:] != -100).sum())
        return loss, (batch["dense_ce"] + config.slack) if config.paired_tau else None, tokens

    steps = config.size("sparse_steps")
    if len(items) < steps * config.size("sparse_batch"):  # the constraint is then partly read on seen text
        run_dir.log(f"post-training repeats its text: {len(items)} sequences for {steps} x "
                    f"{config.size('sparse_batch')} draws")
    rate = config.geco_rate if config.geco_rate is not None else sized_rate(steps, config.slack)
    tc = TrainConfig(steps=steps, batch_size=config.size("sparse_batch"), lr=config.sparse_lr,
                     schedule="constant", warmup_steps=0, checkpoint_every=5, seed=seed,
                     lr_scale=qk_scale(config.qk_lr_scale), description=f"sparse post-training, replicate {replicate}",
                     **config.train_settings())
    out = sparse_post_train(lm.model, items, lambda b: reference_batch(lm, b), ce_fn, tau, tc,
                            where / "sparse_train", rate=rate, initial_multiplier=config.geco_initial,
                            clip=config.geco_clip * config.slack if config.geco_clip else None,
                            edge_weight=0.0 if config.placebo else 1.0)
    if parallel.is_main():  # every process holds the same weights: rank 0 saves them; the record first and the
        # model folder's lmlab.json last, so a kill in between leaves nothing a resume takes for complete
        info = {"tau": tau, "dense_train_ce": dense_ce, "paired_tau": config.paired_tau,
                "final_multiplier": out.geco.multiplier,
                "final_ema": out.geco.ema, "converged": out.geco.holds, "rate": rate, "losses": out.result.losses,
                "steps": steps, "batch": config.size("sparse_batch"), "train_tokens": config.text_tokens,
                "geco": [list(t) for t in out.geco.trace], "history": out.history, "seed": seed,
                "edge_weight": 0.0 if config.placebo else 1.0}
        atomic_write(where / "sparse_training.json", json.dumps(info))
        save_model(lm, folder, sparse_attention=True)
        shutil.rmtree(where / "sparse_train", ignore_errors=True)  # the saved model supersedes checkpoints
    parallel.sync()
    return folder, json.loads((where / "sparse_training.json").read_text())


def _geco_rows(kind: str, info: dict, replicate: int = 0) -> list[dict]:
    """One row per post-training step: the constraint (CE), its moving-average violation, lambda, edges kept."""
    edges = {h["step"]: h["kept_edges"] for h in info.get("history", [])}
    return [{"kind": kind, "replicate": replicate, "step": i + 1, "ce": ce, "tau": tau, "ema": ema, "multiplier": lam,
             "kept_edges": edges.get(i + 1)}
            for i, (ce, tau, ema, lam) in enumerate(info.get("geco", []))]


def _sparsity(sparse_lm, config: Config, run_dir: RunDir, eval_seqs, info: dict, replicate: int) -> None:
    """Replicate `replicate`'s edges kept and CE change on the held-out text, per sequence and in all (recorded)."""
    key = f"rep{replicate}"
    if key in run_dir.done("sparsity") or not parallel.is_main():
        return
    # how the model was post-trained, as its record says (an earlier run's, with --sparse-model; one from before
    # the record named its batch and text length leaves them out)
    trained = {"steps": info.get("steps", len(info["losses"])), "batch": info.get("batch"),
               "train_tokens": info.get("train_tokens")}
    # one held-out sequence at a time: no padding, so every query row is a real token's
    per_seq = [causal_lm_ce_edges(sparse_lm.model, text_batches(sparse_lm, [seq], 1)) for seq in eval_seqs]
    sparse_ce = np.array([ce[0] for ce, _ in per_seq])
    counts = {name: np.array([c[name] for _, c in per_seq]) for name in ("kept", "total", "queries", "fallback")}
    dense_ce = np.array([r["ce"] for r in run_dir.done("dense-text")["dense-text"]])
    ci = bootstrap(sparse_ce - dense_ce, seed=config.seed)
    tokens = int(np.mean([len(s) for s in eval_seqs]))
    rows = [{"kind": "sparsity", "replicate": replicate, "variant": "dense", "value": 1.0, "ce": float(np.mean(dense_ce)),
             "edges_per_query": (tokens + 1) / 2, "tokens": tokens},
            {"kind": "sparsity", "replicate": replicate, "variant": "sparse",
             "value": counts["kept"].sum() / max(counts["total"].sum(), 1.0),
             "edges_per_query": counts["kept"].sum() / max(counts["queries"].sum(), 1.0),
             "fallback": counts["fallback"].sum() / max(counts["queries"].sum(), 1.0), "tokens": tokens,
             "n_sequences": len(eval_seqs), "ce": float(np.mean(sparse_ce)), "ce_diff": ci.estimate, "lo": ci.low,
             "hi": ci.high, "tau_slack": config.slack, "multiplier": info["final_multiplier"],
             "final_ema": info["final_ema"], "converged": bool(info["converged"]),
             **trained, "n_prompts": config.size("n_prompts")}]
    rows += [{"kind": "sparse_seq", "replicate": replicate, "idx": i, "kept": k / max(t, 1.0), "ce_diff": float(c - d)}
             for i, (k, t, c, d) in enumerate(zip(counts["kept"], counts["total"], sparse_ce, dense_ce))]
    run_dir.record("sparsity", key, rows + _geco_rows("geco", info, replicate))


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    for name in config.tasks:
        if name not in TASKS:
            raise LmlabError(f"unknown circuit task '{name}'; registered tasks: {', '.join(TASKS)}")
    if not config.size("circuits"):  # the toy alone: no model to load
        run_toy(config, run_dir)
        parallel.main_only()
        return pd.DataFrame([r for rs in run_dir.done("toy").values() for r in rs])
    lm = _checked(config, lm)
    discover(lm, "dense", config, run_dir)  # under a launch: tasks by process, then the check
    verify(lm, config, run_dir)
    eval_seqs = parallel.main_first(partial(_text, lm, config, run_dir))["eval"]  # sampled once, by rank 0
    if parallel.is_main() and not run_dir.done("dense-text"):  # before post-training changes the weights
        dense_ce, _ = causal_lm_ce_edges(lm.model, text_batches(lm, eval_seqs, 1))
        run_dir.record("dense-text", "dense-text", [{"kind": "dense_text", "ce": c} for c in dense_ce])
    _sparse_models(lm, config, run_dir, eval_seqs)
    del lm
    if config.toy:
        run_toy(config, run_dir)
    parallel.sync()
    parallel.main_only()
    rows = [r for part in ("discovery-dense", "verify", "sparsity", "discovery-sparse", "toy")
            for _, rs in sorted(run_dir.done(part).items(), key=lambda kv: _unit_order(kv[0], config)) for r in rs]
    return pd.DataFrame(rows)  # the measurements; the analysis derives the curves, heads needed and multipliers


def _checked(config: Config, lm: LoadedModel | None) -> LoadedModel:
    """The dense model (a copy where it will be post-trained: a model passed in is never trained in place), checked
    before any work: a causal model with heads in every layer, each task's answers single tokens."""
    if config.sparse_model:  # measured, not post-trained here: the model only runs (a device map may spread it)
        lm = lm if lm is not None else config.load()
    else:  # post-training changes the weights: a model passed in is copied, never trained in place
        lm = copy.deepcopy(lm) if lm is not None else config.load(train=True)
    if not lm.layout.causal:
        raise LmlabError(f"{config.model} is not a causal language model; sparse-circuits needs one")
    lm.layout.check_heads_everywhere("sparse-circuits")
    for name in config.tasks:  # fail fast on answer tokens the tokenizer splits
        make_task(name, lm.tokenizer, 2, config.seed)
    return lm


def _sparse_models(lm: LoadedModel, config: Config, run_dir: RunDir, eval_seqs: list) -> None:
    """k post-training runs (replicates), each from the dense weights (--sparse-model: the one model given,
    measured), each sparse model's sparsity and circuits measured."""
    seeds = [config.seed] if config.sparse_model else config.replicate_seeds()
    dense_state = None if config.sparse_model else {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    for r, seed in enumerate(seeds):
        if config.sparse_model:
            folder, info = Path(config.sparse_model), config.sparse_training()
        else:
            lm.model.load_state_dict(dense_state)  # each replicate starts from the dense weights
            folder, info = _post_train(lm, config, run_dir, r, seed)  # every process, data-parallel
        # through load_model: the deterministic gate comes back with it (placed by the device map, if any)
        sparse_lm = config.load(str(folder), train=not config.sparse_model)
        if not sparse_lm.meta.get("sparse_attention"):
            raise LmlabError(f"{folder} did not load back as a sparse-attention model")
        _sparsity(sparse_lm, config, run_dir, eval_seqs, info, r)
        discover(sparse_lm, "sparse", config, run_dir, replicate=r)
        del sparse_lm


def _unit_order(key: str, config: Config) -> tuple:
    """A recorded unit's place, whichever process recorded it: replicate, then the task's place in the config."""
    task, _, rep = key.partition("|rep")
    return (int(rep) if rep else -1, config.tasks.index(task) if task in config.tasks else len(config.tasks), key)
