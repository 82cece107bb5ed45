"""Thin structures sized at a reference width (data.thin_width_ref) and the thin band: a rod of the drawn radius
is 1-4 px wide at its reference width, at two sizes; the band is exactly the pixels of the thin and small
families in a scene built by hand; stores carry it (older ones render again); bad settings are one clear error."""
import math

import numpy as np
import pytest
import torch

from depthpack.data import raycast as rc
from depthpack.data import synthetic as syn
from depthpack.data.config import DataConfig, Families


def _rod_scene(H: int, W: int, width_ref: int, seed: int):
    """A wall at 12 m and, from the families' radius rule, a vertical rod 3-8 m in front of the camera, off centre;
    a ball beside it of the "front" family (not thin)."""
    cam = syn.look_camera(np.array([0.0, 1.2, 0.0]), 0.0, 0.0, 0.0, math.radians(70), H, W)
    rng = np.random.default_rng(seed)
    z = float(rng.uniform(3.0, 8.0))
    x = float(rng.uniform(-0.3, 0.3)) * z
    f_ref = cam.fx * width_ref / W
    r = syn._thin_radius(rng, cam, f_ref, np.array([x, 1.2, z]))
    wall = syn.Plane(np.array([0.0, 0.0, -1.0]), -12.0, np.eye(3)[0], np.eye(3)[1], 0)
    rod = syn.Cylinder(np.array([x, 0.0, z]), r, 2.4, 0)
    ball = syn.Sphere(np.array([-x - 1.0, 1.2, z + 1.0]), 0.4, 0)
    sc = syn.Scene([wall, rod, ball], [syn.Material("plain", np.full(3, 0.5), np.full(3, 0.5))], np.array([0.0, 3.0, 0.0]),
                   False, 0.3, False, family={1: "thin", 2: "front"})
    return sc, cam, 2 * r * cam.fx / z  # the rod's width in pixels of this image


@pytest.mark.parametrize("H,W", [(96, 128), (420, 560)])
def test_a_rod_is_one_to_four_pixels_wide_at_its_reference_width(H, W):
    for seed in range(4):
        sc, cam, width = _rod_scene(H, W, W, seed)  # the reference width is the image's own
        assert 1.0 <= width <= 4.0
        _, _, thin = rc.cast_and_shade(rc.pack([(sc, cam)]), H, W)
        cols = thin[0].sum(1)  # the rod's pixels on each row
        rows = cols[cols > 0]
        assert len(rows) > 10 and rows.min() >= 1 and rows.max() <= 4, (seed, width, rows.unique())
        assert (rows.float().mean() - width).abs() <= 1.0  # pixel centres inside the rod's width, on average


def test_sized_at_560_a_rod_mostly_vanishes_at_128():
    """Why the reference width is a setting: at 128 px a rod sized for 560 is 0.2-0.9 px wide."""
    sc, cam, width = _rod_scene(96, 128, 560, 1)
    assert width < 1.0
    _, _, thin = rc.cast_and_shade(rc.pack([(sc, cam)]), 96, 128)
    assert thin[0].sum(1).max() <= 1


def test_the_thin_band_is_exactly_the_rods_pixels():
    H, W = 60, 80
    sc, cam, _ = _rod_scene(H, W, W, 2)
    t, kind, slot, thin, _ = rc.cast(rc.pack([(sc, cam)]), H, W)
    cyl = kind.view(H, W) == rc.PRIM_KINDS.index("cyl")
    sphere = kind.view(H, W) == rc.PRIM_KINDS.index("sphere")
    assert cyl.sum() > 0 and sphere.sum() > 0  # the rod and the ball are both in view
    assert torch.equal(thin.view(H, W), cyl)  # the rod (family thin) and nothing else: the ball is "front"
    # by hand: the pixel centres whose ray passes within the rod's radius of its axis, below its top
    rod = sc.prims[1]
    ys, xs = np.mgrid[0:H, 0:W] + 0.5
    d = np.stack([(xs - cam.cx) / cam.fx, (ys - cam.cy) / cam.fy, np.ones_like(xs)], -1) @ cam.R.T  # world rays
    o = cam.origin
    # the nearest approach of each ray to the vertical axis in the xz plane
    ox, oz = o[0] - rod.c[0], o[2] - rod.c[2]
    a = d[..., 0] ** 2 + d[..., 2] ** 2
    tmin = -(ox * d[..., 0] + oz * d[..., 2]) / a
    dist = np.hypot(ox + tmin * d[..., 0], oz + tmin * d[..., 2])
    y = o[1] + tmin * d[..., 1]
    inside = (dist < rod.r * 0.98) & (y > 0.02) & (y < rod.height - 0.02)
    near = (dist > rod.r * 1.02) | (y < -0.02) | (y > rod.height + 0.02)
    got = thin.view(H, W).numpy()
    assert got[inside].all() and not got[near].any()


def test_the_families_take_the_reference_width():
    """data.thin_width_ref reaches the families: the same scene drawn for 128 has thicker rods and larger small
    objects than for 560, and the store key names it."""
    small = syn.draw(3, 0, (96, 128), "outdoor", "train", "fixed", Families(thin=4.0, distant=4.0, width_ref=128))[0]
    ref = syn.draw(3, 0, (96, 128), "outdoor", "train", "fixed", Families(thin=4.0, distant=4.0, width_ref=560))[0]
    sized = [(type(p).__name__, getattr(p, "r", None)) for g, p in enumerate(small.prims) if g in small.family]
    base = [(type(p).__name__, getattr(p, "r", None)) for g, p in enumerate(ref.prims) if g in ref.family]
    assert [k for k, _ in sized] == [k for k, _ in base]  # the same draws
    ratios = [a / b for (_, a), (_, b) in zip(sized, base) if a is not None and b]
    assert ratios and all(x == pytest.approx(560 / 128) for x in ratios)
    from depthpack.data.store import store_key
    assert store_key(DataConfig(thin_width_ref=128), "val", (128, 128), 4).endswith("_wref128")


def test_thin_width_ref_must_be_positive():
    with pytest.raises(ValueError, match="thin_width_ref must be a positive image width"):
        DataConfig(thin_width_ref=0)


def test_the_store_keeps_the_thin_band_and_older_stores_render_again(tmp_path):
    import json

    from depthpack.data.datasets import SyntheticDataset
    from depthpack.data.store import decode_thin, open_store

    cfg = DataConfig(cache_dir=str(tmp_path), num_val=3, thin_structures=4.0, distant_objects=3.0, thin_width_ref=64,
                     scene="outdoor", rig="fixed")
    store = open_store(cfg, "val", (48, 64), syn.render_batch, processes=1)
    want = syn.render_batch(0, range(3), (48, 64), "outdoor", "val", "fixed", cfg.families())["thin"].numpy()
    assert want.any() and np.array_equal(decode_thin(np.asarray(store.rows), store.layout), want)
    ds = SyntheticDataset(cfg, "val", (48, 64), 0.1, 80.0)
    s = ds[0]
    assert torch.equal(s["thin"], torch.from_numpy(want[0]) & s["valid"])
    meta_path = store.path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "version": 2}))  # a store of the version before the band
    again = open_store(cfg, "val", (48, 64), syn.render_batch, processes=1)
    assert json.loads(meta_path.read_text())["version"] == 3 and np.array_equal(np.asarray(again.rows),
                                                                                 np.asarray(store.rows))


def test_points_thin_needs_data_with_the_mask():
    from depthpack.eval.evaluate import region

    sample = dict(valid=torch.ones(4, 4, dtype=torch.bool), eval_mask=torch.ones(4, 4, dtype=torch.bool),
                  depth=torch.ones(4, 4), name="nyu_00001")
    with pytest.raises(ValueError, match="--points thin: sample nyu_00001 has no thin-structure mask"):
        region(sample, "thin", 2, 1.1)
    sample["thin"] = torch.eye(4, dtype=torch.bool)
    assert torch.equal(region(sample, "thin", 2, 1.1), torch.eye(4, dtype=torch.bool))


def test_the_thin_band_keeps_what_is_thin_in_the_image_and_drops_what_is_wide():
    from depthpack.data.queries import thin_band

    g = torch.Generator().manual_seed(7)
    for _ in range(20):  # a rod of 1-4 px and a block of 5-20 px, off the side borders: the band is the rod, whole
        H, W = 40, 60
        m = torch.zeros(H, W, dtype=torch.bool)
        rod_w, blk_w = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(5, 21, (1,), generator=g))
        x0, x1 = int(torch.randint(1, 20 - rod_w, (1,), generator=g)), int(torch.randint(30, W - blk_w, (1,), generator=g))
        y0 = int(torch.randint(0, 10, (1,), generator=g))
        m[y0:y0 + 25, x0:x0 + rod_w] = True
        m[y0:y0 + 25, x1:x1 + blk_w] = True
        rod = torch.zeros_like(m)
        rod[y0:y0 + 25, x0:x0 + rod_w] = True
        assert torch.equal(thin_band(m), rod)
        assert torch.equal(thin_band(m, blk_w), m)  # the block is at most blk_w across: in the band too
    batch = torch.stack([m, m.flip(-1)])
    assert torch.equal(thin_band(batch), torch.stack([thin_band(m), thin_band(m.flip(-1))]))  # [...,H,W]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="thin band width must be a whole number of pixels in \\[1, 4096\\]"):
            thin_band(m, bad)


def test_the_evaluations_thin_band_leaves_out_a_pole_close_to_the_camera():
    from depthpack.eval.evaluate import EvalSettings, region

    thin = torch.zeros(32, 32, dtype=torch.bool)
    thin[:, 2:4] = True    # a wire, 2 px
    thin[:, 10:26] = True  # a pole next to the camera, 16 px
    sample = dict(valid=torch.ones(32, 32, dtype=torch.bool), eval_mask=torch.ones(32, 32, dtype=torch.bool),
                  depth=torch.ones(32, 32), thin=thin)
    wire = torch.zeros_like(thin)
    wire[:, 2:4] = True
    assert torch.equal(region(sample, "thin", 2, 1.1), wire)
    assert torch.equal(region(sample, "thin", 2, 1.1, 16), thin)
    with pytest.raises(ValueError, match="thin band width"):
        EvalSettings(points="all", thin_max_px=0)


def _fence_scene(H: int, W: int, seed: int):
    """The first street of seed, drawn for an image W wide, with a fence (data.fences) and no other family."""
    fam = Families(0.0, 0.0, 0.0, W, fence=1.0)
    for i in range(20):
        sc, cam, _ = syn.draw(seed, i, (H, W), "outdoor", "train", "fixed", fam)
        if sc.family:
            return sc, cam
    raise AssertionError("no fence in 20 scenes")


def test_fences_are_drawn_after_the_other_families_and_leave_them_as_they_were():
    base = Families(thin=3.0, distant=3.0, width_ref=128)
    for i in range(4):
        a = syn.draw(5, i, (96, 128), "mixed", "train", "fixed", base)[0]
        b = syn.draw(5, i, (96, 128), "mixed", "train", "fixed", Families(3.0, 3.0, base.front, 128, fence=3.0))[0]
        n = len(a.prims)
        assert [repr(p) for p in b.prims[:n]] == [repr(p) for p in a.prims]
        assert set(b.family.values()) - set(a.family.values()) <= {"thin"}  # a fence's bars and rail are thin
    from depthpack.data.store import store_key
    assert store_key(DataConfig(fences=2), "val", (128, 128), 4).endswith("_fence2")
    assert "fence" not in store_key(DataConfig(), "val", (128, 128), 4)  # the stores made before fences keep their names
    with pytest.raises(ValueError, match=r"fences must lie in \[0, 10\]"):
        DataConfig(fences=-1)


@pytest.mark.parametrize("H,W", [(96, 128), (420, 560)])
def test_a_fences_bars_are_one_to_four_pixels_wide_two_to_four_widths_apart_and_resolved(H, W):
    for seed in range(3):
        sc, cam = _fence_scene(H, W, seed)
        bars = [p for g, p in enumerate(sc.prims) if sc.family.get(g) == "thin" and isinstance(p, syn.Cylinder)]
        bars = [p for p in bars if p.r == bars[0].r]  # the first fence's: one radius a fence
        assert 8 <= len(bars) <= 24
        mid = bars[len(bars) // 2]
        z = float((mid.c + np.array([0.0, 0.5 * mid.height, 0.0]) - cam.origin) @ cam.R[:, 2])
        assert 0.9 <= 2 * mid.r * cam.fx / z <= 4.2  # drawn for the fence's centre, a bar's width off it
        step = np.linalg.norm(bars[1].c - bars[0].c)
        assert 2.0 <= step / (2 * mid.r) <= 4.0
        # rendered: along the row through the middle bar's half height, the bars are runs of thin pixels
        # with background between them (one grey only below the reference width)
        _, _, thin = rc.cast_and_shade(rc.pack([(sc, cam)]), H, W)
        p = cam.K @ (cam.R.T @ (mid.c + np.array([0.0, 0.5 * mid.height, 0.0]) - cam.origin))
        row = thin[0, int(p[1] / p[2])].numpy().astype(int)
        runs = np.flatnonzero(np.diff(np.concatenate([[0], row, [0]])) == 1)
        assert len(runs) >= 4, (seed, row)
