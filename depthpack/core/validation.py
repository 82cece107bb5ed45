"""Input checks on the host: one clear ValueError that names what is wrong and how many offend.

These run outside the static graph (they read values); the graph itself assumes checked inputs.
"""
from __future__ import annotations

import numpy as np
import torch


def as_points(points, batch: int | None = None) -> torch.Tensor:
    """Array-like [B,Q,2] (x, y) pixels -> float32 tensor; integer points are accepted."""
    if not isinstance(points, torch.Tensor):
        try:
            points = torch.as_tensor(np.asarray(points))
        except (TypeError, ValueError) as e:
            raise ValueError(f"points must be a numeric array of shape [B,Q,2], could not convert: {e}") from None
    if points.dtype == torch.bool or points.is_complex():
        raise ValueError(f"points must be real numbers (float or int), got dtype {points.dtype}")
    if points.ndim != 3 or points.shape[-1] != 2:
        raise ValueError(f"points must have shape [B,Q,2] as (x, y) pixels, got {tuple(points.shape)}")
    if batch is not None and points.shape[0] != batch:
        raise ValueError(f"batch mismatch: {batch} images but points for {points.shape[0]}")
    return points if points.dtype == torch.float32 else points.to(torch.float32)


def check_images(images, patch_size: int, check_values: bool = True) -> torch.Tensor:
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"images must be a torch.Tensor [B,3,H,W], got {type(images).__name__}")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must have shape [B,3,H,W] (RGB), got {tuple(images.shape)}")
    if not images.is_floating_point():
        hint = " (divide uint8 images by 255)" if images.dtype == torch.uint8 else ""
        raise ValueError(f"images must be float RGB in [0,1], got dtype {images.dtype}{hint}")
    H, W = images.shape[-2:]
    if H % patch_size or W % patch_size or H == 0 or W == 0:
        raise ValueError(f"image size {H}x{W} is not a positive multiple of the patch size {patch_size}")
    if check_values and images.numel():
        bad = ~torch.isfinite(images)
        n_bad = int(bad.sum())
        if n_bad:
            raise ValueError(f"images hold {n_bad} non-finite values (NaN or inf)")
        lo, hi = float(images.min()), float(images.max())
        if lo < 0.0 or hi > 1.0:
            n_out = int(((images < 0) | (images > 1)).sum())
            raise ValueError(f"images must be RGB in [0,1]: {n_out} values outside (min {lo:.4g}, max {hi:.4g})")
    return images


def check_points_in_image(points: torch.Tensor, height: int, width: int) -> None:
    """0 <= x < W and 0 <= y < H, finite. Reads values (host sync if on a device)."""
    if points.numel() == 0:
        return
    p = points.detach().cpu()
    finite = torch.isfinite(p).all(-1)
    total = p.shape[0] * p.shape[1]
    n_nonfinite = int((~finite).sum())
    if n_nonfinite:
        b, q = np.argwhere(~finite.numpy())[0]
        raise ValueError(f"points: {n_nonfinite} of {total} are not finite (NaN or inf); first at [{b}, {q}]")
    x, y = p[..., 0], p[..., 1]
    outside = (x < 0) | (x >= width) | (y < 0) | (y >= height)
    n_out = int(outside.sum())
    if n_out:
        b, q = np.argwhere(outside.numpy())[0]
        raise ValueError(
            f"points: {n_out} of {total} are outside the {width}x{height} image "
            f"(need 0 <= x < {width}, 0 <= y < {height}); first (x={float(x[b, q]):g}, y={float(y[b, q]):g}) at [{b}, {q}]")


def check_focal(focal, batch: int, device=None) -> torch.Tensor | None:
    """None, a number, or [B] / [] focal lengths in pixels -> float32 [B] on device (None stays None).
    Each must be finite and >= 0 (0 = unknown: the model's default)."""
    if focal is None:
        return None
    if not isinstance(focal, torch.Tensor):
        try:
            focal = torch.as_tensor(np.asarray(focal, dtype=np.float64))
        except (TypeError, ValueError) as e:
            raise ValueError(f"focal must be a number or [B] numbers (pixels), could not convert: {e}") from None
    if focal.dtype == torch.bool or focal.is_complex() or not (focal.is_floating_point() or focal.dtype in (
            torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)):
        raise ValueError(f"focal must be real numbers (pixels), got dtype {focal.dtype}")
    if focal.ndim == 0:
        focal = focal.reshape(1).expand(batch)
    if focal.ndim != 1 or focal.shape[0] != batch:
        raise ValueError(f"focal must be a number or shape [B] = [{batch}], got {tuple(focal.shape)}")
    f = focal.detach().to("cpu", torch.float64)
    bad = ~torch.isfinite(f) | (f < 0)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"focal: {int(bad.sum())} of {batch} are not finite and >= 0 pixels "
                         f"(0 = unknown); first {float(f[i])!r} at [{i}]")
    return focal.to(device=device, dtype=torch.float32).contiguous()


def check_inputs(images, points, patch_size: int, check_values: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes, dtypes, batch and range of images [B,3,H,W] and points [B,Q,2]; returns float points."""
    images = check_images(images, patch_size, check_values)
    points = as_points(points, batch=images.shape[0])
    if check_values:
        check_points_in_image(points, images.shape[-2], images.shape[-1])
    return images, points.to(images.device)
