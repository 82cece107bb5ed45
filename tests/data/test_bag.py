"""ROS bags as data (depthpack.data.rosbag): the tests write their own bags with rosbags (ROS 1, ROS 2
sqlite3, ROS 2 MCAP; raw and compressed colour; 16UC1, 32FC1 and compressedDepth depth), read them
back exactly, and give every bad bag one clear error. Where ../shared/data/real holds real RGB-D
samples, packed into a bag they give the same arrays as their folders."""
from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from depthpack.data import DataConfig, make_dataset
from depthpack.data.rosbag import (CAMERA_INFO, COMPRESSED, DEPTH_MAX, DEPTH_QUANT, IMAGE, BagReader, BagTopics, BagWriter,
                                decode_color, decode_depth, index_bag, pair_stamps, read_back, split_blocks)
from depthpack.data.intrinsics import NYU_FOCAL
from test_data import REAL, needs_real

H, W = 24, 32
K = np.array([[40.0, 0.0, 15.5], [0.0, 42.0, 11.5], [0.0, 0.0, 1.0]])
FORMATS = [("ros1", "rec.bag"), ("sqlite3", "rec"), ("mcap", "rec")]
COLOR = {"rgb8": ("/cam/rgb", IMAGE), "bgr8": ("/cam/bgr", IMAGE), "mono8": ("/cam/mono", IMAGE),
         "jpeg": ("/cam/jpeg", COMPRESSED), "png": ("/cam/png", COMPRESSED)}
DEPTH = {"16UC1": ("/depth/mm", IMAGE), "32FC1": ("/depth/m", IMAGE),
         "16UC1; compressedDepth": ("/depth/cd16", COMPRESSED), "32FC1; compressedDepth": ("/depth/cd32", COMPRESSED)}
T0, DT = 1_000_000_000, 100_000_000  # 10 frames a second


def frame_arrays(i: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    coarse = rng.integers(0, 256, (4, 6, 3)).astype(np.float32)  # smooth, like a camera image (JPEG-friendly)
    rgb = np.clip(cv2.resize(coarse, (W, H), interpolation=cv2.INTER_LINEAR) + rng.integers(-3, 4, (H, W, 3)), 0, 255).astype(np.uint8)
    depth = rng.uniform(0.3, 8.0, (H, W)).astype(np.float32)
    depth[0, :3] = 0.0  # no measurement
    depth[1, :2] = np.nan
    return rgb, depth


def write_bag(path, fmt: str, n: int = 6, depth_offset_ns: int = 0, extra_depth: int = 0, color_size=(H, W),
              depth_size=(H, W), info_K=K, info_size=None) -> dict:
    """A bag with every colour and depth variant of frames 0..n-1 (+ CameraInfo /cam/camera_info)."""
    frames = []
    with BagWriter(path, fmt) as w:
        conns = {k: w.add(topic, t) for k, (topic, t) in {**COLOR, **DEPTH}.items()}
        info = w.add("/cam/camera_info", CAMERA_INFO)
        for i in range(n):
            t = T0 + i * DT
            rgb, depth = frame_arrays(i)
            rgb = cv2.resize(rgb, color_size[::-1], interpolation=cv2.INTER_NEAREST)
            depth = cv2.resize(depth, depth_size[::-1], interpolation=cv2.INTER_NEAREST)
            frames.append((rgb, depth))
            for enc in ("rgb8", "bgr8", "mono8"):
                w.write(conns[enc], t, w.image(rgb, enc, t))
            for enc in ("jpeg", "png"):
                w.write(conns[enc], t, w.compressed(rgb, enc, t))
            td = t + depth_offset_ns
            for enc in ("16UC1", "32FC1"):
                w.write(conns[enc], td, w.image(depth, enc, td))
            for enc in ("16UC1; compressedDepth", "32FC1; compressedDepth"):
                w.write(conns[enc], td, w.compressed(depth, enc, td))
            w.write(info, t, w.camera_info(info_K, *(info_size or color_size[::-1]), t))
        for j in range(extra_depth):  # depth frames far from every colour frame
            td = T0 + n * DT + (j + 1) * 10 * DT
            w.write(conns["16UC1"], td, w.image(frames[0][1], "16UC1", td))
    return {"frames": frames}


@pytest.fixture(scope="module", params=FORMATS, ids=[f for f, _ in FORMATS])
def bag(request, tmp_path_factory):
    fmt, name = request.param
    path = tmp_path_factory.mktemp(fmt) / name
    return path, fmt, write_bag(path, fmt)


# ---- exact read-back ----------------------------------------------------------------------------
def expected_depth(depth: np.ndarray, enc: str) -> np.ndarray:
    """What each encoding keeps of float meters, computed here independently of the library."""
    ok = np.isfinite(depth) & (depth > 0)
    d = np.where(ok, depth, 0).astype(np.float64)
    if enc in ("16UC1", "16UC1; compressedDepth"):
        return (np.round(d * 1000.0) / 1000.0).astype(np.float32) * ok
    if enc == "32FC1":
        return np.where(ok, depth, 0).astype(np.float32)
    a = np.float32(DEPTH_QUANT * (DEPTH_QUANT + 1.0))  # image_transport's codec.cpp, 32FC1
    b = np.float32(1.0 - a / np.float32(DEPTH_MAX))
    with np.errstate(divide="ignore"):
        q = np.where(ok & (depth < DEPTH_MAX), a / np.where(ok, depth, 1).astype(np.float32) + b, 0).astype(np.uint16)
    return np.where(q > 0, a / (q.astype(np.float32) - b), 0).astype(np.float32)


def test_every_encoding_reads_back_exactly(bag):
    path, fmt, made = bag
    for enc, (topic, _) in COLOR.items():
        msgs = read_back(path, topic)
        assert len(msgs) == len(made["frames"])
        for (t, mt, m), (rgb, _) in zip(msgs, made["frames"]):
            got = decode_color(m, mt, topic)
            assert got.dtype == np.uint8 and got.shape == (H, W, 3)
            if enc == "mono8":  # converted: the gray value in R, G and B
                want = np.repeat(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)[..., None], 3, 2)
            elif enc == "jpeg":  # lossy: exactly what the JPEG decodes to
                want = cv2.cvtColor(cv2.imdecode(np.asarray(m.data), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
                assert np.abs(got.astype(int) - rgb).mean() < 12
            else:
                want = rgb
            assert np.array_equal(got, want), (enc, fmt)
    for enc, (topic, _) in DEPTH.items():
        msgs = read_back(path, topic)
        for (t, mt, m), (_, depth) in zip(msgs, made["frames"]):
            got = decode_depth(m, mt, topic)
            want = expected_depth(depth, enc)
            assert got.dtype == np.float32 and np.array_equal(got, want), (enc, fmt)
            assert (got[0, :3] == 0).all() and (got[1, :2] == 0).all()  # zeros and NaNs: no measurement
            close = want > 0
            tol = 6e-4 if "16UC1" in enc else (0.1 if "compressed" in enc else 0)
            assert np.abs(got[close] - depth[close]).max() <= tol


def test_headers_keep_their_stamps_and_camera_info(bag):
    path, fmt, _ = bag
    (t, _, m), = read_back(path, "/cam/camera_info")[:1]
    K_read = np.asarray(m.K if fmt == "ros1" else m.k).reshape(3, 3)  # ROS 1 spells it K, ROS 2 k
    assert np.array_equal(K_read, K) and (m.width, m.height) == (W, H)
    assert t == T0 and m.header.stamp.sec == 1 and m.header.stamp.nanosec == 0


# ---- pairing and the split ----------------------------------------------------------------------
def test_pairing_is_one_to_one_nearest_within_tolerance():
    a = np.array([0, 100, 200, 300])
    b = np.array([5, 95, 96, 260, 1000])
    assert pair_stamps(a, b, 10) == [(0, 0), (1, 2)]  # 100 takes 96, its nearest; 200 has none within 10
    assert pair_stamps(a, b, 50) == [(0, 0), (1, 2), (3, 3)]
    assert pair_stamps(np.array([0, 4]), np.array([3]), 10) == [(1, 0)]  # two claim one: the closer wins
    assert pair_stamps(a, np.array([], np.int64), 10) == []


def test_pairing_counts_what_it_drops(tmp_path):
    path = tmp_path / "d.mcap_bag"
    write_bag(path, "mcap", n=5, depth_offset_ns=3_000_000, extra_depth=2)
    idx = index_bag(path, BagTopics("/cam/rgb", "/depth/mm"), tol_ms=5)
    s = idx.summary()
    assert (s["colour_frames"], s["depth_frames"], s["paired"], s["dropped_colour"], s["dropped_depth"]) == (5, 7, 5, 0, 2)
    assert s["worst_pair_gap_ms"] == 3.0 and s["info_topic"] == "/cam/camera_info"  # the sibling, found


def test_split_is_by_contiguous_time_blocks_with_gaps():
    t = (np.arange(100) * 0.1 * 1e9).astype(np.int64)  # 10 s at 10 fps
    tr, va = split_blocks(t, "train", 2.0, 5, 0.3), split_blocks(t, "val", 2.0, 5, 0.3)
    assert va == list(range(80, 100))  # block 4 of 0..4: the last 2 s
    assert set(tr).isdisjoint(va) and max(tr) < 80 - 2  # 0.3 s before the val block left out
    assert split_blocks(t, "all", 2.0, 5, 0.3) == list(range(100))
    gaps = np.diff(va)
    assert (gaps == 1).all()  # contiguous, not random frames


def test_dataset_over_several_bags_splits_and_focal(tmp_path):
    for k, fmt in enumerate(("ros1", "mcap")):
        write_bag(tmp_path / ("a.bag" if fmt == "ros1" else "b"), fmt, n=12)
    cfg = DataConfig(kind="bag", root=str(tmp_path), image_topic="/cam/png", depth_topic="/depth/m",
                     split_block_s=0.3, val_every=2, split_gap_s=0.05)
    tr, va, al = (make_dataset(cfg, s, (16, 16), 0.1, 10.0) for s in ("train", "val", "all"))
    # per bag: blocks of 3 frames, every 2nd is val (6 frames); the train frame right after a val block
    # (0.6 s, within split_gap_s of it) is in neither split
    assert (len(al), len(va), len(tr), tr.in_gaps) == (24, 12, 10, 2)
    assert {n.split("@")[0] for n in (tr.frame_name(i) for i in range(len(tr)))} == {"a.bag", "b"}
    s = tr[0]
    assert s["image"].shape == (3, 16, 16) and s["depth"].shape == (16, 16) and s["valid"].dtype == torch.bool
    want_f = math.sqrt(40.0 * 16 / W * 42.0 * 16 / H)  # K scaled with the resize
    assert float(s["focal"]) == pytest.approx(want_f, rel=1e-6)
    rgb, depth = frame_arrays(0)
    folder_like = make_sample_ref(rgb, expected_depth(depth, "32FC1"), cfg, (40.0, 42.0))
    assert torch.equal(al[0]["image"], folder_like["image"]) and torch.equal(al[0]["depth"], folder_like["depth"])
    over = make_dataset(DataConfig(**{**cfg.__dict__, "focal": 100.0}), "all", (16, 16), 0.1, 10.0)
    assert float(over[0]["focal"]) == pytest.approx(100.0 * math.sqrt(16 / W * 16 / H), rel=1e-6)


def make_sample_ref(rgb, depth, cfg, focal):
    from depthpack.data.common import make_sample
    return make_sample(rgb, depth, (16, 16), cfg, 0.1, 10.0, "ref", focal=focal)


def test_decoded_frame_cache_on_disk_and_in_memory(tmp_path):
    write_bag(tmp_path / "r", "sqlite3", n=8)
    base = dict(kind="bag", root=str(tmp_path / "r"), image_topic="/cam/jpeg", depth_topic="/depth/cd16",
                split_block_s=10.0)
    plain = make_dataset(DataConfig(**base), "train", (16, 16), 0.1, 10.0)
    cached = make_dataset(DataConfig(**base, cache_dir=str(tmp_path / "c")), "train", (16, 16), 0.1, 10.0)
    files = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert len(files) == 2 and files[0].endswith(".json")  # rows + the JSON, written last
    for i in range(len(plain)):
        a, b = plain[i], cached[i]
        assert (a["image"] - b["image"]).abs().max() <= 0.5 / 255 + 1e-6  # uint8 rows
        assert torch.equal(a["valid"], b["valid"]) and torch.allclose(a["depth"], b["depth"], rtol=1e-3)
        assert float(a["focal"]) == pytest.approx(float(b["focal"]), rel=1e-6)
    again = make_dataset(DataConfig(**base, cache_dir=str(tmp_path / "c")), "train", (16, 16), 0.1, 10.0)
    assert again.store.path == cached.store.path and sorted(p.name for p in (tmp_path / "c").iterdir()) == files
    mem = make_dataset(DataConfig(**base, cache=True), "train", (16, 16), 0.1, 10.0)
    mem.prefill(processes=2)
    assert mem.rows is not None and torch.equal(mem[3]["image"], cached[3]["image"])


# ---- bad bags: one clear error each ---------------------------------------------------------------
@pytest.mark.parametrize("fmt,name", FORMATS, ids=[f for f, _ in FORMATS])
def test_truncated_bag_is_one_clear_error(tmp_path, fmt, name):
    path = tmp_path / name
    write_bag(path, fmt, n=4)
    f = path if path.is_file() else next(p for p in path.iterdir() if p.suffix in (".mcap", ".db3"))
    data = f.read_bytes()
    f.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ValueError, match=r"bag .*(cannot be read|truncated)"):
        index_bag(path, BagTopics("/cam/rgb", "/depth/mm"))


def test_missing_topic_lists_the_topics_that_exist(bag):
    path, _, _ = bag
    with pytest.raises(ValueError, match=r"no colour topic '/cam/nope'; its topics: .*/cam/rgb \(sensor_msgs/msg/Image\)"):
        index_bag(path, BagTopics("/cam/nope", "/depth/mm"))
    with pytest.raises(ValueError, match=r"no depth topic '/depth/nope'"):
        index_bag(path, BagTopics("/cam/rgb", "/depth/nope"))


def test_unknown_encodings_are_refused_by_name(tmp_path):
    path = tmp_path / "e.bag"
    with BagWriter(path) as w:
        c, d = w.add("/c", IMAGE), w.add("/d", IMAGE)
        m = w.image(np.zeros((4, 6, 3), np.uint8), "rgb8", T0)
        m.encoding = "yuv422"
        w.write(c, T0, m)
        m = w.image(np.ones((4, 6), np.float32), "16UC1", T0)
        m.encoding = "8UC1"
        w.write(d, T0, m)
    ds_cfg = DataConfig(kind="bag", root=str(path), image_topic="/c", depth_topic="/d")
    with pytest.raises(ValueError, match=r"colour topic /c: encoding 'yuv422' is not one of rgb8, bgr8"):
        make_dataset(ds_cfg, "all", (8, 8), 0.1, 10.0)
    (t, mt, msg), = read_back(path, "/d")
    with pytest.raises(ValueError, match=r"depth topic /d: encoding '8UC1' is not one of 16UC1, mono16, 32FC1"):
        decode_depth(msg, mt, "/d")


def test_depth_and_colour_of_different_sizes(tmp_path):
    write_bag(tmp_path / "s", "mcap", n=2, depth_size=(12, 16))
    with pytest.raises(ValueError, match=r"colour 32x24 and depth 16x12 differ in size"):
        index_bag(tmp_path / "s", BagTopics("/cam/rgb", "/depth/mm"))
    cfg = DataConfig(kind="bag", root=str(tmp_path / "s"), image_topic="/cam/jpeg", depth_topic="/depth/cd16")
    with pytest.raises(ValueError, match=r"colour 32x24 and depth 16x12 differ in size"):  # found when decoded
        make_dataset(cfg, "all", (8, 8), 0.1, 10.0)


def test_camera_info_with_zero_K_or_another_size(tmp_path):
    write_bag(tmp_path / "k", "mcap", n=2, info_K=np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"CameraInfo on /cam/camera_info: K = .* no focal length"):
        index_bag(tmp_path / "k", BagTopics("/cam/rgb", "/depth/mm"))
    write_bag(tmp_path / "z.bag", "ros1", n=2, info_size=(64, 48))
    with pytest.raises(ValueError, match=r"CameraInfo on /cam/camera_info describes 64x48 images, the colour topic /cam/rgb holds 32x24"):
        index_bag(tmp_path / "z.bag", BagTopics("/cam/rgb", "/depth/mm"))


def test_timestamps_that_never_pair(tmp_path):
    write_bag(tmp_path / "t", "sqlite3", n=3, depth_offset_ns=40_000_000)
    with pytest.raises(ValueError, match=r"no colour frame of /cam/rgb \(3\) pairs with a depth frame of /depth/mm \(3\) "
                                         r"within 10 ms \(the nearest are 40.0 ms apart\)"):
        index_bag(tmp_path / "t", BagTopics("/cam/rgb", "/depth/mm"), tol_ms=10)


@pytest.mark.parametrize("fmt,name", FORMATS, ids=[f for f, _ in FORMATS])
def test_empty_bag(tmp_path, fmt, name):
    with BagWriter(tmp_path / name, fmt):
        pass
    with pytest.raises(ValueError, match=r"empty \(no topic, no message\)"):
        index_bag(tmp_path / name, BagTopics("/cam/rgb", "/depth/mm"))
    empty_file = tmp_path / "zero.bag"
    empty_file.write_bytes(b"")
    with pytest.raises(ValueError, match=r"not a ROS bag \(empty file\)"):
        index_bag(empty_file, BagTopics("/c", "/d"))


def test_output_that_is_a_folder_or_read_only_leaves_nothing(tmp_path):
    (tmp_path / "dir.bag").mkdir()
    with pytest.raises(ValueError, match=r"output .*dir.bag is a folder; a ROS 1 bag is one .bag file"):
        BagWriter(tmp_path / "dir.bag")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"exists and is not a ROS 2 bag folder; refusing to replace it"):
        BagWriter(tmp_path / "plain", "mcap")
    assert (tmp_path / "plain" / "keep.txt").read_text() == "mine"
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores mode bits: an immutable folder refuses root too
        if subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("cannot make a read-only folder here (root, no chattr)")
    else:
        ro.chmod(0o555)
    try:
        for name, fmt in (("x.bag", "ros1"), ("x", "mcap")):
            with pytest.raises(ValueError, match=r"output .*: the folder .*ro cannot be written"):
                BagWriter(ro / name, fmt)
        assert list(ro.iterdir()) == []
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(ro)], check=False)
        ro.chmod(0o755)


def test_an_error_inside_the_writer_leaves_the_previous_bag(tmp_path):
    for fmt, name in FORMATS:
        path = tmp_path / name
        write_bag(path, fmt, n=2)
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(RuntimeError):
            with BagWriter(path, fmt) as w:
                c = w.add("/only", IMAGE)
                w.write(c, T0, w.image(np.zeros((2, 2, 3), np.uint8), "rgb8", T0))
                raise RuntimeError("killed")
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary left
        assert "/cam/rgb" in BagReader(path).topics  # the previous bag, whole


def write_then_die(out, fmt: str) -> None:
    """Open a bag, write 40 frames, then die without closing it (os._exit: no cleanup, as a kill)."""
    w = BagWriter(out, fmt).__enter__()
    c = w.add("/c", IMAGE)
    for i in range(40):
        w.write(c, T0 + i, w.image(np.full((64, 64, 3), i, np.uint8), "rgb8", T0 + i))
    os._exit(9)


@pytest.mark.parametrize("fmt,name", FORMATS, ids=[f for f, _ in FORMATS])
def test_a_writer_killed_mid_write_leaves_no_bag_a_reader_accepts(tmp_path, fmt, name):
    out = tmp_path / name
    pid = os.fork()  # a child process that dies mid-write (fork: no second interpreter to start)
    if pid == 0:
        try:
            write_then_die(out, fmt)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    assert not out.exists()
    leftovers = list(tmp_path.iterdir())
    assert leftovers and all(p.name.startswith(".") for p in leftovers)  # only the hidden temporary
    for p in leftovers:
        target = p if p.is_file() else p / name
        renamed = tmp_path / "probe.bag" if p.is_file() else target
        if p.is_file():
            p.rename(renamed)
        with pytest.raises(ValueError):
            BagReader(renamed)
    write_bag(out, fmt, n=1)  # the next writer of the same path clears what the dead one left
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ---- the real samples: bag path == folder path ----------------------------------------------------
@needs_real
def test_real_nyu_samples_in_a_bag_give_the_folders_arrays(tmp_path):
    """The NYU samples' JPEG bytes go into CompressedImage messages verbatim, their uint16 PNG depth
    into 16UC1 Images, NYU's K into CameraInfo: the bag data set must equal the folder data set."""
    rgbs = sorted((REAL / "nyu").glob("rgb_*.jpg"))
    out = tmp_path / "nyu.bag"
    Knyu = np.array([[NYU_FOCAL[0], 0, 325.58245], [0, NYU_FOCAL[1], 253.73617], [0, 0, 1]])
    with BagWriter(out) as w:
        c, d, i = w.add("/rgb/compressed", COMPRESSED), w.add("/depth", IMAGE), w.add("/camera_info", CAMERA_INFO)
        for k, p in enumerate(rgbs):
            t = T0 + k * 60 * 10**9  # a minute apart: one frame per split block
            raw = cv2.imread(str(p.with_name("sync_depth_" + p.stem[4:] + ".png")), cv2.IMREAD_UNCHANGED)
            m = w.compressed(np.zeros((1, 1, 3), np.uint8), "jpeg", t)
            m.data = np.frombuffer(p.read_bytes(), np.uint8)
            w.write(c, t, m)
            w.write(d, t, w.image(raw.astype(np.float64) / 1000.0, "16UC1", t))
            w.write(i, t, w.camera_info(Knyu, 640, 480, t))
    size = (48, 64)
    bag = make_dataset(DataConfig(kind="bag", root=str(out), image_topic="/rgb/compressed", depth_topic="/depth",
                                  info_topic="/camera_info"), "all", size, 0.1, 10.0)
    folder = make_dataset(DataConfig(kind="nyu", root=str(REAL / "nyu")), "all", size, 0.1, 10.0)
    assert len(bag) == len(folder) == len(rgbs)
    for a, b in zip((bag[k] for k in range(len(bag))), (folder[k] for k in range(len(folder)))):
        for key in ("image", "depth", "valid", "eval_mask"):
            assert torch.equal(a[key], b[key]), key
        assert float(a["focal"]) == pytest.approx(float(b["focal"]), rel=1e-6)
