"""S4 · Sparse attention post-training and circuit size (Draye et al., arXiv 2512.05865), seed 004.

1. Dense circuit discovery on four generated tasks (data/generated/circuits.py): heads ranked by
   attribution patching (circuits.py), explained effect EE(N) with the top N heads kept and every other
   head patched with its corrupted-run output; N needed for EE >= 0.9. The attribution ranking is checked
   against activation patching on a subset of heads (top heads plus random ones) on IOI.
2. Sparse post-training (train/sparse.py): edge gates on every layer, GECO holding the CE within tau =
   dense CE + slack, on text the dense model samples itself (its own distribution: the constraint is
   about it), mixed with docstrings from Python's stdlib for the Docstring task (DECISION, the issue's
   suggestion). The sparse model is saved as an HF folder (safetensors) and loaded back through
   `load_model`, which re-installs the deterministic gate, so step 3 treats it like any model.
3. The same discovery on the sparse model; multiplier = heads the dense model needs / heads the
   sparse model needs at 0.9 (> 1: the sparse model needs fewer), with a percentile interval from
   resampling prompts (the ranking is fixed; the curve is recomputed from per-prompt metrics).
4. The toy of the paper's Figure 1 (toy.py): 4 layers trained from scratch on 2-digit addition, then
   sparse-post-trained at equal accuracy; its attention edges are drawn dense above, sparse below.

DECISIONS for CPU minutes: quick uses 12 prompts per task, a coarse N grid and 40 sparse steps of 4 sequences; the paper
post-trains for far longer, so the quick sparsity is a lower bound on what the method reaches. The full
profile (GPU) uses 64 prompts, 2000 steps of 16 sequences.
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file

from lmlab.data.generated.circuits import TASKS, make_task
from lmlab.data.generated.selftext import sample_text, stdlib_docstrings
from lmlab.errors import LmlabError
from lmlab.evaluation import causal_lm_ce
from lmlab.files import atomic_write
from lmlab.interventions import SparseAttention, intervene
from lmlab.models import LoadedModel, load_model, save_model
from lmlab.runs import RunDir
from lmlab.stats import bootstrap
from lmlab.studies.sparse_circuits import toy
from lmlab.studies.sparse_circuits.analysis import derive, toy_figure
from lmlab.studies.sparse_circuits.config import Config
from lmlab.studies.sparse_circuits.measure import discover, lm_batch, text_batches, verify
from lmlab.train import TrainConfig, train
from lmlab.train.sparse import sparse_post_train


def _post_train(lm, config: Config, run_dir: RunDir):
    """Sample text, measure tau, sparse-post-train, save; returns the folder of the sparse model."""
    folder = run_dir.path / "sparse_model"
    if (folder / "lmlab.json").is_file():
        return folder, json.loads((run_dir.path / "sparse_training.json").read_text())
    data_file = run_dir.path / "post_training_text.json"
    if data_file.is_file():
        data = json.loads(data_file.read_text())
    else:
        n_eval = max(16, config.size("n_text") // 8)
        text = sample_text(lm, config.size("n_text") + n_eval, config.text_tokens, seed=config.seed)
        docs = stdlib_docstrings(lm.tokenizer, config.size("n_docstrings"), max_tokens=config.text_tokens + 16,
                                 seed=config.seed)
        data = {"train": text[n_eval:] + docs, "eval": text[:n_eval]}
        atomic_write(data_file, json.dumps(data))
    train_seqs, eval_seqs = data["train"], data["eval"]
    dense_ce, _ = causal_lm_ce(lm.model, text_batches(lm, eval_seqs, config.batch_size))
    train_ce, _ = causal_lm_ce(lm.model, text_batches(lm, train_seqs, config.batch_size))
    tau = float(np.mean(train_ce)) + config.slack
    tc = TrainConfig(steps=config.size("sparse_steps"), batch_size=config.size("sparse_batch"), lr=config.sparse_lr,
                     schedule="constant", warmup_steps=0, checkpoint_every=25, seed=config.seed,
                     description="sparse post-training")
    out = sparse_post_train(lm.model, train_seqs, lambda seqs: lm_batch(lm, seqs),
                            lambda m, b: m(**b).loss, tau, tc, run_dir.path / "sparse_train", rate=config.geco_rate,
                            initial_multiplier=config.geco_initial)
    save_model(lm, folder, sparse_attention=True)
    info = {"tau": tau, "dense_train_ce": float(np.mean(train_ce)), "dense_eval_ce": dense_ce,
            "final_multiplier": out.geco.multiplier, "losses": out.result.losses,
            "history": out.history[-config.size("sparse_steps"):]}
    atomic_write(run_dir.path / "sparse_training.json", json.dumps(info))
    shutil.rmtree(run_dir.path / "sparse_train", ignore_errors=True)  # the saved model supersedes checkpoints
    return folder, info


def _toy(config: Config, run_dir: RunDir) -> None:
    if run_dir.done("toy"):
        return
    data = toy.addition_data(seed=config.seed)
    model = toy.build_toy(seed=config.seed).model
    steps = config.size("toy_steps")
    tc = TrainConfig(steps=steps, batch_size=128, lr=3e-3, weight_decay=0.1, warmup_steps=steps // 20,
                     schedule="cosine", checkpoint_every=500, seed=config.seed, description="toy: addition")
    train(model, data.train, toy.collate, toy.answer_loss, tc, run_dir.path / "toy_dense")
    dense = toy.evaluate(model, data.test)
    dense_train = toy.evaluate(model, data.train[:2000])
    dense_usage = toy.edge_usage(model, data.test[:200])

    sparse_steps = config.size("toy_sparse_steps")
    tc = TrainConfig(steps=sparse_steps, batch_size=128, lr=1e-3, schedule="constant", checkpoint_every=200,
                     seed=config.seed, description="toy: sparse post-training")
    out = sparse_post_train(model, data.train, toy.collate, toy.answer_loss, dense_train["ce"] + 0.01, tc,
                            run_dir.path / "toy_sparse", rate=config.geco_rate,
                            initial_multiplier=config.geco_initial)
    gate = SparseAttention(sample=False)
    with intervene(model, gate):
        sparse = toy.evaluate(model, data.test)
    sparse_usage = toy.edge_usage(model, data.test[:200], interventions=(SparseAttention(sample=False),))
    save_file({"dense": torch.from_numpy(dense_usage), "sparse": torch.from_numpy(sparse_usage)},
              str(run_dir.path / "toy_edges.safetensors"))
    rows = [{"kind": "toy", "variant": "dense", "value": dense["exact_match"], "ce": dense["ce"], "kept": 1.0},
            {"kind": "toy", "variant": "sparse", "value": sparse["exact_match"], "ce": sparse["ce"],
             "kept": gate.kept_fraction, "multiplier": out.geco.multiplier}]
    run_dir.record("toy", "toy", rows)


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    for name in config.tasks:
        if name not in TASKS:
            raise LmlabError(f"unknown circuit task '{name}'; registered tasks: {', '.join(TASKS)}")
    # post-training changes the weights: a model passed in is copied, never trained in place
    lm = copy.deepcopy(lm) if lm is not None else load_model(config.model)
    if not lm.layout.causal:
        raise LmlabError(f"{config.model} is not a causal language model; sparse-circuits needs one")
    for name in config.tasks:  # fail fast on answer tokens the tokenizer splits
        make_task(name, lm.tokenizer, 2, config.seed)
    discover(lm, "dense", config, run_dir)
    verify(lm, config, run_dir)
    folder, info = _post_train(lm, config, run_dir)
    del lm
    sparse_lm = load_model(str(folder))  # through load_model: the deterministic gate comes back with it
    if not sparse_lm.meta.get("sparse_attention"):
        raise LmlabError(f"{folder} did not load back as a sparse-attention model")
    if not run_dir.done("sparsity"):
        eval_seqs = json.loads((run_dir.path / "post_training_text.json").read_text())["eval"]
        sparse_ce, kept = causal_lm_ce(sparse_lm.model, text_batches(sparse_lm, eval_seqs, config.batch_size))
        diff = np.array(sparse_ce) - np.array(info["dense_eval_ce"])
        ci = bootstrap(diff, seed=config.seed)
        run_dir.record("sparsity", "sparsity", [
            {"kind": "sparsity", "variant": "dense", "value": 1.0, "ce": float(np.mean(info["dense_eval_ce"]))},
            {"kind": "sparsity", "variant": "sparse", "value": kept, "ce": float(np.mean(sparse_ce)),
             "ce_diff": ci.estimate, "lo": ci.low, "hi": ci.high, "tau_slack": config.slack,
             "multiplier": info["final_multiplier"]}])
    discover(sparse_lm, "sparse", config, run_dir)
    _toy(config, run_dir)
    rows = [r for part in ("discovery-dense", "verify", "sparsity", "discovery-sparse", "toy")
            for rs in run_dir.done(part).values() for r in rs]
    table = derive(pd.DataFrame(rows), config.threshold, config.seed)
    import matplotlib.pyplot as plt

    usage = _load_usage(run_dir)
    if usage is not None:
        fig = toy_figure(*usage)
        run_dir.write_figure(fig, name="toy_figure")
        plt.close(fig)
    return table


def _load_usage(run_dir: RunDir):
    path = run_dir.path / "toy_edges.safetensors"
    if not path.is_file():
        return None
    t = load_file(str(path))
    return t["dense"].numpy(), t["sparse"].numpy()
