"""Trains tiny-llama a few steps; run alone or under torchrun. Writes the loss curve as JSON."""

import json
import sys

import torch

from lmlab.models import load_model
from lmlab.train import TrainConfig, train


def main(out_dir: str, steps: int = 6) -> list[float]:
    torch.set_num_threads(1)
    lm = load_model("tiny-llama")
    texts = ["When Mary and John went to the store, John gave a drink to Mary",
             "The war lasted from the year 1732 to the year 1745", "the capital of France is Paris",
             "def f(name, value): return value", "12 + 34 = 46", "Anna gave a drink to Tom"] * 3
    ids = [torch.tensor(lm.tokenizer(t)["input_ids"][:12]) for t in texts]
    data = [torch.nn.functional.pad(x, (0, 12 - len(x)), value=1) for x in ids]

    def loss_fn(model, batch):
        return model(input_ids=batch, labels=batch).loss

    config = TrainConfig(steps=steps, batch_size=4, lr=3e-3, seed=0, progress=False, grad_accum=2, warmup_steps=1)
    result = train(lm.model, data, torch.stack, loss_fn, config, out_dir)
    return result.losses


if __name__ == "__main__":
    losses = main(sys.argv[1])
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(sys.argv[2], "w") as fh:
            json.dump(losses, fh)
    from lmlab import parallel

    parallel.close()
