"""A whole study on a tiny model, run alone or under `accelerate launch` (lmlab.parallel). On rank 0 it writes
the run folder's path and verdict as JSON. S1 gets the labelling rule its pipeline test uses (both classes)."""

import json
import sys

import torch


def main(study: str, out: str, summary: str) -> None:
    torch.set_num_threads(1)
    from lmlab.studies import run_study

    if study == "knockout":
        from lmlab.studies import knockout as s1

        import lmlab.studies.knockout.recipe as recipe

        recipe.alias_match = lambda text, aliases: aliases[0][0] < "M"
        spec, config = s1.SPEC, s1.Config(model="tiny-llama", datasets=["geo-capital", "geo-continent"],
                                          per_dataset=30, sweep_every=1, min_per_class=3, device="cpu")
    else:
        from lmlab.studies import filler as s3

        spec, config = s3.SPEC, s3.Config(model="tiny-llama", n_test_per_level=3, n_dev_per_level=2,
                                          sweep_problems=3, profile_problems=2, max_new_tokens=6, sweep_lengths=[5],
                                          batch_size=4, device="cpu")
    result = run_study(spec, config, out)
    if result is not None:
        with open(summary, "w") as fh:
            json.dump({"path": str(result.path), "verdict": result.verdict.status,
                       "summary": result.verdict.summary}, fh)


if __name__ == "__main__":
    main(*sys.argv[1:4])
