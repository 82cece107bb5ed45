"""Training losses: SiLogLoss (Depth-Anything-V2's, in fixed-shape form) and PackedObjective, what a
training step minimises: the loss of the packed path at the queried points, as the model runs at inference,
and (Teacher) its distance to a dense teacher's tokens at the queries."""
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
    """SILog of the packed path (dense=True: the dense path) at the queried points, + weight * the distance of its tokens at the queries to
    a dense teacher's (Teacher: an EMA of the weights, no gradient), after the teacher's blocks. One module,
    so DDP sees every parameter its forward uses.

    forward(...) -> (loss, terms): terms are the loss's parts by name, detached scalars; each becomes a
    column of log.csv (in this order), so a new term is one more entry.
    """

    def __init__(self, model: DepthPack, silog_lambda: float, teacher: "Teacher | None" = None,
                 dense: bool = False):
        super().__init__()
        self.model, self.dense = model, dense  # dense: every patch in the buffer (the equal-tokens baseline)
        self.silog = SiLogLoss(lambd=silog_lambda)
        self.teacher = teacher

    def forward(self, images: torch.Tensor, points: torch.Tensor, target: torch.Tensor, valid: torch.Tensor,
                bucket: int, extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                focal: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # images [B,3,H,W], points [B,Q,2], target [B,Q] meters, valid [B,Q] bool, focal [B] pixels (0 unknown).
        # extra: (points [B,E,2], parent [B,E] (the query whose patch holds each), target, valid [B,E]):
        # decoded from the tokens the queries already selected, so they cost the head only
        m, t = self.model, self.teacher
        if self.dense:  # forward_dense_core, in its parts
            index, slot = None, patch_of_points(points, m.cfg.patch_size, m.grid_of(images))
        else:
            index, slot = m.select(images, points, bucket)  # forward_packed, in its parts
        taps: list[torch.Tensor] | None = [] if t is not None else None
        feats = m.forward_features(images, index, taps=taps)
        distill = t.distance(taps, slot, images, points, valid) if t is not None else None
        if extra is not None:
            xp, parent, xt, xv = extra
            slot = torch.cat([slot, torch.gather(slot, 1, parent)], dim=1)
            points, target, valid = torch.cat([points, xp], 1), torch.cat([target, xt], 1), torch.cat([valid, xv], 1)
        pred = m.forward_head(feats, slot, points, m.focal_scale(images, focal))  # [B,Q(+E)] float32
        silog = self.silog(pred, target, valid)
        # without distillation the loss IS silog: `silog + 0.0 * zeros` came out of Inductor without a
        # grad_fn (torch 2.14 CPU), so the compiled step could not backpropagate
        if distill is None:
            return silog, {"silog": silog.detach(), "distill": torch.zeros_like(silog).detach()}
        return silog + t.weight * distill, {"silog": silog.detach(), "distill": distill.detach()}


class Teacher(nn.Module):
    """The dense teacher: an exponential moving average of the model's weights that runs the dense path under
    no_grad on the first `images` images of a batch; its tokens at the queried patches after `blocks` are
    the targets of the packed path's tokens at the queries (mean squared distance of the layer-normed tokens).
    Its weight ramps linearly from 0 to `peak` over `ramp_steps` (a buffer: a CUDA graph reads it in place)."""

    def __init__(self, model: DepthPack, blocks: tuple[int, ...], images: int, decay: float, peak: float,
                 ramp_steps: int):
        super().__init__()
        import copy

        self.ema = copy.deepcopy(model).requires_grad_(False)
        self.blocks, self.images, self.decay, self.peak, self.ramp = blocks, images, decay, peak, max(1, ramp_steps)
        self.register_buffer("weight", torch.zeros(()))

    def distance(self, taps: list[torch.Tensor], slot: torch.Tensor, images: torch.Tensor, points: torch.Tensor,
                 valid: torch.Tensor) -> torch.Tensor:
        n = min(self.images, images.shape[0]) if self.images else images.shape[0]
        e = self.ema
        with torch.no_grad():
            want: list[torch.Tensor] = []
            e.forward_features(images[:n], None, taps=want)  # the dense path: every patch
            patch = patch_of_points(points[:n], e.cfg.patch_size, e.grid_of(images))  # [n,Q]
        w = valid[:n].float()
        total = torch.zeros((), device=images.device)
        for b in self.blocks:
            d = taps[b].shape[-1]
            s = torch.gather(taps[b][:n], 1, slot[:n, :, None].expand(-1, -1, d))  # [n,Q,D]
            t = torch.gather(want[b], 1, patch[:, :, None].expand(-1, -1, d))
            diff = (F.layer_norm(s.float(), (d,)) - F.layer_norm(t.float(), (d,))).square().mean(-1)  # [n,Q]
            total = total + (diff * w).sum() / w.sum().clamp_min(1.0)
        return total / len(self.blocks)

    @torch.no_grad()
    def after_step(self, model: DepthPack, step: int) -> None:
        """The EMA update and the weight of the next step."""
        torch._foreach_lerp_(list(self.ema.parameters()), [p.detach() for p in model.parameters()], 1 - self.decay)
        self.weight.fill_(self.peak * min(1.0, step / self.ramp))
