"""depthpack: metric depth at queried pixels from a ViT packed to the tokens the queries need."""
from .config import ModelConfig, model_config, PRESETS
from .model import DepthPack, create_model
from .predictor import Predictor

__all__ = ["ModelConfig", "model_config", "PRESETS", "DepthPack", "create_model", "Predictor"]
__version__ = "0.1.0"
