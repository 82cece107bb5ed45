"""Training: TrainConfig, the loop (SILog at queried points through the packed path), the loss."""
from .config import TrainConfig, load_train_config
from .loop import train

__all__ = ["TrainConfig", "load_train_config", "train"]
