"""Depth metrics: one eval_depth (Depth-Anything-V2's set) and an accumulator over a data set.

d1, d2, d3 = share of points with max(pred/gt, gt/pred) < 1.25, 1.25^2, 1.25^3
abs_rel = mean |pred - gt| / gt          sq_rel = mean (pred - gt)^2 / gt
rmse = sqrt mean (pred - gt)^2           rmse_log = sqrt mean (log pred - log gt)^2
log10 = mean |log10 pred - log10 gt|     silog = sqrt(mean g^2 - 0.5 (mean g)^2), g = log pred - log gt
(silog as Depth-Anything-V2's eval_depth: lambda 0.5, not x100 as in BTS.)
Computed in float64 over the masked points. median_scaling multiplies pred by median(gt) / median(pred)
over those points first (for relative-depth models).
"""
from __future__ import annotations

import math

import torch

METRICS = ("d1", "d2", "d3", "abs_rel", "sq_rel", "rmse", "rmse_log", "log10", "silog")
_SUMS = ("n", "d1", "d2", "d3", "abs_rel", "sq_rel", "sq", "sq_log", "log10", "log")


def _select(pred, target, mask) -> tuple[torch.Tensor, torch.Tensor]:
    pred, target = torch.as_tensor(pred), torch.as_tensor(target)
    if pred.shape != target.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape")
    if mask is None:
        mask = torch.ones_like(target, dtype=torch.bool)
    mask = torch.as_tensor(mask).bool()
    if mask.shape != target.shape:
        raise ValueError(f"mask {tuple(mask.shape)} does not match target {tuple(target.shape)}")
    p, t = pred.detach()[mask].double(), target.detach()[mask].double()
    if p.numel() == 0:
        raise ValueError("no point to evaluate: the mask selects nothing")
    if not (torch.isfinite(t).all() and (t > 0).all()):
        raise ValueError("target must be finite and > 0 at every masked point (mask the invalid ones)")
    if not (torch.isfinite(p).all() and (p > 0).all()):
        raise ValueError("pred must be finite and > 0 at every masked point")
    return p, t


def _sums(p: torch.Tensor, t: torch.Tensor) -> dict[str, float]:
    thresh = torch.maximum(t / p, p / t)
    diff, dlog = p - t, torch.log(p) - torch.log(t)
    return dict(n=float(p.numel()),
                d1=float((thresh < 1.25).sum()), d2=float((thresh < 1.25**2).sum()), d3=float((thresh < 1.25**3).sum()),
                abs_rel=float((diff.abs() / t).sum()), sq_rel=float((diff.square() / t).sum()),
                sq=float(diff.square().sum()), sq_log=float(dlog.square().sum()),
                log10=float((torch.log10(p) - torch.log10(t)).abs().sum()), log=float(dlog.sum()))


def _from_sums(s: dict[str, float]) -> dict[str, float]:
    n = s["n"]
    mean_log = s["log"] / n
    return dict(d1=s["d1"] / n, d2=s["d2"] / n, d3=s["d3"] / n, abs_rel=s["abs_rel"] / n, sq_rel=s["sq_rel"] / n,
                rmse=math.sqrt(s["sq"] / n), rmse_log=math.sqrt(s["sq_log"] / n), log10=s["log10"] / n,
                silog=math.sqrt(max(s["sq_log"] / n - 0.5 * mean_log * mean_log, 0.0)))


def median_scale(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return p * (t.median() / p.median())


def eval_depth(pred, target, mask=None, median_scaling: bool = False) -> dict[str, float]:
    """The standard metrics over the points where mask is True (all points when mask is None)."""
    p, t = _select(pred, target, mask)
    if median_scaling:
        p = median_scale(p, t)
    return _from_sums(_sums(p, t))


class MetricAccumulator:
    """Metrics over a whole data set, fed one image (or a batch of images) at a time.

    per="image" (default, as BTS / Monodepth2 / Depth-Anything-V2 report): eval_depth of each image,
    then the mean over images. per="pixel": every valid point of the data set pooled into one set.
    update(pred, target, mask): pred/target/mask [Q] or [H,W] for one image, or [B,...] with
    batched=True (each leading index one image). Median scaling, when on, is per image.
    """

    def __init__(self, per: str = "image", median_scaling: bool = False):
        if per not in ("image", "pixel"):
            raise ValueError(f"per={per!r} is not one of ('image', 'pixel')")
        self.per, self.median_scaling = per, median_scaling
        self.reset()

    def reset(self) -> None:
        self.images = 0
        self._image_sum = {k: 0.0 for k in METRICS}
        self._pixel_sum = {k: 0.0 for k in _SUMS}

    def update(self, pred, target, mask=None, batched: bool = False) -> None:
        if batched:
            pred, target = torch.as_tensor(pred), torch.as_tensor(target)
            for b in range(pred.shape[0]):
                self.update(pred[b], target[b], None if mask is None else torch.as_tensor(mask)[b])
            return
        p, t = _select(pred, target, mask)
        if self.median_scaling:
            p = median_scale(p, t)
        s = _sums(p, t)
        m = _from_sums(s)
        self.images += 1
        for k in METRICS:
            self._image_sum[k] += m[k]
        for k in _SUMS:
            self._pixel_sum[k] += s[k]

    def compute(self) -> dict[str, float]:
        if self.images == 0:
            raise ValueError("MetricAccumulator.compute(): no image was added")
        if self.per == "pixel":
            return _from_sums(self._pixel_sum)
        return {k: v / self.images for k, v in self._image_sum.items()}


# ---- boundaries (Depth Pro's scale-invariant boundary F1) -----------------------------------------
def _occlusions(depth: torch.Tensor, pair_valid: tuple[torch.Tensor, ...], t: float) -> tuple[torch.Tensor, ...]:
    """Where a pixel occludes its right / lower / left / upper neighbour by a depth ratio above t."""
    right, down = depth[:, 1:] / depth[:, :-1], depth[1:, :] / depth[:-1, :]
    h, v = pair_valid
    return (h & (right > t), v & (down > t), h & (1.0 / right > t), v & (1.0 / down > t))


def boundary_f1(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, t: float) -> float:
    """F1 of the occlusion boundaries at ratio t: pairs of 4-neighbours where one is nearer than the other
    by more than t, in each of the four directions, pred against target, over pairs whose two target
    pixels are valid (Depth Pro's boundary_f1, with its precision and recall averaged over directions)."""
    pair_valid = (valid[:, 1:] & valid[:, :-1], valid[1:, :] & valid[:-1, :])
    p = torch.where(valid, pred.double().clamp_min(1e-6), 1.0)
    g = torch.where(valid, target.double(), 1.0)
    rec = prec = 0.0
    for a, b in zip(_occlusions(p, pair_valid, t), _occlusions(g, pair_valid, t)):
        hit = float((a & b).sum())
        rec += 0.25 * hit / max(float(b.sum()), 1.0)
        prec += 0.25 * hit / max(float(a.sum()), 1.0)
    return 0.0 if rec + prec == 0 else 2 * rec * prec / (rec + prec)


def si_boundary_f1(pred, target, valid, t_min: float = 1.05, t_max: float = 1.25, n: int = 10) -> float:
    """Depth Pro's scale-invariant boundary F1 of one dense map [H,W]: boundary_f1 at n ratios from t_min to
    t_max, weighted by the ratio. Scale-invariant: only ratios of neighbouring depths enter. As in Depth
    Pro, a direction in which the target has no boundary adds 0 to the recall (a map whose boundaries
    all face one way scores at most 0.25; natural images have them in all four directions)."""
    pred, target, valid = torch.as_tensor(pred), torch.as_tensor(target), torch.as_tensor(valid).bool()
    if pred.ndim != 2 or pred.shape != target.shape or valid.shape != target.shape:
        raise ValueError(f"si_boundary_f1 takes maps [H,W] of one shape, got {tuple(pred.shape)}, "
                         f"{tuple(target.shape)}, {tuple(valid.shape)}")
    ts = torch.linspace(t_min, t_max, n, dtype=torch.float64)
    w = ts / ts.sum()
    return float(sum(float(wi) * boundary_f1(pred, target, valid, float(ti)) for ti, wi in zip(ts, w)))
