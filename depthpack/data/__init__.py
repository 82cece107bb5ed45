"""Data: synthetic scenes, NYU Depth v2, KITTI and generic folders; query sampling; folder writer.

    ds = make_dataset(DataConfig(kind="synthetic"), "train", (224, 224), 0.1, 20.0)
    s = ds[0]   # image [3,H,W], depth [H,W] m (0 invalid), valid, eval_mask [H,W] bool, name
    pts = sample_queries(s["valid"], s["image"], 256, torch.Generator().manual_seed(0))  # [256,2] (x, y)
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

from .common import BadSample, SkippingDataset, crop_mask, make_sample, split_range, valid_mask
from .config import DataConfig
from .datasets import NyuMatDataset, PairsDataset, SyntheticDataset, list_pairs, open_nyu_mat, read_split_file
from .formats import decode_uint16, encode_uint16, read_depth, read_pfm, read_rgb
from .queries import sample_queries, sobel_magnitude
from .synthetic import render

__all__ = ["DataConfig", "make_dataset", "sample_queries", "write_folder_sample", "render", "BadSample",
           "SkippingDataset", "SyntheticDataset", "PairsDataset", "NyuMatDataset", "crop_mask", "valid_mask", "make_sample",
           "read_depth", "read_rgb", "read_pfm", "decode_uint16", "encode_uint16", "sobel_magnitude"]

LABELS = {"nyu": "NYU Depth v2 folder", "kitti": "KITTI depth", "folder": "depth folder"}


def make_dataset(cfg: DataConfig, split: str, img_size: tuple[int, int], min_depth: float,
                 max_depth: float) -> torch.utils.data.Dataset:
    """The data set cfg describes, split "train" | "val" (| "all" for file-based kinds), at img_size (H, W).

    File-based data sets load their first sample at once, so an empty or unreadable data set is a
    ValueError here rather than in the middle of training.
    """
    if isinstance(img_size, int):
        img_size = (img_size, img_size)
    img_size = (int(img_size[0]), int(img_size[1]))
    if split not in ("train", "val", "all"):
        raise ValueError(f"split={split!r} is not one of ('train', 'val', 'all')")
    if cfg.kind == "synthetic":
        return SyntheticDataset(cfg, "train" if split == "all" else split, img_size, min_depth, max_depth)
    listfile = (cfg.val_split_file or cfg.split_file) if split == "val" else cfg.split_file
    if cfg.kind == "nyu_mat":
        with open_nyu_mat(cfg.root) as f:
            n = int(f["images"].shape[0])
        indices = read_indices(listfile, n) if listfile else list(split_range(n, split, cfg.num_val))
        ds = NyuMatDataset(Path(cfg.root), indices, cfg, img_size, min_depth, max_depth)
    else:
        if listfile:
            pairs, names = read_split_file(listfile, Path(cfg.root), Path(cfg.depth_root or cfg.root))
        else:
            pairs, names = list_pairs(_without_split(cfg))
            keep = split_range(len(pairs), split, cfg.num_val)
            pairs, names = [pairs[i] for i in keep], [names[i] for i in keep]
        ds = PairsDataset(pairs, names, cfg, img_size, min_depth, max_depth, f"{LABELS[cfg.kind]} {cfg.root} [{split}]")
    ds.check_nonempty()
    return ds


def _without_split(cfg: DataConfig) -> DataConfig:
    import dataclasses
    return dataclasses.replace(cfg, split_file=None)


def read_indices(path, n: int) -> list[int]:
    """0-based image indices, one per line ('#' comments allowed); each must be < n."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"split_file {path}: no such file")
    out = []
    for k, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            i = int(line)
        except ValueError:
            raise ValueError(f"split_file {path}:{k}: expected a 0-based image index, got {line!r}") from None
        if not 0 <= i < n:
            raise ValueError(f"split_file {path}:{k}: index {i} outside the file's {n} images")
        out.append(i)
    return out


def write_folder_sample(sample: dict, root: str, name: str, depth_scale: float = 1000.0) -> tuple[Path, Path]:
    """Write root/rgb/NAME.png (8-bit RGB) and root/depth/NAME.png (uint16 = round(meters * depth_scale),
    0 = invalid) in the generic folder format; DataConfig(kind="folder", root=root, depth_scale=...)
    reads them back. ValueError if a depth does not fit in uint16 at that scale."""
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
