"""S0 diagnostic: where a finished `lmlab latent` run's largest-rate model goes wrong after the true codes of
the first k chunks of each chain are forced in (k = 1, 2, 3); on a placebo run, the one constant code it was
trained on, in the same layout.

    python -m lmlab.studies.latent.diagnose RUN [--n 300] [--replicate 0]

For each k: accuracy, and where the first generated token that differs from the gold continuation falls
(a copied or a computed chain token, and in which step of the trace). It rebuilds the run's data, its
VQ-VAE (the finished checkpoint is resumed, nothing is retrained) and the fine-tuned model.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch
from lmlab.studies.latent import SPEC, sequences
from lmlab.studies.result import read_config
from lmlab.studies.latent.measure import chunk_codes, train_vq
from lmlab.studies.latent.recipe import final_weights, prepare


class _Run:
    def __init__(self, path: Path):
        self.path = path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--n", type=int, default=300, help="test problems to use")
    parser.add_argument("--replicate", type=int, default=0, help="which replicate of the run")
    args = parser.parse_args()
    config = read_config(args.run, SPEC)
    prep = prepare(config)
    vocab, rate = prep.vocab, max(config.size("rates"))
    r = args.replicate
    vq, _, _ = train_vq(vocab, prep.train, config, rate, _Run(args.run), seed=config.replicate_seeds()[r],
                        replicate=r)  # resumes the finished VQ-VAE
    model = prep.initial[r]
    missing, unexpected = model.load_state_dict(final_weights(args.run, f"r{rate}", replicate=r), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise SystemExit(f"the r{rate} checkpoint does not fit the rebuilt model")
    model.eval()
    test = prep.test[:args.n]
    for k in (1, 2, 3):
        prefixes, kept = [], []
        for ex in test:
            segs = sequences.segments(ex, config.chunk)
            k_here = min(k, len(segs) - 1)
            m = segs[k_here - 1][1] if k_here > 0 else 0
            n_codes = sequences.codes_needed(ex, m, config.chunk, rate)
            codes = chunk_codes(vq, vocab, ex, config.chunk) if m else []
            codes = sequences.carry_nothing(codes) if config.placebo else codes  # a placebo run's model knows one code
            prefixes.append(sequences.replace_with_latents(vocab, ex.chain[:m], codes, m, n_codes))
            kept.append(m)
        ids, mask = sequences.pad_left([ex.prompt + p for ex, p in zip(test, prefixes)], vocab.pad)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=prep.max_new,
                                 do_sample=False, eos_token_id=vocab.eos, pad_token_id=vocab.pad)
        kinds, steps, right = collections.Counter(), collections.Counter(), 0
        for ex, m, row in zip(test, kept, out[:, ids.shape[1]:].tolist()):
            right += sequences.is_correct(vocab, row, ex.value)
            gold = ex.chain[m:] + ex.answer
            for i, (a, b) in enumerate(zip(row, gold)):
                if a != b:
                    at = m + i
                    kinds["answer" if at >= len(ex.chain) else ("computed" if ex.computed[at] else "copied")] += 1
                    steps[sum(1 for s in ex.step_starts if s <= at) - 1] += 1
                    break
        print(f"true codes for the first {k} chunk(s), m = {sum(kept) / len(kept):.1f} tokens on average: accuracy "
              f"{right / len(test):.3f}; first wrong token {dict(kinds)}; in step {dict(sorted(steps.items()))}")


if __name__ == "__main__":
    main()
