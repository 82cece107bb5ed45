"""Query points: valid pixels, a mix of uniform and edge sampling; the depth-edge band.

Image edges are the Sobel gradient magnitude of the image's luminance (what the model also has at
inference). The depth-edge band is where resolution decides: the pixels within `radius` pixels
(a square: Chebyshev distance) of a ground-truth depth discontinuity, which is a pair of 4-neighbours,
both valid, whose depths differ by a ratio above `threshold` (Depth Pro's boundary definition).
The thin band is where the scene's thin structures and small objects are thin in the image: the pixels of
those objects (the renderer's mask) in parts at most `max_px` pixels across, which a max_px+1 square
cannot cover inside the mask (a morphological opening); a pole close to the camera, 20 px wide, is not in it.
Points are integer pixel coordinates (x = column, y = row) as float32, the convention of
DepthPack.depth_map: point (x, y) refers to pixel (floor(x), floor(y)).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_LUMA = torch.tensor([0.299, 0.587, 0.114])
_SOBEL = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])


def sobel_magnitude(image: torch.Tensor) -> torch.Tensor:
    """image [3,H,W] (or a batch [B,3,H,W]) in [0,1] -> gradient magnitude of its luminance [H,W]
    ([B,H,W]), replicate borders."""
    x = image.float() if image.ndim == 4 else image.float()[None]
    gray = (x * _LUMA.to(image.device).view(1, 3, 1, 1)).sum(1, keepdim=True)  # [B,1,H,W]
    k = torch.stack([_SOBEL, _SOBEL.t()])[:, None].to(image.device)  # [2,1,3,3]
    g = F.conv2d(F.pad(gray, (1, 1, 1, 1), mode="replicate"), k)  # [B,2,H,W]
    mag = g.square().sum(1).sqrt()
    return mag if image.ndim == 4 else mag[0]


EDGE_THRESHOLD = 1.1  # a neighbour depth ratio above this is a discontinuity


def check_band(radius: int, threshold: float) -> None:
    """One ValueError naming a band radius or threshold out of range."""
    if isinstance(radius, bool) or not isinstance(radius, int) or not 0 <= radius <= 4096:
        raise ValueError(f"edge band radius must be a whole number of pixels in [0, 4096], got {radius!r}")
    if not (isinstance(threshold, (int, float)) and 1.0 < threshold <= 100.0):
        raise ValueError(f"edge band threshold must be a depth ratio in (1, 100], got {threshold!r}")


def depth_discontinuities(depth: torch.Tensor, valid: torch.Tensor, threshold: float = EDGE_THRESHOLD) -> torch.Tensor:
    """depth, valid [...,H,W] -> bool [...,H,W]: both pixels of every 4-neighbour pair, both valid, whose
    depths differ by a ratio above threshold."""
    d = torch.where(valid, depth.float(), torch.ones((), device=depth.device))
    out = torch.zeros_like(valid)
    for dim in (-1, -2):
        n = d.shape[dim]
        a, b = d.narrow(dim, 0, n - 1), d.narrow(dim, 1, n - 1)
        both = valid.narrow(dim, 0, n - 1) & valid.narrow(dim, 1, n - 1)
        jump = both & ((a > threshold * b) | (b > threshold * a))
        out.narrow(dim, 0, n - 1).logical_or_(jump)
        out.narrow(dim, 1, n - 1).logical_or_(jump)
    return out


def edge_band(depth: torch.Tensor, valid: torch.Tensor, radius: int, threshold: float = EDGE_THRESHOLD) -> torch.Tensor:
    """depth, valid [...,H,W] -> bool [...,H,W]: the valid pixels within `radius` pixels (Chebyshev) of a
    depth discontinuity (depth_discontinuities)."""
    check_band(radius, threshold)
    edges = depth_discontinuities(depth, valid, threshold)
    if radius:
        shape = edges.shape
        x = edges.reshape(-1, 1, *shape[-2:]).float()
        edges = F.max_pool2d(x, 2 * radius + 1, stride=1, padding=radius).reshape(shape) > 0
    return edges & valid


THIN_MAX_PX = 4  # the thin band: parts of thin structures and small objects at most this many pixels across


def check_thin_width(max_px: int) -> None:
    """One ValueError naming a thin band width out of range."""
    if isinstance(max_px, bool) or not isinstance(max_px, int) or not 1 <= max_px <= 4096:
        raise ValueError(f"thin band width must be a whole number of pixels in [1, 4096], got {max_px!r}")


def thin_band(thin: torch.Tensor, max_px: int = THIN_MAX_PX) -> torch.Tensor:
    """thin [...,H,W] bool (the pixels of thin structures and small objects) -> bool [...,H,W]: those pixels
    that no (max_px+1)-square inside the mask covers, the parts at most max_px pixels across. Outside the image
    counts as inside the mask, so a pole cut by the border is judged by its own width."""
    check_thin_width(max_px)
    shape = thin.shape
    x = thin.reshape(-1, 1, *shape[-2:]).float()
    k = max_px + 1
    pad = (k // 2, k - 1 - k // 2, k // 2, k - 1 - k // 2)  # an even square too: the same window both ways
    eroded = -F.max_pool2d(F.pad(-x, pad, value=float("-inf")), k, stride=1)  # the squares' corners inside the mask
    opened = F.max_pool2d(F.pad(eroded, pad[::-1], value=0.0), k, stride=1)  # the pixels those squares cover
    return thin & (opened.reshape(shape) < 0.5)


def sample_queries(valid: torch.Tensor, image: torch.Tensor, q: int, generator: torch.Generator,
                   edge_frac: float = 0.5, band: torch.Tensor | None = None) -> torch.Tensor:
    """q points among the valid pixels: float32 [q,2] (x, y), integer-valued.

    round(q * edge_frac) points are drawn at edges: uniformly inside `band` (a bool [H,W], the depth-edge
    band) when it is given and holds a valid pixel, else with probability proportional to the Sobel
    magnitude of the image (plus a tiny floor, so flat images still work); the rest uniformly; the two
    parts are shuffled together. Without replacement when there are at least as many valid pixels as
    a part needs, with replacement otherwise.
    """
    if valid.ndim != 2 or valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool tensor [H,W], got {tuple(valid.shape)} {valid.dtype}")
    if image.ndim != 3 or image.shape[0] != 3 or image.shape[1:] != valid.shape:
        raise ValueError(f"image must be [3,H,W] matching valid {tuple(valid.shape)}, got {tuple(image.shape)}")
    if q < 1 or not 0.0 <= edge_frac <= 1.0:
        raise ValueError(f"need q >= 1 and 0 <= edge_frac <= 1, got q={q}, edge_frac={edge_frac}")
    H, W = valid.shape
    vflat = valid.reshape(-1).float()
    nvalid = int(vflat.sum())
    if nvalid == 0:
        raise ValueError("no valid pixel to sample query points from")
    n_edge = int(round(q * edge_frac))
    n_uni = q - n_edge
    parts = []
    if n_uni:
        parts.append(torch.multinomial(vflat.cpu(), n_uni, replacement=n_uni > nvalid, generator=generator))
    inband = None if band is None else (band.reshape(-1) & valid.reshape(-1)).float().cpu()
    if n_edge and inband is not None and inband.sum() > 0:
        parts.append(torch.multinomial(inband, n_edge, replacement=n_edge > int(inband.sum()), generator=generator))
    elif n_edge:
        mag = sobel_magnitude(image).reshape(-1).cpu()
        w = (mag + 1e-6 * (1.0 + mag.max())) * vflat.cpu()
        parts.append(torch.multinomial(w, n_edge, replacement=n_edge > nvalid, generator=generator))
    idx = torch.cat(parts)
    idx = idx[torch.randperm(q, generator=generator)]
    return torch.stack([idx % W, idx // W], dim=1).float().to(valid.device)
