"""Procedural scenes with exact depth: rooms and streets of planes, boxes, spheres and cylinders, and
the families that make resolution matter: thin structures (legs, poles, railings, cables), small
objects far away, objects standing in front of far backgrounds.

A scene is drawn deterministically from numpy Generators seeded by (seed, split, index): the room or
street from one, the families from a second, so that a family's frequency changes nothing else. It
is rendered by depthpack.data.raycast: exact analytic ray casting in torch, B scenes at once, on any
device. Depth is the z-depth along the optical axis in meters (what depth sensors and data sets
store); pixels that hit nothing (the sky) have depth 0.

Monocular cues present in the image: perspective (a real pinhole), texture gradients (procedural
checker / stripes / windows / value-noise textures in surface coordinates in meters, faded where a
pixel's footprint exceeds half a period so far textures do not alias), occlusion, Lambertian shading
from a point light (indoor) or the sun (outdoor), cast shadows from the objects, and sky.

Frames: world y is up. Camera x right, y down, z forward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .raycast import cast_and_shade, pack
from .config import NO_FAMILIES, RIGS, Families  # noqa: F401  (Families, NO_FAMILIES: re-exported)

SPLIT_IDS = {"train": 0, "val": 1, "test": 2}
PRIM_KINDS_OF = {"Plane": 0, "Box": 1, "Sphere": 2, "Cylinder": 3}  # raycast.PRIM_KINDS
WIDTH_REF = 560  # the sizes of the small families were chosen at this image width (420x560); Families.width_ref moves them


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


# ----------------------------------------------------------------------------- materials and primitives
@dataclass
class Material:
    """Albedo = mix(c1, c2, pattern(u, v)) x a low-frequency noise stain; u, v in meters (raycast.albedo)."""
    kind: str  # "plain" | "checker" | "stripes" | "grid" | "noise" | "road"
    c1: np.ndarray
    c2: np.ndarray
    period: float = 1.0
    tile: np.ndarray | None = None  # [T,T] value-noise tile in [0,1]


@dataclass
class Plane:
    """n . p = offset; n faces the camera side. e1, e2: texture axes (meters)."""
    n: np.ndarray
    offset: float
    e1: np.ndarray
    e2: np.ndarray
    mat: int
    max_t: float = math.inf
    casts_shadow: bool = False


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


@dataclass
class Sphere:
    c: np.ndarray
    r: float
    mat: int
    casts_shadow: bool = True


@dataclass
class Cylinder:
    """Vertical capped cylinder: axis through (c[0], c[2]), from y = c[1] to y = c[1] + height."""
    c: np.ndarray
    r: float
    height: float
    mat: int
    casts_shadow: bool = True


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
    room: tuple[float, float, float] | None = None  # indoor: (X, Y, Z), the room is [0,X] x [0,Y] x [0,Z]
    street: tuple[float, float] | None = None  # outdoor: half width of the road, sidewalk width
    family: dict = field(default_factory=dict)  # index of a primitive -> the family that added it (thin, distant,
    #                                             front; fixture: the parts of a thin structure that are not thin)


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
                 extent=math.sqrt(X * X + Y * Y + Z * Z), room=(X, Y, Z)), cam


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
    return Scene(prims, mats, sun / np.linalg.norm(sun), sun=True, ambient=float(rng.uniform(0.25, 0.4)), sky=True,
                 street=(road, walk)), cam




# ----------------------------------------------------------------------------- families
def _thin_radius(rng, cam: Camera, f_ref: float, at: np.ndarray) -> float:
    """A radius that makes a vertical rod at world point `at` 1-4 px wide through a focal length of f_ref pixels
    (the camera's at the families' reference width)."""
    z = max(float((np.asarray(at) - cam.origin) @ cam.R[:, 2]), 0.3)
    return float(rng.uniform(1.0, 4.0)) * z / (2.0 * f_ref)


def _in_view(rng, cam: Camera, W: int, near: float, far: float) -> tuple[float, float, float]:
    """(x, z, distance) of a ground point inside the camera's horizontal field of view, `near` to `far`
    meters away along the ground."""
    fwd = cam.R[:, 2] * np.array([1.0, 0.0, 1.0])
    fwd /= max(np.linalg.norm(fwd), 1e-9)
    half = math.atan(0.5 * W / cam.fx) * 0.8
    a = float(rng.uniform(-half, half))
    c, s = math.cos(a), math.sin(a)
    d = np.array([c * fwd[0] + s * fwd[2], 0.0, -s * fwd[0] + c * fwd[2]])
    dist = float(rng.uniform(near, far))
    return cam.origin[0] + dist * d[0], cam.origin[2] + dist * d[2], dist


def add_families(sc: Scene, cam: Camera, rng: np.random.Generator, fam: Families, W: int) -> None:
    """Add the families' objects to a drawn scene, in place, from their own generator."""
    tiles = list({id(m.tile): m.tile for m in sc.mats if m.tile is not None}.values())

    def mat(kinds=("plain", "stripes", "noise", "checker"), period=(0.05, 0.4), gray=False) -> int:
        sc.mats.append(_material(rng, list(kinds), period, tiles[int(rng.integers(len(tiles)))], gray))
        return len(sc.mats) - 1

    def add(family: str, *prims) -> None:
        for p in prims:
            sc.family[len(sc.prims)] = family
            sc.prims.append(p)

    indoor = sc.room is not None
    f_ref = cam.fx * fam.width_ref / W  # thin structures are 1-4 px wide in an image width_ref wide
    for _ in range(min(6, int(rng.poisson(fam.thin)))):
        (_thin_indoor if indoor else _thin_outdoor)(sc, cam, rng, W, f_ref, mat, add)
    for _ in range(min(6, int(rng.poisson(fam.distant)))):
        _distant(sc, cam, rng, W, mat, add, indoor, WIDTH_REF / fam.width_ref)
    for _ in range(min(3, int(rng.poisson(fam.front)))):
        _front(sc, cam, rng, W, mat, add, indoor)
    if fam.fence:  # drawn last, and only when asked for: scenes without fences stay as they were
        for _ in range(min(6, int(rng.poisson(fam.fence)))):
            _fence(sc, cam, rng, W, f_ref, mat, add, indoor)


def _inside_room(sc: Scene, x: float, z: float, margin: float) -> tuple[float, float]:
    X, _, Z = sc.room
    return min(max(x, margin), X - margin), min(max(z, margin), Z - margin)


def _legs(cam, rng, f_ref, x, z, hx, hz, yaw, height, m):
    """Four vertical legs under a rectangle of half sizes (hx, hz) centred at (x, z), rotated by yaw."""
    cs, sn = math.cos(yaw), math.sin(yaw)
    out = []
    for i in (-1, 1):
        for k in (-1, 1):
            px, pz = x + cs * i * hx + sn * k * hz, z - sn * i * hx + cs * k * hz
            r = _thin_radius(rng, cam, f_ref, np.array([px, 0.5 * height, pz]))
            out.append(Cylinder(np.array([px, 0.0, pz]), r, height, m))
    return out


def _thin_indoor(sc, cam, rng, W, f_ref, mat, add) -> None:
    X, Y, Z = sc.room
    x, z, _ = _in_view(rng, cam, W, 1.2, 0.9 * math.hypot(X, Z))
    x, z = _inside_room(sc, x, z, 0.6)
    yaw = float(rng.uniform(0, math.pi))
    kind = ("table", "chair", "lamp", "railing", "cable")[int(rng.integers(5))]
    m = mat()
    if kind in ("table", "chair"):
        hx, hz = (rng.uniform(0.4, 0.8), rng.uniform(0.25, 0.45)) if kind == "table" else (rng.uniform(0.18, 0.25),) * 2
        height = rng.uniform(0.7, 0.78) if kind == "table" else rng.uniform(0.42, 0.48)
        add("thin", *_legs(cam, rng, f_ref, x, z, hx - 0.03, hz - 0.03, yaw, height, m))
        add("fixture", Box(np.array([x, height + 0.015, z]), np.array([hx, 0.015, hz]), yaw, m))
        if kind == "chair":  # the back: a thin board above the seat's far edge
            bx, bz = x + math.sin(yaw) * hz, z + math.cos(yaw) * hz
            add("fixture", Box(np.array([bx, height + 0.25, bz]), np.array([hx, 0.2, 0.012]), yaw, m))
    elif kind == "lamp":
        height = rng.uniform(1.3, min(1.9, Y - 0.4))
        add("thin", Cylinder(np.array([x, 0.0, z]), _thin_radius(rng, cam, f_ref, np.array([x, 1.0, z])), height, m))
        add("fixture", Cylinder(np.array([x, 0.0, z]), rng.uniform(0.12, 0.2), 0.02, m),
            Sphere(np.array([x, height + 0.12, z]), rng.uniform(0.1, 0.18), mat(("plain",))))
    elif kind == "railing":
        length, step, height = rng.uniform(1.5, 3.0), rng.uniform(0.12, 0.3), rng.uniform(0.85, 1.0)
        cs, sn = math.cos(yaw), math.sin(yaw)
        posts = []
        for k in range(int(length / step) + 1):
            px, pz = _inside_room(sc, x + cs * (k * step - 0.5 * length), z - sn * (k * step - 0.5 * length), 0.1)
            posts.append(Cylinder(np.array([px, 0.0, pz]), _thin_radius(rng, cam, f_ref, np.array([px, 0.5, pz])), height, m))
        add("thin", *posts, Box(np.array([x, height + 0.02, z]), np.array([0.5 * length, 0.02, 0.02]), yaw, m))
    else:  # a cable across the room, along x, below the ceiling
        y = rng.uniform(1.9, Y - 0.1)
        r = _thin_radius(rng, cam, f_ref, np.array([0.5 * X, y, z]))
        add("thin", Box(np.array([0.5 * X, y, z]), np.array([0.5 * X - 0.01, r, r]), 0.0, mat(("plain",), gray=True)))


def _thin_outdoor(sc, cam, rng, W, f_ref, mat, add) -> None:
    road, walk = sc.street
    side = float(rng.choice([-1.0, 1.0]))
    z = rng.uniform(4.0, 45.0)
    kind = ("sign", "railing", "cable", "bollards")[int(rng.integers(4))]
    m = mat(("plain", "stripes"), (0.1, 0.3), gray=True)
    if kind == "sign":
        x = side * (road + rng.uniform(0.2, walk - 0.2))
        height = rng.uniform(2.2, 3.5)
        add("thin", Cylinder(np.array([x, 0.0, z]), _thin_radius(rng, cam, f_ref, np.array([x, 1.5, z])), height, m))
        add("fixture", Box(np.array([x, height, z]), np.array([rng.uniform(0.2, 0.4), rng.uniform(0.2, 0.35), 0.02]), 0.0,
                           mat(("plain",))))
    elif kind == "railing":  # posts along the curb and two rails
        x, length, step = side * (road + 0.15), rng.uniform(6.0, 15.0), rng.uniform(1.2, 2.5)
        posts = [Cylinder(np.array([x, 0.0, z + k * step]), _thin_radius(rng, cam, f_ref, np.array([x, 0.5, z + k * step])), 1.0, m)
                 for k in range(int(length / step) + 1)]
        r = _thin_radius(rng, cam, f_ref, np.array([x, 1.0, z + 0.5 * length]))
        add("thin", *posts, *(Box(np.array([x, y, z + 0.5 * length]), np.array([r, r, 0.5 * length]), 0.0, m) for y in (0.5, 1.0)))
    elif kind == "cable":  # across the street, between the building fronts
        y = rng.uniform(5.0, 8.0)
        r = _thin_radius(rng, cam, f_ref, np.array([0.0, y, z]))
        add("thin", Box(np.array([0.0, y, z]), np.array([road + walk, r, r]), rng.uniform(-0.2, 0.2), m))
    else:  # a row of bollards at the curb
        x = side * (road + 0.3)
        add("thin", *(Cylinder(np.array([x, 0.0, z + 1.5 * k]), _thin_radius(rng, cam, f_ref, np.array([x, 0.4, z + 1.5 * k])),
                               rng.uniform(0.7, 1.0), m) for k in range(int(rng.integers(3, 8)))))


def _fence(sc, cam, rng, W, f_ref, mat, add, indoor: bool) -> None:
    """A fence across the view: 8-24 vertical bars 1-4 px wide at the reference width, 2-4 bar widths apart
    (centre to centre), under a top rail as thin. At half the reference width bars and gaps blur into one
    grey: only resolution tells a bar's depth from the background's between them."""
    if indoor:
        X, _, Z = sc.room
        x, z, _ = _in_view(rng, cam, W, 1.2, 0.8 * math.hypot(X, Z))
        x, z = _inside_room(sc, x, z, 0.3)
    else:
        road, walk = sc.street
        x, z, _ = _in_view(rng, cam, W, 4.0, 30.0)
        x = float(np.clip(x, -(road + walk) + 0.5, road + walk - 0.5))
    fwd = cam.R[:, 2]
    yaw = math.atan2(fwd[0], fwd[2]) + float(rng.uniform(-0.4, 0.4))  # its length across the view, turned a little
    cs, sn = math.cos(yaw), math.sin(yaw)
    height = float(rng.uniform(0.8, 1.2))
    r = _thin_radius(rng, cam, f_ref, np.array([x, 0.5 * height, z]))
    step = 2.0 * r * float(rng.uniform(2.0, 4.0))
    n = int(rng.integers(8, 25))
    m = mat()
    bars = []
    for k in range(n):
        t = (k - 0.5 * (n - 1)) * step
        px, pz = x + cs * t, z - sn * t
        if indoor:
            px, pz = _inside_room(sc, px, pz, 0.1)
        bars.append(Cylinder(np.array([px, 0.0, pz]), r, height, m))
    add("thin", *bars, Box(np.array([x, height + r, z]), np.array([0.5 * n * step, r, r]), yaw, m))


def _distant(sc, cam, rng, W, mat, add, indoor: bool, grow: float = 1.0) -> None:
    """A small object (a few cm to half a meter at the reference width, times grow) far from the camera, on the
    ground."""
    if indoor:
        X, _, Z = sc.room
        x, z, dist = _in_view(rng, cam, W, 0.55 * math.hypot(X, Z), 0.95 * math.hypot(X, Z))
        x, z = _inside_room(sc, x, z, 0.3)
        size = rng.uniform(0.04, 0.15) * grow
    else:
        x, z, dist = _in_view(rng, cam, W, 20.0, 70.0)
        road, walk = sc.street
        x = float(np.clip(x, -(road + walk) + 0.5, road + walk - 0.5))
        size = rng.uniform(0.15, 0.5) * grow
    m = mat()
    kind = int(rng.integers(3))
    if kind == 0:
        add("distant", Box(np.array([x, size, z]), np.array([size, size, size]) * rng.uniform(0.6, 1.0, 3), rng.uniform(0, math.pi), m))
    elif kind == 1:
        add("distant", Sphere(np.array([x, size, z]), size, m))
    else:
        add("distant", Cylinder(np.array([x, 0.0, z]), 0.5 * size, rng.uniform(2.0, 4.0) * size, m))


def _front(sc, cam, rng, W, mat, add, indoor: bool) -> None:
    """An object standing near the camera: a person-sized column with a head, or a box."""
    x, z, dist = _in_view(rng, cam, W, 1.0 if indoor else 2.5, 2.5 if indoor else 8.0)
    if indoor:
        x, z = _inside_room(sc, x, z, 0.35)
        if math.hypot(x - cam.origin[0], z - cam.origin[2]) < 0.7:  # pushed back into the camera's way
            return
    m = mat()
    if rng.random() < 0.6:
        r, height = rng.uniform(0.15, 0.28), rng.uniform(1.0, 1.5)
        add("front", Cylinder(np.array([x, 0.0, z]), r, height, m),
            Sphere(np.array([x, height + 0.12, z]), rng.uniform(0.09, 0.12), mat(("plain",))))
    else:
        h = rng.uniform(0.15, 0.5, 3)
        add("front", Box(np.array([x, h[1], z]), h, rng.uniform(0, math.pi), m))


# ----------------------------------------------------------------------------- rendering
def draw(seed: int, index: int, img_size: tuple[int, int], scene: str = "indoor", split: str = "train",
         rig: str = "varied", families: Families | None = None) -> tuple[Scene, Camera, str]:
    """Scene (seed, split, index) and its camera at img_size (H, W), and its kind (indoor / outdoor)."""
    H, W = int(img_size[0]), int(img_size[1])
    if scene not in ("indoor", "outdoor", "mixed"):
        raise ValueError(f"scene must be indoor, outdoor or mixed, got {scene!r}")
    if rig not in RIGS:
        raise ValueError(f"rig must be one of {RIGS}, got {rig!r}")
    key = [int(seed) & 0xFFFFFFFF, SPLIT_IDS[split], int(index)]
    rng = np.random.default_rng(key)
    kind = scene if scene != "mixed" else ("indoor" if rng.random() < 0.5 else "outdoor")
    sc, cam = (indoor_scene if kind == "indoor" else outdoor_scene)(rng, H, W, rig)
    fam = Families() if families is None else families
    if not fam.none:
        add_families(sc, cam, np.random.default_rng(key + [1]), fam, W)
    return sc, cam, kind


def render_batch(seed: int, indices, img_size: tuple[int, int], scene: str = "indoor", split: str = "train",
                 rig: str = "varied", families: Families | None = None, device: torch.device | str = "cpu",
                 shadows: bool = True) -> dict:
    """Scenes (seed, split, i) for i in indices, rendered together on device.

    Returns image float32 [B,H,W,3] in [0,1], depth float32 [B,H,W] meters (0 = no hit), thin bool [B,H,W] (the
    pixels of thin structures and small objects: the thin band), K float32 [B,3,3] (on device) and the scene kinds. Deterministic; a scene's depth does not depend on the batch
    it is rendered in, its colour within float32 rounding (vectorized sin and atan2 round by position)."""
    H, W = int(img_size[0]), int(img_size[1])
    drawn = [draw(seed, i, (H, W), scene, split, rig, families) for i in indices]
    image, depth, thin = render_drawn([(sc, cam) for sc, cam, _ in drawn], device, H, W, shadows)
    K = torch.from_numpy(np.stack([cam.K for _, cam, _ in drawn])).to(device)
    return dict(image=image, depth=depth, thin=thin, K=K, scene=[k for _, _, k in drawn])


def render_drawn(drawn: list, device, H: int, W: int, shadows: bool = True) -> tuple[torch.Tensor, torch.Tensor,
                                                                                     torch.Tensor]:
    """Drawn (Scene, Camera) pairs rendered on device: image [B,H,W,3], depth [B,H,W], thin [B,H,W]
    (raycast.cast_and_shade).
    On a CPU in one thread: the caster's small ops, split over threads, spend more on waiting than working."""
    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)
    try:
        return cast_and_shade(pack(drawn, device), H, W, shadows)
    finally:
        torch.set_num_threads(threads)


def render(seed: int, index: int, img_size: tuple[int, int], scene: str = "indoor", split: str = "train",
           shadows: bool = True, rig: str = "varied", families: Families | None = None) -> dict:
    """Render scene (seed, split, index) at img_size (H, W) through the camera rig (see RIGS), on the CPU.

    Returns image float32 [H,W,3] in [0,1], depth float32 [H,W] meters (0 = no hit), thin bool [H,W], K float32
    [3,3], and the scene kind. Deterministic: the same arguments give the same bytes.
    """
    r = render_batch(seed, [index], img_size, scene, split, rig, families, "cpu", shadows)
    return dict(image=r["image"][0].numpy(), depth=r["depth"][0].numpy(), thin=r["thin"][0].numpy(), K=r["K"][0].numpy(),
                scene=r["scene"][0])


def figure(path: str, n: int = 4, size: tuple[int, int] = (420, 560), seed: int = 3, radius: int = 14,
           families: Families | None = None) -> None:
    """A PNG of n scenes (alternately a room and a street) at size with the families' objects (default: Families()):
    the image, its depth (turbo, sky in black), and the image with the thin band (red: the pixels of thin
    structures and small objects where at most THIN_MAX_PX across; yellow: where wider) and the depth-edge band of the given radius (blue, one vits patch by default)."""
    fam = families or Families()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .queries import THIN_MAX_PX, edge_band, thin_band

    fig, ax = plt.subplots(n, 3, figsize=(3 * 4.2, n * 3.3 * size[0] / size[1] * 4 / 3))
    for j in range(n):
        kind = ("indoor", "outdoor")[j % 2]
        sc, cam, _ = draw(seed, j, size, kind, "train", "fixed", fam)
        image, depth, thin = render_drawn([(sc, cam)], "cpu", *size)
        narrow = thin_band(thin[0]).numpy()
        image, depth, thin = image[0].numpy(), depth[0], thin[0].numpy()
        band = edge_band(depth, depth > 0, radius).numpy()
        over = image * 0.6
        over[band] = 0.4 * over[band] + 0.6 * np.array([0.2, 0.45, 1.0])
        over[thin] = np.array([1.0, 0.75, 0.2])  # the families' pixels where they are wide: not in the band
        over[narrow] = np.array([1.0, 0.15, 0.1])
        d = np.ma.masked_equal(depth.numpy(), 0.0)
        ax[j, 0].imshow(image)
        ax[j, 0].set_title(f"{kind} {j}", fontsize=9)
        im = ax[j, 1].imshow(d, cmap="turbo")
        ax[j, 1].set_facecolor("black")
        ax[j, 1].set_title(f"depth {d.min():.1f}-{d.max():.1f} m", fontsize=9)
        fig.colorbar(im, ax=ax[j, 1], fraction=0.035)
        ax[j, 2].imshow(over, interpolation="nearest")
        ax[j, 2].set_title(f"thin band (red) {100 * narrow.mean():.1f}% (wider: yellow), edge band r={radius} px "
                           f"(blue) {100 * band.mean():.0f}%", fontsize=8)
    for a in ax.ravel():
        a.set_xticks([])
        a.set_yticks([])
    fences = f", {fam.fence:g} fences" if fam.fence else ""
    fig.suptitle(f"{size[0]}x{size[1]}: about {fam.thin:g} thin structures{fences} and {fam.distant:g} small objects a "
                 f"scene, 1-4 px at width {fam.width_ref}; the thin band: their parts at most {THIN_MAX_PX} px across",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
