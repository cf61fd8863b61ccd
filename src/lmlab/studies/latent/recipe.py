"""S0 · Latent compression of reasoning chains, Token Assorted (Su et al., arXiv 2502.03275), seed 000.

1. Data (data/generated/planning.py): by default a generated maze-style grid walk whose step-by-step
   trace is 104-140 tokens, most of them restating the move and the position a step starts from (the
   paper's from-scratch settings, a Keys-Finding Maze and ProsQA, have long traces whose early words
   "support textual coherence rather than core reasoning"); `--data classes` ProsQA-style class chains;
   `--data arithmetic` the short +/- chains (data/generated/reasoning.py), where every computed value is
   needed later, kept as a stress test; `--data gsm8k:PATH` a GSM8K jsonl file. Splits are disjoint.
2. Base model (METHODS DECISION): by default a small Llama-architecture transformer trained from scratch
   in the run on prompt -> chain -> answer, the prompt masked in the loss, with a word-level vocabulary
   that already holds the K codes and the two latent markers. `--model smollm2-135m` starts from the
   pretrained SmolLM2-135M instead: its tokenizer gets <cot>, <ans>, the markers and the K codes as new
   special tokens, its embeddings are resized, and the same CoT training makes the base. Either way every
   variant starts from the same base weights.
3. Per rate r: a VQ-VAE over chunks of at most L tokens (L/r codes each, codebook K; codes.py), trained on
   chunks of the whole training sequences (question, chain, answer) and applied to the chain; then a copy
   of the base model is fine-tuned on mixed sequences where the leftmost m chain tokens are replaced by
   <boLatent> codes <eoLatent>. As in the paper, m is drawn per example from a chunk-aligned set: 0 for
   about 1/7 of examples, else a whole number of chunks that leaves the final step and at least half of
   the chain as text (the paper abstracts about a fifth of a ~640-token trace). Chunks end at word
   starts, so a number is never split between latent and text.
4. Baselines in the same run, fine-tuned from the same base for the same steps: CoT (m = 0 always) and
   answer-only (no chain).
5. Evaluation: greedy generation on the test split; accuracy (Wilson interval), generated tokens per
   problem (latent + text, up to and including <eos>; bootstrap interval), wall time per problem.
   Diagnostics per rate: latent tokens per problem and the share of problems that used any; accuracy
   split by whether the model used latents; the VQ-VAE's reconstruction of computed vs copied chain tokens;
   and accuracy with the true codes forced in for the largest m training allows, which separates "the
   codes lose information" (forced below CoT) from "the model cannot produce the codes" (forced at CoT,
   free generation below).

Compression rate on the figure's x axis: r; CoT and answer-only are reference lines.

Under a launch (`torchrun -m lmlab latent ...`, lmlab.parallel) every model trains data-parallel (each process a
slice of every batch; the CE terms are token shares of the global batch's mean, and the VQ-VAE's codebook is set
and restarted from the whole batch's encoder outputs, drawn on rank 0), each process encodes and generates its
share of the problems, and rank 0 records each variant and writes the run folder.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from lmlab import parallel
from lmlab.data.generated.planning import generate_class_problems, generate_walk_problems
from lmlab.data.generated.reasoning import generate_problems, read_gsm8k_problems, split_problems
from lmlab.errors import LmlabError
from lmlab.models import LoadedModel, ScratchSpec, load_model, resize_vocabulary
from lmlab.runs import RunDir
from lmlab.stats import bootstrap, wilson
from lmlab.studies.latent import codes as L
from lmlab.studies.latent.config import PRETRAINED, Config, check_config
from lmlab.studies.latent.measure import (chunk_codes, collate_for, evaluate, forced_prefix, lm_loss, train_cfg,
                                         train_vq, vq_quality)
from lmlab.train import train


def load_problems(config: Config) -> dict:
    n_test = config.size("n_test")
    n_dev = min(n_test, 200)  # the dev split only measures the VQ-VAE's reconstruction
    if config.task == "walk":
        return generate_walk_problems(config.size("n_train"), n_dev, n_test, seed=config.seed)
    if config.task == "classes":
        return generate_class_problems(config.size("n_train"), n_dev, n_test, seed=config.seed)
    if config.task == "arithmetic":
        return generate_problems(config.size("n_train"), n_test, n_test, seed=config.seed,
                                 max_steps=config.max_steps_per_problem)
    splits = split_problems(read_gsm8k_problems(config.data.partition(":")[2] or None), seed=config.seed)
    sizes = {"train": config.size("n_train"), "dev": n_test, "test": n_test}
    out = {k: v[:sizes[k]] for k, v in splits.items()}
    empty = [k for k, v in out.items() if not v]
    if empty:
        raise LmlabError(f"the GSM8K file gives no {empty[0]} problems after splitting; it needs more rows")
    return out


def _pretrained(config: Config, lm: LoadedModel | None = None):
    """(model, vocab) for the pretrained option: the tokenizer grown by the markers and codes, the
    embeddings resized to match (models.resize_vocabulary)."""
    # the vocabulary grows: a model passed in is copied, never resized in place
    lm = copy.deepcopy(lm) if lm is not None else config.load(train=True)
    vocab = L.TokenizerVocab(lm.tokenizer, config.codebook)
    resize_vocabulary(lm.model, len(vocab))
    return lm.model, vocab


@dataclass
class Prepared:
    base: torch.nn.Module  # untrained (scratch) or pretrained with resized embeddings
    vocab: object
    train: list
    dev: list
    test: list
    max_new: int


def prepare(config: Config, lm: LoadedModel | None = None) -> Prepared:
    """Data, vocabulary and the untrained base model, the same for the same config (the benchmark
    rebuilds a finished run's models from this and the run's checkpoints)."""
    check_config(config)
    problems = load_problems(config)
    if config.model in PRETRAINED:
        base, vocab = _pretrained(config, lm)
    else:
        texts = [p.question + " " + p.chain for split in problems.values() for p in split]
        vocab = L.Vocab.from_texts(texts, config.codebook)
    train_ex = [L.make_example(vocab, p) for p in problems["train"]]
    test_ex = [L.make_example(vocab, p) for p in problems["test"]]
    dev_ex = [L.make_example(vocab, p) for p in problems["dev"]]
    max_new = config.max_new or max(len(ex.chain) + len(ex.answer) for ex in train_ex) + 16
    longest = max(len(ex.prompt) for ex in train_ex + test_ex + dev_ex) + max_new
    if config.model not in PRETRAINED:
        base = load_model("scratch", dtype=torch.float32, device=config.torch_device(), scratch=ScratchSpec(
            vocab_size=len(vocab), d_model=config.size("d_model"), n_layers=config.size("n_layers"), n_heads=4,
            max_positions=max(256, longest + 64), bos=vocab.bos, eos=vocab.eos, pad=vocab.pad, seed=config.seed)).model
        base.train()  # as built: the training loop decides the mode
    if longest > base.config.max_position_embeddings:
        raise LmlabError(f"a prompt plus {max_new} generated tokens ({longest}) exceeds the model's context of "
                         f"{base.config.max_position_embeddings}")
    n_chunks = sum(len(L.segments(ex, config.chunk)) for ex in train_ex)
    if n_chunks < config.codebook:
        raise LmlabError(f"only {n_chunks} training chunks for a codebook of {config.codebook}: lower --codebook "
                         "or generate more problems")
    return Prepared(base, vocab, train_ex, dev_ex, test_ex, max_new)


def final_weights(run_dir, name: str):
    """The last checkpoint's model file of fine-tune `name` in a latent run folder."""
    from pathlib import Path

    found = sorted((Path(run_dir) / f"ft-{name}" / "checkpoints").glob("step-*/model.safetensors"))
    if not found:
        raise LmlabError(f"no fine-tuned '{name}' model in {run_dir}; is it a finished `lmlab latent` run?")
    return found[-1]


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    prep = prepare(config, lm)
    base, vocab, train_ex, dev_ex, test_ex, max_new = (prep.base, prep.vocab, prep.train, prep.dev, prep.test,
                                                       prep.max_new)
    collate = collate_for(vocab.pad)

    cot_items = [(ex.prompt, ex.chain + ex.answer) for ex in train_ex]
    train(base, cot_items, collate, lm_loss, train_cfg(config, config.size("base_steps"), "base model (CoT)"),
          run_dir.path / "base")
    base_state = {k: v.clone() for k, v in base.state_dict().items()}

    def finetune(name: str, items) -> tuple[torch.nn.Module, dict]:
        model = base  # the base's own module, its weights reset to the base state: one model in memory
        model.load_state_dict(base_state)
        fit = train(model, items, collate, lm_loss, train_cfg(config, config.size("finetune_steps"),
                                                              f"fine-tune {name}", lr=config.size("lr") / 2),
                    run_dir.path / f"ft-{name}")
        quarter = max(1, len(fit.losses) // 4)  # the training loss over the third and the last quarter of steps
        return model, {"ft_loss_q3": float(np.mean(fit.losses[-2 * quarter:-quarter] or fit.losses)),
                       "ft_loss_q4": float(np.mean(fit.losses[-quarter:]))}

    done = run_dir.done("variants")
    parallel.sync()  # every process has read the same variants as done before rank 0 records one
    variants = [("cot", 1), ("answer-only", 0)] + [(f"r{r}", r) for r in config.size("rates")]
    for name, rate in variants:
        if name in done:
            continue
        extra, forced = {}, None
        if name == "cot":
            items = cot_items
        elif name == "answer-only":
            items = [(ex.prompt, ex.answer) for ex in train_ex]
        else:
            vq, chunks, vq_collate = train_vq(vocab, train_ex, config, rate, run_dir)
            extra = vq_quality(vq, vocab, dev_ex, config, chunks)
            rng = random.Random(f"{config.seed}|{rate}")
            ms = [L.draw_m(rng, ex, config.chunk) for ex in train_ex]
            codes = parallel.share_out(len(train_ex), lambda idx: [  # each process encodes its share
                chunk_codes(vq, vocab, train_ex[i], config.chunk) if ms[i] else [] for i in idx])
            items, shares, ratio = [], [], []
            for ex, m, ex_codes in zip(train_ex, ms, codes):
                n = L.codes_needed(ex, m, config.chunk, rate) if m else 0
                items.append((ex.prompt, L.replace_with_latents(vocab, ex.chain, ex_codes, m, n) + ex.answer))
                shares.append(m / len(ex.chain))
                if m:
                    ratio.append(m / n)
            extra.update(train_m_share=float(np.mean(shares)), train_m0_share=float(np.mean([s == 0 for s in shares])),
                         tokens_per_code=float(np.mean(ratio)) if ratio else float("nan"))
            forced = parallel.share_out(len(test_ex), lambda idx: [
                forced_prefix(vq, vocab, test_ex[i], config, rate) for i in idx])
        model, fit = finetune(name, items)
        extra.update(fit)
        result = evaluate(model, vocab, test_ex, max_new=max_new)
        acc = wilson(sum(result["correct"]), len(result["correct"]))
        tok = bootstrap(np.array(result["tokens"], dtype=float), seed=config.seed)
        used = np.array(result["latents"]) > 0
        right = np.array(result["correct"], dtype=float)
        row = {"kind": "variant", "variant": name, "rate": rate, "accuracy": acc.estimate, "acc_lo": acc.low,
               "acc_hi": acc.high, "tokens": tok.estimate, "tok_lo": tok.low, "tok_hi": tok.high,
               "latents": float(np.mean(result["latents"])), "used_latents": float(used.mean()),
               "acc_with_latents": float(right[used].mean()) if used.any() else float("nan"),
               "acc_without_latents": float(right[~used].mean()) if (~used).any() else float("nan"),
               "seconds_per_problem": result["seconds_per_problem"], "n_test": len(test_ex), **extra}
        forced_correct = [None] * len(test_ex)
        if forced is not None:
            fres = evaluate(model, vocab, test_ex, max_new=max_new, prefixes=[f for f, _ in forced])
            facc = wilson(sum(fres["correct"]), len(fres["correct"]))
            row.update(forced_accuracy=facc.estimate, forced_lo=facc.low, forced_hi=facc.high,
                       forced_tokens=float(np.mean(fres["tokens"])),
                       forced_m_share=float(np.mean([m / len(ex.chain) for (_, m), ex in zip(forced, test_ex)])))
            forced_correct = [int(c) for c in fres["correct"]]
        per_problem = [{"kind": "problem", "variant": name, "idx": i, "correct": int(c), "tokens": int(t),
                        "latents": int(n), "forced_correct": fc}
                       for i, (c, t, n, fc) in enumerate(zip(result["correct"], result["tokens"], result["latents"],
                                                               forced_correct))]
        if not parallel.is_main():  # it trained its slices and generated its share; rank 0 records the variant
            continue
        run_dir.record("variants", name, [row] + per_problem)
        run_dir.log(f"{name}: accuracy {acc}, tokens {tok.estimate:.1f}, latents {row['latents']:.2f}"
                    + (f", forced codes {row['forced_accuracy']:.3f}" if forced is not None else ""))
    parallel.main_only()
    rows = [r for rs in run_dir.done("variants").values() for r in rs]
    order = {name: i for i, (name, _) in enumerate(variants)}
    return pd.DataFrame(sorted(rows, key=lambda r: order.get(r["variant"], 99)))
