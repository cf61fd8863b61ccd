"""Trains tiny-llama a few steps; run alone or under torchrun. Writes the loss curve and each process's newest
checkpoint as JSON (`late`: see main)."""

import json
import os
import shutil
import sys

import torch

from lmlab.models import load_model
from lmlab.train import TrainConfig, train


def main(out_dir: str, steps: int = 6, late: bool = False):
    """The training's result. `late`: rank 1 lingers after each barrier, and rank 0 removes the training's folder
    as soon as training returns (as a study removes a unit's checkpoints): rank 1 must not read the folder then."""
    torch.set_num_threads(1)
    if late and os.environ.get("RANK") == "1":
        import time

        from accelerate import Accelerator

        waited = Accelerator.wait_for_everyone

        def wait_then_linger(self):
            waited(self)
            time.sleep(0.5)

        Accelerator.wait_for_everyone = wait_then_linger
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
    if late and os.environ.get("RANK", "0") == "0":
        shutil.rmtree(out_dir)
    return result


if __name__ == "__main__":
    late = sys.argv[3:] == ["late"]
    result = main(sys.argv[1], late=late)
    import torch.distributed as dist

    checkpoints = [str(result.checkpoint)]
    if dist.is_initialized():  # every process's newest checkpoint, as its training returned it
        checkpoints = [None] * dist.get_world_size()
        dist.all_gather_object(checkpoints, str(result.checkpoint))
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(sys.argv[2], "w") as fh:
            json.dump({"losses": result.losses, "checkpoints": checkpoints}, fh)
    from lmlab import parallel

    parallel.close()
