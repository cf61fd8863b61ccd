"""S0 measurements: training batches and configs, the VQ-VAE per rate, chunk codes, greedy evaluation and
the VQ-VAE's reconstruction quality."""

from __future__ import annotations

import time

import torch

from lmlab.models import pad_sequences
from lmlab.runs import RunDir
from lmlab.studies.latent import codes as L
from lmlab.studies.latent.config import Config
from lmlab.train import TrainConfig, train


def collate_for(pad: int):
    def collate(items: list[tuple[list[int], list[int]]]) -> dict:  # right-padded; loss on the target only
        return pad_sequences([p + t for p, t in items], pad, side="right", label_from=[len(p) for p, _ in items])
    return collate


def lm_loss(model, batch):
    return model(**batch).loss


def train_cfg(config: Config, steps: int, desc: str, lr: float | None = None) -> TrainConfig:
    return TrainConfig(steps=steps, batch_size=config.size("batch_size"), lr=lr or config.size("lr"), weight_decay=0.1,
                       warmup_steps=max(1, steps // 20), schedule="cosine", checkpoint_every=max(50, steps // 4),
                       seed=config.seed, description=desc)


def train_vq(vocab, examples: list[L.Example], config: Config, rate: int, run_dir: RunDir):
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
    train(vq, chunks, collate, loss_fn, train_cfg(config, steps, f"VQ-VAE r={rate}", lr=2e-3),
          run_dir.path / f"vq-r{rate}", on_step=on_step)
    return vq, chunks, collate


def chunk_codes(vq, vocab, ex: L.Example, chunk: int) -> list[int]:
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


@torch.no_grad()
def vq_quality(vq, vocab, dev_ex, config: Config, train_chunks) -> dict:
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
