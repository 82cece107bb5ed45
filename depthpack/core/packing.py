"""Token selection: which patches fill the fixed-size buffer and where each query finds its token;
the bucket ladder and the chunking rule every runner follows.

Fixed-shape tensor operations only (scatter, max-pool, topk, gather): no nonzero, unique, boolean
indexing, .item() or data-dependent Python, so the packed forward is one static graph.

Priority of a patch (higher is selected first; levels are integers, the spread term is in [0, 1) and
distinct per patch, so there are no ties and the result is deterministic):
    3 + spread   a queried patch      (always selected: there are at most Q <= bucket of them)
    2 + spread   a neighbour (3x3) of a queried patch
    1 + spread   any other patch, in a fixed order that spreads over the image
so every slot holds a real token and no key mask is needed.

Names: a *bucket* is one capacity of the ladder (patch slots of the buffer, K); a call with Q
queries runs on the smallest bucket >= Q; *slots* = min(bucket, N) is how many patches fill it.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import torch
import torch.nn.functional as F

QUERY, NEIGHBOUR, CONTEXT = 3.0, 2.0, 1.0


@lru_cache(maxsize=None)
def _spread_rank_tuple(gh: int, gw: int) -> tuple[int, ...]:
    # bit-reversal (van der Corput) ranks along each axis, interleaved: any prefix of the order
    # covers the grid roughly uniformly
    def bitrev_rank(n: int) -> list[int]:
        bits = max(1, (n - 1).bit_length())
        keys = sorted(range(n), key=lambda i: int(f"{i:0{bits}b}"[::-1], 2))
        rank = [0] * n
        for r, i in enumerate(keys):
            rank[i] = r
        return rank

    ry, rx = bitrev_rank(gh), bitrev_rank(gw)
    n = gh * gw
    key = [(max(ry[y], rx[x]), ry[y], rx[x]) for y in range(gh) for x in range(gw)]
    order = sorted(range(n), key=lambda i: key[i])  # earliest = most spread
    rank = [0] * n
    for r, i in enumerate(order):
        rank[i] = n - 1 - r
    return tuple(rank)


def spread_rank(gh: int, gw: int, device=None) -> torch.Tensor:
    """[gh*gw] int64: a distinct rank per patch (row-major), largest = most spread-out prefix.
    The selection's tie-breaker is rank / N in [0, 1); integers survive any dtype cast of a module."""
    return torch.tensor(_spread_rank_tuple(gh, gw), dtype=torch.long, device=device)


def bucket_for(q: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds q queries (q <= the largest bucket); from q alone, no sync."""
    for b in buckets:
        if b >= q:
            return b
    raise ValueError(f"{q} queries exceed the largest bucket {buckets[-1]}; chunk them")


def chunk_plan(q: int, buckets: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(start, end, bucket) of each chunk of q queries: at most the largest bucket each, in order,
    each on the smallest bucket that holds it. The one rule of every runner (model, Predictor,
    AOTInductor packages, the C++ runner)."""
    kmax = buckets[-1]
    return [(s, min(q, s + kmax), bucket_for(min(kmax, q - s), buckets)) for s in range(0, q, kmax)]


def pad_points(chunk: torch.Tensor, bucket: int) -> torch.Tensor:
    """points [B,q,2] -> [B,bucket,2], padded with copies of each row's first point: the selection is
    unchanged by them and their depths are dropped."""
    B, q = chunk.shape[:2]
    if q == bucket:
        return chunk
    return torch.cat([chunk, chunk[:, :1].expand(B, bucket - q, 2)], dim=1)


def run_chunked(fn: Callable[..., torch.Tensor], images: torch.Tensor, points: torch.Tensor,
                buckets: tuple[int, ...], *extra: torch.Tensor) -> torch.Tensor:
    """depth [B,Q] for any Q from fn(images, points [B,bucket,2], bucket, *extra) -> [B,bucket]:
    chunk_plan's chunks, each padded by pad_points, the padded results dropped."""
    B, Q = points.shape[:2]
    if Q == 0:
        return torch.zeros(B, 0, device=images.device)
    outs = [fn(images, pad_points(points[:, s:e], k).contiguous(), k, *extra)[:, : e - s]
            for s, e, k in chunk_plan(Q, buckets)]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def patch_of_points(points: torch.Tensor, patch_size: int, grid: tuple[int, int]) -> torch.Tensor:
    """points [B,Q,2] (x, y) pixels -> patch index [B,Q] (row-major). Points are validated upstream;
    the clamp only keeps memory access in bounds should an unvalidated caller pass garbage."""
    gh, gw = grid
    cell = torch.div(points, patch_size, rounding_mode="floor").long()  # [B,Q,2]
    px = cell[..., 0].clamp(0, gw - 1)
    py = cell[..., 1].clamp(0, gh - 1)
    return py * gw + px


def select_tokens(points: torch.Tensor, bucket: int, patch_size: int, grid: tuple[int, int],
                  rank: torch.Tensor | None = None, method: str = "topk",
                  order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the patches of the buffer.

    points [B,Q,2] float (x, y) pixels, Q <= bucket; rank [N] the spread rank (spread_rank(grid)).
    Returns index [B,S] (patch ids, distinct, S = slots = min(bucket, N)) and query_slot [B,Q] (the
    position in index of each query's own patch; duplicate queries share it).
    method: "topk" (torch.topk over the priorities, the reference) or "count" (the same set by a
    counting selection: the priorities are 3 integer levels plus a distinct rank, so each patch's place
    is a count, computed with cumulative sums and one scatter; a switch of the fast path); order [N]
    the patches by decreasing rank (argsort(rank), a constant the model keeps).
    """
    B, Q, _ = points.shape
    gh, gw = grid
    n = gh * gw
    slots = min(bucket, n)
    if Q > slots and bucket < n:
        raise ValueError(f"{Q} queries do not fit a bucket of {bucket} patch slots")
    qidx = patch_of_points(points, patch_size, grid)  # [B,Q]
    if rank is None:
        rank = spread_rank(gh, gw, points.device)
    queried = torch.zeros(B, n, device=points.device, dtype=torch.float32)
    queried = queried.scatter(1, qidx, 1.0)  # [B,N] 1 where queried (duplicates write the same 1)
    near = F.max_pool2d(queried.view(B, 1, gh, gw), 3, stride=1, padding=1).view(B, n)
    if method == "count":
        if order is None:
            order = torch.argsort(rank.to(points.device), descending=True)
        index = _count_select(near + queried, order, slots)
    else:
        # queried: 3, neighbour: 2, other: 1; plus the spread term rank / N in [0, 1)
        score = CONTEXT + near + queried + rank.to(points.device).float() / n  # [B,N]
        # unsorted: attention does not depend on the buffer's order, and sorting is a kernel more
        index = torch.topk(score, slots, dim=1, sorted=False).indices  # [B,S] distinct patch ids
    arange = torch.arange(slots, device=points.device).expand(B, slots)
    slot_of_patch = torch.zeros(B, n, dtype=torch.long, device=points.device).scatter(1, index, arange)
    query_slot = torch.gather(slot_of_patch, 1, qidx)  # [B,Q]
    return index, query_slot


def _count_select(level: torch.Tensor, order: torch.Tensor, slots: int) -> torch.Tensor:
    """The top `slots` patches by (level, rank), fixed-shape, without a sort: in the order of
    decreasing rank (order, a constant permutation), a patch's place is the number of patches of a
    higher level plus the number of its own level before it. level [B,N] in {0, 1, 2} (+1 = the
    priority levels 1..3). -> index [B,S], in (level, rank) order."""
    B, n = level.shape
    lv = level[:, order].long()  # [B,N]
    # [B,3,N]: the scans run along contiguous rows (one short persistent kernel, not a strided scan)
    onehot = (lv.unsqueeze(1) == torch.arange(3, device=level.device).view(1, 3, 1)).long()
    before = torch.cumsum(onehot, dim=2) - onehot  # same-level patches ahead, per level
    total = onehot.sum(2)  # [B,3]
    higher = torch.stack([total[:, 1] + total[:, 2], total[:, 2], torch.zeros_like(total[:, 0])], 1)  # [B,3]
    place = torch.gather(before + higher.unsqueeze(-1), 1, lv.unsqueeze(1)).squeeze(1)  # [B,N] distinct in [0, N)
    place = torch.where(place < slots, place, torch.full_like(place, slots))  # the rest to a spare slot
    index = torch.zeros(B, slots + 1, dtype=torch.long, device=level.device)
    index = index.scatter(1, place, order.expand(B, n))
    return index[:, :slots]


def key_mask_from_index(index: torch.Tensor, num_patches: int, num_prefix: int) -> torch.Tensor:
    """Boolean key mask [B, prefix + N] that admits the prefix tokens (cls, anchors) and the selected
    patches: the masked path's view of exactly the tokens the packed path runs."""
    B = index.shape[0]
    sel = torch.zeros(B, num_patches, dtype=torch.bool, device=index.device)
    sel = sel.scatter(1, index, True)
    prefix = torch.ones(B, num_prefix, dtype=torch.bool, device=index.device)
    return torch.cat([prefix, sel], dim=1)
