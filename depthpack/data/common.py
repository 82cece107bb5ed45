"""What every data set shares: resizing to the model's size, masks, eval crops, skipping bad files.

Geometry: a native sample (h, w) reaches (H, W) by "resize" (each axis scaled) or "center_crop"
(uniform scale to cover, centered window). Depth and masks are sampled NEAREST at the destination
pixel centers, so a depth value is never blended with an invalid neighbour; the image is resized
as inference does (depthpack.core.preprocess), or with cv2 INTER_AREA (a training option).
"""
from __future__ import annotations

import logging

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from ..core.preprocess import focal_at_size, frames_to_images
from .errors import BadSample  # noqa: F401  (re-exported: its home is errors.py, below every loader)

log = logging.getLogger("depthpack.data")


# ----------------------------------------------------------------------------- geometry
def source_indices(h: int, w: int, size: tuple[int, int], mode: str) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Nearest source row/column of every destination pixel center, and the plan for the image.

    Returns rows [H] int64, cols [W] int64 and (scaled_h, scaled_w, top, left): the image is resized
    to (scaled_h, scaled_w) and the window [top:top+H, left:left+W] is kept.
    """
    H, W = int(size[0]), int(size[1])
    if mode == "resize":
        sh, sw, top, left = H, W, 0, 0
    elif mode == "center_crop":
        s = max(H / h, W / w)
        sh, sw = max(H, int(round(h * s))), max(W, int(round(w * s)))
        top, left = (sh - H) // 2, (sw - W) // 2
    else:
        raise ValueError(f"resize={mode!r} is not one of ('resize', 'center_crop')")
    rows = np.minimum(np.floor((np.arange(H) + top + 0.5) * (h / sh)).astype(np.int64), h - 1)
    cols = np.minimum(np.floor((np.arange(W) + left + 0.5) * (w / sw)).astype(np.int64), w - 1)
    return rows, cols, (sh, sw, top, left)


def resize_image(rgb: np.ndarray, size: tuple[int, int], mode: str = "resize", interp: str = "linear") -> np.ndarray:
    """uint8 or float RGB [h,w,3] -> float32 [H,W,3] in [0,1], by the resize mode. "linear" is the one
    preprocessing of inference (depthpack.core.preprocess.frames_to_images); "area" (cv2 INTER_AREA,
    antialiased when shrinking) is a training-only option."""
    h, w = rgb.shape[:2]
    H, W = int(size[0]), int(size[1])
    _, _, (sh, sw, top, left) = source_indices(h, w, size, mode)
    if interp == "area" and sh * sw < h * w:
        out = cv2.resize(rgb, (sw, sh), interpolation=cv2.INTER_AREA)
        out = out.astype(np.float32) / 255.0 if out.dtype == np.uint8 else out.astype(np.float32)
    else:
        if rgb.dtype == np.uint8:
            frame = torch.from_numpy(np.ascontiguousarray(rgb))
        else:  # float RGB in [0,1]: the same arithmetic on 0..255 values
            frame = torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32) * np.float32(255.0))
        out = frames_to_images(frame[None], (sh, sw), "rgb")[0].permute(1, 2, 0).numpy()
    return np.ascontiguousarray(out[top:top + H, left:left + W], dtype=np.float32)


def resize_nearest(a: np.ndarray, size: tuple[int, int], mode: str = "resize") -> np.ndarray:
    """Depth or mask [h,w] -> [H,W], each output pixel copied from one input pixel (no blending)."""
    h, w = a.shape[:2]
    if (h, w) == tuple(size):
        return a
    rows, cols, _ = source_indices(h, w, size, mode)
    return a[rows[:, None], cols[None, :]]


# ----------------------------------------------------------------------------- crops and masks
def crop_mask(kind: str | None, h: int, w: int) -> np.ndarray:
    """Boolean [h,w] evaluation crop on the native image (all True for None).

    eigen_nyu: rows 45:471, cols 41:601 of 480x640 (as fractions of other sizes);
    garg / eigen_kitti: the fractions of Garg et al. / Eigen et al. used by Monodepth2 and BTS.
    """
    m = np.zeros((h, w), dtype=bool)
    if kind is None:
        m[:] = True
    elif kind == "eigen_nyu":
        m[int(round(45 / 480 * h)):int(round(471 / 480 * h)), int(round(41 / 640 * w)):int(round(601 / 640 * w))] = True
    elif kind == "garg":
        m[int(0.40810811 * h):int(0.99189189 * h), int(0.03594771 * w):int(0.96405229 * w)] = True
    elif kind == "eigen_kitti":
        m[int(0.3324324 * h):int(0.91351351 * h), int(0.0359477 * w):int(0.96405229 * w)] = True
    else:
        raise ValueError(f"eval_crop={kind!r} is not one of (None, 'eigen_nyu', 'garg', 'eigen_kitti')")
    return m


def valid_mask(depth: np.ndarray, min_depth: float, max_depth: float) -> np.ndarray:
    """finite, > 0 and inside [min_depth, max_depth]."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(depth) & (depth > 0) & (depth >= min_depth) & (depth <= max_depth)


def make_sample(rgb: np.ndarray, depth: np.ndarray, size: tuple[int, int], cfg, min_depth: float,
                max_depth: float, name: str, path="", focal: tuple[float, float] | None = None,
                thin: np.ndarray | None = None) -> dict:
    """Native RGB [h,w,3] (uint8 or float in [0,1]) + depth [h,w] meters -> the sample dict at size.

    The RGB and depth may differ in size (then each is mapped to `size` on its own); the eval crop
    is defined on the depth's native grid and resized with it. focal: (fx, fy) in pixels of the
    native RGB, or None (unknown) -> sample["focal"], float32 pixels at size (0.0 = unknown). thin: the thin
    band on the depth's grid (synthetic scenes) -> sample["thin"] [H,W] bool at size, inside the valid pixels.
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise BadSample(path, f"image has shape {rgb.shape}, expected [h,w,3]")
    if depth.ndim != 2:
        raise BadSample(path, f"depth has shape {depth.shape}, expected [h,w]")
    img = resize_image(rgb, size, cfg.resize, cfg.image_interp)  # float32 [H,W,3] in [0,1]
    d = resize_nearest(depth.astype(np.float32, copy=False), size, cfg.resize)
    crop = resize_nearest(crop_mask(cfg.eval_crop, *depth.shape), size, cfg.resize)
    valid = valid_mask(d, min_depth, max_depth)
    if not valid.any():
        raise BadSample(path, f"no valid depth in [{min_depth}, {max_depth}] m")
    d = np.where(valid, d, np.float32(0.0))
    f = 0.0
    if focal is not None:
        _, _, (sh, sw, _, _) = source_indices(rgb.shape[0], rgb.shape[1], size, cfg.resize)
        f = focal_at_size(focal[0], focal[1], rgb.shape[:2], (sh, sw))
    out = dict(image=torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))),
               focal=torch.tensor(f, dtype=torch.float32),
               depth=torch.from_numpy(np.ascontiguousarray(d)),
               valid=torch.from_numpy(np.ascontiguousarray(valid)),
               eval_mask=torch.from_numpy(np.ascontiguousarray(valid & crop)),
               name=str(name))
    if thin is not None:
        out["thin"] = torch.from_numpy(np.ascontiguousarray(resize_nearest(thin, size, cfg.resize) & valid))
    return out


# ----------------------------------------------------------------------------- skipping
class SkippingDataset(Dataset):
    """Base: dataset[i] loads sample i; a bad one is logged with its path, counted and skipped.

    `skipped` counts the distinct bad samples met so far in this process (each DataLoader worker
    keeps its own count). dataset[i] returns the next working sample after i (wrapping around);
    when every sample fails, ValueError.
    """

    def __init__(self, size: tuple[int, int], min_depth: float, max_depth: float, cfg):
        if not 0 < min_depth < max_depth:
            raise ValueError(f"need 0 < min_depth < max_depth, got {min_depth}, {max_depth}")
        self.size = (int(size[0]), int(size[1]))
        self.min_depth, self.max_depth = float(min_depth), float(max_depth)
        self.cfg = cfg
        self.skipped = 0
        self._bad: set[int] = set()

    def __len__(self) -> int:
        raise NotImplementedError

    def load(self, i: int) -> dict:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__

    def __getitem__(self, i: int) -> dict:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} samples")
        i %= n
        for k in range(n):
            j = (i + k) % n
            if j in self._bad:
                continue
            try:
                return self.load(j)
            except (BadSample, OSError, EOFError) as e:
                self._bad.add(j)
                self.skipped = len(self._bad)
                path = getattr(e, "path", None) or getattr(e, "filename", None) or "?"
                log.warning("skipping bad sample %d (%s): %s [%d skipped so far in %s]", j, path, e,
                            self.skipped, self.describe())
        raise ValueError(f"{self.describe()}: no valid sample: all {n} failed to load (see the warnings above)")

    def check_nonempty(self) -> None:
        """ValueError now (at construction) if the data set is empty or no sample can be loaded."""
        if len(self) == 0:
            raise ValueError(f"{self.describe()}: no sample found")
        self[0]


def split_range(n: int, split: str, num_val: int) -> range:
    """Deterministic split of n items without a split file: val = the last min(num_val, n // 2)."""
    v = min(num_val, n // 2)
    if split == "train":
        return range(0, n - v)
    if split == "val":
        return range(n - v, n)
    if split == "all":
        return range(n)
    raise ValueError(f"split={split!r} is not one of ('train', 'val', 'all')")

