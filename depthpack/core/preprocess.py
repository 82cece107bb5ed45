"""Preprocessing shared bit-for-bit with the C++ runner (deploy_cpp/depthpack_run.cpp).

image file -> OpenCV decode (BGR) -> RGB -> cv2.resize to the model's (W, H) with INTER_LINEAR
-> float32 / 255 -> [3,H,W]. Normalization by mean/std happens inside the model.
Points are given in the original image's pixels and scaled by (W / w0, H / h0).
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch


def read_rgb(path: str | Path) -> np.ndarray:
    """uint8 RGB [h,w,3]; a clear ValueError if the file is missing or not an image."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"image {path}: no such file")
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f"image {path}: cannot be decoded as an image")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def to_model_input(rgb: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """uint8 RGB [h,w,3] -> float32 [3,H,W] in [0,1] at size (H, W)."""
    H, W = size
    if rgb.shape[:2] != (H, W):
        rgb = cv2.resize(rgb, (W, H), interpolation=cv2.INTER_LINEAR)
    return torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1))).float().div_(255.0)


def scale_points(points, orig_size: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """(x, y) in the original image (h0, w0) -> (x, y) in the model's image (H, W)."""
    (h0, w0), (H, W) = orig_size, size
    pts = torch.as_tensor(np.asarray(points, dtype=np.float32))
    return pts * torch.tensor([W / w0, H / h0], dtype=torch.float32)


def load_image(path: str | Path, size: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """Read and preprocess one image: ([3,H,W] float32, original (h0, w0))."""
    rgb = read_rgb(path)
    return to_model_input(rgb, size), rgb.shape[:2]
