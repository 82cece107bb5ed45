"""What a training step reads (Batch), the batch order both data paths follow, and the host data path.

    for b in host_batches(train_set, cfg, rank, world, start_step, device):   # Batch on the device
        loss, terms, grad_norm = train_step(b)

Both data paths yield a Batch on the device, this one (a DataLoader over the data set: Q points per
sample from depthpack.data.sample_queries, after an optional mirror) and depthpack.train.device_data,
so the loop never asks which it is on. Both follow batch_order: a step's images depend only on (seed,
step, rank, world), a DistributedSampler permutation per epoch, its Q only on (seed, step) (draw_q).
The data position is the step: that is what makes resuming exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler

from ..data.queries import edge_band, sample_queries
from .config import QueryConfig, TrainConfig, draw_bucket, draw_q, glance_size


@dataclass
class Batch:
    """One training step's input, on the training device."""
    images: torch.Tensor  # [B,3,H,W] float32 in [0,1]
    points: torch.Tensor  # [B,K,2] float32 (x, y) pixels; K = q, or the bucket on the device path (the padding invalid)
    target: torch.Tensor  # [B,K] float32 meters
    valid: torch.Tensor  # [B,K] bool
    extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None  # points, parent, target, valid [B,E]
    focal: torch.Tensor | None  # [B] float32 pixels (0 = unknown); None where the data set has none
    bucket: int  # the packed buffer's capacity for q (draw_bucket)
    q: int  # the step's query count
    step: int
    glance: tuple[torch.Tensor, torch.Tensor] | None = None  # target, valid [B,rows,cols] at the glance image's pixels
    path: str = "packed"  # the path this step trains: "packed" or "dense" (step_path)
    size: tuple[int, int] | None = None  # the image size this step runs at (None: as loaded)


def glance_targets(depth: torch.Tensor, valid: torch.Tensor, size: tuple[int, int] | None) -> tuple | None:
    """The ground truth at the glance image's pixel centres, nearest (never a blend of valid and
    invalid): (target, valid) [B,rows,cols], or None for a model without a glance depth (size None)."""
    if size is None:
        return None
    B, H, W = depth.shape
    rows = ((torch.arange(size[0], device=depth.device) + 0.5) * (H / size[0])).long().clamp_max(H - 1)
    cols = ((torch.arange(size[1], device=depth.device) + 0.5) * (W / size[1])).long().clamp_max(W - 1)
    return depth[:, rows][:, :, cols], valid[:, rows][:, :, cols]


def at_points(points: torch.Tensor, *maps: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Values of [B,H,W] maps at the pixels (floor(x), floor(y)) of points [B,P,2] -> [B,P] each."""
    W = maps[0].shape[-1]
    flat = points[..., 1].long() * W + points[..., 0].long()
    return tuple(torch.gather(m.reshape(m.shape[0], -1), 1, flat) for m in maps)


def batch_order(n: int, cfg: TrainConfig, world: int, rank: int, start_step: int,
                what: str) -> Iterator[tuple[list[int], range, int]]:
    """Per epoch from start_step on: (this process's permutation of the n samples, the steps that read
    it, the batch index of the first of them): step steps[i] reads perm[(offset + i) * B:][:B]."""
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True)
    per_epoch = len(sampler) // cfg.batch_size
    if per_epoch == 0:
        raise ValueError(f"{what} has {n} samples: fewer than one batch of {cfg.batch_size} per process "
                         f"({world} processes)")
    step = start_step
    while step < cfg.steps:
        epoch, offset = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        steps = range(step + 1, min(step + per_epoch - offset, cfg.steps) + 1)
        yield list(sampler), steps, offset
        step = steps[-1]


class WithQueries(torch.utils.data.Dataset):
    """ds[(index, step, slot, q)] -> the sample plus points [q,2] drawn among its valid pixels as queries says.

    The query sampling runs where the sample is made (in the DataLoader workers when there are any),
    with a generator seeded by (seed, step, rank, slot in the batch): the same points whatever the
    number of workers, and again on a resumed run.
    """

    def __init__(self, base, seed: int, rank: int, queries: QueryConfig, hflip: bool = False, patch_size: int = 1,
                 xy: tuple[float, float] = (1.0, 1.0)):
        self.base, self.seed, self.rank, self.queries, self.hflip = base, seed, rank, queries, hflip
        self.patch_size, self.xy = patch_size, xy

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: tuple[int, int, int, int]) -> dict:
        index, step, slot, q = key
        sample = dict(self.base[index])
        g = torch.Generator().manual_seed(((self.seed * 7919 + step) * 131 + self.rank) * 1031 + slot)
        if self.hflip and bool(torch.rand((), generator=g) < 0.5):
            sample = hflip_sample(sample)
        qc = self.queries
        band = edge_band(sample["depth"], sample["valid"], self.patch_size) if qc.edge_source == "depth" else None
        sample["points"] = sample_queries(sample["valid"], sample["image"], q, g, qc.edge_frac, band).float()
        if qc.extra_points:  # pixels inside the patches of the queries (any pixel: invalid ones are masked)
            n = q * qc.extra_points
            parent = torch.randint(q, (n,), generator=g)
            sample["extra_points"] = in_patch(sample["points"][parent], torch.randint(self.patch_size, (n, 2), generator=g),
                                              self.patch_size, self.xy)
            sample["extra_parent"] = parent
        return sample


def in_patch(points: torch.Tensor, offset: torch.Tensor, p: int, xy: tuple[float, float]) -> torch.Tensor:
    """Points [...,2] in the data's pixels -> the pixel at integer offset [...,2] in [0, p) of each point's patch,
    the patch the model sees it in (xy: model pixels per data pixel, x and y, as the step scales them; to_model)."""
    if xy == (1.0, 1.0):
        return torch.div(points, p, rounding_mode="floor") * p + offset.float()
    s = torch.tensor(xy, dtype=torch.float32, device=points.device)
    corner = torch.div(points * s, p, rounding_mode="floor") * p
    return (corner + offset.float() + 1e-3) / s  # a thousandth inside: rounding cannot carry it across the border


def to_model(cfg: TrainConfig) -> tuple[float, float]:
    """Model pixels per data pixel (x, y): the model's size over cfg.data_size, else 1."""
    if cfg.data_size is None:
        return 1.0, 1.0
    (H, W), (h, w) = cfg.data_size, cfg.model_config().img_size
    return w / W, h / H


def hflip_sample(sample: dict) -> dict:
    """The sample mirrored left-right: image [3,H,W] and the [H,W] maps (depth, valid, eval_mask)."""
    return {k: v.flip(-1) if k in ("image", "depth", "valid", "eval_mask") else v for k, v in sample.items()}


def to_batch(batch: dict, step: int, q: int, bucket: int, device: torch.device,
             glance_size: tuple[int, int] | None = None) -> Batch:
    """A collated batch of WithQueries samples as a step reads it: the targets at its points (and at the
    glance image's pixels, glance_size), on the device."""
    points, depth, valid_map = batch["points"], batch["depth"], batch["valid"]
    target, valid = at_points(points, depth, valid_map)
    extra = None
    if "extra_points" in batch:
        xp = batch["extra_points"]
        extra = tuple(t.to(device) for t in (xp, batch["extra_parent"], *at_points(xp, depth, valid_map)))
    focal = batch["focal"].to(device) if "focal" in batch else None
    glance = glance_targets(depth, valid_map, glance_size)
    glance = None if glance is None else tuple(t.to(device) for t in glance)
    return Batch(batch["image"].to(device, non_blocking=True), points.to(device), target.to(device), valid.to(device),
                 extra, focal, bucket, q, step, glance)


def host_batches(dataset, cfg: TrainConfig, rank: int, world: int, start_step: int,
                 device: torch.device) -> Iterator[Batch]:
    """The batches of steps start_step+1 .. cfg.steps, made by a DataLoader (one per epoch) and copied to device."""
    buckets = cfg.model_config().buckets
    wrapped = WithQueries(dataset, cfg.seed, rank, cfg.queries, cfg.hflip, cfg.model_config().patch_size, to_model(cfg))
    B = cfg.batch_size
    for perm, steps, offset in batch_order(len(dataset), cfg, world, rank, start_step, "the data set"):
        qs = [draw_q(cfg, buckets, s) for s in steps]
        keys = [[(perm[i * B + j], s, j, q) for j in range(B)] for (i, s), q in zip(enumerate(steps, offset), qs)]
        loader = DataLoader(wrapped, batch_sampler=keys, num_workers=cfg.num_workers, persistent_workers=False,
                            pin_memory=device.type == "cuda")
        for s, q, batch in zip(steps, qs, loader):
            yield to_batch(batch, s, q, draw_bucket(cfg, buckets, q, s), device, glance_size(cfg))
