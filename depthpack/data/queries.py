"""Training query points: valid pixels, a mix of uniform and image-edge-weighted sampling.

Edges are the Sobel gradient magnitude of the image's luminance: image edges are what the model
also has at inference (depth discontinuities are only known in training), and depth edges mostly
coincide with them. Points are integer pixel coordinates (x = column, y = row) as float32, the
convention of DepthPack.depth_map: point (x, y) refers to pixel (floor(x), floor(y)).
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


def sample_queries(valid: torch.Tensor, image: torch.Tensor, q: int, generator: torch.Generator,
                   edge_frac: float = 0.5) -> torch.Tensor:
    """q points among the valid pixels: float32 [q,2] (x, y), integer-valued.

    round(q * edge_frac) points are drawn with probability proportional to the Sobel magnitude of the
    image (plus a tiny floor, so flat images still work), the rest uniformly; the two parts are
    shuffled together. Without replacement when there are at least as many valid pixels as a part
    needs, with replacement otherwise.
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
    if n_edge:
        mag = sobel_magnitude(image).reshape(-1).cpu()
        w = (mag + 1e-6 * (1.0 + mag.max())) * vflat.cpu()
        parts.append(torch.multinomial(w, n_edge, replacement=n_edge > nvalid, generator=generator))
    idx = torch.cat(parts)
    idx = idx[torch.randperm(q, generator=generator)]
    return torch.stack([idx % W, idx // W], dim=1).float().to(valid.device)
