"""Training losses: SiLogLoss (Depth-Anything-V2's, in fixed-shape form) and PackedObjective, what a
training step minimises: the loss of the packed path at the queried points, as the model runs at inference."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.model import DepthPack
from ..core.packing import patch_of_points


class SiLogLoss(nn.Module):
    """Scale-invariant log loss: sqrt(mean(g^2) - lambd * mean(g)^2), g = log(target) - log(pred).

    Equal to Depth-Anything-V2's SiLogLoss (pooled over every valid element of the batch), but with
    masked sums instead of boolean indexing, so the shape never depends on the data (compile-friendly)
    and it works on any shape: [B,Q] at queried points or [B,H,W] maps. Invalid elements (mask False)
    contribute nothing and receive no gradient, whatever their values (0, NaN, inf).
    With no valid element the loss is 0 (still attached to the graph).
    """

    def __init__(self, lambd: float = 0.5):
        super().__init__()
        if not 0.0 <= lambd <= 1.0:
            raise ValueError(f"lambd must be in [0, 1], got {lambd}")
        self.lambd = lambd

    def forward(self, pred: torch.Tensor, target: torch.Tensor, valid_mask: torch.Tensor) -> torch.Tensor:
        if pred.shape != target.shape or pred.shape != valid_mask.shape:
            raise ValueError(f"pred {tuple(pred.shape)}, target {tuple(target.shape)} and valid_mask "
                             f"{tuple(valid_mask.shape)} must have the same shape")
        m = valid_mask.detach().bool()
        one = torch.ones((), dtype=torch.float32, device=pred.device)
        p = torch.where(m, pred.float(), one)  # placeholders keep log finite where masked
        t = torch.where(m, target.float(), one)
        g = torch.where(m, torch.log(t) - torch.log(p), torch.zeros_like(p))
        n = m.sum().clamp_min(1).float()
        mean = g.sum() / n
        var = g.square().sum() / n - self.lambd * mean.square()
        return torch.sqrt(var.clamp_min(1e-12)) * (m.any().float())


class PackedObjective(nn.Module):
    """SILog of the packed path (dense=True: the dense path) at the queried points, plus, for a model with a
    glance depth, glance_weight x SILog of the glance's depth map over the glance image's valid pixels.
    One module, so DDP sees every parameter its forward uses.

    forward(...) -> (loss, terms): terms are the loss's parts by name, detached scalars; each becomes a
    column of log.csv (in this order), so a new term is one more entry.
    """

    def __init__(self, model: DepthPack, silog_lambda: float, glance_weight: float = 1.0):
        super().__init__()
        self.model, self.glance_weight = model, glance_weight
        self.silog = SiLogLoss(lambd=silog_lambda)

    def forward(self, images: torch.Tensor, points: torch.Tensor, target: torch.Tensor, valid: torch.Tensor,
                bucket: int, extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                focal: torch.Tensor | None = None, glance: tuple[torch.Tensor, torch.Tensor] | None = None,
                dense: bool = False, size: tuple[int, int] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # images [B,3,H,W], points [B,Q,2], target [B,Q] meters, valid [B,Q] bool, focal [B] pixels (0 unknown).
        # extra: (points [B,E,2], parent [B,E] (the query whose patch holds each), target, valid [B,E]):
        # decoded from the tokens the queries already selected, so they cost the head only.
        # glance: (target, valid) [B,rows,cols] of the glance map. dense: the dense path (every patch);
        # size: the images resized to (H, W) first (area), the points scaled with them
        m = self.model
        if size is not None and tuple(size) != tuple(images.shape[-2:]):
            sx, sy = size[1] / images.shape[-1], size[0] / images.shape[-2]
            images = F.interpolate(images, size=tuple(size), mode="area")
            xy = torch.tensor([sx, sy], device=points.device)
            points = points * xy
            extra = None if extra is None else (extra[0] * xy, *extra[1:])
            focal = None if focal is None else focal * (sx * sy) ** 0.5
        hw = tuple(images.shape[-2:])
        if dense:  # dense_core, in its parts
            index, slot = None, patch_of_points(points, m.cfg.patch_size, m.grid_of(images))
        else:
            index, slot = m.select(images, points, bucket)  # packed_core, in its parts
        feats, gfeat = m.encode(images, index)
        if extra is not None:
            xp, parent, xt, xv = extra
            slot = torch.cat([slot, torch.gather(slot, 1, parent)], dim=1)
            points, target, valid = torch.cat([points, xp], 1), torch.cat([target, xt], 1), torch.cat([valid, xv], 1)
        scale = m.focal_scale(images, focal)
        pred = m.forward_head(feats, slot, points, scale, gfeat, hw)  # [B,Q(+E)] float32
        silog = self.silog(pred, target, valid)
        terms = {"silog": silog.detach()}
        loss = silog
        if glance is not None and gfeat is not None:
            g = self.silog(m.glance_map(gfeat, hw, scale), *glance)
            terms["glance"] = g.detach()
            loss = loss + self.glance_weight * g
        return loss, terms
