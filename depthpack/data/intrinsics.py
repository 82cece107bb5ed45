"""Camera focal lengths of the data sets, in pixels of the native files: (fx, fy), or None if unknown.

Where they come from (DataConfig.focal and DataConfig.intrinsics override all of them):
- NYU Depth v2 (kind nyu, nyu_mat): the published Kinect RGB intrinsics, fx 518.8579, fy 519.46961
  at 640x480 (the NYU toolbox's camera_params.m).
- KITTI (kind kitti): per image, from the calibration the data set ships beside it:
  the depth benchmark's val_selection_cropped/intrinsics/NAME.txt (3x3 K), the object-style
  calib/NAME.txt (line "P2: ..." for image_2, "P3:" for image_3), or the raw layout's
  DATE/calib_cam_to_cam.txt found above the image (P_rect_02 / P_rect_03 by the image_0X folder).
  None when none is there (e.g. a bare rgb/ + depth/ folder).
- generic folder (kind folder): DataConfig.intrinsics, else ROOT/intrinsics.txt or
  ROOT/camera-intrinsics.txt (7-Scenes ships the latter: fx = fy = 585 at 640x480), else None.
An intrinsics file holds 9 numbers (3x3 K, row-major), 12 (3x4 P) or 4 (fx fy cx cy).
The model sees sqrt(fx' fy') after the resize to its size (depthpack.core.preprocess.focal_at_size).
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

NYU_FOCAL = (518.8579, 519.46961)  # NYU Depth v2 RGB camera at 640x480 (fx, fy)
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def read_intrinsics_file(path) -> tuple[float, float]:
    """(fx, fy) from a text file of 9 (K), 12 (P) or 4 (fx fy cx cy) numbers; ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"intrinsics {path}: no such file")
    vals = [float(v) for v in _NUM.findall(path.read_text())]
    if len(vals) == 9:
        fx, fy = vals[0], vals[4]
    elif len(vals) == 12:
        fx, fy = vals[0], vals[5]
    elif len(vals) == 4:
        fx, fy = vals[0], vals[1]
    else:
        raise ValueError(f"intrinsics {path}: expected 9 (3x3 K), 12 (3x4 P) or 4 (fx fy cx cy) numbers, "
                         f"found {len(vals)}")
    if not (fx > 0 and fy > 0):
        raise ValueError(f"intrinsics {path}: focal lengths must be > 0, got fx={fx}, fy={fy}")
    return fx, fy


@lru_cache(maxsize=256)
def read_kitti_calib(path: str, key: str) -> tuple[float, float]:
    """(fx, fy) of projection matrix `key` (P2, P_rect_02, ...) in a KITTI calib text file."""
    for line in Path(path).read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == key:
            vals = [float(v) for v in _NUM.findall(rest)]
            if len(vals) != 12:
                raise ValueError(f"KITTI calib {path}: {key} has {len(vals)} numbers, expected 12 (3x4)")
            return vals[0], vals[5]
    raise ValueError(f"KITTI calib {path}: no {key} line")


def kitti_focal(rgb_path) -> tuple[float, float] | None:
    """The focal of a KITTI image from the calibration shipped with it (module docstring), or None."""
    p = Path(rgb_path)
    cam = next((part[-1] for part in p.parts if re.fullmatch(r"image_0?[23]", part)), None)
    k = p.parent.parent / "intrinsics" / (p.stem + ".txt")  # val_selection_cropped
    if k.is_file():
        return read_intrinsics_file(k)
    c = p.parent.parent / "calib" / (p.stem + ".txt")  # object / odometry style
    if c.is_file():
        return read_kitti_calib(str(c), f"P{cam or '2'}")
    for parent in p.parents:  # raw: DATE/calib_cam_to_cam.txt above DATE/DRIVE/image_02/data/NAME.png
        f = parent / "calib_cam_to_cam.txt"
        if f.is_file():
            return read_kitti_calib(str(f), f"P_rect_0{cam or '2'}")
    return None


def folder_focal(root) -> tuple[float, float] | None:
    """ROOT/intrinsics.txt or ROOT/camera-intrinsics.txt (7-Scenes), or None."""
    for name in ("intrinsics.txt", "camera-intrinsics.txt"):
        f = Path(root) / name
        if f.is_file():
            return read_intrinsics_file(f)
    return None


def dataset_focal(cfg) -> tuple[float, float] | None:
    """One focal for every sample of the data set, where the config or the data set fixes it; None
    means per sample (KITTI) or unknown."""
    if cfg.focal is not None:
        return float(cfg.focal), float(cfg.focal)
    if cfg.intrinsics:
        return read_intrinsics_file(cfg.intrinsics)
    if cfg.kind in ("nyu", "nyu_mat"):
        return NYU_FOCAL
    if cfg.kind == "folder" and cfg.root:
        return folder_focal(cfg.root)
    return None
