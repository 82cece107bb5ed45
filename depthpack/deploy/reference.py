"""The reference an export ships: an image at a size the model does not run at (so resizing and point
scaling are exercised), points past the largest bucket (so chunking and padding are exercised), and
the eager depths at them; every runner (the Python loader, the C++ runner) is held to it."""
from __future__ import annotations

import csv
from pathlib import Path

import cv2
import numpy as np
import torch

from ..core.files import atomic_write_bytes, sha256_file
from ..core.model import DepthPack
from ..core.packing import chunk_plan, pad_points, run_chunked
from ..core.preprocess import load_image, read_rgb, scale_points
from .contract import REFERENCE, REFERENCE_IMAGE, REFERENCE_POINTS


def reference_image(h0: int, w0: int, seed: int) -> np.ndarray:
    """uint8 RGB [h0,w0,3]: a rendered synthetic scene when depthpack.data has the renderer, else a
    procedural pattern (sky gradient, checkered floor, discs) with edges at every scale."""
    try:
        from ..data.synthetic import render
        img = render(seed, 0, (h0, w0), scene="outdoor", split="test")["image"]
        return np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)
    except Exception:  # noqa: BLE001 - no renderer (or a broken one): the procedural pattern will do
        pass
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h0, 0:w0].astype(np.float32)
    img = np.stack([0.3 + 0.4 * y / h0, 0.5 + 0.3 * y / h0, np.full_like(y, 0.9)], -1)
    horizon = 0.45 * h0
    floor = y > horizon
    depth = 1.0 / np.maximum(y - horizon, 1.0)
    check = ((np.floor((x - w0 / 2) * depth * 2) + np.floor(depth * 200)) % 2).astype(np.float32)
    img[floor] = (0.25 + 0.5 * check[floor])[:, None] * np.array([0.9, 0.7, 0.5])
    for _ in range(6):
        cy, cx, r = rng.uniform(0.2, 0.9) * h0, rng.uniform(0, 1) * w0, rng.uniform(0.05, 0.15) * min(h0, w0)
        img[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0.1, 0.95, 3)
    return np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)


def reference_points(q: int, h0: int, w0: int, seed: int) -> np.ndarray:
    """[Q,2] (x, y) on a quarter-pixel grid inside the original image: exact in decimal text and in
    float32, so the CSV and the tensor hold the same numbers. A few duplicates on purpose."""
    rng = np.random.default_rng(seed + 1)
    pts = np.stack([rng.integers(0, 4 * w0, q), rng.integers(0, 4 * h0, q)], -1).astype(np.float32) / 4
    if q > 6:
        pts[5] = pts[2]
    return pts


def write_points_csv(path: Path, pts: np.ndarray) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["x", "y"])
        w.writerows([repr(float(x)), repr(float(y))] for x, y in pts)


def write_reference(model: DepthPack, buckets, out: Path, batch: int, seed: int, device, frame: dict | None = None) -> dict:
    """reference.png, reference_points.csv (Q = largest bucket + 3, so chunking and padding are
    exercised) and reference.safetensors: the packages' inputs by name, and the eager depth.

    Image packages: the PNG is 1.5x / 1.25x the model size (resizing and point scaling are exercised),
    "images" = preprocess(reference.png), "points" scaled to the model's pixels. Frame packages: the
    PNG is a frame of the packages' size, "frames" its uint8 pixels in their channel order, "points"
    the CSV's, and the depth is the package's own function (preprocessing included) run eagerly.
    A model with a focal input: "focal" [B], 1.25x the manifest's default (pixels of the packages'
    input), so a runner that dropped or misscaled it fails the check. A model with a glance depth: "map",
    the glance's map of the first chunk's buffer (the points of the first bucket of the chunk plan)."""
    from safetensors.torch import save

    from .package import PackedForward, manifest_focal

    H, W = model.cfg.img_size
    h0, w0 = tuple(frame["size"]) if frame else ((3 * H) // 2, (5 * W) // 4)
    rgb = reference_image(h0, w0, seed)
    if not cv2.imwrite(str(out / REFERENCE_IMAGE), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
        raise OSError(f"could not write {out / REFERENCE_IMAGE}")
    q = buckets[-1] + 3
    pts0 = reference_points(q, h0, w0, seed)
    write_points_csv(out / REFERENCE_POINTS, pts0)
    if frame:
        pixels = read_rgb(out / REFERENCE_IMAGE)  # what a runner decodes from the PNG
        pixels = pixels[..., ::-1] if frame["color"] == "bgr" else pixels
        inputs = torch.from_numpy(pixels.copy())[None].repeat(batch, 1, 1, 1).contiguous()  # [B,h,w,3] uint8
        pts = torch.from_numpy(pts0)
        name = "frames"
    else:
        image, orig = load_image(out / REFERENCE_IMAGE, (H, W))  # [3,H,W], exactly what runners compute
        assert tuple(orig) == (h0, w0)
        inputs = image.unsqueeze(0).repeat(batch, 1, 1, 1).contiguous()  # [B,3,H,W]
        pts = scale_points(pts0, (h0, w0), (H, W))  # [Q,2] model pixels
        name = "images"
    points = torch.stack([pts.roll(b, 0) for b in range(batch)]).contiguous()  # [B,Q,2], row 0 = CSV order
    tensors = {name: inputs, "points": points}
    if model.cfg.uses_focal:
        tensors["focal"] = torch.full((batch,), 1.25 * manifest_focal(model.cfg, frame)["default"], dtype=torch.float32)
    extra = (tensors["focal"].to(device),) if "focal" in tensors else ()
    with torch.no_grad():
        def fn(x, p, k, *f):
            out = PackedForward(model, k, frame)(x, p, *f)
            return out[0] if isinstance(out, tuple) else out
        depth = run_chunked(fn, inputs.to(device), points.to(device), tuple(buckets), *extra).float().cpu()
        tensors["depth"] = depth.contiguous()
        if model.cfg.glance_depth:
            k0 = chunk_plan(q, tuple(buckets))[0][2]
            first = pad_points(points[:, :k0].to(device), k0)
            tensors["map"] = PackedForward(model, k0, frame)(inputs.to(device), first, *extra)[1].float().cpu().contiguous()
    # through atomic_write_bytes: the umask's mode like every file of the export (save_file makes 0600)
    atomic_write_bytes(out / REFERENCE, save(tensors))
    return {"file": REFERENCE, "sha256": sha256_file(out / REFERENCE), "image": REFERENCE_IMAGE,
            "points_csv": REFERENCE_POINTS}
