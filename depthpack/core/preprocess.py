"""The one preprocessing of depthpack: camera frame -> model input. Training, evaluation, the
Predictor (inside its CUDA graphs), the exported packages and the C++ runner all compute this.

    frame uint8 [h,w,3] in channel order `color` (rgb | bgr)
      -> float32 [3,h,w] RGB -> bilinear resize to the model's (H, W) (align_corners=False, no
         antialias: torch.nn.functional.interpolate) -> / 255 -> [3,H,W] in [0,1]
    points (x, y) in the frame's pixels -> * (W / w, H / h) in float32
    focal (fx, fy) in the frame's pixels -> sqrt(fx * W / w * fy * H / h) (focal_at_size; scale_focal
      for a tensor of sqrt(fx * fy) per frame, 0 = unknown)
Normalization by mean and std happens inside the model. Image files are decoded by OpenCV, after a
check that the file is complete (a truncated JPEG or PNG decodes without complaint otherwise).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F

COLORS = ("rgb", "bgr")
MAX_IMAGE_BYTES = 256 << 20


class FrameSizeError(argparse.ArgumentTypeError, ValueError):
    """A frame size that is not WIDTHxHEIGHT (argparse prints its message as is)."""


def parse_frame_size(text: str) -> tuple[int, int]:
    """'640x480' (width x height, as cameras are named) -> (h, w)."""
    try:
        w, h = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise FrameSizeError(f"{text!r} is not WIDTHxHEIGHT (e.g. 640x480)") from None
    if w < 1 or h < 1:
        raise FrameSizeError(f"{text!r}: width and height must be positive")
    return h, w


def frames_to_images(frames: torch.Tensor, size: tuple[int, int], color: str = "rgb") -> torch.Tensor:
    """uint8 frames [B,h,w,3] in channel order color -> float32 images [B,3,H,W] RGB in [0,1] at size.
    Fixed shapes only: it runs inside compiled graphs and packages."""
    x = frames.permute(0, 3, 1, 2).to(torch.float32)  # [B,3,h,w] 0..255
    if color == "bgr":
        x = x.flip(1)
    H, W = size
    if tuple(x.shape[-2:]) != (H, W):
        x = F.interpolate(x, size=(H, W), mode="bilinear", align_corners=False, antialias=False)
    return x / 255.0


def scale_points(points, frame_size: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """(x, y) in the frame (h, w) -> (x, y) in the model's image (H, W); float32, on points' device."""
    (h, w), (H, W) = frame_size, size
    pts = points if isinstance(points, torch.Tensor) else torch.as_tensor(np.asarray(points, dtype=np.float32))
    pts = pts.to(torch.float32)
    # Python-number factors (float32 in the product): no tensor is made, so it captures in a CUDA graph
    sx, sy = float(np.float32(W / w)), float(np.float32(H / h))  # the factors rounded to float32, as before
    return torch.stack([pts[..., 0] * sx, pts[..., 1] * sy], dim=-1)


def focal_factor(from_size: tuple[int, int], to_size: tuple[int, int]) -> float:
    """sqrt(W / w * H / h): what a focal length in pixels of an image (h, w) = from_size is multiplied
    by when the image is resized to (H, W) = to_size (sqrt(fx' * fy') with fx' = fx * W / w and
    fy' = fy * H / h; a crop after the scaling leaves it unchanged). The one definition, for data
    sets, runtimes, packages and the model."""
    (h, w), (H, W) = from_size, to_size
    return math.sqrt((W / w) * (H / h))


def focal_at_size(fx: float, fy: float, frame_size: tuple[int, int], size: tuple[int, int]) -> float:
    """The focal length the model sees, in pixels: sqrt(fx * fy) of a frame (h, w) with focal
    lengths (fx, fy) in its pixels, once the frame is scaled to (H, W)."""
    return math.sqrt(float(fx) * float(fy)) * focal_factor(frame_size, size)


def scale_focal(focal: torch.Tensor, frame_size: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """focal [B] (sqrt(fx * fy) in the frame's pixels; 0 = unknown) -> in the model image's pixels,
    times a constant of the static sizes (inside graphs and packages, as scale_points); 0 stays 0
    (the model's default)."""
    return focal.to(torch.float32) * focal_factor(frame_size, size)


def check_complete(data: bytes, path) -> None:
    """A ValueError if a JPEG lacks its end marker or a PNG its IEND chunk (a cut-off file)."""
    if data[:3] == b"\xff\xd8\xff":
        end = data.rstrip(b"\x00")
        if not end.endswith(b"\xff\xd9"):
            raise ValueError(f"image {path}: truncated JPEG (no end-of-image marker)")
    elif data[:8] == b"\x89PNG\r\n\x1a\n":  # walk the chunks (length, type, data, CRC) to IEND
        at = 8
        while at + 8 <= len(data) and data[at + 4:at + 8] != b"IEND":
            at += 12 + int.from_bytes(data[at:at + 4], "big")
        if at + 12 > len(data):
            raise ValueError(f"image {path}: truncated PNG (no IEND chunk)")


def read_rgb(path: str | Path) -> np.ndarray:
    """uint8 RGB [h,w,3]; one clear ValueError if the file is missing, too large, cut off or not an image."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"image {path}: no such file")
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise ValueError(f"image {path}: {path.stat().st_size} bytes is larger than {MAX_IMAGE_BYTES}")
    data = path.read_bytes()
    check_complete(data, path)
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f"image {path}: cannot be decoded as an image")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def to_model_input(rgb: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """uint8 RGB [h,w,3] -> float32 [3,H,W] in [0,1] at size (H, W) (frames_to_images)."""
    return frames_to_images(torch.from_numpy(np.ascontiguousarray(rgb))[None], size, "rgb")[0]


def load_image(path: str | Path, size: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """Read and preprocess one image: ([3,H,W] float32, original (h0, w0))."""
    rgb = read_rgb(path)
    return to_model_input(rgb, size), rgb.shape[:2]


def to_model_size(model, images: torch.Tensor, points: torch.Tensor | None = None, focal: torch.Tensor | None = None):
    """Images of another size than the model's resized to it (bilinear, antialiased: a user's downsampling),
    their points and focal scaled alike; at the model's size everything is returned as it is."""
    size, have = tuple(model.cfg.img_size), tuple(images.shape[-2:])
    if have == size:
        return images, points, focal
    images = torch.nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=True)
    images = images.clamp(0.0, 1.0)  # the filter's weights are >= 0: anything past [0, 1] is their rounding
    if points is not None:  # pixel (x, y) stays inside the image: x * W / w < W
        points = scale_points(points, have, size).clamp(min=0).minimum(
            torch.tensor([size[1] - 1e-3, size[0] - 1e-3], device=points.device))
    return images, points, scale_focal(focal, have, size) if focal is not None else None
