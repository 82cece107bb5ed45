"""python -m depthpack.bag: robot recordings in and out, with no ROS install (rosbags reads and writes).

    python -m depthpack.bag info run1.bag
    python -m depthpack.bag run run1/ --image-topic /camera/color/image_raw --points grid:16x12 \\
        --checkpoint runs/demo/train --out runs/run1_depth
    python -m depthpack.bag run run1.bag --image-topic /cam/image --points pts.csv \\
        --packages out/cam/manifest.json --out runs/run1_depth.bag

info: every topic with its type, count and rate, and whether colour, depth and CameraInfo pair up.
run: the model (a checkpoint through the Predictor, or an export's packages) on every colour frame at
the same query points, with a progress bar. It writes
- OUT: a bag of the input's kind (ROS 1 .bag, or a ROS 2 folder: the input's storage, or --storage)
  holding every message of the input unchanged, plus the answers on --answer-topic (default
  /depthpack/points) as sensor_msgs/PointCloud2, one message per frame, same header (stamp and
  frame_id) and log time as the frame, one point per query, float32 fields
      u, v    the queried pixel (depthpack's convention: pixel (i, j) spans [i, i+1) x [j, j+1))
      depth   the predicted depth in meters (z along the optical axis)
      x, y, z the 3D point in the camera's optical frame from the CameraInfo's K (ROS: pixel centres
              at integers, so x = (u - 0.5 - cx) z / fx); NaN without a CameraInfo
- OUT.csv beside it: frame, stamp_ns, u, v, depth, x, y, z, gt (the bag's depth there, empty if none)
- OUT.json: the report (also printed): frames, pairing, accuracy (AbsRel and delta1 at the queried
  points where the bag's depth is valid, per frame then averaged, as depthpack.eval), per-frame
  latency of one predict call with its device sync (median / p90; the first call, which compiles
  and captures, reported apart) and the decode rate.
All three are written under temporary names in OUT's folder and renamed at the end: a run killed
mid-write leaves no half bag (nor CSV) that a reader accepts, and the previous output intact.
"""
from __future__ import annotations

if __name__ == "__main__":  # python -m depthpack.bag: the imports below (torch) inside the one-line contract
    import sys as _sys

    from depthpack.core import cli as _cli
    _sys.exit(_cli.run("bag", _cli.lazy("depthpack.bag:main")))

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .core import cli
from .core.files import atomic_write_json, temporary_name
from .data.rosbag import (CAMERA_INFO, COMPRESSED, IMAGE, POINTCLOUD2, BagReader, BagTopics, BagWriter, bag_format,
                       check_frame, check_output, decode_color, decode_depth, index_bag, sibling_info_topic)
from .eval.metrics import MetricAccumulator
from .runtime.graphs import summarize

ANSWER_TOPIC = "/depthpack/points"
CSV_HEADER = "frame,stamp_ns,u,v,depth,x,y,z,gt\n"


# ---- points -------------------------------------------------------------------------------------
def parse_points(spec: str):
    """'grid:CxR' -> ('grid', C, R); a file of 'x y' or 'x,y' lines (frame pixels, '#' comments) ->
    float32 [Q,2]. ValueError naming the spec or the line."""
    if spec.startswith("grid:"):
        try:
            c, r = (int(v) for v in spec[5:].lower().split("x"))
        except ValueError:
            raise ValueError(f"--points {spec!r}: expected grid:COLSxROWS, e.g. grid:16x12") from None
        if c < 1 or r < 1:
            raise ValueError(f"--points {spec!r}: the grid needs at least 1x1 points")
        return ("grid", c, r)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--points {spec!r}: neither grid:COLSxROWS nor a file of 'x y' lines")
    pts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].replace(",", " ").split()
        if not line:
            continue
        try:
            x, y = (float(v) for v in line)
        except ValueError:
            if not pts and n == 1:
                continue  # a header line such as "x,y"
            raise ValueError(f"--points {path}:{n}: expected two numbers 'x y', got {' '.join(line)!r}") from None
        pts.append((x, y))
    if not pts:
        raise ValueError(f"--points {path}: no point in the file")
    return np.asarray(pts, np.float32)


def points_for(spec, w: int, h: int) -> np.ndarray:
    """The query points [Q,2] (x, y) for a w x h frame: a grid at cell centres, or the file's points."""
    if isinstance(spec, tuple):
        _, c, r = spec
        xs, ys = (np.arange(c) + 0.5) * (w / c), (np.arange(r) + 0.5) * (h / r)
        return np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2).astype(np.float32)
    p = np.asarray(spec, np.float32)
    bad = ~((p[:, 0] >= 0) & (p[:, 0] < w) & (p[:, 1] >= 0) & (p[:, 1] < h))
    if bad.any():
        raise ValueError(f"--points: {int(bad.sum())} of {len(p)} points lie outside the {w}x{h} frame "
                         f"(first: {p[bad][0].tolist()})")
    return p


def backproject(points: np.ndarray, depth: np.ndarray, cam) -> np.ndarray:
    """[Q,3] camera-frame points from depthpack pixel coordinates and K (ROS convention); NaN without K."""
    if cam is None:
        return np.full((len(points), 3), np.nan, np.float32)
    z = depth.astype(np.float64)
    x = (points[:, 0] - 0.5 - cam.cx) / cam.fx * z
    y = (points[:, 1] - 0.5 - cam.cy) / cam.fy * z
    return np.stack([x, y, z], 1).astype(np.float32)


# ---- info ---------------------------------------------------------------------------------------
def bag_info(path, image_topic: str | None = None, depth_topic: str | None = None, info_topic: str | None = None,
             tol_ms: float = 10.0) -> dict:
    """Topics (type, count, rate), and the pairing of colour, depth and CameraInfo: the given topics,
    else the guessed ones (the only colour-like and the only depth-like image topic)."""
    topics, guess = {}, {"colour": [], "depth": []}
    with BagReader(path) as r:
        fmt = r.format
        for name, conns in sorted(r.topics.items()):
            ts = [t for _, t, _ in r.messages(connections=conns)]
            n = len(ts)
            rate = (n - 1) / ((ts[-1] - ts[0]) / 1e9) if n > 1 and ts[-1] > ts[0] else None
            topics[name] = dict(type=conns[0].msgtype, count=n, rate_hz=round(rate, 3) if rate else None)
            if conns[0].msgtype in (IMAGE, COMPRESSED) and n:
                c, _, raw = next(r.messages(connections=conns))
                m = r.deserialize(raw, c.msgtype)
                enc = m.encoding if c.msgtype == IMAGE else m.format
                topics[name]["encoding"] = enc
                if c.msgtype == IMAGE:
                    topics[name]["size"] = f"{m.width}x{m.height}"
                depthish = enc in ("16UC1", "mono16", "32FC1") or "compresseddepth" in enc.lower()
                guess["depth" if depthish else "colour"].append(name)
        names = set(r.topics)
    out = dict(bag=str(path), format=fmt, topics=topics,
               camera_info_topics=[n for n, t in topics.items() if t["type"] == CAMERA_INFO])
    image = image_topic or (guess["colour"][0] if len(guess["colour"]) == 1 else None)
    depth = depth_topic or (guess["depth"][0] if len(guess["depth"]) == 1 else None)
    if image is None:
        out["pairing"] = {"ok": False, "why": f"name the colour topic (--image-topic): candidates {guess['colour']}"}
        return out
    try:
        idx = index_bag(path, BagTopics(image, depth, info_topic or sibling_info_topic(image, names)), tol_ms,
                        need_depth=False)
        out["pairing"] = {"ok": bool(depth), **idx.summary(),
                          "camera": idx.cameras[0].__dict__ if idx.cameras and idx.cameras[0] else None}
        if not depth:
            out["pairing"]["why"] = f"no depth topic (--depth-topic): candidates {guess['depth']}"
    except ValueError as e:
        out["pairing"] = {"ok": False, "image_topic": image, "depth_topic": depth, "why": str(e)}
    return out


def info_text(info: dict) -> str:
    lines = [f"{info['bag']} ({info['format']})", f"{'topic':40s} {'type':34s} {'count':>7s} {'rate Hz':>8s}  encoding"]
    for name, t in info["topics"].items():
        rate = f"{t['rate_hz']:.2f}" if t["rate_hz"] else "-"
        enc = " ".join(x for x in (t.get("encoding", ""), t.get("size", "")) if x)
        lines.append(f"{name:40s} {t['type']:34s} {t['count']:7d} {rate:>8s}  {enc}")
    p = info["pairing"]
    if p.get("paired") is not None:
        found = info.get("camera_info_topics") or []  # none beside the colour topic: say which the bag has
        cam = p["info_topic"] or ("none" + (f" (the bag has {', '.join(found)}: name one with --info-topic)" if found else ""))
        lines.append(f"pairing: colour {p['image_topic']} ({p['colour_frames']}) + depth {p['depth_topic']} "
                     f"({p['depth_frames']}) within {p['tolerance_ms']:g} ms: {p['paired']} pairs, dropped "
                     f"{p['dropped_colour']} colour / {p['dropped_depth']} depth frames; worst gap "
                     f"{p['worst_pair_gap_ms']:g} ms; CameraInfo: {cam}")
    if p.get("why"):
        lines.append(f"pairing: {'incomplete' if p.get('paired') is not None else 'no'}: {p['why']}")
    return "\n".join(lines)


# ---- run ----------------------------------------------------------------------------------------
def output_format(src_fmt: str, out: Path, storage: str | None) -> str:
    """The output's format: ROS 1 for a ROS 1 input (OUT must be *.bag); ROS 2 keeps the input's storage
    unless --storage says otherwise. Messages are copied as their bytes, so ROS 1 <-> ROS 2 is refused."""
    if src_fmt == "ros1":
        if storage or out.suffix != ".bag":
            raise ValueError(f"the input is a ROS 1 bag: the output is one too, named *.bag (got {out}); convert "
                             f"with rosbags-convert for ROS 2")
        return "ros1"
    if out.suffix == ".bag":
        raise ValueError(f"the input is a ROS 2 bag: the output is a ROS 2 bag folder, not {out}")
    return storage or src_fmt


class _Pass:
    """One pass of run_bag over a bag, in log-time order: which colour frames it answers (the first n)
    and which depth message scores each; the answers and depths that wait for their partner (either may
    come first); and what it measures (accuracy at the points, per-call latency, decode time)."""

    def __init__(self, bag: Path, predictor, spec, image_topic: str, depth_topic: str | None,
                 info_topic: str | None, tol_ms: float, max_frames: int | None, depth_range):
        self.idx = index_bag(bag, BagTopics(image_topic, None, info_topic), tol_ms, need_depth=False)  # every colour frame
        self.paired = (index_bag(bag, BagTopics(image_topic, depth_topic, self.idx.topics.info), tol_ms)
                       if depth_topic else self.idx)
        self.by_color = {ct: k for k, (ct, _, _) in enumerate(self.idx.frames)}
        self.depth_of = {ct: dt for ct, dt, _ in self.paired.frames if dt is not None}  # the depth that scores each frame
        self.wanted_depth = {dt: self.by_color[ct] for ct, dt in self.depth_of.items()}
        self.n = min(len(self.idx.frames), max_frames or len(self.idx.frames))
        self.predictor, self.spec, self.depth_range = predictor, spec, depth_range
        self.image_topic, self.depth_topic = image_topic, depth_topic
        self.acc, self.lat, self.dec, self.first, self.n_valid, self.done = MetricAccumulator(), [], [], None, 0, 0
        self.pending_pred: dict[int, tuple] = {}  # frame -> (points, pred, (h, w)) waiting for its depth
        self.pending_depth: dict[int, np.ndarray] = {}  # frame -> depth waiting for its colour frame
        self.rows_of: dict[int, list] = {}  # frame -> its CSV rows, written once scored
        self.sync = torch.cuda.synchronize if predictor.device.type == "cuda" else (lambda: None)

    def on_depth(self, r, c, t: int, raw, csv) -> None:
        """A depth message: decode it if it scores an answered frame; score now or keep it for its frame."""
        if t not in self.wanted_depth or self.wanted_depth[t] >= self.n:
            return
        k = self.wanted_depth.pop(t)
        d = decode_depth(r.deserialize(raw, c.msgtype), c.msgtype, self.depth_topic)
        if k in self.pending_pred:
            rows = self.rows_of.pop(k)
            self.score(k, *self.pending_pred.pop(k), d, rows)
            csv.writelines(",".join(row) + "\n" for row in rows)
        else:
            self.pending_depth[k] = d

    def on_colour(self, r, c, t: int, raw, w, answer, csv) -> bool:
        """A colour message: if it is a frame to answer, predict, write its answer and (once scored) its
        CSV rows; True when it was one."""
        if t not in self.by_color or self.by_color[t] >= self.n:
            return False
        k = self.by_color.pop(t)
        t0 = time.perf_counter()
        msg = r.deserialize(raw, c.msgtype)
        rgb = decode_color(msg, c.msgtype, self.image_topic)
        self.dec.append(time.perf_counter() - t0)
        cam = self.idx.cameras[k]
        h, wd = rgb.shape[:2]
        check_frame((h, wd), None, cam, self.idx)
        pts = points_for(self.spec, wd, h)
        pred = self.predict(rgb, pts, math.sqrt(cam.fx * cam.fy) if cam else None)
        xyz = backproject(pts, pred, cam)
        stamp = self.idx.frames[k][2]
        w.write(answer, t, w.point_cloud(dict(u=pts[:, 0], v=pts[:, 1], depth=pred, x=xyz[:, 0], y=xyz[:, 1],
                                              z=xyz[:, 2]), stamp, msg.header.frame_id))
        rows = [[str(k), str(stamp), f"{u:.6g}", f"{v:.6g}", f"{p:.6g}", f"{x:.6g}", f"{y:.6g}", f"{z:.6g}", ""]
                for (u, v), p, (x, y, z) in zip(pts.tolist(), pred.tolist(), xyz.tolist())]
        if k in self.pending_depth:
            self.score(k, pts, pred, (h, wd), self.pending_depth.pop(k), rows)
        elif t in self.depth_of:
            self.pending_pred[k], self.rows_of[k] = (pts, pred, (h, wd)), rows
        if k not in self.rows_of:
            csv.writelines(",".join(row) + "\n" for row in rows)
        self.done += 1
        return True

    def predict(self, rgb: np.ndarray, pts: np.ndarray, focal: float | None) -> np.ndarray:
        """One predict call plus its device sync, timed (the first call apart); the depths [Q] on the host."""
        packages = getattr(self.predictor, "frame_packages", None)  # frame packages take their own channel order
        order = packages[1] if packages else "rgb"
        frame = rgb if order == "rgb" else np.ascontiguousarray(rgb[..., ::-1])
        t0 = time.perf_counter()
        pred = self.predictor.predict(frame, pts, focal=focal, color=order)
        self.sync()
        dt_ms = (time.perf_counter() - t0) * 1e3
        if self.first is None:
            self.first = dt_ms
        else:
            self.lat.append(dt_ms)
        return pred.detach().float().cpu().numpy().reshape(-1)

    def score(self, k: int, pts: np.ndarray, pred: np.ndarray, hw: tuple, depth: np.ndarray, rows: list) -> None:
        """Frame k's answers against the bag's depth at the points: the gt column of its rows, and the
        accuracy where the depth is valid (and inside depth_range)."""
        check_frame(hw, depth.shape, self.idx.cameras[k], self.idx)
        gt = depth[pts[:, 1].astype(np.int64), pts[:, 0].astype(np.int64)]
        ok = gt > 0
        if self.depth_range:
            ok &= (gt >= self.depth_range[0]) & (gt <= self.depth_range[1])
        for row, g in zip(rows, gt.tolist()):
            row[-1] = f"{g:.6g}" if g > 0 else ""
        if ok.any():
            self.acc.update(torch.from_numpy(pred[ok]), torch.from_numpy(gt[ok]))
            self.n_valid += int(ok.sum())

    def flush_unscored(self, csv) -> None:
        """The rows of frames whose depth never came (it lies past max_frames)."""
        for k, rows in sorted(self.rows_of.items()):
            csv.writelines(",".join(row) + "\n" for row in rows)

    def report(self, bag: Path, out: Path, csv_path: Path, fmt: str, answer_topic: str, wall: float) -> dict:
        lat, dec, spec = self.lat, self.dec, self.spec
        report = dict(bag=str(bag), out=str(out), csv=str(csv_path), format=fmt, answer_topic=answer_topic,
                      answer_message="sensor_msgs/PointCloud2 (u, v, depth, x, y, z float32)", frames=self.done,
                      points_per_frame=int(len(points_for(spec, 64, 64)) if isinstance(spec, tuple) else len(spec)),  # a grid: C x R at any size
                      pairing=self.paired.summary(), predictor=self.predictor.describe(), device=str(self.predictor.device),
                      latency_ms=dict(first_call_ms=round(self.first, 3) if self.first is not None else None,
                                      **({k: round(v, 3) if isinstance(v, float) else v for k, v in summarize(lat).items()}
                                         if lat else {"calls": 0})),
                      decode_ms_median=round(1e3 * float(np.median(dec)), 3) if dec else None,
                      decode_frames_per_s=round(len(dec) / sum(dec), 1) if dec and sum(dec) > 0 else None,
                      run_frames_per_s=round(self.done / wall, 2) if wall > 0 else None, wall_s=round(wall, 2))
        if self.acc.images:
            m = self.acc.compute()
            report["accuracy"] = dict(abs_rel=round(m["abs_rel"], 5), d1=round(m["d1"], 5), frames=self.acc.images,
                                      points=self.n_valid)
        return report


def _copy_and_answer(bag: Path, out: Path, fmt: str, p: _Pass, answer_topic: str, csv_path: Path, progress: bool) -> None:
    """Copy every message of bag into OUT, the answers added, and write OUT.csv; both under temporary
    names renamed into place at the end (the CSV's temporary removed on any failure)."""
    from tqdm import tqdm

    csv_tmp = temporary_name(csv_path)
    try:
        with BagReader(bag) as r, BagWriter(out, fmt) as w, open(csv_tmp, "w") as csv:
            if answer_topic in r.topics:
                raise ValueError(f"--answer-topic {answer_topic} is already in the input bag; choose another")
            conns = {c.id: w.add(c.topic, c.msgtype, like=c) for c in r.reader.connections}
            answer = w.add(answer_topic, POINTCLOUD2)
            color_ids = {c.id for c in r.topics[p.image_topic]}
            depth_ids = {c.id for c in r.topics[p.depth_topic]} if p.depth_topic else set()
            csv.write(CSV_HEADER)
            bar = tqdm(total=p.n, desc="depthpack.bag run", disable=not progress, dynamic_ncols=True)
            for c, t, raw in r.messages():
                w.write(conns[c.id], t, raw)
                if c.id in depth_ids:
                    p.on_depth(r, c, t, raw, csv)
                if c.id in color_ids and p.on_colour(r, c, t, raw, w, answer, csv):
                    bar.update(1)
            p.flush_unscored(csv)
            bar.close()
            csv.flush()
            os.fsync(csv.fileno())
        os.replace(csv_tmp, csv_path)
    except BaseException:
        csv_tmp.unlink(missing_ok=True)
        raise


def run_bag(bag, out, predictor, image_topic: str, points="grid:16x12", depth_topic: str | None = None,
            info_topic: str | None = None, tol_ms: float = 10.0, answer_topic: str = ANSWER_TOPIC,
            storage: str | None = None, max_frames: int | None = None, progress: bool = True,
            depth_range: tuple[float, float] | None = None) -> dict:
    """Run predictor (a depthpack.Predictor) on every colour frame of bag; write OUT, OUT.csv and
    OUT.json (see the module docstring); return the report. points: 'grid:CxR', a file, or [Q,2]."""
    bag, out = Path(bag), Path(out)
    spec = parse_points(points) if isinstance(points, str) else (points if isinstance(points, tuple)
                                                                  else np.asarray(points, np.float32))
    fmt = output_format(bag_format(bag), out, storage)
    if out.resolve() == bag.resolve():
        raise ValueError(f"--out {out} is the input bag")
    p = _Pass(bag, predictor, spec, image_topic, depth_topic, info_topic, tol_ms, max_frames, depth_range)
    csv_path, json_path = out.with_name(out.name + ".csv"), out.with_name(out.name + ".json")
    t_start = time.perf_counter()
    _copy_and_answer(bag, out, fmt, p, answer_topic, csv_path, progress)
    report = p.report(bag, out, csv_path, fmt, answer_topic, time.perf_counter() - t_start)
    atomic_write_json(json_path, report, sort_keys=False)
    return report


def make_predictor(checkpoint=None, packages=None, model=None, device: str | None = None, dtype: str | None = None):
    """(Predictor for frames in RGB order, (min_depth, max_depth)): from a checkpoint
    (depthpack.load_model), a model, or an export's manifest.json (Predictor.from_packages)."""
    from .core.checkpoint import load_model
    from .runtime.predictor import Predictor

    if sum(x is not None for x in (checkpoint, packages, model)) != 1:
        raise ValueError("give exactly one of --checkpoint or --packages")
    device = None if device in (None, "auto") else device
    if packages is not None:
        if dtype:
            raise ValueError("--dtype applies to --checkpoint; packages hold their own dtype")
        pred = Predictor.from_packages(packages, device=device, color="rgb")
        return pred, (float(pred.manifest["min_depth"]), float(pred.manifest["max_depth"]))
    if model is None:
        model = load_model(checkpoint)
    kw = {"dtype": getattr(torch, dtype)} if dtype else {}
    return Predictor(model, device=device, color="rgb", **kw), (model.cfg.min_depth, model.cfg.max_depth)


# ---- the demo's recording -----------------------------------------------------------------------
def render_moving(seed: int, frames: int, size, scene: str = "mixed", rig: str = "fixed", frames_per_scene: int = 16):
    """Yield (rgb uint8 [H,W,3], depth float32 m [H,W] (0 = sky), K [3,3]) of a camera moving through
    synthetic scenes (depthpack.data.synthetic, its "test" stream): a new scene every frames_per_scene
    frames; in each the camera moves forward (0.4 m in a room, 8 m on a street) while it pans."""
    from .data.raycast import cast_and_shade, pack
    from .data.synthetic import Camera, Families, draw

    H, W = int(size[0]), int(size[1])
    for k in range(frames):
        s, j = divmod(k, frames_per_scene)
        if j == 0:
            sc, cam0, kind = draw(seed, s, (H, W), scene, "test", rig, Families(front=0.0))  # nothing in the camera's way
        u = j / max(1, frames_per_scene - 1)
        yaw = (0.25 if kind == "indoor" else 0.1) * math.sin(2 * math.pi * u)
        ahead = cam0.R[:, 2] * np.array([1.0, 0.0, 1.0])
        ahead /= max(np.linalg.norm(ahead), 1e-9)
        c, s_ = math.cos(yaw), math.sin(yaw)
        turn = np.array([[c, 0.0, s_], [0.0, 1.0, 0.0], [-s_, 0.0, c]])  # about world up
        cam = Camera(cam0.fx, cam0.fy, cam0.cx, cam0.cy, turn @ cam0.R,
                     cam0.origin + ahead * (0.4 if kind == "indoor" else 8.0) * u)
        image, depth, _ = cast_and_shade(pack([(sc, cam)]), H, W)
        rgb = np.round(np.clip(image[0].numpy(), 0.0, 1.0) * 255.0).astype(np.uint8)
        yield rgb, depth[0].numpy(), cam.K


DEMO_TOPICS = BagTopics("/camera/color/image_raw/compressed", "/camera/aligned_depth_to_color/image_raw",
                        "/camera/color/camera_info")


def demo_recording(out_path, model_cfg=None, frames: int = 48, seed: int = 0, fps: float = 10.0,
                   frames_per_scene: int = 16, scene: str = "mixed", rig: str = "fixed", size=None,
                   fmt: str = "mcap") -> dict:
    """Render a short recording with a moving camera through the embedded synthetic scenes (the
    "test" split's scenes: held out from training) and write it as a ROS 2 bag (MCAP by default):
    JPEG colour (CompressedImage), 16UC1 depth in mm registered to it (0 = sky or beyond 65.5 m),
    and CameraInfo, at `fps`. size: (H, W) of the frames (default: 4x model_cfg.img_size, the
    model's aspect). Returns {"bag", "image_topic", "depth_topic", "info_topic", "frames", "size"}."""
    if size is None:
        H, W = (model_cfg.img_size if model_cfg is not None else (64, 64))
        size = (4 * int(H), 4 * int(W))
    with BagWriter(out_path, fmt) as w:
        ci, cd, cinf = w.add(DEMO_TOPICS.image, COMPRESSED), w.add(DEMO_TOPICS.depth, IMAGE), w.add(DEMO_TOPICS.info, CAMERA_INFO)
        for k, (rgb, depth, K) in enumerate(render_moving(seed, frames, size, scene, rig, frames_per_scene)):
            t = 1_700_000_000_000_000_000 + int(round(k * 1e9 / fps))
            Kros = np.array(K, np.float64)
            Kros[0, 2] -= 0.5  # depthpack's pixel (i, j) spans [i, i+1): ROS puts its centre at i
            Kros[1, 2] -= 0.5
            w.write(ci, t, w.compressed(rgb, "jpeg", t, "camera_color_optical_frame"))
            w.write(cd, t, w.image(depth, "16UC1", t, "camera_color_optical_frame"))
            w.write(cinf, t, w.camera_info(Kros, size[1], size[0], t, "camera_color_optical_frame"))
    return dict(bag=str(out_path), image_topic=DEMO_TOPICS.image, depth_topic=DEMO_TOPICS.depth,
                info_topic=DEMO_TOPICS.info, frames=frames, size=list(size), fps=fps)


def run_recording(bag, out, model=None, checkpoint=None, packages=None, points="grid:16x12",
                  image_topic: str = DEMO_TOPICS.image, depth_topic: str | None = DEMO_TOPICS.depth,
                  info_topic: str | None = None, device: str | None = None, progress: bool = False) -> dict:
    """run_bag with a Predictor made here (from a model, a checkpoint or packages): the demo's call."""
    pred, depth_range = make_predictor(checkpoint, packages, model, device)
    return run_bag(bag, out, pred, image_topic, points, depth_topic, info_topic, progress=progress,
                   depth_range=depth_range)


def report_text(r: dict) -> str:
    lat = r["latency_ms"]
    acc = r.get("accuracy")
    lines = [f"{r['frames']} frames of {r['bag']} -> {r['out']} ({r['format']}), answers on {r['answer_topic']} "
             f"({r['answer_message']}), {r['points_per_frame']} points a frame; CSV {r['csv']}",
             f"latency (one predict call + sync, {r['device']}): median {lat.get('median_ms', float('nan')):.3f} ms, "
             f"p90 {lat.get('p90_ms', float('nan')):.3f} ms over {lat['calls']} calls; first call {lat['first_call_ms']} ms",
             f"decode {r['decode_frames_per_s']} frames/s (colour, one core); run {r['run_frames_per_s']} frames/s end to end"]
    if acc:
        lines.append(f"accuracy at the queried points against the bag's depth: AbsRel {acc['abs_rel']:.4f}, "
                     f"delta1 {acc['d1']:.4f} ({acc['points']} points in {acc['frames']} frames)")
    return "\n".join(lines)


# ---- the command --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = cli.Parser(prog="python -m depthpack.bag", name="bag", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=functools.partial(cli.Parser, name="bag"))
    i = sub.add_parser("info", help="topics, counts, rates, and whether colour, depth and CameraInfo pair up")
    r = sub.add_parser("run", help="run a model on every frame; write OUT (bag), OUT.csv, OUT.json")
    for p in (i, r):
        p.add_argument("bag", help="a ROS 1 .bag, or a ROS 2 bag folder (or .mcap / .db3 file)")
        p.add_argument("--image-topic", required=p is r, default=None, help="the colour topic (Image or CompressedImage)")
        p.add_argument("--depth-topic", default=None, help="a depth topic registered to the colour (for accuracy)")
        p.add_argument("--info-topic", default=None, help="CameraInfo (default: the colour topic's sibling camera_info)")
        p.add_argument("--tolerance-ms", type=float, default=10.0, help="colour and depth stamps closer than this pair")
    i.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    r.add_argument("--points", default="grid:16x12",
                   help="grid:COLSxROWS (cell centres), or a file of 'x y' lines in frame pixels (default grid:16x12)")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a run folder, checkpoint folder, or a weights file (that file, config.json beside it)")
    src.add_argument("--packages", help="an export's manifest.json (its .pt2 packages)")
    r.add_argument("--out", required=True, help="the output bag: *.bag for a ROS 1 input, a folder name for ROS 2")
    r.add_argument("--storage", choices=("mcap", "sqlite3"), default=None, help="ROS 2 output storage (default: the input's)")
    r.add_argument("--answer-topic", default=ANSWER_TOPIC)
    r.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    r.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="compute dtype (default: the Predictor's: bfloat16 on CUDA, float32 on a CPU)")
    r.add_argument("--max-frames", type=int, default=None)
    r.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    if a.tolerance_ms < 0:
        ap.error(f"--tolerance-ms {a.tolerance_ms}: must be >= 0")
    if a.cmd == "info":
        info = bag_info(a.bag, a.image_topic, a.depth_topic, a.info_topic, a.tolerance_ms)
        print(json.dumps(info, indent=1) if a.json else info_text(info))
        return 0
    if a.max_frames is not None and a.max_frames < 1:
        ap.error(f"--max-frames {a.max_frames}: must be >= 1")
    spec = parse_points(a.points)
    check_output(Path(a.out), output_format(bag_format(a.bag), Path(a.out), a.storage))  # before loading a model,
    with BagReader(a.bag) as rd:  # and the topics too
        rd.require(a.image_topic, "colour", (IMAGE, COMPRESSED))
        if a.depth_topic:
            rd.require(a.depth_topic, "depth", (IMAGE, COMPRESSED))
        if a.info_topic:
            rd.require(a.info_topic, "CameraInfo", (CAMERA_INFO,))
    pred, depth_range = make_predictor(a.checkpoint, a.packages, None, a.device, a.dtype)
    report = run_bag(a.bag, a.out, pred, a.image_topic, spec, a.depth_topic, a.info_topic, a.tolerance_ms,
                     a.answer_topic, a.storage, a.max_frames, not a.no_progress, depth_range)
    print(report_text(report))
    print(json.dumps(report))
    return 0


def main_cli() -> None:
    """The console script depthpack-bag: main with the one-line error contract."""
    sys.exit(cli.run("bag", main))

