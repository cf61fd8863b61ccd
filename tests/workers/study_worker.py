"""A whole study on a tiny model, run alone or under a launcher (lmlab.parallel). On rank 0 it writes
the run folder's path and verdict as JSON. S1 gets the labelling rule its pipeline test uses (both classes)."""

import json
import sys
from pathlib import Path

import torch


def main(study: str, out: str, summary: str) -> None:
    from lmlab.studies import run_study

    spec, config, lm = build(study, out)
    result = run_study(spec, config, out, lm=lm)
    if result is not None:
        with open(summary, "w") as fh:
            json.dump({"path": str(result.path), "verdict": result.verdict.status,
                       "summary": result.verdict.summary}, fh)


def build(study: str, out: str):
    """(spec, config, model passed in or None) of `study`'s tiny run (also the fault-injection harness's)."""
    torch.set_num_threads(1)
    lm = None  # a model passed in, where the study needs one built here

    if study == "knockout":
        from lmlab.studies import knockout as s1

        import lmlab.studies.knockout.recipe as recipe

        recipe.alias_match = lambda text, aliases, exact=False: aliases[0][0] < "M"
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
                                          bits=[2], budgets=["A"], epochs_a=2, teacher_epochs=2, best_dev=True,
                                          device="cpu")
    elif study in ("sparse_circuits_model", "quantize_decoder"):  # a tiny random Llama speaking SmolLM2's tokens
        from transformers import LlamaConfig, LlamaForCausalLM

        from lmlab import parallel
        from lmlab.models import load_model
        from lmlab.studies import quantize as s2
        from lmlab.studies import sparse_circuits as s4

        smol = load_model("smollm2-135m", device="cpu")
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=len(smol.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=True)
        folder = Path(out).parent / f"tiny-smol-{study}"  # saved and loaded back, as a user's local model
        if parallel.is_main():
            LlamaForCausalLM(cfg).save_pretrained(folder)
            smol.tokenizer.save_pretrained(folder)
        parallel.sync()
        lm = load_model(str(folder), device="cpu")
        lm.name = "tiny-smol"
        if study == "quantize_decoder":
            spec, config = s2.SPEC, s2.Config(model="tiny-smol", tasks=["ioi"], bits=[2], budgets=["A"], n_text=8,
                                              n_eval_text=4, text_tokens=12, n_prompts=4, batch_size=4, device="cpu")
        else:  # circuits on two tasks (one per process), post-training, sparsity, the toy (at the toy-alone
            # case's size below: two replicates, one circuit task; every phase of the toy over two processes is
            # that case's check, this one's is the model's half)
            spec, config = s4.SPEC, s4.Config(model="tiny-smol", tasks=["ioi", "greater-than"], n_prompts=2,
                                              sparse_steps=2, sparse_batch=2, n_text=6, n_docstrings=2, text_tokens=6,
                                              n_eval_text=2, eval_tokens=8, toy_steps=3, toy_sparse_steps=2,
                                              toy_width=16, toy_seeds=2, toy_tasks=["carry"], verify_heads=4,
                                              batch_size=4, fine_grid=False, rank_draws=5, toy_rank_draws=5,
                                              device="cpu")
    elif study == "latent":  # the scratch model, one rate: base, CoT, answer-only, the VQ-VAE and r8's fine-tune
        from lmlab.studies import latent as s0

        spec, config = s0.SPEC, s0.Config(model="scratch", rates=[8], n_train=200, n_test=10, steps=40,
                                          seeds=2, vq_steps=25, d_model=32, n_layers=2, batch_size=8,
                                          codebook=16, device="cpu")
    else:  # sparse_circuits: the addition toy alone (it trains, then sparse-post-trains); two replicates and one
        # circuit task keep every phase of the toy (stacked training, rollback states, both models' circuits)
        from lmlab.studies import sparse_circuits as s4

        spec, config = s4.SPEC, s4.Config(model="tiny-llama", circuits=False, toy_steps=6, toy_sparse_steps=4,
                                          toy_width=16, toy_seeds=2, toy_tasks=["carry"], toy_rank_draws=5,
                                          device="cpu")
    return spec, config, lm


if __name__ == "__main__":
    main(*sys.argv[1:4])
    from lmlab import parallel

    parallel.close()
