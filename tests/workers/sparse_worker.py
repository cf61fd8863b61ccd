"""S4's sparse post-training (the study's own ce_fn shape: paired bound, token-weighted) on tiny-llama over texts of
different lengths, a few steps; run alone or under torchrun. Writes the loss curve, the multiplier's trace and the
edge record as JSON on rank 0."""

import sys

import torch


def main(out_dir: str, steps: int = 4) -> dict:
    torch.set_num_threads(1)
    from lmlab.models import load_model
    from lmlab.studies.sparse_circuits.measure import reference_batch, with_dense_reference
    from lmlab.train import TrainConfig
    from lmlab.train.sparse import sparse_post_train

    lm = load_model("tiny-llama", device="cpu")
    texts = ["When Mary and John went to the store, John gave a drink to Mary",
             "The war lasted from the year 1732 to the year 1745", "the capital of France is Paris",
             "def f(name, value): return value", "12 + 34 = 46", "Anna gave a drink to Tom at the old market square"]
    seqs = [lm.tokenizer(t)["input_ids"][:16] for t in texts] * 2
    items, dense = with_dense_reference(lm, seqs, 4)

    def ce_fn(model, batch):
        loss = model(**{k: v for k, v in batch.items() if k != "dense_ce"}).loss
        return loss, batch["dense_ce"] + 0.1, float((batch["labels"][:, 1:] != -100).sum())

    tc = TrainConfig(steps=steps, batch_size=4, lr=3e-3, schedule="constant", seed=0, progress=False,
                     lr_scale={"q_proj": 10, "k_proj": 10})
    out = sparse_post_train(lm.model, items, lambda b: reference_batch(lm, b), ce_fn, dense + 0.1, tc, out_dir,
                            rate=2.0)
    return {"losses": out.result.losses, "geco": [list(t) for t in out.geco.trace], "history": out.history}


if __name__ == "__main__":
    from _report import report  # (the workers' folder is on the path of a script run from it)

    report(sys.argv[2], main(sys.argv[1]))
