"""depthpack: metric depth at queried pixels from a ViT packed to the tokens the queries need."""
from .core.lazy import lazy_attributes

_WHERE = {"load_model": ".core.checkpoint", "PRESETS": ".core.config", "ModelConfig": ".core.config",
          "model_config": ".core.config", "DepthPack": ".core.model", "create_model": ".core.model",
          "Predictor": ".runtime.predictor"}
__getattr__ = lazy_attributes(__name__, _WHERE)  # no torch until a name is used (core.lazy says why)

__all__ = ["ModelConfig", "model_config", "PRESETS", "DepthPack", "create_model", "load_model", "Predictor"]
__version__ = "0.1.0"
