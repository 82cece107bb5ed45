"""Data: synthetic scenes, every file format decoded exactly, crops, masks, skips, real samples.

Tests write their own tiny files under tmp_path. The real samples are read from ../shared/data/real
beside the repository and the tests that need them skip when it is absent.
"""
import logging
import threading
from pathlib import Path

import cv2
import h5py
import numpy as np
import pytest
import torch

from depthpack.data import DataConfig, make_dataset, read_depth, render, sample_queries, write_folder_sample
from depthpack.data import synthetic as syn
from depthpack.data.common import crop_mask, resize_nearest

# beside the repository, or (a git worktree under /work/wt/NAME) beside the worktrees' folder
REAL = next((p / "shared" / "data" / "real" for p in Path(__file__).resolve().parents[3:5]
             if (p / "shared" / "data" / "real").is_dir()), Path(__file__).resolve().parents[3] / "shared" / "data" / "real")
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"real samples not found at {REAL}")


# ----------------------------------------------------------------------------- synthetic
def test_render_deterministic_sized_and_in_range():
    a = render(3, 5, (48, 80), "indoor")
    b = render(3, 5, (48, 80), "indoor")
    assert a["image"].shape == (48, 80, 3) and a["depth"].shape == (48, 80)
    assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["depth"], b["depth"])
    assert not np.array_equal(a["depth"], render(3, 5, (48, 80), "indoor", split="val")["depth"])
    assert not np.array_equal(a["depth"], render(3, 6, (48, 80), "indoor")["depth"])
    assert 0.0 <= a["image"].min() and a["image"].max() <= 1.0 and a["image"].std() > 0.02
    indoor = np.concatenate([render(0, i, (32, 32), "indoor")["depth"].ravel() for i in range(8)])
    outdoor = np.concatenate([render(0, i, (32, 32), "outdoor")["depth"].ravel() for i in range(8)])
    assert indoor.min() > 0.3 and indoor.max() < 13.0  # rooms: every ray hits a wall
    assert (outdoor == 0).any() and outdoor.max() > 60.0  # streets: sky and far buildings
    K = a["K"]
    assert K[0, 2] == 40.0 and K[1, 2] == 24.0 and K[0, 0] == K[1, 1] > 0


def test_synthetic_dataset_splits_and_masks():
    cfg = DataConfig(kind="synthetic", scene="outdoor", num_samples=5, num_val=3, seed=1)
    train, val = make_dataset(cfg, "train", (32, 48), 1.0, 30.0), make_dataset(cfg, "val", (32, 48), 1.0, 30.0)
    assert len(train) == 5 and len(val) == 3
    s = train[2]
    assert s["image"].shape == (3, 32, 48) and s["image"].dtype == torch.float32
    assert s["depth"].dtype == torch.float32 and s["valid"].dtype == torch.bool
    d, v = s["depth"], s["valid"]
    assert ((d >= 1.0) & (d <= 30.0) == v).all() and (d[~v] == 0).all() and (~v).any()
    assert torch.equal(s["eval_mask"], v)
    assert not torch.equal(train[0]["depth"], val[0]["depth"])
    assert train.skipped == 0
    cached = make_dataset(DataConfig(scene="outdoor", num_samples=5, seed=1, cache=True), "train", (32, 48), 1.0, 30.0)
    assert torch.equal(cached[2]["depth"], d) and torch.equal(cached[2]["depth"], d) and len(cached._cache) == 1


# ----------------------------------------------------------------------------- queries
def test_sample_queries_valid_only_integer_and_deterministic():
    H, W = 20, 30
    valid = torch.zeros(H, W, dtype=torch.bool)
    valid[5:15, 3:20] = True
    image = torch.rand(3, H, W, generator=torch.Generator().manual_seed(0))
    pts = sample_queries(valid, image, 64, torch.Generator().manual_seed(1))
    assert pts.shape == (64, 2) and pts.dtype == torch.float32
    assert torch.equal(pts, pts.floor())
    assert valid[pts[:, 1].long(), pts[:, 0].long()].all()
    assert torch.equal(pts, sample_queries(valid, image, 64, torch.Generator().manual_seed(1)))
    # fewer valid pixels than queries: with replacement, still only valid pixels
    few = torch.zeros(H, W, dtype=torch.bool)
    few[2, 7] = few[11, 21] = True
    p = sample_queries(few, image, 50, torch.Generator().manual_seed(2))
    assert set(map(tuple, p.long().tolist())) == {(7, 2), (21, 11)}
    with pytest.raises(ValueError, match="no valid pixel"):
        sample_queries(torch.zeros(H, W, dtype=torch.bool), image, 4, torch.Generator())


def test_sample_queries_edge_weighting():
    H, W = 64, 64
    image = torch.zeros(3, H, W)
    image[:, :, 40:] = 1.0  # one vertical edge: Sobel is nonzero in columns 39 and 40 only (128 pixels)
    valid = torch.ones(H, W, dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    near = lambda p: ((p[:, 0] >= 39) & (p[:, 0] <= 40)).float().mean().item()
    edge = sample_queries(valid, image, 100, g, edge_frac=1.0)
    assert near(edge) == 1.0 and len(set(map(tuple, edge.tolist()))) == 100  # no pixel twice
    assert near(sample_queries(valid, image, 400, g, edge_frac=0.0)) < 0.08  # 2 of 64 columns
    assert 0.45 < near(sample_queries(valid, image, 100, g, edge_frac=0.5)) < 0.65


# ----------------------------------------------------------------------------- formats
def write_u16(path, arr):
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.asarray(arr, dtype=np.uint16))


def write_rgb(path, h, w, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return rgb


RAW = np.array([[0, 1, 255, 256, 1000], [1234, 5000, 21733, 65534, 65535]], dtype=np.uint16)


@pytest.mark.parametrize("scale", [1000.0, 256.0, 5000.0])
def test_png_depth_decodes_exactly(tmp_path, scale):
    write_u16(tmp_path / "d.png", RAW)
    d = read_depth(tmp_path / "d.png", scale)
    want = (RAW.astype(np.float64) / scale).astype(np.float32)
    want[RAW == 0] = 0
    want[RAW == 65535] = 0  # the saturated sentinel (7-Scenes) is invalid
    assert d.dtype == np.float32 and np.array_equal(d, want)


def test_sunrgbd_npy_and_middlebury_decoding(tmp_path):
    mm = np.array([[0, 1057, 4000, 9870]], dtype=np.uint16)
    stored = ((mm.astype(np.uint32) << 3) | (mm.astype(np.uint32) >> 13)).astype(np.uint16)  # SUN RGB-D rotation
    write_u16(tmp_path / "sun.png", stored)
    assert np.array_equal(read_depth(tmp_path / "sun.png", 1000.0, "sunrgbd"), (mm / 1000.0).astype(np.float32))
    meters = np.array([[1.5, 0.0, np.nan], [np.inf, 2.25, -1.0]], dtype=np.float32)
    np.save(tmp_path / "d.npy", meters)
    assert np.array_equal(read_depth(tmp_path / "d.npy"), np.array([[1.5, 0, 0], [0, 2.25, 0]], dtype=np.float32))
    # Middlebury: little-endian PFM stored bottom row first, inf = unknown, calib with extra spaces
    disp = np.array([[10.0, 20.0, np.inf], [40.0, 50.0, 60.0]], dtype=np.float32)  # top row first
    with open(tmp_path / "disp0GT.pfm", "wb") as f:
        f.write(b"Pf\n3 2\n-1.0\n" + np.flipud(disp).astype("<f4").tobytes())
    (tmp_path / "calib.txt").write_text(" cam0=[ 1000.5 0 300 ; 0 1000.5 200 ; 0 0 1]\n doffs= 50.0 \n baseline= 160.0\n")
    got = read_depth(tmp_path / "disp0GT.pfm", decode="middlebury")
    want = np.where(np.isfinite(disp), 160.0 * 1000.5 / (disp.astype(np.float64) + 50.0) / 1000.0, 0).astype(np.float32)
    assert np.array_equal(got, want)


# ----------------------------------------------------------------------------- loaders
def test_folder_round_trip_through_write_folder_sample(tmp_path):
    cfg = DataConfig(kind="synthetic", num_samples=2)
    src = make_dataset(cfg, "train", (24, 32), 0.5, 12.0)
    for i in range(2):
        write_folder_sample(src[i], tmp_path, f"s{i}", depth_scale=1000.0)
    back = make_dataset(DataConfig(kind="folder", root=str(tmp_path), depth_scale=1000.0), "all", (24, 32), 0.5, 12.0)
    assert len(back) == 2
    for i in range(2):
        a, b = src[i], back[i]
        assert b["name"] == f"s{i}" and torch.equal(a["valid"], b["valid"])
        assert (a["depth"] - b["depth"]).abs().max() <= 0.5e-3 + 1e-6  # rounded to mm
        assert (a["image"] - b["image"]).abs().max() <= 0.5 / 255 + 1e-6
    with pytest.raises(ValueError, match="does not fit"):
        write_folder_sample(dict(image=torch.zeros(3, 2, 2), depth=torch.full((2, 2), 80.0)), tmp_path, "x", 1000.0)


def test_kitti_split_file_values_and_crops(tmp_path):
    h, w = 375, 1242
    raw = np.zeros((h, w), dtype=np.uint16)
    raw[150:, ::3] = 2560  # 10 m, sparse like LiDAR
    raw[300, 600] = 21733  # 84.89453125 m: over max_depth 80 -> invalid
    write_u16(tmp_path / "gt" / "drive" / "0000000005.png", raw)
    write_rgb(tmp_path / "raw" / "drive" / "img" / "0000000005.png", h, w)
    split = tmp_path / "eigen_test.txt"
    split.write_text("# rgb depth focal\n/drive/img/0000000005.png /drive/0000000005.png 721.5\n"
                     "drive/img/0000000006.png None 721.5\n")
    cfg = DataConfig(kind="kitti", root=str(tmp_path / "raw"), depth_root=str(tmp_path / "gt"), split_file=str(split),
                     eval_crop="garg")
    s = make_dataset(cfg, "val", (h, w), 1e-3, 80.0)[0]  # native size: nothing resized
    d = s["depth"].numpy()
    assert np.array_equal(np.unique(d), [0.0, 10.0]) and d[300, 600] == 0 and not s["valid"][300, 600]
    assert s["valid"].sum() == (raw == 2560).sum()
    garg = np.zeros((h, w), bool)
    garg[153:371, 44:1197] = True  # int(0.40810811*375):int(0.99189189*375), int(0.03594771*1242):int(0.96405229*1242)
    assert np.array_equal(s["eval_mask"].numpy(), garg & s["valid"].numpy())
    eig = crop_mask("eigen_kitti", h, w)
    assert np.argwhere(eig).min(0).tolist() == [124, 44] and np.argwhere(eig).max(0).tolist() == [341, 1196]
    small = make_dataset(cfg, "val", (94, 312), 1e-3, 80.0)[0]  # resized: nearest, never blended
    assert set(np.unique(small["depth"].numpy()).tolist()) <= {0.0, 10.0}
    assert small["eval_mask"].any() and not (small["eval_mask"] & ~small["valid"]).any()


def test_a_relative_split_file_is_read_from_data_root(tmp_path, monkeypatch):
    """data.split_file=lists/train.txt is data.root/lists/train.txt whatever the working folder (a .mat root:
    its folder); where it is not, the one error names the folder searched, and the working folder's file."""
    root = tmp_path / "data"
    write_u16(root / "d" / "a.png", np.full((8, 8), 1500))
    write_rgb(root / "r" / "a.png", 8, 8)
    (root / "lists").mkdir()
    (root / "lists" / "train.txt").write_text("r/a.png d/a.png\n")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "other").mkdir(parents=True)
    (elsewhere / "other" / "train.txt").write_text("r/a.png d/a.png\n")
    monkeypatch.chdir(elsewhere)
    cfg = DataConfig(kind="folder", root=str(root), split_file="lists/train.txt")
    assert len(make_dataset(cfg, "train", (8, 8), 0.5, 10.0)) == 1
    with pytest.raises(ValueError, match=rf"data.split_file {root / 'other' / 'train.txt'}: no such file \(a relative "
                                         rf"data.split_file is read from data.root {root}\); other/train.txt lies in the "
                                         rf"working folder"):
        make_dataset(DataConfig(kind="folder", root=str(root), split_file="other/train.txt"), "train", (8, 8), 0.5, 10.0)
    with pytest.raises(ValueError, match=rf"data.val_split_file {root / 'lists'}: is a folder"):
        make_dataset(DataConfig(kind="folder", root=str(root), val_split_file="lists"), "val", (8, 8), 0.5, 10.0)


def test_nyu_folder_eigen_crop_and_resize(tmp_path):
    h, w = 480, 640
    raw = np.full((h, w), 2500, dtype=np.uint16)
    raw[:, :20] = 0
    write_u16(tmp_path / "scene_a" / "sync_depth_00007.png", raw)
    write_rgb(tmp_path / "scene_a" / "rgb_00007.jpg", h, w)
    cfg = DataConfig(kind="nyu", root=str(tmp_path), eval_crop="eigen_nyu")
    s = make_dataset(cfg, "all", (h, w), 1e-3, 10.0)[0]
    assert s["name"] == "scene_a/rgb_00007" and (s["depth"][:, 20:] == 2.5).all()
    crop = np.zeros((h, w), bool)
    crop[45:471, 41:601] = True
    assert np.array_equal(s["eval_mask"].numpy(), crop)
    half = make_dataset(cfg, "all", (240, 320), 1e-3, 10.0)[0]  # dst row i reads src row 2i+1
    rows = np.flatnonzero(half["eval_mask"].numpy().any(1))
    cols = np.flatnonzero(half["eval_mask"].numpy().any(0))
    assert (rows[0], rows[-1], cols[0], cols[-1]) == (22, 234, 20, 299)
    crop = make_dataset(DataConfig(kind="nyu", root=str(tmp_path), resize="center_crop"), "all", (64, 64), 1e-3, 10.0)[0]
    assert crop["image"].shape == (3, 64, 64) and crop["valid"].all()  # the invalid left columns are cropped away


def test_nyu_mat_v73_transposed_layout(tmp_path):
    N, H, W = 3, 6, 8
    rgb = np.zeros((N, H, W, 3), np.uint8)
    depth = np.zeros((N, H, W), np.float32)
    for n in range(N):
        for r in range(H):
            for c in range(W):
                rgb[n, r, c] = (10 * r, 10 * c, n)
                depth[n, r, c] = 1.0 + r + 0.1 * c + 0.01 * n
    path = tmp_path / "nyu_depth_v2_labeled.mat"
    with h5py.File(path, "w", userblock_size=512) as f:  # MATLAB v7.3 = HDF5 behind a 512-byte header
        f["images"] = rgb.transpose(0, 3, 2, 1)  # MATLAB column-major as h5py sees it: [N, 3, W, H]
        f["depths"] = depth.transpose(0, 2, 1)  # [N, W, H]
    with open(path, "r+b") as f:
        f.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 .")
    (tmp_path / "test.txt").write_text("2\n0\n")
    cfg = DataConfig(kind="nyu_mat", root=str(path), val_split_file="test.txt")  # relative: beside the .mat
    ds = make_dataset(cfg, "val", (H, W), 0.5, 10.0)
    assert len(ds) == 2
    s = ds[0]
    assert s["name"] == "nyu_00002"
    assert np.array_equal(np.round(s["image"].numpy().transpose(1, 2, 0) * 255).astype(np.uint8), rgb[2])
    assert np.array_equal(s["depth"].numpy(), depth[2])
    assert len(make_dataset(DataConfig(kind="nyu_mat", root=str(path), num_val=1), "train", (H, W), 0.5, 10.0)) == 2


def test_corrupt_and_missing_files_are_skipped_and_counted(tmp_path, caplog):
    for i in range(4):
        write_rgb(tmp_path / "rgb" / f"f{i}.png", 8, 8, seed=i)
    write_u16(tmp_path / "depth" / "f0.png", np.full((8, 8), 1500))
    (tmp_path / "depth" / "f1.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")  # corrupt
    write_u16(tmp_path / "depth" / "f3.png", np.zeros((8, 8)))  # no valid depth
    # f2 has no depth file at all
    ds = make_dataset(DataConfig(kind="folder", root=str(tmp_path)), "all", (8, 8), 0.1, 10.0)
    with caplog.at_level(logging.WARNING, logger="depthpack.data"):
        names = [ds[i]["name"] for i in range(4)]
    assert names == ["f0"] * 4 and ds.skipped == 3
    text = caplog.text
    assert str(tmp_path / "depth" / "f1.png") in text and str(tmp_path / "depth" / "f2.png") in text
    assert "no valid depth" in text and "3 skipped so far" in text


def test_no_valid_sample_is_a_value_error(tmp_path):
    write_rgb(tmp_path / "rgb" / "a.png", 8, 8)
    (tmp_path / "depth").mkdir()
    (tmp_path / "depth" / "a.png").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="no valid sample"):
        make_dataset(DataConfig(kind="folder", root=str(tmp_path)), "all", (8, 8), 0.1, 10.0)
    (tmp_path / "empty" / "rgb").mkdir(parents=True)
    with pytest.raises(ValueError, match="no sample"):
        make_dataset(DataConfig(kind="folder", root=str(tmp_path / "empty")), "all", (8, 8), 0.1, 10.0)
    with pytest.raises(ValueError, match="no such folder"):
        make_dataset(DataConfig(kind="kitti", root=str(tmp_path / "nope")), "all", (8, 8), 0.1, 10.0)


def test_nearest_resize_never_blends():
    d = np.zeros((9, 13), np.float32)
    d[::2, ::2] = np.arange(35, dtype=np.float32).reshape(5, 7) + 1  # valid values next to invalid ones
    for size in [(4, 5), (20, 31), (9, 13)]:
        out = resize_nearest(d, size, "resize")
        assert set(np.unique(out).tolist()) <= set(np.unique(d).tolist())


# ----------------------------------------------------------------------------- real samples
def load_native(cfg, size, min_depth=1e-3, max_depth=1000.0):
    return make_dataset(cfg, "all", size, min_depth, max_depth)


def pairs_file(tmp_path, line):
    p = tmp_path / "pairs.txt"
    p.write_text(line + "\n")
    return str(p)


def depth_stats(s):
    d = s["depth"][s["valid"]]
    return s["valid"].float().mean().item(), d.min().item(), d.max().item()


@needs_real
def test_real_kitti_ranges():
    cfg = DataConfig(kind="kitti", root=str(REAL / "kitti"), eval_crop="garg")
    ds = load_native(cfg, (375, 1242))
    assert len(ds) == 3
    frac, lo, hi = depth_stats(ds[0])
    assert ds[0]["name"] == "0000000005"
    assert frac == pytest.approx(0.195, abs=0.0006) and lo == pytest.approx(5.332, abs=6e-4) and hi == pytest.approx(84.895, abs=6e-4)
    capped = make_dataset(cfg, "all", (375, 1242), 1e-3, 80.0)[0]
    assert depth_stats(capped)[2] <= 80.0 and capped["valid"].sum() < ds[0]["valid"].sum()
    assert not capped["valid"][:119].any()  # no LiDAR ground truth above row ~119


@needs_real
def test_real_nyu_folder_ranges():
    cfg = DataConfig(kind="nyu", root=str(REAL / "nyu"), eval_crop="eigen_nyu")
    ds = load_native(cfg, (480, 640))
    assert [ds[i]["name"] for i in range(3)] == ["rgb_00000", "rgb_00050", "rgb_00100"]
    want = [(0.733, 1.390, 6.625), (0.751, 0.887, 8.266), (0.670, 0.713, 6.446)]
    for i, (f, lo, hi) in enumerate(want):
        s = ds[i]
        frac, dmin, dmax = depth_stats(s)
        assert frac == pytest.approx(f, abs=6e-4) and dmin == pytest.approx(lo, abs=6e-4) and dmax == pytest.approx(hi, abs=6e-4)
        in_crop = s["eval_mask"].sum().item() / (426 * 560)
        assert 0.845 <= in_crop < 0.945  # README: 85-94 %


@needs_real
@pytest.mark.parametrize("sub,line,kw,want", [
    ("tum", "TUM_color.png TUM_depth.png", dict(depth_scale=5000.0), (0.808, 1.464, 9.331)),
    ("7scenes", "frame-000000.color.jpg frame-000000.depth.png", dict(depth_scale=1000.0), (0.892, 0.801, 3.493)),
    ("sunrgbd", "SUN_color.jpg SUN_depth.png", dict(decode="sunrgbd"), (0.818, 1.057, 9.870)),
    ("middlebury", "ArtL/im0.png ArtL/disp0GT.pfm", dict(decode="middlebury"), (0.998, 1.418, 2.160)),
])
def test_real_folder_formats(tmp_path, sub, line, kw, want):
    cfg = DataConfig(kind="folder", root=str(REAL / sub), split_file=pairs_file(tmp_path, line), **kw)
    rgb = cv2.imread(str(REAL / sub / line.split()[0]))
    s = load_native(cfg, rgb.shape[:2])[0]
    frac, lo, hi = depth_stats(s)
    assert frac == pytest.approx(want[0], abs=6e-4) and lo == pytest.approx(want[1], abs=6e-4)
    assert hi == pytest.approx(want[2], abs=6e-4)


def test_fixed_rig_is_one_camera_over_the_same_scenes():
    import math

    fixed = [render(0, i, (32, 48), "mixed", rig="fixed") for i in range(6)]
    varied = [render(0, i, (32, 48), "mixed") for i in range(6)]
    assert all(np.array_equal(s["K"], fixed[0]["K"]) for s in fixed)  # one lens
    assert len({float(s["K"][0, 0]) for s in varied}) > 1  # varied: a lens per scene
    assert [s["scene"] for s in fixed] == [s["scene"] for s in varied]  # the same draws, the same scenes
    r = syn.FIXED_RIG
    for i in range(10):
        for make in (syn.indoor_scene, syn.outdoor_scene):
            _, cam = make(np.random.default_rng(i), 32, 32, "fixed")
            pitch = math.asin(-cam.R[1, 2])  # R's third column is the forward direction
            assert abs(cam.origin[1] - r["height"]) <= r["jitter_height"] + 1e-9
            assert abs(pitch - r["pitch"]) <= r["jitter_pitch"] + 1e-6
    lens = [render(0, i, (32, 48), "mixed", rig="lens") for i in range(6)]
    assert [float(s["K"][0, 0]) for s in lens] == [float(s["K"][0, 0]) for s in varied]  # varied's lenses
    for i in range(10):  # on the fixed rig's mount and tilt
        for make in (syn.indoor_scene, syn.outdoor_scene):
            _, cam = make(np.random.default_rng(i), 32, 32, "lens")
            assert abs(cam.origin[1] - r["height"]) <= r["jitter_height"] + 1e-9
            assert abs(math.asin(-cam.R[1, 2]) - r["pitch"]) <= r["jitter_pitch"] + 1e-6
    with pytest.raises(ValueError, match="rig='robot' is not one of"):
        DataConfig(rig="robot")


def test_prefill_renders_nothing_over_a_scene_store(tmp_path, monkeypatch):
    """data.cache with data.cache_dir: the store holds every scene, so prefill renders none (every trainer of a
    frontier on the GPU rendered the whole train split again, 85 s, and then read only the store)."""
    import depthpack.data.datasets as ds

    cfg = DataConfig(kind="synthetic", scene="mixed", rig="fixed", num_samples=4, num_val=2, cache=True,
                     cache_dir=str(tmp_path))
    stored = make_dataset(cfg, "train", (32, 32), 0.5, 80.0)  # renders the store
    monkeypatch.setattr(ds, "_render_span", lambda job: pytest.fail("prefill rendered over a store"))
    stored.prefill(processes=2)
    assert stored._cache == {} and stored.store is not None and len(stored) == 4


def test_prefill_renders_the_same_scenes_in_processes():
    cfg = DataConfig(kind="synthetic", scene="mixed", rig="fixed", num_samples=6, seed=2, cache=True)
    pre = make_dataset(cfg, "train", (32, 32), 0.5, 80.0)
    pre[0]  # a cache already holding tensors, and a dataset that cannot be pickled: prefill sends neither
    pre._not_picklable = threading.Lock()
    pre.prefill(processes=2)
    assert len(pre._cache) == 6
    lazy = make_dataset(cfg, "train", (32, 32), 0.5, 80.0)
    for i in range(6):
        a, b = pre[i], lazy[i]
        # depth bit for bit; colour within float32 rounding (vectorized sin/atan2 round by position in a batch)
        assert a["name"] == b["name"] and all(torch.equal(a[k], b[k]) for k in ("depth", "valid"))
        assert torch.allclose(a["image"], b["image"], atol=1e-6, rtol=0)
