"""S4's toy training (the study's own model, data, collate, loss and settings), a few steps; run alone or under
torchrun. Writes the loss curve and the number of processes as JSON on rank 0."""

import sys

import torch

from lmlab.studies.sparse_circuits.toy import model as toy
from lmlab.studies.sparse_circuits.config import Config
from lmlab.train import TrainConfig, train


def main(out_dir: str, steps: int = 5) -> list[float]:
    torch.set_num_threads(1)
    config = Config(model="smollm2-135m", device="cpu", toy_width=16)
    model = toy.build_toy(seed=config.seed, d_model=config.size("toy_width"), n_layers=1, n_heads=2,
                          device=config.torch_device()).model
    data = toy.addition_data(n_test=50, seed=config.seed, repeats=1)
    tc = TrainConfig(steps=steps, batch_size=16, lr=3e-3, weight_decay=0.1, warmup_steps=1, schedule="cosine",
                     seed=config.seed, progress=False, description="toy: addition", **config.train_settings())
    return train(model, data.train[:256], toy.collate, toy.answer_loss, tc, out_dir).losses


if __name__ == "__main__":
    from _report import report  # (the workers' folder is on the path of a script run from it)

    report(sys.argv[2], {"losses": main(sys.argv[1])})
