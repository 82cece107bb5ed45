"""Data: synthetic scenes, NYU Depth v2, KITTI, generic folders, ROS bags; query sampling; folder writer.

    ds = make_dataset(DataConfig(kind="synthetic"), "train", (224, 224), 0.1, 20.0)
    s = ds[0]   # image [3,H,W], depth [H,W] m (0 invalid), valid, eval_mask [H,W] bool, name
    pts = sample_queries(s["valid"], s["image"], 256, torch.Generator().manual_seed(0))  # [256,2] (x, y)
"""
from __future__ import annotations

from pathlib import Path

from ..core.lazy import lazy_attributes

_WHERE = {"BagDataset": ".bag", "BagWriter": ".bag", "BadSample": ".common", "SkippingDataset": ".common",
          "crop_mask": ".common", "make_sample": ".common", "valid_mask": ".common", "DataConfig": ".config",
          "NyuMatDataset": ".datasets", "PairsDataset": ".datasets", "SyntheticDataset": ".datasets",
          "make_dataset": ".datasets", "decode_uint16": ".formats", "encode_uint16": ".formats",
          "read_depth": ".formats", "read_pfm": ".formats", "read_rgb": ".formats", "sample_queries": ".queries",
          "sobel_magnitude": ".queries", "render": ".synthetic"}
__getattr__ = lazy_attributes(__name__, _WHERE)  # no torch until a name is used (core.lazy says why)

__all__ = ["DataConfig", "make_dataset", "sample_queries", "write_folder_sample", "render", "BadSample",
           "SkippingDataset", "SyntheticDataset", "PairsDataset", "NyuMatDataset", "BagDataset", "BagWriter", "crop_mask", "valid_mask", "make_sample",
           "read_depth", "read_rgb", "read_pfm", "decode_uint16", "encode_uint16", "sobel_magnitude"]


def write_folder_sample(sample: dict, root: str, name: str, depth_scale: float = 1000.0) -> tuple[Path, Path]:
    """Write root/rgb/NAME.png (8-bit RGB) and root/depth/NAME.png (uint16 = round(meters * depth_scale),
    0 = invalid) in the generic folder format; DataConfig(kind="folder", root=root, depth_scale=...)
    reads them back. ValueError if a depth does not fit in uint16 at that scale."""
    import cv2
    import numpy as np
    import torch

    from .formats import encode_uint16

    img = sample["image"]
    img = img.detach().cpu().numpy().transpose(1, 2, 0) if isinstance(img, torch.Tensor) else np.asarray(img)
    depth = sample["depth"]
    depth = depth.detach().cpu().numpy() if isinstance(depth, torch.Tensor) else np.asarray(depth)
    if "valid" in sample:
        v = sample["valid"]
        v = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        depth = np.where(v, depth, 0.0)
    if img.ndim != 3 or img.shape[2] != 3 or img.shape[:2] != depth.shape:
        raise ValueError(f"sample image {img.shape} and depth {depth.shape} must be [H,W,3]/[3,H,W] and [H,W]")
    rgb8 = img if img.dtype == np.uint8 else np.round(np.clip(img, 0.0, 1.0) * 255.0).astype(np.uint8)
    d16 = encode_uint16(depth, depth_scale)
    root = Path(root)
    (root / "rgb").mkdir(parents=True, exist_ok=True)
    (root / "depth").mkdir(parents=True, exist_ok=True)
    rgb_path, depth_path = root / "rgb" / f"{name}.png", root / "depth" / f"{name}.png"
    if not cv2.imwrite(str(rgb_path), cv2.cvtColor(rgb8, cv2.COLOR_RGB2BGR)):
        raise OSError(f"cannot write {rgb_path}")
    if not cv2.imwrite(str(depth_path), d16):
        raise OSError(f"cannot write {depth_path}")
    return rgb_path, depth_path
