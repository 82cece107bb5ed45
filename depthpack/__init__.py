"""depthpack: metric depth at queried pixels from a ViT packed to the tokens the queries need."""
from .core.checkpoint import load_model
from .core.config import PRESETS, ModelConfig, model_config
from .core.model import DepthPack, create_model
from .runtime.predictor import Predictor

__all__ = ["ModelConfig", "model_config", "PRESETS", "DepthPack", "create_model", "load_model", "Predictor"]
__version__ = "0.1.0"
