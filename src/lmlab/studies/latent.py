"""S0 · Latent compression of reasoning chains, Token Assorted (Su et al., arXiv 2502.03275), seed 000.

1. Data: generated multi-step arithmetic word problems with a step-by-step chain (data/generated/
   reasoning.py), disjoint train/dev/test; or `--data gsm8k:PATH`, a GSM8K jsonl file whose reasoning
   lines become the chain (calculator annotations removed), split by the same seeded hash.
2. Base model (METHODS DECISION): by default a small Llama-architecture transformer trained from scratch
   in the run on prompt -> chain -> answer, the prompt masked in the loss, with a word-level vocabulary
   that already holds the K codes and the two latent markers. `--model smollm2-135m` starts from the
   pretrained SmolLM2-135M instead: its tokenizer gets <cot>, <ans>, the markers and the K codes as new
   special tokens, its embeddings are resized, and the same CoT training makes the base. Either way every
   variant starts from the same base weights.
3. Per rate r: a VQ-VAE over chunks of L chain tokens (L/r codes each, codebook K; latent.py), trained on
   the training chains; then a copy of the base model is fine-tuned on mixed sequences where the leftmost m
   chain tokens (m drawn per example from the chunk-aligned set 0, L, 2L, ... up to the chain, seeded) are
   replaced by <boLatent> codes <eoLatent>.
4. Baselines in the same run, fine-tuned from the same base for the same steps: CoT (m = 0 always) and
   answer-only (no chain).
5. Evaluation: greedy generation on the test split; accuracy (Wilson interval), generated tokens per
   problem (latent + text, up to and including <eos>; bootstrap interval), wall time per problem.

Compression rate on the figure's x axis: CoT is r = 1 (no latents); answer-only is drawn as a line.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from pydantic import Field

from lmlab import latent as L
from lmlab.data.generated.reasoning import generate_problems, read_gsm8k_problems, split_problems
from lmlab.errors import LmlabError
from lmlab.runs import RunDir
from lmlab.stats import bootstrap, wilson
from lmlab.studies.base import StudyConfig, StudySpec, register
from lmlab.studies.latent_analysis import figure, summary, verdict
from lmlab.train import TrainConfig, train

PROFILES = {
    "quick": dict(rates=[4, 16], n_train=3000, n_test=100, base_steps=1200, finetune_steps=300, vq_steps=500,
                  d_model=128, n_layers=3, batch_size=32),
    "full": dict(rates=[2, 4, 8, 16], n_train=20000, n_test=1000, base_steps=6000, finetune_steps=2000,
                 vq_steps=3000, d_model=256, n_layers=6, batch_size=64),
}
# the pretrained option: fewer, smaller steps at a fine-tuning learning rate (d_model / n_layers unused)
PRETRAINED_PROFILES = {
    "quick": dict(rates=[4, 16], n_train=3000, n_test=60, base_steps=60, finetune_steps=25, vq_steps=1200,
                  batch_size=8, lr=3e-4),
    "full": dict(rates=[2, 4, 8, 16], n_train=20000, n_test=1000, base_steps=2000, finetune_steps=600,
                 vq_steps=3000, batch_size=32, lr=1e-4),
}
PRETRAINED = {"smollm2-135m"}


class Config(StudyConfig):
    rates: list[int] | None = Field(None, description="compression rates r (quick: 4,16; full: 2,4,8,16)")
    chunk: int = Field(16, description="chunk length L (chain tokens per VQ-VAE chunk)")
    codebook: int = Field(64, description="codebook size K")
    n_train: int | None = None
    n_test: int | None = None
    base_steps: int | None = None
    finetune_steps: int | None = None
    vq_steps: int | None = None
    d_model: int | None = None
    n_layers: int | None = None
    batch_size: int | None = None
    lr: float | None = Field(None, description="learning rate (scratch 2e-3; smollm2-135m 3e-4 quick, 1e-4 full)")
    max_steps_per_problem: int = Field(4, description="reasoning steps per generated problem (2..this)")
    data: str = Field("generated", description="generated, or gsm8k:PATH (a GSM8K jsonl file)")
    max_new: int | None = Field(None, description="generated tokens per test problem (default: the longest "
                                                  "training chain + answer, plus 16)")

    def size(self, name: str):
        value = getattr(self, name)
        if value is not None:
            return value
        table = PRETRAINED_PROFILES if self.model in PRETRAINED else PROFILES
        return table[self.profile].get(name, PROFILES[self.profile].get(name, 2e-3 if name == "lr" else None))


def check_config(config: Config) -> None:
    """Every bad setting fails here, before any training."""
    rates = config.size("rates")
    bad = [r for r in rates if r < 1 or config.chunk % r]
    if bad:
        raise LmlabError(f"rate {bad[0]} does not divide the chunk length {config.chunk}")
    if not rates:
        raise LmlabError("give at least one compression rate")
    if config.codebook < 2:
        raise LmlabError("the codebook needs at least 2 codes")
    if config.model not in ("scratch", *sorted(PRETRAINED)):
        raise LmlabError(f"latent supports --model scratch (a small transformer trained in the run, the default) "
                         f"or {', '.join(sorted(PRETRAINED))}, not '{config.model}'")
    if config.data != "generated" and not config.data.startswith("gsm8k:"):
        raise LmlabError(f"unknown --data '{config.data}'; use generated or gsm8k:PATH")


def load_problems(config: Config) -> dict:
    n_test = config.size("n_test")
    if config.data == "generated":
        return generate_problems(config.size("n_train"), n_test, n_test, seed=config.seed,
                                 max_steps=config.max_steps_per_problem)
    splits = split_problems(read_gsm8k_problems(config.data.split(":", 1)[1]), seed=config.seed)
    sizes = {"train": config.size("n_train"), "dev": n_test, "test": n_test}
    out = {k: v[:sizes[k]] for k, v in splits.items()}
    empty = [k for k, v in out.items() if not v]
    if empty:
        raise LmlabError(f"the GSM8K file gives no {empty[0]} problems after splitting; it needs more rows")
    return out


def _lm_config(vocab: L.Vocab, config: Config, max_len: int = 256):
    from transformers import LlamaConfig

    d = config.size("d_model")
    return LlamaConfig(vocab_size=len(vocab), hidden_size=d, intermediate_size=4 * d,
                       num_hidden_layers=config.size("n_layers"), num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=max(256, max_len), bos_token_id=vocab.bos, eos_token_id=vocab.eos,
                       pad_token_id=vocab.pad, tie_word_embeddings=True, attn_implementation="sdpa")


def _build(vocab, config, seed: int, max_len: int = 256):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(_lm_config(vocab, config, max_len)).float()


def _pretrained(config: Config):
    """(model, vocab) for the pretrained option: the tokenizer grown by the markers and codes, the
    embeddings resized to match (models.resize_vocabulary)."""
    from lmlab.models import load_model, resize_vocabulary

    lm = load_model(config.model, dtype=torch.float32)
    vocab = L.TokenizerVocab(lm.tokenizer, config.codebook)
    resize_vocabulary(lm.model, len(vocab))
    return lm.model, vocab


def _collate(pad: int):
    def collate(items: list[tuple[list[int], list[int]]]) -> dict:
        width = max(len(p) + len(t) for p, t in items)
        ids = torch.full((len(items), width), pad, dtype=torch.long)
        labels = torch.full((len(items), width), -100, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for i, (prompt, target) in enumerate(items):
            seq = prompt + target
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, len(prompt):len(seq)] = torch.tensor(target)
            mask[i, :len(seq)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return collate


def _lm_loss(model, batch):
    return model(**batch).loss


def _train_cfg(config: Config, steps: int, desc: str, lr: float | None = None) -> TrainConfig:
    return TrainConfig(steps=steps, batch_size=config.size("batch_size"), lr=lr or config.size("lr"), weight_decay=0.1,
                       warmup_steps=max(1, steps // 20), schedule="cosine", checkpoint_every=max(50, steps // 4),
                       seed=config.seed, description=desc)


def _train_vq(vocab, examples: list[L.Example], config: Config, rate: int, run_dir: RunDir):
    """Train the VQ-VAE for `rate` on every full chunk of the training chains (resumable)."""
    chunks = [(ex.prompt, ex.chain[k:k + config.chunk]) for ex in examples
              for k in range(0, len(ex.chain) - config.chunk + 1, config.chunk)]
    torch.manual_seed(config.seed + rate)
    vq = L.ChunkVQVAE(len(vocab), config.chunk, rate, config.codebook,
                      max_prompt=max(len(p) for p, _ in chunks) + 8)
    pad = vocab.pad

    def collate(items):
        prompt, mask = L.pad_left([p for p, _ in items], pad)
        return {"prompt": prompt, "mask": mask, "chunk": torch.tensor([c for _, c in items])}

    state = {}

    def loss_fn(model, batch):
        loss, _, _, _, z = model(batch["prompt"], batch["mask"], batch["chunk"])
        state["z"] = z.detach()
        return loss

    def on_step(step, _loss):  # the loop's own step count, so a resumed run restarts codes at the same steps
        if (step + 1) % 50 == 0:
            vq.quantizer.restart_dead(state["z"])

    steps = config.size("vq_steps")
    train(vq, chunks, collate, loss_fn, _train_cfg(config, steps, f"VQ-VAE r={rate}", lr=2e-3),
          run_dir.path / f"vq-r{rate}", on_step=on_step)
    return vq, chunks, collate


def _chunk_codes(vq, vocab, ex: L.Example, chunk: int) -> list[int]:
    n = len(ex.chain) // chunk
    if n == 0:
        return []
    prompt, mask = L.pad_left([ex.prompt] * n, vocab.pad)
    ids = torch.tensor([ex.chain[k * chunk:(k + 1) * chunk] for k in range(n)])
    return vq.codes(prompt, mask, ids).reshape(-1).tolist()


@torch.no_grad()
def evaluate(model, vocab, examples: list[L.Example], max_new: int = 96, batch_size: int = 100) -> dict:
    """Greedy generation; per problem: correct, generated tokens (latent + text, to <eos>), latents used."""
    model.eval()
    correct, tokens, latents = [], [], []
    t0 = time.perf_counter()
    for start in range(0, len(examples), batch_size):
        part = examples[start:start + batch_size]
        ids, mask = L.pad_left([ex.prompt for ex in part], vocab.pad)
        out = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=vocab.eos, pad_token_id=vocab.pad)
        for ex, row in zip(part, out[:, ids.shape[1]:].tolist()):
            gen = row[:row.index(vocab.eos) + 1] if vocab.eos in row else row
            tokens.append(len(gen))
            latents.append(sum(1 for t in gen if vocab.is_code(t)))
            correct.append(vocab.parse_answer(gen) == ex.value)
    seconds = time.perf_counter() - t0
    return {"correct": correct, "tokens": tokens, "latents": latents, "seconds_per_problem": seconds / len(examples)}


@dataclass
class Prepared:
    base: torch.nn.Module  # untrained (scratch) or pretrained with resized embeddings
    vocab: object
    train: list
    dev: list
    test: list
    max_new: int


def prepare(config: Config) -> Prepared:
    """Data, vocabulary and the untrained base model, the same for the same config (the benchmark
    rebuilds a finished run's models from this and the run's checkpoints)."""
    check_config(config)
    problems = load_problems(config)
    if config.model in PRETRAINED:
        base, vocab = _pretrained(config)
    else:
        texts = [p.question + " " + p.chain for split in problems.values() for p in split]
        vocab = L.Vocab.from_texts(texts, config.codebook)
    train_ex = [L.make_example(vocab, p) for p in problems["train"]]
    test_ex = [L.make_example(vocab, p) for p in problems["test"]]
    dev_ex = [L.make_example(vocab, p) for p in problems["dev"]]
    max_new = config.max_new or max(len(ex.chain) + len(ex.answer) for ex in train_ex) + 16
    longest = max(len(ex.prompt) for ex in train_ex + test_ex + dev_ex) + max_new
    if config.model not in PRETRAINED:
        base = _build(vocab, config, config.seed, max_len=longest)
    if longest > base.config.max_position_embeddings:
        raise LmlabError(f"a prompt plus {max_new} generated tokens ({longest}) exceeds the model's context of "
                         f"{base.config.max_position_embeddings}")
    n_chunks = sum(len(ex.chain) // config.chunk for ex in train_ex)
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


def run(config: Config, run_dir: RunDir) -> pd.DataFrame:
    prep = prepare(config)
    base, vocab, train_ex, dev_ex, test_ex, max_new = (prep.base, prep.vocab, prep.train, prep.dev, prep.test,
                                                       prep.max_new)
    collate = _collate(vocab.pad)

    cot_items = [(ex.prompt, ex.chain + ex.answer) for ex in train_ex]
    train(base, cot_items, collate, _lm_loss, _train_cfg(config, config.size("base_steps"), "base model (CoT)"),
          run_dir.path / "base")
    base_state = {k: v.clone() for k, v in base.state_dict().items()}

    def finetune(name: str, items) -> torch.nn.Module:
        model = base  # the base's own module, its weights reset to the base state: one model in memory
        model.load_state_dict(base_state)
        train(model, items, collate, _lm_loss, _train_cfg(config, config.size("finetune_steps"), f"fine-tune {name}",
                                                           lr=config.size("lr") / 2), run_dir.path / f"ft-{name}")
        return model

    done = run_dir.done("variants")
    variants = [("cot", 1), ("answer-only", 0)] + [(f"r{r}", r) for r in config.size("rates")]
    for name, rate in variants:
        if name in done:
            continue
        extra = {}
        if name == "cot":
            items = cot_items
        elif name == "answer-only":
            items = [(ex.prompt, ex.answer) for ex in train_ex]
        else:
            vq, chunks, vq_collate = _train_vq(vocab, train_ex, config, rate, run_dir)
            extra = _vq_quality(vq, vocab, dev_ex, config, chunks)
            rng = random.Random(f"{config.seed}|{rate}")
            items = []
            for ex in train_ex:
                m = rng.choice(L.chunk_options(len(ex.chain), config.chunk))
                codes = _chunk_codes(vq, vocab, ex, config.chunk) if m else []
                items.append((ex.prompt, L.replace_with_latents(vocab, ex.chain, codes, m, config.chunk, rate)
                              + ex.answer))
        model = finetune(name, items)
        result = evaluate(model, vocab, test_ex, max_new=max_new)
        acc = wilson(sum(result["correct"]), len(result["correct"]))
        tok = bootstrap(np.array(result["tokens"], dtype=float), seed=config.seed)
        row = {"kind": "variant", "variant": name, "rate": rate, "accuracy": acc.estimate, "acc_lo": acc.low,
               "acc_hi": acc.high, "tokens": tok.estimate, "tok_lo": tok.low, "tok_hi": tok.high,
               "latents": float(np.mean(result["latents"])), "seconds_per_problem": result["seconds_per_problem"],
               "n_test": len(test_ex), "correct": json.dumps([int(c) for c in result["correct"]]),
               "token_counts": json.dumps(result["tokens"]), **extra}
        run_dir.record("variants", name, [row])
        run_dir.log(f"{name}: accuracy {acc}, tokens {tok.estimate:.1f}, latents {row['latents']:.2f}")
    rows = [r for rs in run_dir.done("variants").values() for r in rs]
    order = {name: i for i, (name, _) in enumerate(variants)}
    return pd.DataFrame(sorted(rows, key=lambda r: order.get(r["variant"], 99)))


@torch.no_grad()
def _vq_quality(vq, vocab, dev_ex, config: Config, train_chunks) -> dict:
    dev_chunks = [(ex.prompt, ex.chain[k:k + config.chunk]) for ex in dev_ex
                  for k in range(0, len(ex.chain) - config.chunk + 1, config.chunk)]
    out = {}
    for name, chunks in (("vq_train", train_chunks[:2000]), ("vq_dev", dev_chunks)):
        if not chunks:
            continue
        prompt, mask = L.pad_left([p for p, _ in chunks], vocab.pad)
        ids = torch.tensor([c for _, c in chunks])
        rec = vq.reconstruct(prompt, mask, ids)
        out[f"{name}_token_acc"] = float((rec == ids).float().mean())
        out[f"{name}_chunk_exact"] = float((rec == ids).all(1).float().mean())
        if name == "vq_train":
            codes = vq.codes(prompt, mask, ids)
            out["codebook_used"] = int(codes.unique().numel())
    return out


SPEC = register(StudySpec(
    name="latent",
    title="S0 · Latent compression of reasoning chains (Token Assorted)",
    paper="Su et al., arXiv 2502.03275",
    seed_file="000_255a087192c42e30.txt",
    config=Config, run=run, figure=figure, verdict=verdict, default_model="scratch",
    seed_summary="Llama-3.2-3B, average math accuracy and reasoning-trace tokens vs latent compression rate r: "
                 "tokens fall from about 590 to 480 as r rises, accuracy rises from 27.1 to a peak of 28.1 near "
                 "r = 16 (within about one point of CoT throughout).",
    summary=summary,
))
