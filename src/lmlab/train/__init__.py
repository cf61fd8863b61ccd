"""One training loop on accelerate, shared by the studies that train (latent, quantize, sparse-circuits)."""

from lmlab.train.loop import TrainConfig, TrainingDiverged, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "TrainingDiverged", "train"]
