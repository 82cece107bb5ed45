"""Procedural scenes with exact depth: rooms and streets of planes, boxes, spheres and cylinders.

A scene is drawn deterministically from a numpy Generator (seeded by (seed, split, index)) and
ray-cast exactly in vectorized NumPy: one ray per pixel center through a pinhole camera with known
intrinsics, analytic ray/primitive intersections, the nearest hit wins (occlusion). Depth is the
z-depth along the optical axis in meters (what depth sensors and data sets store); pixels that hit
nothing (the sky) have depth 0.

Monocular cues present in the image: perspective (a real pinhole), texture gradients (procedural
checker / stripes / windows / value-noise textures in surface coordinates in meters, faded where a
pixel's footprint exceeds half a period so far textures do not alias), occlusion, Lambertian shading
from a point light (indoor) or the sun (outdoor), cast shadows from the objects, and sky.

Cost: each primitive is tested only inside the screen rectangle its bounding box projects to, so a
256x256 image takes about 20 ms of one contended core (`python -m depthpack.data` prints the benchmark).

Frames: world y is up. Camera x right, y down, z forward; ray directions have camera z = 1, so the
ray parameter t of a hit IS its z-depth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .config import RIGS

F = np.float32  # ray arrays: exact analytic hits, float32 rounding only (within 2e-6 relative of float64, tested)
EPS = 1e-6
INF = np.inf
SPLIT_IDS = {"train": 0, "val": 1, "test": 2}


# ----------------------------------------------------------------------------- camera
@dataclass
class Camera:
    fx: float
    fy: float
    cx: float
    cy: float
    R: np.ndarray  # [3,3] camera -> world, columns = right, down, forward
    origin: np.ndarray  # [3] world position

    @property
    def K(self) -> np.ndarray:
        return np.array([[self.fx, 0, self.cx], [0, self.fy, self.cy], [0, 0, 1]], dtype=np.float32)

    def rays(self, H: int, W: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """World directions through every pixel center, camera z = 1: three [H,W] arrays."""
        a = (np.arange(W, dtype=np.float64) + 0.5 - self.cx) / self.fx  # [W]
        b = (np.arange(H, dtype=np.float64) + 0.5 - self.cy) / self.fy  # [H]
        R = self.R
        return tuple(R[i, 0] * a[None, :] + (R[i, 1] * b[:, None] + R[i, 2]) for i in range(3))

    def project(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """World points [n,3] -> pixel (u, v) and camera z."""
        pc = (pts - self.origin) @ self.R  # [n,3] camera coords
        z = pc[:, 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.fx * pc[:, 0] / z + self.cx, self.fy * pc[:, 1] / z + self.cy, z


def look_camera(origin, yaw: float, pitch: float, roll: float, hfov: float, H: int, W: int) -> Camera:
    """Pinhole camera at origin; yaw about world up (0 looks along +z), pitch > 0 looks down."""
    fwd = np.array([math.sin(yaw) * math.cos(pitch), -math.sin(pitch), math.cos(yaw) * math.cos(pitch)])
    up = np.array([0.0, 1.0, 0.0])
    right = np.cross(fwd, up)
    right /= np.linalg.norm(right)
    down = np.cross(fwd, right)
    c, s = math.cos(roll), math.sin(roll)
    right, down = c * right + s * down, -s * right + c * down
    f = 0.5 * W / math.tan(0.5 * hfov)
    return Camera(f, f, 0.5 * W, 0.5 * H, np.stack([right, down, fwd], axis=1), np.asarray(origin, dtype=np.float64))


# ----------------------------------------------------------------------------- materials
@dataclass
class Material:
    """Albedo = mix(c1, c2, pattern(u, v)) x a low-frequency noise stain; u, v in meters."""
    kind: str  # "plain" | "checker" | "stripes" | "grid" | "noise" | "road"
    c1: np.ndarray
    c2: np.ndarray
    period: float = 1.0
    tile: np.ndarray | None = None  # [T,T] value-noise tile in [0,1]

    def albedo(self, u: np.ndarray, v: np.ndarray, footprint: np.ndarray) -> np.ndarray:
        s = self.period
        k = self.kind
        if k == "checker":
            p = ((np.floor(u / s) + np.floor(v / s)) % 2).astype(F)
        elif k == "stripes":
            p = 0.5 + 0.5 * np.sin((2 * math.pi / s) * u)
        elif k == "grid":  # windows / tiles: a rectangle in each cell
            fu, fv = u / s - np.floor(u / s), v / s - np.floor(v / s)
            p = ((fu > 0.25) & (fu < 0.75) & (fv > 0.2) & (fv < 0.7)).astype(F)
        elif k == "noise":
            p = value_noise(self.tile, u / s, v / s)
        elif k == "road":  # asphalt with a dashed center line at u = 0
            line = (np.abs(u) < 0.08) & ((v / 6.0 - np.floor(v / 6.0)) < 0.5)
            p = np.where(line, 1.0, 0.25 * value_noise(self.tile, u / 0.7, v / 0.7))
            s = 0.16  # the line's width sets the fade
        else:
            p = np.zeros_like(u)
        contrast = np.clip(1.0 - 2.0 * footprint / s, 0.0, 1.0)  # fade what the pixel cannot resolve
        mean = 0.125 if k == "road" else 0.5
        p = mean + (p - mean) * contrast
        stain = 0.8 + 0.4 * value_noise(self.tile, u / (3.0 * s) + 7.3, v / (3.0 * s) + 1.9) if self.tile is not None else 1.0
        c1, c2 = self.c1.astype(F), self.c2.astype(F)
        rgb = c1[:, None] + (c2 - c1)[:, None] * p[None, :]  # [3,n]
        return rgb * stain[None, :] if self.tile is not None else rgb


def value_noise(tile: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bilinear lookup of a periodic random tile [T,T] (T a power of two): smooth noise in [0,1]."""
    T = tile.shape[0]
    flat = tile.ravel()
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = (x - x0).astype(F), (y - y0).astype(F)
    i0 = x0.astype(np.int32) & (T - 1)
    j0 = (y0.astype(np.int32) & (T - 1)) * T
    i1, j1 = (i0 + 1) & (T - 1), (j0 + T) & (T * T - 1)
    top = flat.take(j0 + i0)
    top += (flat.take(j0 + i1) - top) * fx
    bot = flat.take(j1 + i0)
    bot += (flat.take(j1 + i1) - bot) * fx
    return top + (bot - top) * fy


# ----------------------------------------------------------------------------- primitives
# hit(o, r): o = ray origin (3 python floats for camera rays, 3 arrays for shadow rays); r = Rays.
# Returns t (float32, inf where missed) of the nearest intersection with t > EPS. surface(P) gives the
# outward normal [3,n] and texture coordinates (meters) at hit points P [3,n] (channel-first: numpy is
# slow on a trailing axis of 3).
@dataclass
class Rays:
    d: tuple  # 3 arrays: direction components
    inv: tuple  # 3 arrays: 1 / d (inf where d == 0)
    dd: np.ndarray  # |d|^2

    @staticmethod
    def of(d) -> "Rays":
        d = tuple(np.asarray(di, dtype=F) for di in d)
        with np.errstate(divide="ignore"):
            inv = tuple(np.float32(1.0) / di for di in d)
        return Rays(d, inv, d[0] * d[0] + d[1] * d[1] + d[2] * d[2])

    def sub(self, sl) -> "Rays":
        return Rays(tuple(x[sl] for x in self.d), tuple(x[sl] for x in self.inv), self.dd[sl])


def _miss_to_inf(t: np.ndarray, hit: np.ndarray) -> np.ndarray:
    np.copyto(t, np.float32(INF), where=~hit)
    return t


def _near_root(a, b, c):
    """Nearer root t of a t^2 + 2 b t + c = 0 if it is > EPS, else inf (the origin is outside)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (-b - np.sqrt(b * b - a * c)) / a  # nan where the discriminant is negative
        return _miss_to_inf(t, t > EPS)


@dataclass
class Plane:
    """n . p = offset; n faces the camera side. e1, e2: texture axes (meters)."""
    n: np.ndarray
    offset: float
    e1: np.ndarray
    e2: np.ndarray
    mat: int
    max_t: float = INF
    casts_shadow: bool = False

    def corners(self):
        return None  # unbounded: tested over the whole image

    def hit(self, o, r: Rays):
        n = [float(x) for x in self.n]
        nd = sum(n[i] * r.d[i] for i in range(3) if n[i] != 0.0)
        no = sum(n[i] * o[i] for i in range(3) if n[i] != 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.offset - no) / nd
            return _miss_to_inf(t, (t > EPS) & (t < self.max_t))

    def surface(self, P):
        n = np.broadcast_to(self.n.astype(F)[:, None], P.shape)
        return n, self.e1.astype(F) @ P, self.e2.astype(F) @ P


@dataclass
class Box:
    """Box with half sizes h, rotated by yaw about the vertical axis through its center c."""
    c: np.ndarray
    h: np.ndarray
    yaw: float
    mat: int
    casts_shadow: bool = True
    R: np.ndarray = field(init=False)  # local -> world

    def __post_init__(self):
        cs, sn = math.cos(self.yaw), math.sin(self.yaw)
        self.R = np.array([[cs, 0, sn], [0, 1, 0], [-sn, 0, cs]])

    def corners(self):
        s = np.array([[i, j, k] for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)], dtype=np.float64)
        return self.c + (s * self.h) @ self.R.T

    def hit(self, o, r: Rays):
        R = self.R.tolist()
        c, h = self.c.tolist(), self.h.tolist()
        oc = [o[i] - c[i] for i in range(3)]
        tn = tf = None
        with np.errstate(divide="ignore", invalid="ignore"):
            for a in range(3):  # slab test in local coordinates (R's columns are the local axes)
                if self.yaw == 0.0:
                    ol, inv = oc[a], r.inv[a]
                else:
                    ol = R[0][a] * oc[0] + R[1][a] * oc[1] + R[2][a] * oc[2]
                    inv = np.float32(1.0) / (R[0][a] * r.d[0] + R[1][a] * r.d[1] + R[2][a] * r.d[2])
                t1 = (-h[a] - ol) * inv
                t2 = (h[a] - ol) * inv
                lo, hi = np.fmin(t1, t2), np.fmax(t1, t2)
                tn = lo if tn is None else np.fmax(tn, lo, out=tn)
                tf = hi if tf is None else np.fmin(tf, hi, out=tf)
            return _miss_to_inf(tn, (tn <= tf) & (tn > EPS))

    def surface(self, P):
        R = self.R.astype(F)
        pl = R.T @ (P - self.c.astype(F)[:, None])  # [3,n] local
        ax = np.argmax(np.abs(pl) / self.h.astype(F)[:, None], axis=0)
        nl = np.zeros_like(pl)
        cols = np.arange(pl.shape[1])
        nl[ax, cols] = np.sign(pl[ax, cols])
        # texture coords: the two other local axes (horizontal first, then height)
        u = np.where(ax == 0, pl[2], pl[0]) + F(self.c[0] + self.c[2])
        v = np.where(ax == 1, pl[2], pl[1])
        return R @ nl, u, v


@dataclass
class Sphere:
    c: np.ndarray
    r: float
    mat: int
    casts_shadow: bool = True

    def corners(self):
        s = np.array([[i, j, k] for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)], dtype=np.float64)
        return self.c + s * self.r

    def hit(self, o, r: Rays):
        c = self.c.tolist()
        oc = [o[i] - c[i] for i in range(3)]
        b = r.d[0] * oc[0] + r.d[1] * oc[1] + r.d[2] * oc[2]
        cc = oc[0] * oc[0] + oc[1] * oc[1] + oc[2] * oc[2] - self.r * self.r
        return _near_root(r.dd, b, cc)

    def surface(self, P):
        n = (P - self.c.astype(F)[:, None]) / F(self.r)
        u = F(self.r) * np.arctan2(n[2], n[0])
        v = F(self.r) * np.arcsin(np.clip(n[1], -1, 1))
        return n, u, v


@dataclass
class Cylinder:
    """Vertical capped cylinder: axis through (c[0], c[2]), from y = c[1] to y = c[1] + height."""
    c: np.ndarray
    r: float
    height: float
    mat: int
    casts_shadow: bool = True

    def corners(self):
        s = np.array([[i, j, k] for i in (-1, 1) for j in (0, 1) for k in (-1, 1)], dtype=np.float64)
        return self.c + s * np.array([self.r, self.height, self.r])

    def hit(self, o, r: Rays):
        c = self.c.tolist()
        ox, oz = o[0] - c[0], o[2] - c[2]
        y0, y1 = c[1], c[1] + self.height
        d = r.d
        a = d[0] * d[0] + d[2] * d[2]
        b = d[0] * ox + d[2] * oz
        cc = ox * ox + oz * oz - self.r * self.r
        with np.errstate(divide="ignore", invalid="ignore"):
            best = _near_root(a, b, cc)  # side
            ys = o[1] + best * d[1]
            _miss_to_inf(best, (ys >= y0) & (ys <= y1))
            for yc in (y0, y1):  # caps
                tc = (yc - o[1]) * r.inv[1]
                xc, zc = ox + tc * d[0], oz + tc * d[2]
                ok = (tc > EPS) & (xc * xc + zc * zc <= self.r * self.r) & (tc < best)
                np.copyto(best, tc, where=ok)
        return best

    def surface(self, P):
        rel = P - self.c.astype(F)[:, None]
        rad = np.hypot(rel[0], rel[2])
        on_cap = rad < self.r * (1 - 1e-4)  # side points lie at rad == r up to rounding
        side = np.stack([rel[0] / F(self.r), np.zeros(P.shape[1], F), rel[2] / F(self.r)])
        cap = np.zeros_like(P)
        cap[1] = np.where(rel[1] > 0.5 * self.height, F(1.0), F(-1.0))
        n = np.where(on_cap[None], cap, side)
        u = np.where(on_cap, P[0], F(self.r) * np.arctan2(rel[2], rel[0]))
        v = np.where(on_cap, P[2], rel[1])
        return n, u, v


# ----------------------------------------------------------------------------- scenes
@dataclass
class Scene:
    prims: list
    mats: list
    light: np.ndarray  # point light (indoor) or direction toward the sun (outdoor)
    sun: bool
    ambient: float
    sky: bool  # pixels with no hit show a sky gradient (and depth 0)
    extent: float = 0.0  # indoor: the room's diagonal (bounds how far a shadow reaches)


def _color(rng, lo=0.15, hi=0.9):
    return rng.uniform(lo, hi, 3)


def _material(rng, kinds, period=(0.2, 1.0), tile=None, gray=False):
    kind = kinds[rng.integers(len(kinds))]
    c1 = _color(rng)
    c2 = np.clip(c1 * rng.uniform(0.3, 0.8) + rng.uniform(0, 0.3, 3), 0, 1)
    if gray:
        c1, c2 = c1.mean() * np.ones(3), c2.mean() * np.ones(3)
    return Material(kind, c1, c2, float(rng.uniform(*period)), tile)


def _tiles(rng, n=3, T=32):
    return [rng.random((T, T), dtype=np.float32) for _ in range(n)]


# The camera. "varied": field of view, mount height, pitch and roll drawn per scene, as in a data set
# pooled from many cameras; metric depth from one image is then ambiguous up to those draws (about
# +-25% from the height alone). "fixed": one robot's camera, a known lens at a known mount height and
# tilt (as NYU's Kinect or KITTI's car), with a little jitter from the robot's motion; metric depth is
# then well posed from the image. "lens": the fixed rig's mount and tilt with the varied rig's lens per
# scene (cameras that differ only in focal length: what a focal input can explain). All draw the same
# random numbers, so the scenes are the same.
FIXED_RIG = dict(hfov_deg=70.0, height=1.4, pitch=0.1, jitter_height=0.01, jitter_pitch=0.01, jitter_roll=0.01)


def _camera(rng_vals: tuple[float, float, float, float], pos: np.ndarray, ranges, rig: str, H: int, W: int) -> Camera:
    """look_camera from the drawn (yaw, pitch, roll, hfov) and pos, or the fixed (or lens) rig's remap of them."""
    yaw, pitch, roll, hfov = rng_vals
    if rig in ("fixed", "lens"):
        def jit(v, lo, hi, centre, j):  # the same draw, squeezed to centre +- j
            return centre + j * (2.0 * (v - lo) / (hi - lo) - 1.0)
        r = FIXED_RIG
        pos = pos.copy()
        pos[1] = jit(pos[1], *ranges["height"], r["height"], r["jitter_height"])
        pitch = jit(pitch, *ranges["pitch"], r["pitch"], r["jitter_pitch"])
        roll = jit(roll, *ranges["roll"], 0.0, r["jitter_roll"])
        if rig == "fixed":
            hfov = math.radians(r["hfov_deg"])
    elif rig != "varied":
        raise ValueError(f"rig must be one of {RIGS}, got {rig!r}")
    return look_camera(pos, yaw, pitch, roll, hfov, H, W)


def indoor_scene(rng: np.random.Generator, H: int, W: int, rig: str = "varied") -> tuple[Scene, Camera]:
    """A room (0..X, 0..Y, 0..Z) with furniture-like boxes, balls and columns; depth ~0.5-10 m."""
    X, Y, Z = rng.uniform(3.0, 7.0), rng.uniform(2.4, 3.3), rng.uniform(4.0, 9.0)
    tiles = _tiles(rng)
    mats = [_material(rng, ["checker", "stripes", "noise", "grid"], (0.25, 0.8), tiles[0]),  # floor
            _material(rng, ["plain", "grid", "noise"], (0.4, 1.2), tiles[1], gray=True),  # ceiling
            _material(rng, ["stripes", "noise", "plain", "grid"], (0.15, 0.8), tiles[2]),  # walls
            _material(rng, ["stripes", "noise", "checker", "plain"], (0.15, 0.8), tiles[1])]
    ex, ey, ez = np.eye(3)
    prims = [Plane(ey, 0.0, ex, ez, 0), Plane(-ey, -Y, ex, ez, 1),
             Plane(ex, 0.0, ez, ey, 2), Plane(-ex, -X, ez, ey, 3),
             Plane(ez, 0.0, ex, ey, 3), Plane(-ez, -Z, ex, ey, 2)]
    for p in prims:
        p.casts_shadow = False
    cam_pos = np.array([rng.uniform(0.3, X - 0.3), rng.uniform(1.0, 1.8), rng.uniform(0.2, 1.2)])
    draws = (rng.uniform(-0.6, 0.6), rng.uniform(-0.05, 0.45), rng.uniform(-0.05, 0.05),
             rng.uniform(math.radians(55), math.radians(80)))
    cam = _camera(draws, cam_pos, dict(height=(1.0, 1.8), pitch=(-0.05, 0.45), roll=(-0.05, 0.05)), rig, H, W)
    n_obj = int(rng.integers(3, 9))
    tries = 0
    while n_obj and tries < 60:
        tries += 1
        mats.append(_material(rng, ["plain", "checker", "stripes", "noise"], (0.05, 0.4), tiles[int(rng.integers(3))]))
        m = len(mats) - 1
        kind = rng.choice(["box", "box", "sphere", "cylinder"])
        if kind == "box":
            h = np.array([rng.uniform(0.15, 0.8), rng.uniform(0.15, 1.0), rng.uniform(0.15, 0.8)])
            rad = float(np.hypot(h[0], h[2]))
        elif kind == "sphere":
            rad = rng.uniform(0.15, 0.6)
        else:
            rad = rng.uniform(0.08, 0.4)
        if X - 2 * rad < 0.2 or Z - 2 * rad < 0.2:
            continue
        x, z = rng.uniform(rad, X - rad), rng.uniform(rad, Z - rad)
        if math.hypot(x - cam_pos[0], z - cam_pos[2]) < rad + 0.6:  # keep the camera out of objects
            continue
        if kind == "box":
            prims.append(Box(np.array([x, h[1], z]), h, rng.uniform(0, math.pi), m))
        elif kind == "sphere":
            prims.append(Sphere(np.array([x, rad, z]), rad, m))
        else:
            prims.append(Cylinder(np.array([x, 0.0, z]), rad, rng.uniform(0.3, min(2.2, Y)), m))
        n_obj -= 1
    light = np.array([rng.uniform(0.5, X - 0.5), Y - 0.15, rng.uniform(0.5, Z - 0.5)])
    return Scene(prims, mats, light, sun=False, ambient=float(rng.uniform(0.15, 0.35)), sky=False,
                 extent=math.sqrt(X * X + Y * Y + Z * Z)), cam


def outdoor_scene(rng: np.random.Generator, H: int, W: int, rig: str = "varied") -> tuple[Scene, Camera]:
    """A street along +z lined with buildings, cars, poles and trees; depth up to ~80 m, sky = 0."""
    tiles = _tiles(rng)
    road = rng.uniform(3.0, 6.0)  # half width of the road
    walk = rng.uniform(1.5, 4.0)  # sidewalk width
    mats = [Material("road", np.full(3, rng.uniform(0.18, 0.3)), np.full(3, 0.9), 1.0, tiles[0]),
            _material(rng, ["checker", "grid"], (0.3, 0.7), tiles[1], gray=True)]
    ex, ey, ez = np.eye(3)
    prims = [Plane(ey, 0.0, ex, ez, 0, max_t=150.0)]
    prims[0].casts_shadow = False
    for side in (-1, 1):  # sidewalks: long low boxes
        prims.append(Box(np.array([side * (road + 0.5 * walk), 0.075, 60.0]), np.array([0.5 * walk, 0.075, 80.0]), 0.0, 1))
        prims[-1].casts_shadow = False
    for side in (-1, 1):  # buildings
        z = rng.uniform(-10.0, 0.0)
        while z < 110.0:
            length, depth, height = rng.uniform(6, 25), rng.uniform(8, 15), rng.uniform(5, 30)
            face = road + walk + rng.uniform(0.0, 3.0)
            mats.append(_material(rng, ["grid", "grid", "stripes", "noise"], (1.5, 3.5), tiles[2]))
            prims.append(Box(np.array([side * (face + 0.5 * depth), 0.5 * height, z + 0.5 * length]),
                             np.array([0.5 * depth, 0.5 * height, 0.5 * length]), 0.0, len(mats) - 1))
            z += length + rng.uniform(0.0, 6.0)
    for _ in range(int(rng.integers(0, 6))):  # cars: body + cabin
        x = rng.choice([-1, 1]) * 0.5 * road + rng.uniform(-0.4, 0.4)
        z, yaw = rng.uniform(6.0, 70.0), rng.uniform(-0.15, 0.15)
        mats.append(_material(rng, ["plain"], tile=tiles[1]))
        prims.append(Box(np.array([x, 0.75, z]), np.array([0.9, 0.45, 2.1]), yaw, len(mats) - 1))
        prims.append(Box(np.array([x, 1.45, z - 0.2]), np.array([0.8, 0.3, 1.1]), yaw, len(mats) - 1))
    mats.append(_material(rng, ["plain", "stripes"], (0.1, 0.3), tiles[0], gray=True))
    pole_mat = len(mats) - 1
    mats.append(Material("noise", np.array([0.1, 0.35, 0.1]), np.array([0.3, 0.6, 0.2]), 0.3, tiles[2]))
    leaf_mat = len(mats) - 1
    for side in (-1, 1):
        z = rng.uniform(3.0, 15.0)
        while z < 90.0:
            x = side * (road + rng.uniform(0.3, walk - 0.3))
            if rng.random() < 0.5:
                prims.append(Cylinder(np.array([x, 0.0, z]), rng.uniform(0.08, 0.15), rng.uniform(4.0, 8.0), pole_mat))
            else:
                trunk = rng.uniform(2.0, 3.5)
                prims.append(Cylinder(np.array([x, 0.0, z]), rng.uniform(0.12, 0.25), trunk, pole_mat))
                r = rng.uniform(1.0, 2.2)
                prims.append(Sphere(np.array([x, trunk + 0.7 * r, z]), r, leaf_mat))
            z += rng.uniform(8.0, 25.0)
    cam_pos = np.array([rng.uniform(-0.5, 0.5) * road, rng.uniform(1.4, 2.0), 0.0])
    draws = (rng.uniform(-0.3, 0.3), rng.uniform(-0.05, 0.12), rng.uniform(-0.03, 0.03),
             rng.uniform(math.radians(60), math.radians(90)))
    cam = _camera(draws, cam_pos, dict(height=(1.4, 2.0), pitch=(-0.05, 0.12), roll=(-0.03, 0.03)), rig, H, W)
    sun = np.array([rng.uniform(-1, 1), rng.uniform(0.4, 1.2), rng.uniform(-1, 1)])
    return Scene(prims, mats, sun / np.linalg.norm(sun), sun=True, ambient=float(rng.uniform(0.25, 0.4)), sky=True), cam


# ----------------------------------------------------------------------------- rendering
def _rect_of(pts, cam: Camera, H: int, W: int):
    """Pixel rectangle (r0, r1, c0, c1) covering the convex hull of world points, or None if empty.

    Exact for points in front of the camera (a pinhole maps the hull to the hull of the projections);
    the whole image when some point is near or behind the camera plane.
    """
    if pts is None:
        return 0, H, 0, W
    u, v, z = cam.project(pts)
    if np.any(z <= 1e-3):
        return 0, H, 0, W
    c0, c1 = max(0, int(math.floor(u.min())) - 1), min(W, int(math.ceil(u.max())) + 1)
    r0, r1 = max(0, int(math.floor(v.min())) - 1), min(H, int(math.ceil(v.max())) + 1)
    if c0 >= c1 or r0 >= r1:
        return None
    return r0, r1, c0, c1


def cast(scene: Scene, cam: Camera, H: int, W: int):
    """Nearest hit of every pixel's ray: t [H,W] (inf = no hit), primitive id [H,W] (-1 = none), rays."""
    rays = Rays.of(cam.rays(H, W))
    o = tuple(cam.origin.tolist())
    t = np.full((H, W), INF, dtype=F)
    ids = np.full((H, W), -1, dtype=np.int16)  # int16: the stable argsort in shade() is a radix sort
    for k, prim in enumerate(scene.prims):
        rect = _rect_of(prim.corners(), cam, H, W)
        if rect is None:
            continue
        sl = np.s_[rect[0]:rect[1], rect[2]:rect[3]]
        tk = prim.hit(o, rays.sub(sl))
        closer = tk < t[sl]
        np.copyto(t[sl], tk, where=closer)
        np.copyto(ids[sl], k, where=closer)
    return t, ids, rays


def shade(scene: Scene, cam: Camera, t, ids, rays: Rays, shadows: bool = True) -> np.ndarray:
    """Lambertian shading of the nearest hits (+ cast shadows); sky or black where nothing was hit.

    Works channel-first on the hit pixels only: P, normals, albedo are [3,n].
    """
    H, W = t.shape
    flat_ids = ids.ravel()
    hit = np.flatnonzero(flat_ids >= 0)
    hit_ids = flat_ids.take(hit)
    order = np.argsort(hit_ids, kind="stable")
    hit = hit.take(order)  # hit pixels grouped by primitive: each primitive's points are one slice
    bounds = np.searchsorted(hit_ids.take(order), np.arange(len(scene.prims) + 1))
    dirs = np.stack([di.ravel().take(hit) for di in rays.d])  # [3,n]
    th = t.ravel().take(hit)
    P = cam.origin.astype(F)[:, None] + th[None, :] * dirs
    normals = np.empty_like(P)
    albedo = np.empty_like(P)
    ray_len = np.sqrt(rays.dd.ravel().take(hit))
    inv_f = F(1.0 / cam.fx)
    for k, prim in enumerate(scene.prims):
        sel = slice(bounds[k], bounds[k + 1])
        if bounds[k] == bounds[k + 1]:
            continue
        n, u, v = prim.surface(P[:, sel])
        ds, rl = dirs[:, sel], ray_len[sel]
        cos = np.abs(n[0] * ds[0] + n[1] * ds[1] + n[2] * ds[2]) / rl
        footprint = th[sel] * rl * inv_f / np.maximum(cos, F(0.05))  # meters per pixel on the surface
        normals[:, sel] = n
        albedo[:, sel] = scene.mats[prim.mat].albedo(u, v, footprint)
    light = scene.light.astype(F)
    if scene.sun:
        lit = np.maximum(light @ normals, F(0.0))
        atten = F(1.0)
    else:
        L = light[:, None] - P
        dist = np.sqrt(L[0] * L[0] + L[1] * L[1] + L[2] * L[2])
        lit = np.maximum((normals[0] * L[0] + normals[1] * L[1] + normals[2] * L[2]) / dist, F(0.0))
        atten = F(1.6) / (F(1.0) + (dist * F(1 / 6.0)) ** 2)
    if shadows:
        lit *= _unshadowed(scene, cam, hit, P + F(1e-3) * normals, lit > 0, (H, W))
    amb = F(scene.ambient)
    albedo *= (amb + (F(1.0) - amb) * (lit * atten))[None, :]
    img = np.zeros((3, H * W), dtype=F)
    if scene.sky:
        up = np.clip(rays.d[1].ravel() / np.sqrt(rays.dd.ravel()), F(0), F(1))
        for c, (base, slope) in enumerate(((0.75, -0.4), (0.85, -0.3), (0.95, -0.05))):
            img[c] = F(base) + F(slope) * up
    for c in range(3):
        img[c].put(hit, albedo[c])
    np.clip(img, F(0.0), F(1.0), out=img)
    return np.sqrt(img).reshape(3, H, W).transpose(1, 2, 0)  # gamma 2, [H,W,3]


def _shadow_hull(prim, scene: Scene) -> np.ndarray | None:
    """World points whose convex hull holds every surface point this primitive can shadow (or None).

    Sun: receivers lie at y >= 0, so on segments from the object down to the ground against the light.
    Point light: receivers lie inside the room (diameter scene.extent) on rays from the light through
    the object, so within a bounded stretch behind it.
    """
    C = prim.corners()
    if scene.sun:
        ly = scene.light[1]
        return None if ly < 0.05 else np.vstack([C, C - (C[:, 1:2] / ly) * scene.light])
    center = C.mean(axis=0)
    rad = np.linalg.norm(C - center, axis=1).max()
    dist = np.linalg.norm(scene.light - center)
    if dist <= rad * 1.01:
        return None
    lam = 1.0 + scene.extent / (dist - rad)
    return np.vstack([C, scene.light + lam * (C - scene.light)])


def _unshadowed(scene: Scene, cam: Camera, hit, origins, need, hw) -> np.ndarray:
    """1 where the light reaches a surface point, 0 where an object blocks it (lit points only)."""
    H, W = hw
    free = np.ones(origins.shape[1], dtype=F)
    where = np.full(H * W, -1, dtype=np.int64)  # pixel -> index into the hit arrays, lit pixels only
    lit_idx = np.flatnonzero(need)
    where[hit[lit_idx]] = lit_idx
    where = where.reshape(H, W)
    O = [origins[i] for i in range(3)]  # origins [3,n]
    blocked = np.zeros(origins.shape[1], dtype=bool)
    sun = [float(x) for x in scene.light]
    for prim in scene.prims:
        if not prim.casts_shadow:
            continue
        hull = _shadow_hull(prim, scene)
        rect = _rect_of(hull, cam, H, W) if hull is not None else (0, H, 0, W)
        if rect is None:
            continue
        idx = where[rect[0]:rect[1], rect[2]:rect[3]].ravel()
        idx = idx[idx >= 0]
        if len(idx) == 0:
            continue
        o = [x.take(idx) for x in O]
        if scene.sun:  # one direction for every ray: scalars broadcast through hit()
            d = sun
            with np.errstate(divide="ignore"):
                rays = Rays(tuple(d), tuple(1.0 / x if x else INF for x in d), sum(x * x for x in d))
            tk = prim.hit(o, rays)
            blocked[idx] |= tk < INF
        else:  # toward the point light; the light sits at t = 1
            rays = Rays.of([sun[i] - o[i] for i in range(3)])
            blocked[idx] |= prim.hit(o, rays) < 1.0
    free[blocked] = 0.0
    return free


def render(seed: int, index: int, img_size: tuple[int, int], scene: str = "indoor", split: str = "train",
           shadows: bool = True, rig: str = "varied") -> dict:
    """Render scene (seed, split, index) at img_size (H, W) through the camera rig (see RIGS).

    Returns image float32 [H,W,3] in [0,1], depth float32 [H,W] meters (0 = no hit), K float32 [3,3],
    and the scene kind. Deterministic: the same arguments give the same bytes.
    """
    H, W = int(img_size[0]), int(img_size[1])
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, SPLIT_IDS[split], int(index)])
    kind = scene if scene != "mixed" else ("indoor" if rng.random() < 0.5 else "outdoor")
    sc, cam = (indoor_scene if kind == "indoor" else outdoor_scene)(rng, H, W, rig)
    t, ids, rays = cast(sc, cam, H, W)
    image = shade(sc, cam, t, ids, rays, shadows)
    depth = np.where(np.isfinite(t), t, 0.0)
    return dict(image=image.astype(np.float32), depth=depth.astype(np.float32), K=cam.K, scene=kind)


def benchmark(n: int = 20, size: tuple[int, int] = (256, 256), repeats: int = 3) -> dict:
    """Render time per image for each scene kind, in this (single) thread.

    Each of n scenes is rendered `repeats` times and its fastest run kept (less noise from other
    processes on a shared machine); reports the median and max over scenes of wall and CPU time.
    """
    import time
    out = {}
    for kind in ("indoor", "outdoor"):
        render(0, 0, size, kind)  # warm-up
        wall, cpu = [], []
        for i in range(n):
            w = c = INF
            for _ in range(repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                render(0, i, size, kind)
                w, c = min(w, time.perf_counter() - t0), min(c, time.process_time() - c0)
            wall.append(w)
            cpu.append(c)
        out[kind] = dict(median_ms=round(1e3 * float(np.median(wall)), 2), max_ms=round(1e3 * float(np.max(wall)), 2),
                         cpu_median_ms=round(1e3 * float(np.median(cpu)), 2))
    return out


def figure(path: str, n: int = 6, size: tuple[int, int] = (192, 256)) -> None:
    """A PNG of n indoor and n outdoor scenes: image above, depth (turbo, 0 = sky in black) below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(4, n, figsize=(3 * n, 9.5))
    for j in range(n):
        for r, kind in enumerate(("indoor", "outdoor")):
            s = render(0, j, size, kind)
            d = np.ma.masked_equal(s["depth"], 0.0)
            ax[2 * r, j].imshow(s["image"])
            ax[2 * r, j].set_title(f"{kind} {j}", fontsize=9)
            im = ax[2 * r + 1, j].imshow(d, cmap="turbo")
            ax[2 * r + 1, j].set_facecolor("black")
            ax[2 * r + 1, j].set_title(f"depth {d.min():.1f}-{d.max():.1f} m", fontsize=9)
            fig.colorbar(im, ax=ax[2 * r + 1, j], fraction=0.046)
    for a in ax.ravel():
        a.set_xticks([])
        a.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
