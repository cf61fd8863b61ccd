"""S0: the CoT baseline alone for several seeds (the first two stages of `lmlab latent`: the base model,
then the CoT fine-tune), to measure its seed-to-seed spread without the latent variants.

    python bench/latent_cot_baseline.py --seeds 0,1,2 [--profile quick] [--data walk]

Prints CoT accuracy on the test split (Wilson interval) and the wall time per seed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from lmlab.stats import wilson
from lmlab.studies.latent.config import Config
from lmlab.studies.latent.measure import collate_for, evaluate, lm_loss, train_cfg
from lmlab.studies.latent.recipe import prepare
from lmlab.train import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--profile", default="quick", choices=["quick", "full"])
    parser.add_argument("--data", default="walk")
    args = parser.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        t0 = time.perf_counter()
        config = Config(model="scratch", profile=args.profile, seed=seed, data=args.data)
        prep = prepare(config)
        items = [(ex.prompt, ex.chain + ex.answer) for ex in prep.train]
        collate = collate_for(prep.vocab.pad)
        with tempfile.TemporaryDirectory() as tmp:
            train(prep.base, items, collate, lm_loss, train_cfg(config, config.size("base_steps"), "base"),
                  Path(tmp) / "base")
            train(prep.base, items, collate, lm_loss, train_cfg(config, config.size("finetune_steps"), "fine-tune cot",
                                                                lr=config.size("lr") / 2), Path(tmp) / "cot")
        result = evaluate(prep.base, prep.vocab, prep.test, max_new=prep.max_new)
        print(f"seed {seed}: CoT {wilson(sum(result['correct']), len(result['correct']))} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
