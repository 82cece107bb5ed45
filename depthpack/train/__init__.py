"""Training: TrainConfig, the loop (SILog at queried points through the packed path), the loss."""
from ..core.lazy import lazy_attributes

_WHERE = {"TrainConfig": ".config", "load_train_config": ".config", "train": ".loop"}
__getattr__ = lazy_attributes(__name__, _WHERE)  # no torch until a name is used (core.lazy says why)

__all__ = ["TrainConfig", "load_train_config", "train"]
