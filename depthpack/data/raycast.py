"""Exact ray casting of a batch of synthetic scenes in torch, on any device.

    batch = pack(scenes, device)          # scenes: [(Scene, Camera)] from depthpack.data.synthetic
    image, depth, thin = cast_and_shade(batch, H, W)   # [B,H,W,3] float32 in [0,1], [B,H,W] z-depth m (0 = no
    #                                                    hit), [B,H,W] bool: the pixels of THIN_FAMILIES

B scenes are rendered at once: each kind of primitive (planes, boxes, spheres, vertical cylinders)
is a padded table [B,S,...] (a padding slot never hits), and every ray is tested against every slot
of its scene, S slots at a time so that B x S x pixels stays bounded. Intersections are the analytic
ones, in float32 like the rays; what depends on the camera alone (the origin relative to each
primitive) is computed in float64 on the host and rounded once, so depth equals float32 rounding of
the exact hit. The nearest hit wins; on a tie the primitive drawn first does. Shading: Lambertian
from a point light (rooms) or the sun (streets), ambient, cast shadows from every object (a ray from
each lit point toward the light), procedural textures in surface coordinates (meters) faded where a
pixel's footprint exceeds half a period, a sky gradient, gamma 2.

Frames: world y is up. Camera x right, y down, z forward; ray directions have camera z = 1, so the
ray parameter t of a hit IS its z-depth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

EPS = 1e-6
INF = float("inf")
KINDS = ("plain", "checker", "stripes", "grid", "noise", "road")  # material patterns
PRIM_KINDS = ("plane", "box", "sphere", "cyl")
TILE = 32  # value-noise tiles are TILE x TILE, periodic
ELEMENTS = 1 << 16  # (ray, primitive) pairs tested at once on a CPU: their temporaries stay in the cache
GPU_ELEMENTS = 1 << 22  # on a GPU: pieces large enough that launches and syncs do not dominate (about 1 GB)
DENSE_ELEMENTS = 1 << 24  # (ray, plane) pairs tested at once (every ray meets every plane)
THIN_FAMILIES = ("thin", "distant")  # the scene families whose pixels form the thin band (Scene.family's names)


@dataclass
class SceneBatch:
    """B scenes as padded tensors on one device. Per-kind tables hold one row per slot; `gid` is the
    primitive's index in its scene (-1: a padding slot), so ties go to the primitive drawn first."""
    cam: dict[str, torch.Tensor]  # R [B,3,3] f64, origin [B,3] f64, f [B,4] f64 (fx, fy, cx, cy)
    prims: dict[str, dict[str, torch.Tensor]]  # "plane" | "box" | "sphere" | "cyl" -> name -> [B,S,...]
    gid_kind: torch.Tensor  # [B,G]: the kind (index in PRIM_KINDS) of each scene's primitive gid
    gid_slot: torch.Tensor  # [B,G]: its slot in that kind's table
    gid_thin: torch.Tensor  # [B,G] bool: the primitive is a thin structure or a small object (THIN_FAMILIES)
    mats: dict[str, torch.Tensor]  # kind [B,M] int, c1 c2 [B,M,3], period32 period3 freq32 [B,M], tile [B,M] int
    tiles: torch.Tensor  # [B,T,TILE*TILE] float32
    light: torch.Tensor  # [B,3] f64: the point light, or the direction toward the sun
    sun: torch.Tensor  # [B] bool
    ambient: torch.Tensor  # [B] float32
    sky: torch.Tensor  # [B] bool
    extent: torch.Tensor  # [B] float64: a room's diagonal (how far a shadow reaches), 0 outdoors

    @property
    def device(self) -> torch.device:
        return self.light.device

    @property
    def size(self) -> int:
        return self.light.shape[0]


# ----------------------------------------------------------------------------- packing (host, float64)
def _prim_rows(kind: str, prim, origin: np.ndarray, gid: int) -> dict[str, list[float]]:
    """One slot's parameters: geometry plus the camera-relative terms, exact in float64."""
    o = origin
    if kind == "plane":
        n = np.asarray(prim.n, np.float64)
        num = prim.offset - sum(n[i] * o[i] for i in range(3) if n[i] != 0.0)
        return dict(n=list(n), num=[num], offset=[prim.offset], e1=list(prim.e1), e2=list(prim.e2), max_t=[prim.max_t])
    if kind == "box":
        R = prim.R
        oc = [o[i] - prim.c[i] for i in range(3)]
        ol = [R[0][a] * oc[0] + R[1][a] * oc[1] + R[2][a] * oc[2] for a in range(3)] if prim.yaw != 0.0 else oc
        h = list(prim.h)
        return dict(c=list(prim.c), h=h, R=list(R.reshape(-1)), lo=[-h[a] - ol[a] for a in range(3)],
                    hi=[h[a] - ol[a] for a in range(3)], cxz=[prim.c[0] + prim.c[2]], yaw=[R[0][0], R[0][2]])
    if kind == "sphere":
        oc = [o[i] - prim.c[i] for i in range(3)]
        return dict(c=list(prim.c), r=[prim.r], r2=[prim.r * prim.r], oc=oc, cc=[sum(x * x for x in oc) - prim.r * prim.r])
    ox, oz = o[0] - prim.c[0], o[2] - prim.c[2]
    y0, y1 = prim.c[1], prim.c[1] + prim.height
    return dict(c=list(prim.c), r=[prim.r], r2=[prim.r * prim.r], height=[prim.height], oxz=[ox, oz],
                cc=[ox * ox + oz * oz - prim.r * prim.r], oy=[o[1]], y01=[y0, y1], y01_rel=[y0 - o[1], y1 - o[1]],
                r_cap=[prim.r * (1 - 1e-4)], half_height=[0.5 * prim.height])


_PAD = {"plane": dict(n=[0.0, 0.0, 0.0], num=[0.0], offset=[0.0], e1=[0.0] * 3, e2=[0.0] * 3, max_t=[0.0]),
        "box": dict(c=[0.0] * 3, h=[0.0] * 3, R=[1.0, 0, 0, 0, 1, 0, 0, 0, 1], lo=[0.0] * 3, hi=[0.0] * 3, cxz=[0.0],
                    yaw=[1.0, 0.0]),
        "sphere": dict(c=[0.0] * 3, r=[0.0], r2=[0.0], oc=[0.0] * 3, cc=[1.0]),
        "cyl": dict(c=[0.0] * 3, r=[0.0], r2=[0.0], height=[0.0], oxz=[0.0, 0.0], cc=[1.0], oy=[0.0], y01=[0.0, 0.0],
                    y01_rel=[0.0, 0.0], r_cap=[0.0], half_height=[0.0])}


def kind_of(prim) -> str:
    return {"Plane": "plane", "Box": "box", "Sphere": "sphere", "Cylinder": "cyl"}[type(prim).__name__]


def pack(scenes: list, device: torch.device | str = "cpu") -> SceneBatch:
    """[(Scene, Camera)] -> a SceneBatch on device (primitive tables padded to the batch's largest)."""
    B = len(scenes)
    rows: dict[str, list[list[dict]]] = {k: [[] for _ in range(B)] for k in _PAD}
    meta: dict[str, list[list[tuple[int, int, bool]]]] = {k: [[] for _ in range(B)] for k in _PAD}
    for b, (sc, cam) in enumerate(scenes):
        for gid, prim in enumerate(sc.prims):
            k = kind_of(prim)
            rows[k][b].append(_prim_rows(k, prim, cam.origin, gid))
            meta[k][b].append((gid, prim.mat, bool(prim.casts_shadow)))
    prims = {}
    for k, per in rows.items():
        S = max(1, max(len(r) for r in per))
        table = {}
        for name in _PAD[k]:
            vals = [[r[name] for r in per[b]] + [_PAD[k][name]] * (S - len(per[b])) for b in range(B)]
            table[name] = torch.tensor(vals, dtype=torch.float64)
        # float32 copies, one contiguous column [B*S] per number: what the intersections gather per ray
        table.update({f"{name}.{i}": table[name][..., i].to(torch.float32).reshape(-1).contiguous()
                      for name in _PAD[k] for i in range(len(_PAD[k][name]))})
        table["gid"] = torch.tensor([[m[0] for m in meta[k][b]] + [-1] * (S - len(meta[k][b])) for b in range(B)])
        table["mat"] = torch.tensor([[m[1] for m in meta[k][b]] + [0] * (S - len(meta[k][b])) for b in range(B)])
        table["shadow"] = torch.tensor([[m[2] for m in meta[k][b]] + [False] * (S - len(meta[k][b])) for b in range(B)])
        prims[k] = {n: t.to(device) for n, t in table.items()}
    G = max(len(sc.prims) for sc, _ in scenes)
    gid_kind = torch.zeros((B, G), dtype=torch.long)
    gid_slot = torch.zeros((B, G), dtype=torch.long)
    gid_thin = torch.zeros((B, G), dtype=torch.bool)
    for b, (sc, _) in enumerate(scenes):
        for gid, family in getattr(sc, "family", {}).items():
            gid_thin[b, gid] = family in THIN_FAMILIES
    for k, per in meta.items():
        for b, slots in enumerate(per):
            for s, (gid, _, _) in enumerate(slots):
                gid_kind[b, gid], gid_slot[b, gid] = PRIM_KINDS.index(k), s
    M = max(len(sc.mats) for sc, _ in scenes)
    tiles_of = [_tiles_of(sc) for sc, _ in scenes]
    T = max(1, max(len(t) for t in tiles_of))
    mat_rows = []
    for (sc, _), tl in zip(scenes, tiles_of):
        ids = {id(t): i for i, t in enumerate(tl)}
        r = [(KINDS.index(m.kind), list(m.c1), list(m.c2), m.period, ids[id(m.tile)] if m.tile is not None else -1)
             for m in sc.mats]
        mat_rows.append(r + [(0, [0.0] * 3, [0.0] * 3, 1.0, -1)] * (M - len(r)))
    tiles = np.zeros((B, T, TILE * TILE), np.float32)
    for b, tl in enumerate(tiles_of):
        for i, t in enumerate(tl):
            tiles[b, i] = t.reshape(-1)
    mats = dict(kind=torch.tensor([[m[0] for m in r] for r in mat_rows]),
                c1=torch.tensor([[m[1] for m in r] for r in mat_rows], dtype=torch.float32),
                c2=torch.tensor([[m[2] for m in r] for r in mat_rows], dtype=torch.float32),
                period32=torch.tensor([[m[3] for m in r] for r in mat_rows], dtype=torch.float32),
                period3=torch.tensor([[3.0 * m[3] for m in r] for r in mat_rows], dtype=torch.float32),
                freq32=torch.tensor([[2 * math.pi / m[3] for m in r] for r in mat_rows], dtype=torch.float32),
                tile=torch.tensor([[m[4] for m in r] for r in mat_rows]))
    cam = dict(R=torch.tensor(np.stack([c.R for _, c in scenes]), dtype=torch.float64),
               origin=torch.tensor(np.stack([c.origin for _, c in scenes]), dtype=torch.float64),
               f=torch.tensor([[c.fx, c.fy, c.cx, c.cy] for _, c in scenes], dtype=torch.float64))
    return SceneBatch({k: v.to(device) for k, v in cam.items()}, prims, gid_kind.to(device), gid_slot.to(device),
                      gid_thin.to(device), {k: v.to(device) for k, v in mats.items()},
                      torch.from_numpy(tiles).to(device),
                      torch.tensor(np.stack([sc.light for sc, _ in scenes]), dtype=torch.float64, device=device),
                      torch.tensor([sc.sun for sc, _ in scenes], device=device),
                      torch.tensor([sc.ambient for sc, _ in scenes], dtype=torch.float32, device=device),
                      torch.tensor([sc.sky for sc, _ in scenes], device=device),
                      torch.tensor([sc.extent for sc, _ in scenes], dtype=torch.float64, device=device))


def _tiles_of(sc) -> list[np.ndarray]:
    out, seen = [], set()
    for m in sc.mats:
        if m.tile is not None and id(m.tile) not in seen:
            seen.add(id(m.tile))
            out.append(m.tile)
    return out


# ----------------------------------------------------------------------------- intersections
# Every function takes ray directions d (3 tensors [B,1,N] or broadcastable), slot parameters
# [B,S,1] and returns t [B,S,N] float32 (inf where missed) of the nearest hit with t > EPS.
def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


def _near_root(a, b, c):
    """Nearer root of a t^2 + 2 b t + c = 0 where it is > EPS, else inf."""
    t = (-b - torch.sqrt(b * b - a * c)) / a  # nan where the discriminant is negative
    return torch.where(t > EPS, t, INF)


def _plane_t(d, num, n, max_t):
    nd = d[0] * n[0] + d[1] * n[1] + d[2] * n[2]
    t = num / nd
    return torch.where((t > EPS) & (t < max_t), t, INF)


def _box_t(d, lo, hi, cs, sn):
    """Slab test in the box's frame (a yaw of cos cs, sin sn about the vertical): lo/hi (x3) are
    (-h - o_local), (h - o_local). fmin / fmax semantics (a NaN from 0 x inf loses), in fast ops."""
    tn = tf = None
    for a, along in enumerate(_local(d, cs, sn)):
        inv = 1.0 / along
        t1, t2 = lo[a] * inv, hi[a] * inv
        t1, t2 = torch.where(t1 != t1, t2, t1), torch.where(t2 != t2, t1, t2)
        near, far = torch.minimum(t1, t2), torch.maximum(t1, t2)
        tn = near if tn is None else torch.maximum(tn, near)
        tf = far if tf is None else torch.minimum(tf, far)
    return torch.where((tn <= tf) & (tn > EPS), tn, INF)


def _local(x, cs, sn):
    """A world vector (3 components) in a box's frame: R^T x for R = [[cs, 0, sn], [0, 1, 0], [-sn, 0, cs]],
    summed as the full product would be (the zero terms add nothing)."""
    return [cs * x[0] + -sn * x[2], x[1], sn * x[0] + cs * x[2]]


def _sphere_t(d, dd, oc, cc):
    return _near_root(dd, d[0] * oc[0] + d[1] * oc[1] + d[2] * oc[2], cc)


def _cyl_t(d, ox, oz, cc, r2, oy, y0, y1, y0_rel, y1_rel):
    """Vertical capped cylinder. ox, oz: the origin relative to the axis; oy: the origin's height;
    y0, y1: the caps' heights; y0_rel, y1_rel: the same relative to the origin."""
    a = d[0] * d[0] + d[2] * d[2]
    best = _near_root(a, d[0] * ox + d[2] * oz, cc)  # side
    ys = oy + best * d[1]
    best = torch.where((ys >= y0) & (ys <= y1), best, INF)
    inv = 1.0 / d[1]
    for yc in (y0_rel, y1_rel):  # caps
        tc = yc * inv
        xc, zc = ox + tc * d[0], oz + tc * d[2]
        best = torch.where((tc > EPS) & (xc * xc + zc * zc <= r2) & (tc < best), tc, best)
    return best


def _g(p: dict[str, torch.Tensor], name: str, own: torch.Tensor, i: int = 0) -> torch.Tensor:
    """Number i of parameter `name` of a kind's table p at flat slot indices own [L] (b * S + s) -> [L] float32."""
    return p[f"{name}.{i}"].index_select(0, own)


def _camera_hits(batch: SceneBatch, kind: str, own: torch.Tensor, d, dd) -> torch.Tensor:
    """t [L] of camera rays d (3 x [L]) against the slots own [L] of one kind (camera-relative terms
    from the host)."""
    p = batch.prims[kind]
    if kind == "plane":
        return _plane_t(d, _g(p, "num", own), [_g(p, "n", own, i) for i in range(3)], _g(p, "max_t", own))
    if kind == "box":
        return _box_t(d, [_g(p, "lo", own, a) for a in range(3)], [_g(p, "hi", own, a) for a in range(3)],
                      _g(p, "yaw", own, 0), _g(p, "yaw", own, 1))
    if kind == "sphere":
        return _sphere_t(d, dd, [_g(p, "oc", own, i) for i in range(3)], _g(p, "cc", own))
    return _cyl_t(d, _g(p, "oxz", own, 0), _g(p, "oxz", own, 1), _g(p, "cc", own), _g(p, "r2", own), _g(p, "oy", own),
                  _g(p, "y01", own, 0), _g(p, "y01", own, 1), _g(p, "y01_rel", own, 0), _g(p, "y01_rel", own, 1))


def _shadow_hits(batch: SceneBatch, kind: str, own: torch.Tensor, o, d, dd) -> torch.Tensor:
    """t [L] of rays from surface points o (3 x [L] float32) along d against the slots own [L]."""
    p = batch.prims[kind]
    oc = [o[i] - _g(p, "c", own, i) for i in range(3)]
    if kind == "box":
        cs, sn = _g(p, "yaw", own, 0), _g(p, "yaw", own, 1)
        h = [_g(p, "h", own, a) for a in range(3)]
        ol = _local(oc, cs, sn)
        return _box_t(d, [-h[a] - ol[a] for a in range(3)], [h[a] - ol[a] for a in range(3)], cs, sn)
    r2 = _g(p, "r2", own)
    if kind == "sphere":
        return _sphere_t(d, dd, oc, oc[0] * oc[0] + oc[1] * oc[1] + oc[2] * oc[2] - r2)
    y0, y1 = _g(p, "y01", own, 0), _g(p, "y01", own, 1)
    return _cyl_t(d, oc[0], oc[2], oc[0] * oc[0] + oc[2] * oc[2] - r2, r2, o[1], y0, y1, y0 - o[1], y1 - o[1])


# ----------------------------------------------------------------------------- culling
# A primitive is tested only at the pixels of the screen rectangle its bounding box (or, for a
# shadow, the region it can shade) projects to: (scene, slot, pixel) triples, built without a
# Python loop over primitives, and the nearest hit per pixel by scatter_reduce.
_SIGNS = torch.tensor([[i, j, k] for i in (-1.0, 1.0) for j in (-1.0, 1.0) for k in (-1.0, 1.0)], dtype=torch.float64)


def corners(batch: SceneBatch, kind: str) -> torch.Tensor | None:
    """World corners [B,S,8,3] float64 of each slot's bounding box (None for unbounded planes)."""
    p = batch.prims[kind]
    s = _SIGNS.to(batch.device)
    if kind == "box":
        R = p["R"].view(*p["R"].shape[:2], 3, 3)
        return p["c"][:, :, None] + torch.einsum("bsij,bskj->bski", R, s * p["h"][:, :, None])
    if kind == "sphere":
        return p["c"][:, :, None] + s * p["r"][:, :, None]
    if kind == "cyl":
        half = torch.cat([p["r"], 0.5 * p["height"], p["r"]], -1)  # the axis runs from c_y up by height
        mid = p["c"] + torch.cat([torch.zeros_like(p["r"]), 0.5 * p["height"], torch.zeros_like(p["r"])], -1)
        return mid[:, :, None] + s * half[:, :, None]
    return None


def screen_rects(batch: SceneBatch, pts: torch.Tensor | None, H: int, W: int, S: int) -> torch.Tensor:
    """Pixel rectangles [B,S,4] (r0, r1, c0, c1) covering the projection of the convex hull of the
    world points pts [B,S,P,3] (exact for points in front of the camera; the whole image when some
    point is near or behind the camera plane, or when pts is None); empty ones have r0 >= r1."""
    B = batch.size
    whole = torch.tensor([0, H, 0, W], device=batch.device).expand(B, S, 4)
    if pts is None:
        return whole
    R, o, f = batch.cam["R"], batch.cam["origin"], batch.cam["f"]
    pc = torch.einsum("bspi,bij->bspj", pts - o[:, None, None], R)  # camera coordinates
    z = pc[..., 2]
    with torch.no_grad():
        u = f[:, 0, None, None] * pc[..., 0] / z + f[:, 2, None, None]
        v = f[:, 1, None, None] * pc[..., 1] / z + f[:, 3, None, None]
    behind = (z <= 1e-3).any(-1)
    u0 = torch.where(behind, 0.0, u.amin(-1)).clamp(-1e9, 1e9)
    u1 = torch.where(behind, 0.0, u.amax(-1)).clamp(-1e9, 1e9)
    v0 = torch.where(behind, 0.0, v.amin(-1)).clamp(-1e9, 1e9)
    v1 = torch.where(behind, 0.0, v.amax(-1)).clamp(-1e9, 1e9)
    c0 = (torch.floor(u0) - 1).clamp(0, W).long()
    c1 = (torch.ceil(u1) + 1).clamp(0, W).long()
    r0 = (torch.floor(v0) - 1).clamp(0, H).long()
    r1 = (torch.ceil(v1) + 1).clamp(0, H).long()
    rect = torch.stack([r0, r1, c0, c1], -1)
    return torch.where(behind[..., None], whole, rect)


def pieces(device: torch.device) -> int:
    """(ray, primitive) pairs per piece of triples() on this device."""
    return ELEMENTS if torch.device(device).type == "cpu" else GPU_ELEMENTS


def triples(rects: torch.Tensor, keep: torch.Tensor, W: int, budget: int = 0):
    """The (flat slot b * S + s, pixel) pairs inside each kept slot's rectangle, in pieces of about
    `budget` pairs (0: one piece): yields (own [L], pixel [L], scene [L])."""
    B, S, _ = rects.shape
    h = (rects[..., 1] - rects[..., 0]).clamp_min(0)
    w = (rects[..., 3] - rects[..., 2]).clamp_min(0)
    area = torch.where(keep, h * w, 0).reshape(-1)
    slots = torch.nonzero(area).squeeze(1)
    if slots.numel() == 0:
        return
    counts = area[slots]
    ends = torch.cumsum(counts, 0)
    total = int(ends[-1])
    marks = torch.arange(budget, total, budget, device=ends.device) if budget and total > budget else ends[:0]
    cuts = [0] + torch.searchsorted(ends, marks).tolist() + [slots.numel()]
    flat = rects.reshape(-1, 4)
    for a, b in zip(cuts[:-1], cuts[1:]):
        if a >= b:
            continue
        sl, cn = slots[a:b], counts[a:b]
        own_local = torch.repeat_interleave(torch.arange(b - a, device=sl.device), cn)
        start = torch.cumsum(cn, 0) - cn
        off = torch.arange(own_local.numel(), device=sl.device) - start.index_select(0, own_local)
        own = sl.index_select(0, own_local)
        r = flat.index_select(0, own)
        width = r[:, 3] - r[:, 2]
        pixel = (r[:, 0] + torch.div(off, width, rounding_mode="floor")) * W + r[:, 2] + off % width
        yield own, pixel, torch.div(own, S, rounding_mode="floor")


# ----------------------------------------------------------------------------- casting
def camera_rays(batch: SceneBatch, H: int, W: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """World directions through every pixel centre, camera z = 1: 3 x [B,H*W] float32, and |d|^2."""
    dev, f = batch.device, batch.cam["f"]
    a = (torch.arange(W, dtype=torch.float64, device=dev) + 0.5 - f[:, 2:3]) / f[:, 0:1]  # [B,W]
    b = (torch.arange(H, dtype=torch.float64, device=dev) + 0.5 - f[:, 3:4]) / f[:, 1:2]  # [B,H]
    R = batch.cam["R"]
    d = [_f32(R[:, i, 0, None, None] * a[:, None, :] + (R[:, i, 1, None, None] * b[:, :, None] + R[:, i, 2, None, None]))
         .reshape(-1, H * W) for i in range(3)]
    return d, d[0] * d[0] + d[1] * d[1] + d[2] * d[2]


def cast(batch: SceneBatch, H: int, W: int):
    """Nearest hit of every pixel's ray: t [B,N] float32 (inf = none), kind index [B,N] (-1 = none),
    slot [B,N] within its kind's table, thin [B,N] bool (the hit is of THIN_FAMILIES), and the rays
    (3 x [B,N] directions, |d|^2)."""
    d, dd = camera_rays(batch, H, W)
    B, N = batch.size, H * W
    dev = batch.device
    flat_d, flat_dd = [x.reshape(-1) for x in d], dd.reshape(-1)
    # one int64 key per hit: t's bits (a positive float32 orders as its bits do) above the primitive's
    # index in its scene, so the smallest key is the nearest hit and, on a tie, the primitive drawn first
    none = torch.iinfo(torch.long).max
    best = _plane_keys(batch, d, none).reshape(-1)
    for kind in PRIM_KINDS[1:]:  # bounded primitives: only the rays inside their screen rectangles
        p = batch.prims[kind]
        S = p["gid"].shape[1]
        rects = screen_rects(batch, corners(batch, kind), H, W, S)
        gid = p["gid"].reshape(-1)
        for own, pixel, scene in triples(rects, p["gid"] >= 0, W, pieces(dev)):
            ray = scene * N + pixel
            t = _camera_hits(batch, kind, own, [x.index_select(0, ray) for x in flat_d], flat_dd.index_select(0, ray))
            found = torch.nonzero(t < INF).squeeze(1)
            key = _key(t.index_select(0, found), gid.index_select(0, own.index_select(0, found)))
            best.scatter_reduce_(0, ray.index_select(0, found), key, "amin")
    hit = best != none
    t = torch.where(hit, (best >> GID_BITS).to(torch.int32).view(torch.float32), INF)  # _key undone
    g = torch.where(hit, best & ((1 << GID_BITS) - 1), 0).view(B, N)
    kind_idx = torch.where(hit.view(B, N), torch.gather(batch.gid_kind, 1, g), -1)
    thin = hit.view(B, N) & torch.gather(batch.gid_thin, 1, g)
    return t.view(B, N), kind_idx, torch.gather(batch.gid_slot, 1, g), thin, (d, dd)


GID_BITS = 16  # primitives per scene < 65536


def _key(t: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    return (t.view(torch.int32).long() << GID_BITS) | gid


def _plane_keys(batch: SceneBatch, d: list[torch.Tensor], none: int) -> torch.Tensor:
    """[B,N] the smallest hit key over the (unbounded) planes: every ray against every plane slot."""
    p = batch.prims["plane"]
    B, S = p["gid"].shape
    N = d[0].shape[1]
    best = torch.full((B, N), none, dtype=torch.long, device=batch.device)
    dr = [x[:, None, :] for x in d]
    step = max(1, DENSE_ELEMENTS // max(1, B * N))
    for s0 in range(0, S, step):
        sl = slice(s0, min(S, s0 + step))

        def col(name, i=0):
            return p[f"{name}.{i}"].view(B, S)[:, sl, None]
        t = _plane_t(dr, col("num"), [col("n", i) for i in range(3)], col("max_t"))  # [B,s,N]
        gid = p["gid"][:, sl]
        t = torch.where(gid[:, :, None] >= 0, t, INF)
        tmin, arg = t.min(dim=1)  # the first slot on a tie: slots are in drawing order
        key = torch.where(tmin < INF, _key(tmin, torch.gather(gid, 1, arg)), none)
        best = torch.minimum(best, key)
    return best
def _at(table: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """Per-pixel rows of a slot table: table [B,S(,k)], slot [B,N] -> [B,N(,k)]."""
    if table.ndim == 2:
        return torch.gather(table, 1, slot)
    return torch.gather(table, 1, slot.unsqueeze(-1).expand(-1, -1, table.shape[-1]))


def surface(batch: SceneBatch, kind_idx: torch.Tensor, slot: torch.Tensor, P: list[torch.Tensor]):
    """Outward normal (3 x [B*N]), texture coordinates u, v (meters) and material [B*N] at the hit
    points P (3 x [B*N]); each kind is computed at its own pixels only."""
    B, N = slot.shape
    dev = batch.device
    n = [torch.zeros(B * N, device=dev) for _ in range(3)]
    u, v = torch.zeros(B * N, device=dev), torch.zeros(B * N, device=dev)
    mat = torch.zeros(B * N, dtype=torch.long, device=dev)
    scene = torch.arange(B, device=dev).repeat_interleave(N)
    for ki, kind in enumerate(PRIM_KINDS):
        px = torch.nonzero(kind_idx.reshape(-1) == ki).squeeze(1)
        if px.numel() == 0:
            continue
        p = batch.prims[kind]
        S = p["gid"].shape[1]
        own = scene.index_select(0, px) * S + slot.reshape(-1).index_select(0, px)
        Pk = [x.index_select(0, px) for x in P]
        nk, uk, vk = _surface(kind, p, own, Pk)
        for i in range(3):
            n[i].index_copy_(0, px, nk[i])
        u.index_copy_(0, px, uk)
        v.index_copy_(0, px, vk)
        mat.index_copy_(0, px, p["mat"].reshape(-1).index_select(0, own))
    return n, u, v, mat


def _surface(kind: str, p: dict[str, torch.Tensor], own: torch.Tensor, P: list[torch.Tensor]):
    """Normal, u, v of hit points P (3 x [L]) on the slots own [L] of one kind."""
    if kind == "plane":
        e1, e2 = [_g(p, "e1", own, i) for i in range(3)], [_g(p, "e2", own, i) for i in range(3)]
        return ([_g(p, "n", own, i) for i in range(3)], e1[0] * P[0] + e1[1] * P[1] + e1[2] * P[2],
                e2[0] * P[0] + e2[1] * P[1] + e2[2] * P[2])
    c = [_g(p, "c", own, i) for i in range(3)]
    rel = [P[i] - c[i] for i in range(3)]
    if kind == "box":
        R = [[_g(p, "R", own, 3 * i + a) for a in range(3)] for i in range(3)]
        pl = [R[0][a] * rel[0] + R[1][a] * rel[1] + R[2][a] * rel[2] for a in range(3)]  # local = R^T rel
        q = [pl[a].abs() / _g(p, "h", own, a) for a in range(3)]
        ax = torch.where(q[1] > q[0], 1, 0)  # the axis of the largest ratio, the first on a tie
        ax = torch.where(q[2] > torch.maximum(q[0], q[1]), 2, ax)
        nl = [torch.where(ax == a, torch.sign(pl[a]), 0.0) for a in range(3)]
        normal = [R[i][0] * nl[0] + R[i][1] * nl[1] + R[i][2] * nl[2] for i in range(3)]
        # texture coordinates: the two other local axes (horizontal first, then height)
        return normal, torch.where(ax == 0, pl[2], pl[0]) + _g(p, "cxz", own), torch.where(ax == 1, pl[2], pl[1])
    r = _g(p, "r", own)
    if kind == "sphere":
        normal = [rel[i] / r for i in range(3)]
        return normal, r * torch.atan2(normal[2], normal[0]), r * torch.asin(normal[1].clamp(-1, 1))
    on_cap = torch.hypot(rel[0], rel[2]) < _g(p, "r_cap", own)  # side points lie at rad == r up to rounding
    cap_y = torch.where(rel[1] > _g(p, "half_height", own), 1.0, -1.0)
    normal = [torch.where(on_cap, 0.0, rel[0] / r), torch.where(on_cap, cap_y, 0.0), torch.where(on_cap, 0.0, rel[2] / r)]
    return normal, torch.where(on_cap, P[0], r * torch.atan2(rel[2], rel[0])), torch.where(on_cap, P[2], rel[1])


def value_noise(flat: torch.Tensor, base: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Bilinear lookup of periodic random tiles: flat [B,T*TILE*TILE] (every tile of a scene), base
    [B,N] the offset of each pixel's tile in it, x, y [B,N] in tile cells -> [B,N] in [0,1]."""
    T = TILE
    x0, y0 = torch.floor(x), torch.floor(y)
    fx, fy = x - x0, y - y0
    i0 = x0.int() & (T - 1)  # int32: int64 arithmetic is several times slower on the CPU
    j0 = (y0.int() & (T - 1)) * T
    i1, j1 = (i0 + 1) & (T - 1), (j0 + T) & (T * T - 1)
    j0, j1 = j0 + base, j1 + base

    def at(j, i):
        return torch.gather(flat, 1, (j + i).long())
    top = at(j0, i0)
    top = top + (at(j0, i1) - top) * fx
    bot = at(j1, i0)
    bot = bot + (at(j1, i1) - bot) * fx
    return top + (bot - top) * fy


def albedo(batch: SceneBatch, mat: torch.Tensor, u, v, footprint) -> list[torch.Tensor]:
    """RGB albedo (3 x [B,N]) of each pixel's material at (u, v), faded where the footprint (meters
    per pixel) exceeds half a period."""
    m = batch.mats
    kind = torch.gather(m["kind"], 1, mat)
    s = torch.gather(m["period32"], 1, mat)
    tile = torch.gather(m["tile"], 1, mat)
    flat = batch.tiles.reshape(batch.size, -1)
    base = (tile.clamp_min(0) * (TILE * TILE)).int()
    us, vs = u / s, v / s
    fu, fv = us - torch.floor(us), vs - torch.floor(vs)
    road = kind == KINDS.index("road")
    p = torch.zeros_like(u)
    p = torch.where(kind == KINDS.index("checker"), torch.remainder(torch.floor(us) + torch.floor(vs), 2.0), p)
    p = torch.where(kind == KINDS.index("stripes"), 0.5 + 0.5 * torch.sin(torch.gather(m["freq32"], 1, mat) * u), p)
    grid = ((fu > 0.25) & (fu < 0.75) & (fv > 0.2) & (fv < 0.7)).float()
    p = torch.where(kind == KINDS.index("grid"), grid, p)
    # "noise" reads the tile at (u, v) / period; "road" is asphalt (the tile at (u, v) / 0.7) with a
    # dashed centre line at u = 0
    noise = value_noise(flat, base, torch.where(road, u / 0.7, us), torch.where(road, v / 0.7, vs))
    p = torch.where(kind == KINDS.index("noise"), noise, p)
    line = (u.abs() < 0.08) & ((v / 6.0 - torch.floor(v / 6.0)) < 0.5)
    p = torch.where(road, torch.where(line, 1.0, 0.25 * noise), p)
    s = torch.where(road, 0.16, s)  # the line's width sets the fade
    contrast = (1.0 - 2.0 * footprint / s).clamp(0.0, 1.0)
    mean = torch.where(road, 0.125, 0.5)
    p = mean + (p - mean) * contrast
    s3 = torch.where(road, 0.48, torch.gather(m["period3"], 1, mat))
    stain = 0.8 + 0.4 * value_noise(flat, base, u / s3 + 7.3, v / s3 + 1.9)
    stain = torch.where(tile >= 0, stain, 1.0)
    c1, c2 = _at(m["c1"], mat), _at(m["c2"], mat)
    return [(c1[..., c] + (c2[..., c] - c1[..., c]) * p) * stain for c in range(3)]


def shadow_hulls(batch: SceneBatch, kind: str) -> torch.Tensor | None:
    """World points [B,S,16,3] whose convex hull holds every surface point a slot can shadow.

    Sun: receivers lie at y >= 0, so on segments from the object down to the ground against the
    light (no bound when the sun is low). Point light: receivers lie inside the room (diameter
    `extent`) on rays from the light through the object, so within a bounded stretch behind it (no
    bound when the light is inside the object's bounding sphere). Unbounded hulls come back as points
    behind the camera, which screen_rects reads as the whole image.
    """
    C = corners(batch, kind)  # [B,S,8,3]
    light = batch.light[:, None, None]  # [B,1,1,3]
    ly = batch.light[:, 1, None, None, None]
    sun_far = C - (C[..., 1:2] / ly.clamp_min(0.05)) * light
    center = C.mean(2, keepdim=True)
    rad = (C - center).norm(dim=-1).amax(-1, keepdim=True)[..., None]  # [B,S,1,1]
    dist = (light - center).norm(dim=-1, keepdim=True)
    lam = 1.0 + batch.extent[:, None, None, None] / (dist - rad).clamp_min(1e-9)
    point_far = light + lam * (C - light)
    sun = batch.sun[:, None, None, None]
    far = torch.where(sun, sun_far, point_far)
    unbounded = torch.where(sun, ly < 0.05, dist <= rad * 1.01)  # [B,S,1,1]
    hull = torch.cat([C, far], 2)
    behind = batch.cam["origin"][:, None, None] - batch.cam["R"][:, None, None, :, 2]  # a point behind the camera
    return torch.where(unbounded, behind.expand_as(hull), hull)


def unshadowed(batch: SceneBatch, origins: list[torch.Tensor], need: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """[B,N] 0 where an object blocks the light from a surface point that `need`s it, else 1."""
    B, N = need.shape
    flat_o = [x.reshape(-1) for x in origins]
    flat_need = need.reshape(-1)
    light64 = batch.light
    blocked = torch.zeros(B * N, dtype=torch.bool, device=batch.device)
    for kind in ("box", "sphere", "cyl"):
        p = batch.prims[kind]
        S = p["gid"].shape[1]
        rects = screen_rects(batch, shadow_hulls(batch, kind), H, W, S)
        for own, pixel, scene in triples(rects, p["shadow"], W, pieces(batch.device)):
            ray = scene * N + pixel
            use = torch.nonzero(flat_need.index_select(0, ray)).squeeze(1)
            own, ray, scene = own.index_select(0, use), ray.index_select(0, use), scene.index_select(0, use)
            o = [x.index_select(0, ray) for x in flat_o]
            sun = batch.sun.index_select(0, scene)
            light = [_f32(light64[:, i].index_select(0, scene)) for i in range(3)]
            d = [torch.where(sun, light[i], light[i] - o[i]) for i in range(3)]  # the point light sits at t = 1
            dd = d[0] * d[0] + d[1] * d[1] + d[2] * d[2]
            t = _shadow_hits(batch, kind, own, o, d, dd)
            hit = t < torch.where(sun, INF, 1.0)
            blocked.index_fill_(0, ray.index_select(0, torch.nonzero(hit).squeeze(1)), True)
    return (~blocked).float().view(B, N)


def cast_and_shade(batch: SceneBatch, H: int, W: int, shadows: bool = True) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """image [B,H,W,3] float32 in [0,1] (gamma 2), z-depth [B,H,W] float32 meters (0 = no hit) and the thin band
    [B,H,W] bool (the pixels whose nearest hit is a thin structure or a small object)."""
    t, kind_idx, slot, thin, (d, dd) = cast(batch, H, W)
    B, N = t.shape
    hit = (kind_idx >= 0).reshape(-1)
    th = torch.where(hit, t.reshape(-1), 0.0)
    dirs = [x.reshape(-1) for x in d]
    ray_len = torch.sqrt(dd.reshape(-1))
    per_pixel = torch.arange(B, device=batch.device).repeat_interleave(N)  # each pixel's scene

    def scene_value(x: torch.Tensor) -> torch.Tensor:  # [B] -> [B*N]
        return x.index_select(0, per_pixel)
    origin = _f32(batch.cam["origin"])
    P = [scene_value(origin[:, i]) + th * dirs[i] for i in range(3)]
    n, u, v, mat = surface(batch, kind_idx, slot, P)
    inv_f = scene_value(_f32(1.0 / batch.cam["f"][:, 0]))
    cos = (n[0] * dirs[0] + n[1] * dirs[1] + n[2] * dirs[2]).abs() / ray_len
    footprint = th * ray_len * inv_f / cos.clamp_min(0.05)  # meters per pixel on the surface
    rgb = albedo(batch, mat.view(B, N), u.view(B, N), v.view(B, N), footprint.view(B, N))
    rgb = [x.reshape(-1) for x in rgb]
    light = [scene_value(_f32(batch.light[:, i])) for i in range(3)]
    sun = scene_value(batch.sun)
    L = [light[i] - P[i] for i in range(3)]
    dist = torch.sqrt(L[0] * L[0] + L[1] * L[1] + L[2] * L[2])
    lit_sun = (light[0] * n[0] + light[1] * n[1] + light[2] * n[2]).clamp_min(0.0)
    lit_point = ((n[0] * L[0] + n[1] * L[1] + n[2] * L[2]) / dist).clamp_min(0.0)
    lit = torch.where(sun, lit_sun, lit_point)
    atten = torch.where(sun, 1.0, 1.6 / (1.0 + (dist * (1 / 6.0)) ** 2))
    if shadows:
        lit = lit * unshadowed(batch, [(P[i] + 1e-3 * n[i]).view(B, N) for i in range(3)], (hit & (lit > 0)).view(B, N),
                               H, W).reshape(-1)
    amb = scene_value(batch.ambient)
    shade = amb + (1.0 - amb) * (lit * atten)
    up = (dirs[1] / ray_len).clamp(0.0, 1.0)
    sky = scene_value(batch.sky)
    img = []
    for c, (base, slope) in enumerate(((0.75, -0.4), (0.85, -0.3), (0.95, -0.05))):
        img.append(torch.where(hit, rgb[c] * shade, torch.where(sky, base + slope * up, 0.0)))
    image = torch.stack(img, -1).clamp(0.0, 1.0).sqrt().view(B, H, W, 3)
    return image, torch.where(hit, t.reshape(-1), 0.0).view(B, H, W), thin.view(B, H, W)
