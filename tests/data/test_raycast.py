"""The torch ray caster: exact against analytic hits, equal to the NumPy ray caster it replaced on
golden scenes, the same scene whatever batch it is rendered in.

tests/data/golden/scenes.npz holds six scenes rendered by the NumPy ray caster (depthpack/data/
synthetic.py at commit 6a63c3a): depth float32 exactly as it rendered them, the image quantized to
uint16, each with its (seed, index, H, W), scene kind and rig.
"""
from pathlib import Path

import numpy as np
import pytest
import torch

from depthpack.data import raycast as rc
from depthpack.data import synthetic as syn

GOLDEN = Path(__file__).parent / "golden" / "scenes.npz"


def golden_cases():
    g = np.load(GOLDEN)
    n = len([k for k in g.files if k.startswith("case") and not k.endswith("_meta")])
    for k in range(n):
        seed, idx, H, W = (int(x) for x in g[f"case{k}"])
        scene, rig, _ = str(g[f"case{k}_meta"]).split()
        yield k, seed, idx, (H, W), scene, rig, g[f"image{k}"].astype(np.float32) / 65535, g[f"depth{k}"], g[f"K{k}"]


@pytest.mark.parametrize("case", list(golden_cases()), ids=lambda c: f"{c[4]}-{c[5]}-{c[3][0]}x{c[3][1]}")
def test_golden_scenes_stay_equal(case):
    k, seed, idx, size, scene, rig, image, depth, K = case
    r = syn.render(seed, idx, size, scene, "train", rig=rig, families=syn.NO_FAMILIES)
    both = (depth > 0) & (r["depth"] > 0)
    assert ((depth > 0) == (r["depth"] > 0)).all(), "the same pixels hit something"
    np.testing.assert_allclose(r["depth"][both], depth[both], rtol=4e-7, atol=0)  # float32 rounding
    err = np.abs(r["image"] - image)
    assert err.max() < 2e-3 and err.mean() < 1e-5, (err.max(), err.mean())
    np.testing.assert_array_equal(r["K"], K)


def analytic_sphere_depth(H, W, f, c, r):
    """z-depth of a sphere seen from the origin looking along +z, float64, inf where missed."""
    u = (np.arange(W) + 0.5 - W / 2) / f
    v = (np.arange(H) + 0.5 - H / 2) / f
    d = np.stack(np.broadcast_arrays(u[None, :], v[:, None], np.ones((H, W))), -1)  # camera = world here
    dd, b = (d * d).sum(-1), d @ np.asarray(c, float)
    disc = b * b - dd * (np.dot(c, c) - r * r)
    with np.errstate(invalid="ignore"):
        t = (b - np.sqrt(disc)) / dd
    return np.where(disc >= 0, t, np.inf)


def test_ray_cast_is_exact_and_occludes():
    H, W = 40, 56
    cam = syn.Camera(30.0, 30.0, W / 2, H / 2, np.diag([1.0, 1.0, 1.0]), np.zeros(3))  # looks along +z
    wall = syn.Plane(np.array([0.0, 0.0, -1.0]), -6.0, np.eye(3)[0], np.eye(3)[1], 0)  # z = 6
    ball = syn.Sphere(np.array([0.3, -0.2, 4.0]), 1.1, 0)
    box = syn.Box(np.array([-1.0, 0.6, 3.0]), np.array([0.4, 0.3, 0.5]), 0.0, 0)  # front face z = 2.5
    pole = syn.Cylinder(np.array([1.6, -1.0, 2.0]), 0.1, 1.5, 0)  # from y = -1 (up in the image) to 0.5
    scene = syn.Scene([wall, ball, box, pole], [syn.Material("plain", np.ones(3), np.ones(3))], np.zeros(3), False, 0.3, False)
    t, kind, slot, _, _ = rc.cast(rc.pack([(scene, cam)]), H, W)
    t, kind, slot = t.view(H, W).numpy(), kind.view(H, W).numpy(), slot.view(H, W).numpy()
    sphere = analytic_sphere_depth(H, W, 30.0, [0.3, -0.2, 4.0], 1.1)
    x = (np.arange(W) + 0.5 - W / 2) / 30.0
    y = (np.arange(H) + 0.5 - H / 2) / 30.0
    ray = np.stack(np.broadcast_arrays(x[None, :], y[:, None], np.ones((H, W))), -1)
    lo, hi = np.array([-1.4, 0.3, 2.5]), np.array([-0.6, 0.9, 3.5])
    box_t = np.full((H, W), np.inf)
    for ax in range(3):  # each of the 6 faces: plane hit, then inside the face's rectangle
        for bound in (lo[ax], hi[ax]):
            with np.errstate(divide="ignore", invalid="ignore"):
                tf = bound / ray[..., ax]
            p = ray * tf[..., None]
            inside = np.all([(p[..., k] >= lo[k] - 1e-9) & (p[..., k] <= hi[k] + 1e-9) for k in range(3) if k != ax], axis=0)
            box_t = np.where(inside & (tf > 0), np.minimum(box_t, tf), box_t)
    # the pole's side: x^2 + (z - 2)^2 = 0.01 around x = 1.6, between y = -1 and 0.5
    a = ray[..., 0] ** 2 + ray[..., 2] ** 2
    b = -(1.6 * ray[..., 0] + 2.0 * ray[..., 2])
    disc = b * b - a * (1.6 ** 2 + 4.0 - 0.01)
    with np.errstate(invalid="ignore"):
        pt = (-b - np.sqrt(disc)) / a
    ys = pt * ray[..., 1]
    pole_t = np.where((disc >= 0) & (ys >= -1.0) & (ys <= 0.5), pt, np.inf)
    want = np.minimum(np.minimum(box_t, pole_t), np.minimum(sphere, 6.0))  # nearest hit wins
    kinds = {k: i for i, k in enumerate(rc.PRIM_KINDS)}
    assert (kind == kinds["sphere"]).sum() > 100 and (kind == kinds["box"]).sum() > 20
    assert (kind == kinds["plane"]).sum() > 100 and (kind == kinds["cyl"]).sum() > 10
    np.testing.assert_allclose(t, want, rtol=2e-6)  # float32 rays: exact up to rounding
    assert (t[kind == kinds["plane"]] == np.float32(6.0)).all()  # z-depth, not ray length: a fronto-parallel wall is flat


def test_a_scene_renders_the_same_alone_and_in_any_batch():
    size = (30, 44)
    alone = [syn.render(2, i, size, "mixed", "train", rig="varied") for i in range(5)]
    batch = syn.render_batch(2, [3, 0, 4, 1, 2], size, "mixed", "train", rig="varied")
    for j, i in enumerate([3, 0, 4, 1, 2]):
        np.testing.assert_array_equal(batch["depth"][j].numpy(), alone[i]["depth"])
        np.testing.assert_allclose(batch["image"][j].numpy(), alone[i]["image"], atol=1e-6)
        np.testing.assert_array_equal(batch["K"][j].numpy(), alone[i]["K"])


def test_the_piece_size_changes_nothing(monkeypatch):
    """A GPU tests (ray, primitive) pairs in larger pieces than a CPU: the image is the same whatever the size."""
    want = syn.render_batch(4, [0, 1, 2], (40, 52), "mixed", "train", rig="varied")
    for elements in (1 << 8, 1 << 24):
        monkeypatch.setattr(rc, "ELEMENTS", elements)
        got = syn.render_batch(4, [0, 1, 2], (40, 52), "mixed", "train", rig="varied")
        for k in ("depth", "image"):
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)


def test_ties_go_to_the_primitive_drawn_first():
    H, W = 8, 8
    cam = syn.Camera(8.0, 8.0, W / 2, H / 2, np.eye(3), np.zeros(3))
    mats = [syn.Material("plain", np.full(3, 0.2), np.full(3, 0.2)), syn.Material("plain", np.full(3, 0.9), np.full(3, 0.9))]
    first = syn.Box(np.array([0.0, 0.0, 3.0]), np.array([5.0, 5.0, 1.0]), 0.0, 1)  # front face at z = 2
    second = syn.Plane(np.array([0.0, 0.0, -1.0]), -2.0, np.eye(3)[0], np.eye(3)[1], 0)  # z = 2 too
    for prims, want in (([first, second], 1), ([second, first], 0)):
        scene = syn.Scene(prims, mats, np.zeros(3), False, 1.0, False)
        t, kind, slot, _, _ = rc.cast(rc.pack([(scene, cam)]), H, W)
        assert (t == 2.0).all()
        winner = prims[0]
        assert (kind == rc.PRIM_KINDS.index(rc.kind_of(winner))).all(), (prims, kind)
        img, _, _ = rc.cast_and_shade(rc.pack([(scene, cam)]), H, W, shadows=False)
        assert torch.allclose(img, torch.tensor(mats[want].c1[0] ** 0.5, dtype=torch.float32))


def test_families_add_their_objects_and_change_nothing_else():
    base = [syn.draw(5, i, (420, 560), "mixed", "train", "fixed", syn.NO_FAMILIES) for i in range(24)]
    full = [syn.draw(5, i, (420, 560), "mixed", "train", "fixed") for i in range(24)]
    counts = {"thin": 0, "distant": 0, "front": 0, "fixture": 0}  # fixture: the parts of a thin structure that are not thin
    for (b, bcam, bk), (f, fcam, fk) in zip(base, full):
        assert bk == fk and np.array_equal(bcam.R, fcam.R) and not b.family
        assert [repr(p) for p in f.prims[:len(b.prims)]] == [repr(p) for p in b.prims]  # the room or street as it was
        assert set(f.family) == set(range(len(b.prims), len(f.prims)))  # everything added belongs to a family
        for gid, fam in f.family.items():
            p = f.prims[gid]
            z = float((p.c - fcam.origin) @ fcam.R[:, 2])
            counts[fam] += 1
            if fam == "thin" and isinstance(p, syn.Cylinder) and p.height > 0.1:  # legs, posts, poles
                top = p.c + np.array([0.0, 0.5 * p.height, 0.0])
                zmid = max(float((top - fcam.origin) @ fcam.R[:, 2]), 0.3)
                assert 0.99 <= 2 * p.r * fcam.fx / zmid <= 4.01  # 1-4 px wide at 420x560, at its middle
            if fam == "front" and isinstance(p, syn.Cylinder):
                assert 0.5 < z < 8.5
            if fam == "distant" and fk == "outdoor":
                assert z > 15.0
    assert all(counts.values()), counts

