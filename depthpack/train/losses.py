"""Training losses. One SILog, as Depth-Anything-V2's metric-depth SiLogLoss, in fixed-shape form."""
from __future__ import annotations

import torch
import torch.nn as nn


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
