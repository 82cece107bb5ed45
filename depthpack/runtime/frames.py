"""What a caller hands the Predictor, checked on the host: camera frames (uint8 [h,w,3], one, a list
or [B,h,w,3], numpy or torch, any strides) or float images [B,3,H,W] in [0,1]; points in their pixels.
One ValueError names what is wrong; nothing here reads a frame's pixel values (any uint8 is valid)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core.preprocess import COLORS
from ..core.validation import as_points, check_images


@dataclass
class Batch:
    kind: str  # "frames" or "images"
    data: torch.Tensor | list[torch.Tensor]  # frames uint8 [B,h,w,3] or B x [h,w,3] (any strides) | images [B,3,H,W]
    points: torch.Tensor  # float32 [B,Q,2]

    @property
    def size(self) -> tuple[int, int]:
        """(h, w) of the input: the frame's or the image's pixels the points refer to (from the shape: a
        batch of no images has one too)."""
        if self.kind == "images":
            return tuple(self.data.shape[-2:])
        return tuple(self.data[0].shape[:2]) if isinstance(self.data, list) else tuple(self.data.shape[1:3])

    def rows(self, b0: int, n: int) -> torch.Tensor | list[torch.Tensor]:
        return self.data[b0:b0 + n]

    def stacked(self) -> torch.Tensor:
        return torch.stack(self.data) if isinstance(self.data, list) else self.data


def _as_tensor(a) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a
    if isinstance(a, np.ndarray):
        if any(s < 0 for s in a.strides):  # a flipped view: torch cannot wrap it
            a = np.ascontiguousarray(a)
        return torch.from_numpy(a)
    raise ValueError(f"frames must be numpy arrays or torch tensors, got {type(a).__name__}")


def _frame_problem(t: torch.Tensor, what: str) -> str | None:
    if t.dtype != torch.uint8:
        return f"{what} must be uint8 [H,W,3] (or float images [B,3,H,W] in [0,1]), got {t.dtype} {list(t.shape)}"
    if t.ndim != 3 or t.shape[-1] != 3:
        ch = t.shape[-1] if t.ndim == 3 else (1 if t.ndim == 2 else None)
        hint = {1: "; convert grey frames with cv2.cvtColor(f, cv2.COLOR_GRAY2BGR)",
                4: "; drop alpha with cv2.cvtColor(f, cv2.COLOR_BGRA2BGR)"}.get(ch, "")
        return f"{what} must have shape [H,W,3], got {list(t.shape)}{hint}"
    if t.shape[0] == 0 or t.shape[1] == 0:
        return f"{what} is empty ({t.shape[0]}x{t.shape[1]})"
    return None


def as_batch(inputs, points, patch_size: int, check_values: bool) -> Batch:
    """Frames or images + points -> Batch; points [Q,2] go with a single frame."""
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise ValueError("frames: an empty list")
        ts = [_as_tensor(f) for f in inputs]
        for i, t in enumerate(ts):
            bad = _frame_problem(t, f"frame {i}")
            if bad:
                raise ValueError(bad)
        sizes = sorted({tuple(t.shape[:2]) for t in ts})
        if len(sizes) > 1:
            raise ValueError(f"frames of one batch must share a size, got {', '.join(f'{h}x{w}' for h, w in sizes)} (HxW)")
        return Batch("frames", ts, _points(points, len(ts)))
    t = _as_tensor(inputs)
    if t.dtype == torch.uint8 and t.ndim in (2, 3):
        bad = _frame_problem(t, "frame")
        if bad:
            raise ValueError(bad)
        return Batch("frames", [t], _points(points, 1))
    if t.dtype == torch.uint8 and t.ndim == 4 and t.shape[-1] == 3 and t.shape[1] != 3:
        if t.shape[0] == 0:
            raise ValueError("frames: an empty batch")
        bad = _frame_problem(t[0], "frames")
        if bad:
            raise ValueError(bad)
        return Batch("frames", t, _points(points, t.shape[0]))
    if t.dtype != torch.uint8 and not t.is_floating_point():
        raise ValueError(f"frames must be uint8 [H,W,3] or [B,H,W,3], or images float [B,3,H,W] in [0,1]; got "
                         f"{t.dtype} {list(t.shape)}")
    if t.dtype == torch.uint8:
        raise ValueError(f"uint8 input must be frames [H,W,3] or [B,H,W,3] (HWC), got {list(t.shape)}")
    if t.ndim == 3 and t.shape[-1] == 3:
        raise ValueError(f"float input must be images [B,3,H,W] in [0,1]; a [H,W,3] array must be a uint8 frame "
                         f"(got {t.dtype} {list(t.shape)})")
    images = check_images(t, patch_size, check_values=check_values and t.device.type == "cpu")
    return Batch("images", images, _points(points, images.shape[0]))


def _points(points, batch: int) -> torch.Tensor:
    if batch == 1 and not isinstance(points, torch.Tensor):
        arr = np.asarray(points) if not isinstance(points, np.ndarray) else points
        if arr.ndim == 2 and arr.shape[-1:] == (2,):
            points = arr[None]
    elif isinstance(points, torch.Tensor) and batch == 1 and points.ndim == 2 and points.shape[-1] == 2:
        points = points[None]
    return as_points(points, batch=batch)


def check_color(color: str | None) -> str:
    if color not in COLORS:
        raise ValueError(f"frames need their channel order: color='bgr' (OpenCV, most camera drivers) or 'rgb'; "
                         f"got {color!r}")
    return color
