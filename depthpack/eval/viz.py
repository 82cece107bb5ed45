"""Figures a person would rather look at than read: depth maps, errors at points, the packer's choice.

matplotlib with the Agg backend (no display needed); every function writes one PNG and returns its path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch


def save_figure(fig, path: str | Path, **savefig: Any) -> Path:
    """fig as a PNG at path, written atomically (depthpack.core.files: a full disk or a kill leaves the old
    file or none, never a 0-byte or half PNG), then closed."""
    import io

    from ..core.files import atomic_write_bytes

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", **savefig)
    finally:
        _plt().close(fig)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _hwc(image: torch.Tensor) -> np.ndarray:
    # [3,H,W] float in [0,1] -> [H,W,3] numpy for imshow
    return image.detach().float().cpu().clamp(0, 1).permute(1, 2, 0).numpy()


def depth_figure(path: str | Path, image: torch.Tensor, gt: torch.Tensor, pred_map: torch.Tensor,
                 points: torch.Tensor, point_pred: torch.Tensor, point_gt: torch.Tensor,
                 title: str = "") -> Path:
    """Image | ground truth | dense prediction | queried points colored by relative error.

    image [3,H,W], gt [H,W] (0 = invalid), pred_map [H,W], points [Q,2] (x, y), point_pred/point_gt [Q].
    """
    plt = _plt()
    gt_np = gt.detach().float().cpu().numpy()
    pred_np = pred_map.detach().float().cpu().numpy()
    valid = gt_np > 0
    lo = float(np.percentile(gt_np[valid], 2)) if valid.any() else float(pred_np.min())
    hi = float(np.percentile(gt_np[valid], 98)) if valid.any() else float(pred_np.max())
    fig, ax = plt.subplots(1, 4, figsize=(16, 4.4))
    ax[0].imshow(_hwc(image))
    ax[0].set_title("image")
    ax[1].imshow(np.where(valid, gt_np, np.nan), cmap="turbo", vmin=lo, vmax=hi)
    ax[1].set_title("ground truth (m)")
    im = ax[2].imshow(pred_np, cmap="turbo", vmin=lo, vmax=hi)
    ax[2].set_title("dense prediction (m)")
    fig.colorbar(im, ax=ax[1:3], fraction=0.025)
    ax[3].imshow(_hwc(image), alpha=0.55)
    pts = points.detach().float().cpu().numpy()
    err = (point_pred.detach().float().cpu() - point_gt.detach().float().cpu()).abs() / point_gt.detach().float().cpu().clamp_min(1e-6)
    sc = ax[3].scatter(pts[:, 0] - 0.5, pts[:, 1] - 0.5, c=err.numpy(), cmap="magma_r", vmin=0, vmax=0.5, s=14, edgecolors="k", linewidths=0.3)
    ax[3].set_xlim(-0.5, gt_np.shape[1] - 0.5)
    ax[3].set_ylim(gt_np.shape[0] - 0.5, -0.5)
    ax[3].set_title(f"packed, |rel err| at {len(pts)} points")
    fig.colorbar(sc, ax=ax[3], fraction=0.046)
    for a in ax:
        a.set_xticks([])
        a.set_yticks([])
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def selection_figure(path: str | Path, model, image: torch.Tensor, points: torch.Tensor, bucket: int | None = None) -> Path:
    """The tokens the packer put in the buffer for one image, drawn over it.

    image [3,H,W] in [0,1], points [Q,2]. Queried patches red, their neighbours orange, context
    patches filling leftover capacity blue, unselected patches dimmed; the anchors' thumbnail
    (what the A anchor tokens see) is shown beside it.
    """
    import torch.nn.functional as F
    from matplotlib.patches import Rectangle

    from ..core.packing import bucket_for, patch_of_points, select_tokens

    plt = _plt()
    cfg = model.cfg
    p = cfg.patch_size
    H, W = image.shape[-2:]
    gh, gw = H // p, W // p
    pts = points.detach().float().cpu()[None]
    bucket = bucket or bucket_for(pts.shape[1], cfg.buckets)
    index, _ = select_tokens(pts, bucket, p, (gh, gw))
    queried = set(patch_of_points(pts, p, (gh, gw))[0].tolist())
    qmask = torch.zeros(1, 1, gh, gw)
    qmask.view(-1)[list(queried)] = 1
    near = set(torch.nonzero(F.max_pool2d(qmask, 3, 1, 1).view(-1)).view(-1).tolist()) - queried  # figure only
    fig, ax = plt.subplots(1, 2, figsize=(12, 5.6), gridspec_kw={"width_ratios": [3, 1]})
    ax[0].imshow(_hwc(image))
    shade = np.ones((gh, gw))
    for i in index[0].tolist():
        shade[i // gw, i % gw] = 0
        kind = "red" if i in queried else "orange" if i in near else "deepskyblue"
        ax[0].add_patch(Rectangle(((i % gw) * p - 0.5, (i // gw) * p - 0.5), p, p, fill=False, edgecolor=kind, linewidth=0.8))
    ax[0].imshow(np.kron(shade, np.ones((p, p))), cmap="gray_r", alpha=0.45 * np.kron(shade, np.ones((p, p))), vmin=0, vmax=1)
    ax[0].scatter(pts[0, :, 0] - 0.5, pts[0, :, 1] - 0.5, s=6, c="white", edgecolors="k", linewidths=0.3)
    ax[0].set_xlim(-0.5, W - 0.5)
    ax[0].set_ylim(H - 0.5, -0.5)
    n_ctx = len(index[0]) - len(queried) - len(near & set(index[0].tolist()))
    ax[0].set_title(f"buffer: {len(index[0])} of {gh * gw} patches for {pts.shape[1]} queries "
                    f"(red queried {len(queried)}, orange neighbours, blue context {n_ctx})", fontsize=9)
    g = cfg.anchor_grid
    if g:
        side = g * p
        thumb = F.interpolate(image[None].float().cpu(), size=(side, side), mode="area")[0]
        ax[1].imshow(_hwc(thumb))
        for k in range(1, g):
            ax[1].axhline(k * p - 0.5, color="w", lw=0.5)
            ax[1].axvline(k * p - 0.5, color="w", lw=0.5)
        ax[1].set_title(f"{g * g} anchor tokens: a {side}x{side} thumbnail", fontsize=9)
    else:
        ax[1].set_axis_off()
    for a in ax:
        a.set_xticks([])
        a.set_yticks([])
    path = Path(path)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
