"""A whole study on a tiny model, run alone or under a launcher (lmlab.parallel). On rank 0 it writes
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
    elif study == "filler":
        from lmlab.studies import filler as s3

        spec, config = s3.SPEC, s3.Config(model="tiny-llama", n_test_per_level=3, n_dev_per_level=2,
                                          sweep_problems=3, profile_problems=2, max_new_tokens=6, sweep_lengths=[5],
                                          batch_size=4, device="cpu")
    elif study == "quantize":  # tiny-bert without dropout (each process draws its own masks), passed in
        from lmlab.models import load_model
        from lmlab.studies import quantize as s2

        lm = load_model("tiny-bert", device="cpu")
        lm.model.config.hidden_dropout_prob = lm.model.config.attention_probs_dropout_prob = 0.0
        lm.name = "tiny-bert-no-dropout"
        spec, config = s2.SPEC, s2.Config(model=lm.name, tasks=["fact-qnli"], n_train=32, n_eval=16, batch_size=8,
                                          bits=[2], budgets=["A"], epochs_a=2, teacher_epochs=2, device="cpu")
        result = run_study(spec, config, out, lm=lm)
    else:  # sparse_circuits: the addition toy alone (it trains, then sparse-post-trains)
        from lmlab.studies import sparse_circuits as s4

        spec, config = s4.SPEC, s4.Config(model="tiny-llama", circuits=False, toy_steps=6, toy_sparse_steps=4,
                                          toy_width=16, device="cpu")
    if study != "quantize":
        result = run_study(spec, config, out)
    if result is not None:
        with open(summary, "w") as fh:
            json.dump({"path": str(result.path), "verdict": result.verdict.status,
                       "summary": result.verdict.summary}, fh)


if __name__ == "__main__":
    main(*sys.argv[1:4])
    from lmlab import parallel

    parallel.close()
