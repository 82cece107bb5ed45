"""Training losses: SiLogLoss (Depth-Anything-V2's, in fixed-shape form) and PackedObjective, what a
training step minimises: the loss of the packed path at the queried points, as the model runs at inference."""
from __future__ import annotations

import torch
import torch.nn as nn

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
    """SILog of the packed path (dense=True: the dense path) at the queried points. One module, so DDP sees
    every parameter its forward uses.

    forward(...) -> (loss, terms): terms are the loss's parts by name, detached scalars; each becomes a
    column of log.csv (in this order), so a new term is one more entry.
    """

    def __init__(self, model: DepthPack, silog_lambda: float, dense: bool = False):
        super().__init__()
        self.model, self.dense = model, dense  # dense: every patch in the buffer (the equal-tokens baseline)
        self.silog = SiLogLoss(lambd=silog_lambda)

    def forward(self, images: torch.Tensor, points: torch.Tensor, target: torch.Tensor, valid: torch.Tensor,
                bucket: int, extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                focal: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # images [B,3,H,W], points [B,Q,2], target [B,Q] meters, valid [B,Q] bool, focal [B] pixels (0 unknown).
        # extra: (points [B,E,2], parent [B,E] (the query whose patch holds each), target, valid [B,E]):
        # decoded from the tokens the queries already selected, so they cost the head only
        m = self.model
        if self.dense:  # forward_dense_core, in its parts
            index, slot = None, patch_of_points(points, m.cfg.patch_size, m.grid_of(images))
        else:
            index, slot = m.select(images, points, bucket)  # forward_packed, in its parts
        feats = m.forward_features(images, index)
        if extra is not None:
            xp, parent, xt, xv = extra
            slot = torch.cat([slot, torch.gather(slot, 1, parent)], dim=1)
            points, target, valid = torch.cat([points, xp], 1), torch.cat([target, xt], 1), torch.cat([valid, xv], 1)
        pred = m.forward_head(feats, slot, points, m.focal_scale(images, focal))  # [B,Q(+E)] float32
        silog = self.silog(pred, target, valid)
        return silog, {"silog": silog.detach()}
