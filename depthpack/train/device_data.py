"""The training data paths on the device: a scene store in one uint8 tensor (data.device_cache), or
scenes rendered new every step (data.fresh); batches made there.

    for b in DeviceScenes(store, device, cfg, mcfg, rank, world).batches(start_step):   # data.device_cache
        ...                                                 # b: a depthpack.train.batches.Batch
    for b in FreshScenes(cfg, mcfg, device, world, rank).batches(start_step):           # data.fresh
        ...

Why: rendering or loading samples on the host, collating them and copying them over made training
data-bound. Here a batch is a handful of kernels with no host work and no host sync: one index_select of the
batch's rows (image uint8, depth float16, focal float32 in one row, depthpack.data.store), the
left-right mirror as a select, and the query points drawn by Gumbel top-k (sampling without
replacement, weights uniform over the valid pixels or, for the edge share, the Sobel magnitude of
the image as depthpack.data.sample_queries weighs them, or the depth-edge band with
queries.edge_source=depth). The points are padded to the bucket
(copies of the first point, marked invalid, so the selection and the loss are those of the Q real
points), so the shapes of a step depend on its bucket alone: one compiled graph per bucket.

Everything random is drawn from a generator on the device seeded by (seed, step, rank), and the batch
order is the host path's (batch_order), so a resumed run replays the same batches. It is not the host
path's sampler (another algorithm draws the points), so a run keeps the data path it started with.
"""
from __future__ import annotations

import math
from typing import Iterator

import torch

from ..core.config import ModelConfig
from ..data.queries import edge_band, sobel_magnitude
from ..data.store import SceneStore, decode_rows
from ..data.synthetic import draw, render_drawn
from .batches import Batch, at_points, batch_order, glance_targets, in_patch, to_model
from .config import TrainConfig, draw_bucket, draw_q, glance_size

LOAD_CHUNK_BYTES = 256 << 20  # host -> device copy in pieces of this size (no giant staging buffer)


def load_rows(store: SceneStore, device: torch.device) -> torch.Tensor:
    """The store's rows as ONE uint8 tensor [n, row_bytes] on the device, copied in chunks."""
    n, L = store.n, store.layout.row_bytes
    out = torch.empty((n, L), dtype=torch.uint8, device=device)
    chunk = max(1, LOAD_CHUNK_BYTES // L)
    for s in range(0, n, chunk):
        part = torch.from_numpy(store.rows[s:s + chunk].copy())  # the memmap is read-only: copy the piece
        out[s:s + part.shape[0]].copy_(part)
    return out


def gumbel_topk(logw: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    """k indices per row of logw [B,N] (log weights, -inf = never unless fewer than k are finite),
    drawn without replacement with probability proportional to the weights (Gumbel top-k)."""
    u = torch.rand(logw.shape, generator=g, device=logw.device).clamp_(min=1e-20)
    return (logw - torch.log(-torch.log(u))).topk(k, dim=1, sorted=False).indices


def sample_points(valid: torch.Tensor, images: torch.Tensor, q: int, edge_frac: float, g: torch.Generator,
                  band: torch.Tensor | None = None) -> torch.Tensor:
    """q points per image among the valid pixels: float32 [B,q,2] (x, y), integer-valued.
    round(q * edge_frac) at edges: uniformly inside the depth-edge band [B,H,W] when one is given (an
    image without one: uniform), else by Sobel magnitude (+ a tiny floor); the rest uniform, shuffled together."""
    B, H, W = valid.shape
    vflat = valid.reshape(B, H * W)
    n_edge = int(round(q * edge_frac))
    neg = torch.tensor(float("-inf"), device=valid.device)
    zero = torch.zeros((), device=valid.device)
    parts = []
    if q - n_edge:
        parts.append(gumbel_topk(torch.where(vflat, zero, neg), q - n_edge, g))
    if n_edge and band is not None:
        bflat = band.reshape(B, H * W) & vflat
        bflat = bflat | (vflat & ~bflat.any(dim=1, keepdim=True))  # no band in an image: its valid pixels
        parts.append(gumbel_topk(torch.where(bflat, zero, neg), n_edge, g))
    elif n_edge:
        mag = sobel_magnitude(images).reshape(B, H * W)
        w = (mag + 1e-6 * (1.0 + mag.amax(dim=1, keepdim=True))) * vflat
        parts.append(gumbel_topk(torch.where(vflat, torch.log(w), neg), n_edge, g))
    idx = torch.cat(parts, dim=1)  # [B,q]
    idx = torch.gather(idx, 1, torch.rand(B, q, generator=g, device=valid.device).argsort(dim=1))
    return torch.stack([idx % W, torch.div(idx, W, rounding_mode="floor")], dim=-1).float()


class DeviceScenes:
    """A scene store resident on the training device, and the batches made from it."""

    def __init__(self, store: SceneStore, device: torch.device, cfg: TrainConfig, mcfg: ModelConfig, rank: int = 0,
                 world: int = 1):
        want = cfg.scene_size
        if want != (store.layout.height, store.layout.width):
            raise ValueError(f"scene store {store.path} holds {store.layout.height}x{store.layout.width} scenes, "
                             f"the run takes {want} (model.img_size, or data_size)")
        self.store, self.device, self.cfg, self.mcfg, self.rank, self.world = store, device, cfg, mcfg, rank, world
        self.rows = load_rows(store, device)  # [n, row_bytes] uint8: the one tensor
        self.n = store.n
        self.gen = torch.Generator(device=device)

    def batch(self, idx: torch.Tensor, q: int, bucket: int, step: int) -> Batch:
        """The batch of scene indices idx [B] (on the device) with q query points each, padded to bucket."""
        rows = self.rows.index_select(0, idx)  # [B, row_bytes]: one gather
        img8, d16, focal = decode_rows(rows, self.store.layout)
        return make_batch(img8, d16.float(), focal.float(), q, bucket, step, self.cfg, self.mcfg, self.rank, self.gen)

    def batches(self, start_step: int) -> Iterator[Batch]:
        """The batches of steps start_step+1 .. cfg.steps, in the host path's order (device_stream)."""
        buckets = self.mcfg.buckets
        for step, q, idx in device_stream(self.n, self.cfg, self.world, self.rank, start_step, buckets, self.device):
            yield self.batch(idx, q, draw_bucket(self.cfg, buckets, q, step), step)


def make_batch(img8: torch.Tensor, depth: torch.Tensor, focal: torch.Tensor, q: int, bucket: int, step: int,
               cfg: TrainConfig, mcfg: ModelConfig, rank: int, g: torch.Generator) -> Batch:
    """A step's Batch from scenes on the device: image uint8 [B,3,H,W], depth float32 [B,H,W] meters (0 =
    none), focal float32 [B]; mirrored, q points drawn and padded to bucket, seeded by (seed, step, rank)."""
    dev = img8.device
    g.manual_seed(((cfg.seed * 7919 + step) * 131 + rank) * 1031)
    B = img8.shape[0]
    if cfg.hflip:
        flip = torch.rand(B, generator=g, device=dev) < 0.5
        img8 = torch.where(flip[:, None, None, None], img8.flip(-1), img8)
        depth = torch.where(flip[:, None, None], depth.flip(-1), depth)
    images = img8.float() / 255.0  # as depthpack.core.preprocess.frames_to_images
    valid_map = (depth >= mcfg.min_depth) & (depth <= mcfg.max_depth)  # 0 (no hit) is invalid
    depth = torch.where(valid_map, depth, torch.zeros((), device=dev))
    band = edge_band(depth, valid_map, mcfg.patch_size) if cfg.queries.edge_source == "depth" else None
    pts = sample_points(valid_map, images, q, cfg.queries.edge_frac, g, band)  # [B,q,2]
    points = torch.cat([pts, pts[:, :1].expand(B, bucket - q, 2)], dim=1)  # [B,K,2]
    real = torch.arange(bucket, device=dev) < q  # [K]
    target, valid = at_points(points, depth, valid_map)
    valid = valid & real
    extra = None
    if cfg.queries.extra_points:
        n, p = cfg.queries.extra_points * bucket, mcfg.patch_size
        parent = torch.randint(q, (B, n), generator=g, device=dev)  # among the real queries only
        xp = in_patch(torch.gather(points, 1, parent.unsqueeze(-1).expand(B, n, 2)),
                      torch.randint(p, (B, n, 2), generator=g, device=dev), p, to_model(cfg))
        xt, xv = at_points(xp, depth, valid_map)
        extra = (xp, parent, xt, xv & (torch.arange(n, device=dev) < cfg.queries.extra_points * q))
    return Batch(images, points, target, valid, extra, focal, bucket, q, step, glance_targets(depth, valid_map, glance_size(cfg)))


class FreshScenes:
    """data.fresh: every step's scenes rendered new on the training device. Step s of rank r reads the
    train stream's scenes ((s - 1) * world + r) * B ... + B - 1, so no scene repeats, ranks draw disjoint
    scenes and a resumed run continues the same stream. The next step's scenes are drawn on the host
    (depthpack.data.synthetic.draw) while this step trains."""

    def __init__(self, cfg: TrainConfig, mcfg: ModelConfig, device: torch.device, world: int, rank: int):
        from concurrent.futures import ThreadPoolExecutor

        self.cfg, self.mcfg, self.device, self.world, self.rank = cfg, mcfg, device, world, rank
        self.gen = torch.Generator(device=device)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="draw-scenes")

    def indices(self, step: int) -> range:
        B = self.cfg.batch_size
        first = ((step - 1) * self.world + self.rank) * B
        return range(first, first + B)

    def _draw(self, step: int) -> list:
        c, size = self.cfg.data, self.mcfg.img_size
        return [draw(c.seed, i, size, c.scene, "train", c.rig, c.families())[:2] for i in self.indices(step)]

    def batches(self, start_step: int) -> Iterator[Batch]:
        """The batches of steps start_step+1 .. cfg.steps."""
        cfg, buckets = self.cfg, self.mcfg.buckets
        H, W = self.mcfg.img_size
        ahead = self.pool.submit(self._draw, start_step + 1) if start_step < cfg.steps else None
        try:
            for step in range(start_step + 1, cfg.steps + 1):
                drawn = ahead.result()
                ahead = self.pool.submit(self._draw, step + 1) if step < cfg.steps else None
                image, depth, _ = render_drawn(drawn, self.device, H, W)
                img8 = torch.round(image.clamp(0, 1) * 255.0).to(torch.uint8).permute(0, 3, 1, 2)  # as a camera's
                focal = torch.tensor([math.sqrt(cam.fx * cam.fy) for _, cam in drawn], dtype=torch.float32,
                                     device=self.device)
                q = draw_q(cfg, buckets, step)
                yield make_batch(img8, depth, focal, q, draw_bucket(cfg, buckets, q, step), step, cfg, self.mcfg,
                                 self.rank, self.gen)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def device_stream(n: int, cfg: TrainConfig, world: int, rank: int, start_step: int, buckets: tuple[int, ...],
                  device: torch.device) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(step, q, idx [B] on the device) for steps start_step+1 .. cfg.steps: batch_order, and its Q (draw_q)."""
    B = cfg.batch_size
    for perm, steps, offset in batch_order(n, cfg, world, rank, start_step, "the scene store"):
        perm = torch.tensor(perm, dtype=torch.long, device=device)  # one copy an epoch: no host sync a step
        for i, step in enumerate(steps, offset):
            yield step, draw_q(cfg, buckets, step), perm[i * B:(i + 1) * B]
