"""python -m depthpack.bag: info, and run (a model over every frame of a bag, answers into a copy of it
as PointCloud2, a CSV and a report), with the one-line error contract and atomic outputs."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import randomize_
from test_bag import FORMATS, K, T0, write_bag

from depthpack import Predictor, create_model
from depthpack.bag import bag_info, demo_recording, main, parse_points, points_for, run_bag
from depthpack.core import cli
from depthpack.data.rosbag import BagReader, decode_color, decode_depth, read_back


@pytest.fixture(scope="module")
def model():
    return randomize_(create_model("tiny")).eval()


def predictor(model):
    return Predictor(model, device="cpu", color="rgb")


def raw_messages(path) -> dict[str, list[tuple[int, bytes]]]:
    with BagReader(path) as r:
        out: dict[str, list] = {}
        for c, t, raw in r.messages():
            out.setdefault(c.topic, []).append((t, bytes(raw)))
        return out


def cloud_array(msg) -> tuple[list[str], np.ndarray]:
    names = [f.name for f in msg.fields]
    assert [f.datatype for f in msg.fields] == [7] * len(names) and msg.point_step == 4 * len(names)
    return names, np.frombuffer(bytes(msg.data), "<f4").reshape(msg.width, len(names))


def test_points_grid_and_file(tmp_path):
    g = points_for(parse_points("grid:4x3"), 32, 24)
    assert g.shape == (12, 2) and g[0].tolist() == [4.0, 4.0] and g[-1].tolist() == [28.0, 20.0]
    f = tmp_path / "p.csv"
    f.write_text("x,y\n1 2\n# a comment\n3.5,4\n")
    assert parse_points(str(f)).tolist() == [[1.0, 2.0], [3.5, 4.0]]
    with pytest.raises(ValueError, match="outside the 3x3 frame"):
        points_for(parse_points(str(f)), 3, 3)
    for bad in ("grid:0x3", "grid:4", "nofile.txt"):
        with pytest.raises(ValueError, match="--points"):
            parse_points(bad)


def test_info_lists_topics_rates_and_pairing(tmp_path, capsys):
    write_bag(tmp_path / "r", "mcap", n=6)
    info = bag_info(tmp_path / "r", "/cam/rgb", "/depth/mm")
    assert info["topics"]["/cam/rgb"] == {"type": "sensor_msgs/msg/Image", "count": 6, "rate_hz": 10.0,
                                          "encoding": "rgb8", "size": "32x24"}
    assert info["pairing"]["ok"] and info["pairing"]["paired"] == 6 and info["pairing"]["info_topic"] == "/cam/camera_info"
    assert info["pairing"]["camera"]["fx"] == 40.0
    guessed = bag_info(tmp_path / "r")  # five colour-like topics: it asks which
    assert not guessed["pairing"]["ok"] and "--image-topic" in guessed["pairing"]["why"]
    assert main(["info", str(tmp_path / "r"), "--image-topic", "/cam/jpeg", "--depth-topic", "/depth/cd32"]) == 0
    text = capsys.readouterr().out
    assert "/depth/cd32" in text and "32FC1; compressedDepth png" in text and "6 pairs, dropped 0 colour / 0 depth" in text


def test_info_names_the_camera_info_topics_when_none_is_beside_the_colour_topic(tmp_path, capsys):
    """CameraInfo published away from the colour topic's sibling: info lists the CameraInfo topics it found
    and says how to name one, rather than a bare "CameraInfo: none"; --info-topic then pairs it."""
    from depthpack.data.rosbag import CAMERA_INFO, IMAGE, BagWriter

    K = np.array([[40.0, 0, 16], [0, 40.0, 12], [0, 0, 1]])
    with BagWriter(tmp_path / "r", "mcap") as w:
        img, cam = w.add("/front/image", IMAGE), w.add("/calib/front_info", CAMERA_INFO)
        for k in range(3):
            t = 1_000_000_000 + k * 100_000_000
            w.write(img, t, w.image(np.zeros((24, 32, 3), np.uint8), "rgb8", t, "front"))
            w.write(cam, t, w.camera_info(K, 32, 24, t, "front"))
    assert main(["info", str(tmp_path / "r"), "--image-topic", "/front/image"]) == 0
    assert "CameraInfo: none (the bag has /calib/front_info: name one with --info-topic)" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "r"), "--image-topic", "/front/image", "--info-topic", "/calib/front_info"]) == 0
    assert "CameraInfo: /calib/front_info" in capsys.readouterr().out


@pytest.mark.parametrize("fmt,name", FORMATS, ids=[f for f, _ in FORMATS])
def test_run_copies_the_bag_and_adds_the_answers(tmp_path, model, fmt, name):
    src = tmp_path / name
    made = write_bag(src, fmt, n=5)
    out = tmp_path / ("out.bag" if fmt == "ros1" else "out")
    pred = predictor(model)
    rep = run_bag(src, out, pred, "/cam/png", "grid:4x3", depth_topic="/depth/m", progress=False, depth_range=(0.1, 10.0))
    before, after = raw_messages(src), raw_messages(out)
    assert set(after) == set(before) | {"/depthpack/points"}
    for topic, msgs in before.items():
        assert after[topic] == msgs  # every input message, byte for byte, at its log time
    clouds = read_back(out, "/depthpack/points")
    assert len(clouds) == 5 and all(mt == "sensor_msgs/msg/PointCloud2" for _, mt, _ in clouds)
    csv = np.array([[float(v) if v else np.nan for v in line.split(",")]
                    for line in Path(rep["csv"]).read_text().splitlines()[1:]])
    assert csv.shape == (5 * 12, 9)
    per_frame = []
    pts = points_for(parse_points("grid:4x3"), 32, 24)
    for k, ((t, _, m), (rgb, depth)) in enumerate(zip(clouds, made["frames"])):
        assert t == T0 + k * 100_000_000 and m.header.stamp.sec * 10**9 + m.header.stamp.nanosec == t
        names, a = cloud_array(m)
        assert names == ["u", "v", "depth", "x", "y", "z"]
        want = pred.predict(rgb, pts, focal=math.sqrt(40.0 * 42.0)).reshape(-1).numpy()
        assert np.array_equal(a[:, :2], pts) and np.allclose(a[:, 2], want, rtol=1e-6)
        assert np.allclose(a[:, 5], a[:, 2]) and np.allclose(a[:, 3], (pts[:, 0] - 0.5 - K[0, 2]) / K[0, 0] * a[:, 2], rtol=1e-5)
        rows = csv[csv[:, 0] == k]
        assert np.allclose(rows[:, 2:8], a, rtol=1e-5)
        gt = depth[pts[:, 1].astype(int), pts[:, 0].astype(int)]
        ok = np.isfinite(gt) & (gt > 0)
        assert np.allclose(rows[ok, 8], gt[ok], rtol=1e-5)
        per_frame.append(np.mean(np.abs(a[ok, 2] - gt[ok]) / gt[ok]))
    assert rep["accuracy"]["abs_rel"] == pytest.approx(np.mean(per_frame), abs=1e-5) and rep["accuracy"]["frames"] == 5
    assert rep["latency_ms"]["calls"] == 4 and rep["latency_ms"]["median_ms"] > 0 and rep["latency_ms"]["first_call_ms"] > 0
    assert json.loads(Path(str(out) + ".json").read_text())["frames"] == 5
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_run_leaves_the_previous_output_whole(tmp_path, model):
    write_bag(tmp_path / "in", "mcap", n=4)
    out = tmp_path / "out"
    run_bag(tmp_path / "in", out, predictor(model), "/cam/rgb", "grid:2x2", progress=False)
    first = (raw_messages(out), Path(str(out) + ".csv").read_text())

    class Dies:  # a predictor that fails on the third frame, mid-write
        device = torch.device("cpu")

        def __init__(self):
            self.calls = 0

        def predict(self, *a, **k):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("killed")
            return torch.zeros(1, 4)

        def describe(self):
            return {}

    with pytest.raises(RuntimeError, match="killed"):
        run_bag(tmp_path / "in", out, Dies(), "/cam/rgb", "grid:2x2", progress=False)
    assert (raw_messages(out), Path(str(out) + ".csv").read_text()) == first
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_command_errors_are_one_line(tmp_path, capsys):
    write_bag(tmp_path / "r.bag", "ros1", n=2)
    (tmp_path / "d.bag").mkdir()
    base = ["run", str(tmp_path / "r.bag"), "--image-topic", "/cam/rgb", "--points", "grid:2x2", "--checkpoint", "nowhere"]
    cases = [
        (["info", str(tmp_path / "missing.bag")], "no such file or folder"),
        (["run", str(tmp_path / "r.bag"), "--image-topic", "/nope", "--points", "grid:2x2", "--checkpoint", "x",
          "--out", str(tmp_path / "o.bag")], "no colour topic '/nope'; its topics: .*/cam/rgb"),  # before the model
        (base + ["--out", str(tmp_path / "o")], "the output is one too, named \\*.bag"),
        (["run", str(tmp_path / "r.bag"), "--image-topic", "/cam/rgb", "--points", "grid:2", "--checkpoint", "x",
          "--out", str(tmp_path / "o.bag")], "grid:COLSxROWS"),
        (["run", str(tmp_path / "r.bag"), "--points", "grid:2x2", "--out", "o.bag"], "required"),
    ]
    for argv, pattern in cases:
        try:
            rc = cli.run("bag", main, argv)
        except SystemExit as e:  # argparse's refusals exit from inside the parser, with the same one line
            rc = e.code
        assert rc == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("bag: error: "), err
        if pattern:
            assert re.search(pattern, err[0]), err[0]


def test_run_refuses_bad_outputs_and_topics_before_writing(tmp_path, model):
    write_bag(tmp_path / "r.bag", "ros1", n=2)
    (tmp_path / "d.bag").mkdir()
    pred = predictor(model)
    with pytest.raises(ValueError, match="is a folder; a ROS 1 bag is one .bag file"):
        run_bag(tmp_path / "r.bag", tmp_path / "d.bag", pred, "/cam/rgb", "grid:2x2", progress=False)
    with pytest.raises(ValueError, match=r"no colour topic '/nope'; its topics: .*/cam/rgb"):
        run_bag(tmp_path / "r.bag", tmp_path / "o.bag", pred, "/nope", "grid:2x2", progress=False)
    with pytest.raises(ValueError, match="is the input bag"):
        run_bag(tmp_path / "r.bag", tmp_path / "r.bag", pred, "/cam/rgb", "grid:2x2", progress=False)
    with pytest.raises(ValueError, match="already in the input bag"):
        run_bag(tmp_path / "r.bag", tmp_path / "o.bag", pred, "/cam/rgb", "grid:2x2", answer_topic="/cam/jpeg",
                progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bag", "r.bag"]


def test_demo_recording_is_a_ros2_mcap_bag_with_colour_depth_and_camera_info(tmp_path, model):
    rec = demo_recording(tmp_path / "rec", model.cfg, frames=4, frames_per_scene=2, seed=3)
    assert (tmp_path / "rec" / "metadata.yaml").is_file() and rec["size"] == [256, 256]
    info = bag_info(rec["bag"], rec["image_topic"], rec["depth_topic"])
    assert info["format"] == "mcap" and info["pairing"]["paired"] == 4
    (t, mt, m), = read_back(rec["bag"], rec["image_topic"])[:1]
    rgb = decode_color(m, mt)
    (_, mt, d), = read_back(rec["bag"], rec["depth_topic"])[:1]
    depth = decode_depth(d, mt)
    assert rgb.shape == (256, 256, 3) and rgb.std() > 5 and (depth > 0).mean() > 0.3
    a, b = (decode_color(x[2], x[1]) for x in read_back(rec["bag"], rec["image_topic"])[:2])
    assert 0 < np.abs(a.astype(int) - b).mean()  # the camera moves
    rep = run_bag(rec["bag"], tmp_path / "out", predictor(model), rec["image_topic"], "grid:4x4", rec["depth_topic"],
                  progress=False)
    assert rep["frames"] == 4 and 0 < rep["accuracy"]["abs_rel"] and rep["accuracy"]["points"] > 0


def test_run_answers_every_frame_and_scores_only_the_paired_ones(tmp_path, model):
    from depthpack.data.rosbag import IMAGE, BagWriter
    from test_bag import frame_arrays

    with BagWriter(tmp_path / "in.bag") as w:
        c, d = w.add("/c", IMAGE), w.add("/d", IMAGE)
        for k in range(4):
            rgb, depth = frame_arrays(k)
            t = T0 + k * 100_000_000
            w.write(c, t, w.image(rgb, "rgb8", t))
            if k % 2 == 0:  # depth for frames 0 and 2 only; frame 3's depth arrives first
                w.write(d, t, w.image(depth, "32FC1", t))
        t = T0 + 3 * 100_000_000
        w.write(d, t - 1, w.image(frame_arrays(3)[1], "32FC1", t))
    rep = run_bag(tmp_path / "in.bag", tmp_path / "out.bag", predictor(model), "/c", "grid:2x2", depth_topic="/d",
                  progress=False)
    assert rep["frames"] == 4 and len(read_back(tmp_path / "out.bag", "/depthpack/points")) == 4
    assert rep["pairing"]["paired"] == 3 and rep["pairing"]["dropped_colour"] == 1 and rep["accuracy"]["frames"] == 3
    rows = Path(rep["csv"]).read_text().splitlines()[1:]
    assert len(rows) == 16 and all(r.split(",")[-1] == "" for r in rows if r.startswith("1,"))  # no depth for frame 1
