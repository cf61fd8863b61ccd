"""One training loop on accelerate, shared by the studies that train (S0, S2, S4)."""

from lmlab.train.loop import TrainConfig, TrainingDiverged, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "TrainingDiverged", "train"]
