"""S0 measurements: training batches and configs, the VQ-VAE per rate, chunk codes, greedy evaluation and
the VQ-VAE's reconstruction quality."""

from __future__ import annotations

import time

import torch

from lmlab import parallel
from lmlab.models import module_device, pad_sequences
from lmlab.runs import RunDir
from lmlab.studies.latent import sequences, vqvae
from lmlab.studies.latent.config import Config
from lmlab.train import TrainConfig, train
from lmlab.parallel import all_sum, group_size
from lmlab.train.ensemble import per_replicate_ce, replicas
from lmlab.train.loop import share


def collate_for(pad: int):
    def collate(items: list[tuple[list[int], list[int]]]) -> dict:  # right-padded; loss on the target only
        return pad_sequences([p + t for p, t in items], pad, side="right", label_from=[len(p) for p, _ in items])
    return collate


def lm_loss(model, batch):
    """The batch's mean CE over its target tokens, one per replicate of a stacked model (lmlab.train.ensemble);
    under a launch this process's share of the global batch's mean (every process's tokens weigh alike, so N
    processes follow one process's curve)."""
    k = replicas(model)
    if k == 1:
        tokens = float((batch["labels"][:, 1:] != -100).sum())
        return share(model(**batch).loss * tokens, tokens)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ce, tokens = per_replicate_ce(logits, batch["labels"], k)
    totals = torch.tensor(all_sum(tokens.tolist()), dtype=ce.dtype, device=ce.device)
    return ce * (group_size() / totals.clamp_min(1e-12))


def train_cfg(config: Config, steps: int, desc: str, lr: float | None = None,
              replicate_seeds: list[int] | None = None, seed: int | None = None) -> TrainConfig:
    return TrainConfig(steps=steps, batch_size=config.size("batch_size"), lr=lr or config.size("lr"), weight_decay=0.1,
                       warmup_steps=max(1, steps // 20), schedule="cosine", checkpoint_every=max(50, steps // 4),
                       seed=config.seed if seed is None else seed, replicate_seeds=replicate_seeds or [],
                       description=desc, **config.train_settings())


def padded(ids: list[int], chunk: int, pad: int) -> list[int]:
    return list(ids) + [pad] * (chunk - len(ids))


def vq_chunks(examples: list[sequences.Example], chunk: int, pad: int) -> list[tuple[list[int], list[int], int]]:
    """(prompt, chunk, offset) over the whole sequence, as the paper trains its VQ-VAE: the question in
    L-token pieces, the chain in its word-aligned segments, the answer; every chunk padded to L; offset is
    the chunk's first position in prompt + chain + answer."""
    out = []
    for ex in examples:
        n = len(ex.prompt)
        out += [(ex.prompt, padded(ex.prompt[1:-1][k:k + chunk], chunk, pad), 1 + k)
                for k in range(0, n - 2, chunk)]
        out += [(ex.prompt, padded(ex.chain[a:b], chunk, pad), n + a) for a, b in sequences.segments(ex, chunk)]
        out += [(ex.prompt, padded(ex.answer[1:][k:k + chunk], chunk, pad), n + len(ex.chain) + 1 + k)
                for k in range(0, len(ex.answer) - 1, chunk)]
    return out


def max_offset(examples: list[sequences.Example]) -> int:
    return max(len(ex.prompt) + len(ex.chain) + len(ex.answer) for ex in examples)


def build_vq(vocab, examples: list[sequences.Example], config: Config, rate: int, device: str | None = None):
    """An untrained VQ-VAE for `rate`, sized to hold `examples`' prompts and positions, built on `device` (default:
    the config's, where it trains and runs); its initial weights come from torch's current seed."""
    with torch.device(device or config.torch_device()):
        return vqvae.ChunkVQVAE(len(vocab), config.chunk, rate, config.size("codebook"),
                            max_prompt=max(len(ex.prompt) for ex in examples) + 8, pad_id=vocab.pad,
                            max_offset=max_offset(examples) + 64)


def train_vq(vocab, examples: list[sequences.Example], config: Config, rate: int, run_dir: RunDir, seed: int | None = None,
             replicate: int = 0):
    """Train replicate `replicate`'s VQ-VAE for `rate` (initial weights, batches and code restarts from `seed`) on
    chunks of the training sequences (resumable)."""
    seed = config.seed if seed is None else seed
    chunks = vq_chunks(examples, config.chunk, vocab.pad)
    torch.manual_seed(seed + rate)
    vq = build_vq(vocab, examples, config, rate)
    pad = vocab.pad

    def collate(items):
        prompt, mask = sequences.pad_left([p for p, _, _ in items], pad)
        return {"prompt": prompt, "mask": mask, "chunk": torch.tensor([c for _, c, _ in items], device="cpu"),
                "offset": torch.tensor([o for _, _, o in items], device="cpu")}  # the loop moves batches

    state = {}

    def loss_fn(model, batch):  # the reconstruction CE weighs the chunks' real tokens alike over every process
        _, rec, vq_loss, _, _, z = model(batch["prompt"], batch["mask"], batch["chunk"], batch["offset"])
        tokens = float((batch["chunk"] != pad).sum())
        state["z"] = z.detach()
        return share(rec * tokens, tokens) + vq_loss

    def on_step(step, _loss):  # the loop's own step count, so a resumed run restarts codes at the same steps
        if (step + 1) % 20 == 0:
            vq.quantizer.restart_dead(state["z"])

    steps = config.size("vq_steps")
    train(vq, chunks, collate, loss_fn, train_cfg(config, steps, f"VQ-VAE r={rate}, replicate {replicate}", lr=2e-3,
                                                  seed=seed),
          run_dir.path / f"vq-r{rate}-rep{replicate}", on_step=on_step)
    return vq, chunks, collate


def chunk_codes(vq, vocab, ex: sequences.Example, chunk: int) -> list[int]:
    """The codes of every segment of the chain, in order (chunk / rate per segment)."""
    return chunk_codes_many(vq, vocab, [ex], chunk)[0]


def chunk_codes_many(vq, vocab, examples: list[sequences.Example], chunk: int, batch_size: int = 1024) -> list[list[int]]:
    """`chunk_codes` of each example, the segments of all of them encoded in batches of `batch_size` (each
    segment's codes from the segment and where it starts alone, as in training: they do not depend on its batch)."""
    device = module_device(vq)
    segs = [sequences.segments(ex, chunk) for ex in examples]
    flat = [(padded(ex.chain[a:b], chunk, vocab.pad), len(ex.prompt) + a)
            for ex, ex_segs in zip(examples, segs) for a, b in ex_segs]
    codes: list[int] = []
    for start in range(0, len(flat), batch_size):
        part = flat[start:start + batch_size]
        ids = torch.tensor([c for c, _ in part], device=device)
        offset = torch.tensor([o for _, o in part], device=device)
        codes += vq.codes(ids, offset).reshape(-1).tolist()
    per_seg = chunk // vq.rate
    out, at = [], 0
    for ex_segs in segs:
        out.append(codes[at:at + per_seg * len(ex_segs)])
        at += per_seg * len(ex_segs)
    return out


def forced_prefixes(vq, vocab, examples: list[sequences.Example], config: Config, rate: int) -> list[tuple[list[int], int]]:
    """<boLatent> true codes <eoLatent> for the largest m training allows each example, and that m (the "forced
    codes" evaluation; an example that allows none gets no prefix), their codes encoded in batches. Under the placebo
    the codes are the constant code its model was trained on (`codes.carry_nothing`), in the same layout."""
    options = [sequences.replacement_options(ex, config.chunk) for ex in examples]
    need = [ex for ex, opts in zip(examples, options) if opts]
    encoded = chunk_codes_many(vq, vocab, need, config.chunk)
    codes = iter([sequences.carry_nothing(c) for c in encoded] if config.placebo else encoded)
    out = []
    for ex, opts in zip(examples, options):
        if not opts:
            out.append(([], 0))
            continue
        m = opts[-1]
        n = sequences.codes_needed(ex, m, config.chunk, rate)
        out.append((sequences.replace_with_latents(vocab, ex.chain[:m], next(codes), m, n), m))
    return out


@torch.no_grad()
def evaluate(model, vocab, examples: list[sequences.Example], max_new: int = 96, batch_size: int = 250,
             prefixes: list[list[list[int]]] | None = None) -> list[dict]:
    """Greedy generation, one dict per replicate of a stacked model (one for an ordinary model); per problem:
    correct, generated tokens (latent + text, to <eos>; a forced prefix counts as generated), latents used.
    `prefixes[r][i]`: ids forced after problem i's prompt for replicate r (the true codes of its VQ-VAE). A stacked
    model generates every replicate's rows in one batch. Under a launch each process generates its share of the
    problems (lmlab.parallel.share_out); seconds_per_problem is the whole evaluation's wall time over the problems
    (for all replicates at once)."""
    model.eval()
    k = replicas(model)
    prefixes = prefixes or [[[] for _ in examples] for _ in range(k)]
    t0 = time.perf_counter()
    rows = parallel.share_out(len(examples), lambda idx: _generate(
        model, vocab, [examples[i] for i in idx], [[p[i] for i in idx] for p in prefixes], max_new, batch_size))
    seconds = time.perf_counter() - t0
    out = []
    for r in range(k):
        mine = [row[r] for row in rows]
        correct, tokens, latents = (list(col) for col in zip(*mine)) if mine else ([], [], [])
        out.append({"correct": correct, "tokens": tokens, "latents": latents,
                    "seconds_per_problem": seconds / max(1, len(examples))})
    return out


def _generate(model, vocab, examples: list[sequences.Example], prefixes: list[list[list[int]]], max_new: int,
              batch_size: int) -> list[list[tuple[bool, int, int]]]:
    """Per example, per replicate: (correct, generated tokens, latents), generated in batches (a stacked model's
    rows are each replicate's prompts in turn)."""
    device = module_device(model)
    k = len(prefixes)
    out_rows = []
    for start in range(0, len(examples), batch_size):
        part = examples[start:start + batch_size]
        forced = [p[start:start + batch_size] for p in prefixes]
        ids, mask = sequences.pad_left([ex.prompt + f for r in range(k) for ex, f in zip(part, forced[r])], vocab.pad, device)
        out = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=vocab.eos, pad_token_id=vocab.pad)
        gen = out[:, ids.shape[1]:].tolist()
        for i, ex in enumerate(part):
            per = []
            for r in range(k):
                row = gen[r * len(part) + i]
                g = forced[r][i] + (row[:row.index(vocab.eos) + 1] if vocab.eos in row else row)
                per.append((sequences.is_correct(vocab, g, ex.value), len(g), sum(1 for t in g if vocab.is_code(t))))
            out_rows.append(per)
    return out_rows


@torch.no_grad()
def vq_quality(vq, vocab, dev_ex: list[sequences.Example], config: Config, train_chunks) -> dict:
    """Reconstruction of chain segments on the dev problems (padding left out): token accuracy, split into
    the tokens a step computes and the copied ones, and whole-chunk exact match; codes used on training
    chunks."""
    out = {}
    prompts, ids, hot, offsets = [], [], [], []
    for ex in dev_ex:
        for a, b in sequences.segments(ex, config.chunk):
            prompts.append(ex.prompt)
            offsets.append(len(ex.prompt) + a)
            ids.append(padded(ex.chain[a:b], config.chunk, vocab.pad))
            hot.append(padded([int(x) for x in ex.computed[a:b]], config.chunk, -1))
    device = module_device(vq)
    if ids:
        prompt, mask = sequences.pad_left(prompts, vocab.pad, device)
        ids_t = torch.tensor(ids, device=device)
        rec = vq.reconstruct(prompt, mask, ids_t, torch.tensor(offsets, device=device))
        real = ids_t != vocab.pad
        same = (rec == ids_t) & real
        kind = torch.tensor(hot, device=device)
        out["vq_dev_token_acc"] = float(same.sum() / real.sum())
        for name, flag in (("computed", 1), ("copied", 0)):
            sel = kind == flag
            out[f"vq_dev_{name}_acc"] = float(same[sel].float().mean()) if sel.any() else float("nan")
        out["vq_dev_chunk_exact"] = float((same | ~real).all(1).float().mean())
    sample = train_chunks[:2000]
    if sample:
        used = vq.codes(torch.tensor([c for _, c, _ in sample], device=device),
                        torch.tensor([o for _, _, o in sample], device=device))
        out["codebook_used"] = int(used.unique().numel())
    return out
