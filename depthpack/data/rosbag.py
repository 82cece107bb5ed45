"""Robot recordings as data: ROS 1 bags and ROS 2 bags (sqlite3 or MCAP), read and written with
`rosbags` (pure Python, no ROS install), never with a parser of our own.

    idx = index_bag("run1.mcap_folder", BagTopics("/cam/color/image_raw", "/cam/aligned_depth/image_raw"))
    ds = make_dataset(DataConfig(kind="bag", root="run1,run2", image_topic=..., depth_topic=...), "train", ...)
    with BagWriter("out.bag") as w:                       # ROS 1 file; a name without .bag: a ROS 2 folder
        c = w.add("/cam/image", IMAGE)
        w.write(c, t_ns, w.image(rgb, "rgb8", t_ns, "cam"))

What a bag must hold (DataConfig.image_topic / depth_topic / info_topic):
- colour: sensor_msgs/Image in rgb8, bgr8, rgba8, bgra8 or mono8 (mono8 is converted: the gray value
  copied into R, G and B, as cv2's GRAY2RGB; a colour model sees a gray image), or
  sensor_msgs/CompressedImage in JPEG or PNG (image_transport's "compressed").
- depth: sensor_msgs/Image 16UC1 (or mono16) in millimetres, 32FC1 in metres, or a CompressedImage in
  image_transport's compressedDepth PNG format (16UC1: the PNG of the millimetres; 32FC1: the PNG of a
  quantized inverse depth, depth = a / (q - b), a and b in the 12-byte header). 0, NaN and inf are
  "no measurement" (0 m here). The depth must be registered to the colour image (the same pixels,
  e.g. a RealSense's aligned_depth_to_color) and of the same size: a size mismatch is refused.
- CameraInfo (optional; default: the sibling `camera_info` of the colour topic when the bag has one):
  its K gives fx, fy in the colour image's own pixels (then scaled with the image to the model's size);
  a zero K, or a width and height that differ from the colour image's, are refused.
Times: a message's capture time is its header stamp (the bag's log time where the stamp is 0).
Colour and depth pair one to one, nearest stamps first, within tol_ms; the frames left without a
partner are counted (BagIndex.dropped_color / dropped_depth) and reported, never silently lost.
A ROS 1 bag is one .bag file; a ROS 2 bag is a folder with metadata.yaml (a bare .mcap or .db3 file
is read too). Every failure to read is one ValueError naming the bag and what is wrong.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from ..core.files import (atomic_write_json, check_writable_dir, fsync_dir, publish_dir, remove_stale_temporaries,
                          staging_dir, temporary_name)
from ..core.preprocess import focal_at_size
from .common import SkippingDataset, make_sample, resize_image, resize_nearest, source_indices
from .errors import BadSample
from .formats import decode_uint16
from .intrinsics import dataset_focal
from .store import RowLayout, SceneStore, encode_rows

log = logging.getLogger("depthpack.data")

IMAGE, COMPRESSED = "sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"
CAMERA_INFO, POINTCLOUD2 = "sensor_msgs/msg/CameraInfo", "sensor_msgs/msg/PointCloud2"
COLOR_ENCODINGS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}
DEPTH_ENCODINGS = ("16UC1", "mono16", "32FC1")
FORMATS = ("ros1", "sqlite3", "mcap")
ROS1_MAGIC, MCAP_MAGIC, SQLITE_MAGIC = b"#ROSBAG V2.0", b"\x89MCAP0\r\n", b"SQLite format 3\x00"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DEPTH_QUANT, DEPTH_MAX = 100.0, 10.0  # image_transport compressedDepth's defaults for 32FC1


def _rosbags():
    try:
        import rosbags  # noqa: F401
    except ImportError:
        raise ValueError("ROS bags need the rosbags package (pip install rosbags)") from None


# ----------------------------------------------------------------------------- which bag is this
def bag_format(path) -> str:
    """'ros1' | 'sqlite3' | 'mcap' by the bag's own bytes (a ROS 2 folder: by its storage file);
    ValueError for anything else, naming what was found."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"bag {path}: no such file or folder")
    if path.is_dir():
        if not (path / "metadata.yaml").is_file():
            raise ValueError(f"bag {path}: a folder without metadata.yaml is not a ROS 2 bag")
        files = sorted(p for p in path.iterdir() if p.suffix in (".mcap", ".db3"))
        if not files:
            raise ValueError(f"bag {path}: metadata.yaml but no .mcap or .db3 file beside it")
        return bag_format(files[0])
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(ROS1_MAGIC):
        if path.suffix != ".bag":
            raise ValueError(f"bag {path}: a ROS 1 bag must be named *.bag (rosbags reads it by that name)")
        return "ros1"
    if head.startswith(MCAP_MAGIC):
        return "mcap"
    if head.startswith(SQLITE_MAGIC):
        return "sqlite3"
    raise ValueError(f"bag {path}: not a ROS bag ({'empty file' if not head else f'starts with {head[:12]!r}'}); "
                     f"depthpack reads ROS 1 .bag files and ROS 2 bags (a folder with metadata.yaml, or .mcap / .db3)")


def list_bags(root: str) -> list[Path]:
    """The bags of DataConfig.root: one bag, a folder of bags (sorted), or several of these joined by ','."""
    out: list[Path] = []
    for part in (p.strip() for p in str(root).split(",")):
        if not part:
            continue
        p = Path(part)
        if p.is_dir() and not (p / "metadata.yaml").is_file():
            inner = sorted(q for q in p.iterdir() if not q.name.startswith(".") and (
                (q.is_dir() and (q / "metadata.yaml").is_file()) or q.suffix in (".bag", ".mcap", ".db3")))
            if not inner:
                raise ValueError(f"bag folder {p}: holds no bag (*.bag, *.mcap, *.db3, or folders with metadata.yaml)")
            out += inner
        else:
            bag_format(p)
            out.append(p)
    if not out:
        raise ValueError(f"data.root {root!r} names no bag")
    return out


class BagReader:
    """A rosbags AnyReader opened on one bag, its errors turned into one ValueError naming the bag."""

    def __init__(self, path):
        _rosbags()
        from rosbags.highlevel import AnyReader
        from rosbags.typesys import Stores, get_typestore

        self.path = Path(path)
        self.format = bag_format(self.path)
        try:
            self.reader = AnyReader([self.path], default_typestore=get_typestore(Stores.LATEST))
            self.reader.open()
        except Exception as e:  # rosbags' own, sqlite's, struct's: a broken file, whatever the layer
            raise ValueError(f"bag {self.path}: cannot be read ({_why(e)}); a truncated or unfinished recording?") from None
        self.topics = {}
        for c in self.reader.connections:
            self.topics.setdefault(c.topic, []).append(c)

    def close(self) -> None:
        try:
            self.reader.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def msgtype(self, topic: str) -> str:
        return self.topics[topic][0].msgtype

    def require(self, topic: str, role: str, types: tuple[str, ...]) -> list:
        """The connections of topic; ValueError listing the topics that exist if it is missing or
        listing the accepted types if it has another."""
        if topic not in self.topics:
            have = ", ".join(f"{t} ({self.msgtype(t)})" for t in sorted(self.topics)) or "none: the bag is empty"
            raise ValueError(f"bag {self.path}: no {role} topic {topic!r}; its topics: {have}")
        if self.msgtype(topic) not in types:
            raise ValueError(f"bag {self.path}: {role} topic {topic} is {self.msgtype(topic)}, expected one of {', '.join(types)}")
        return self.topics[topic]

    def messages(self, connections=(), start=None, stop=None):
        """(connection, log time ns, raw bytes) in log-time order; a read error is a ValueError naming the bag."""
        try:
            for c, t, raw in self.reader.messages(connections=connections, start=start, stop=stop):
                yield c, t, raw
        except (ValueError, OSError) as e:
            raise ValueError(f"bag {self.path}: cannot be read at {_why(e)}; a truncated recording?") from None
        except Exception as e:
            raise ValueError(f"bag {self.path}: cannot be read ({_why(e)}); a truncated recording?") from None

    def deserialize(self, raw, msgtype: str):
        try:
            return self.reader.deserialize(raw, msgtype)
        except Exception as e:
            raise BadSample(self.path, f"a {msgtype} message cannot be deserialized ({_why(e)})") from None


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def stamp_ns(msg, log_t: int) -> int:
    """A message's capture time: its header stamp, or the log time where the stamp is 0."""
    s = msg.header.stamp
    t = int(s.sec) * 1_000_000_000 + int(s.nanosec)
    return t if t else int(log_t)


# ----------------------------------------------------------------------------- decoding
def _pixels(msg, channels: int, dtype, what: str) -> np.ndarray:
    """An Image's data as [h,w,channels] of dtype (rows of `step` bytes, byte order by is_bigendian)."""
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    dt = np.dtype(dtype).newbyteorder(">" if msg.is_bigendian else "<")
    row = w * channels * dt.itemsize
    data = np.asarray(msg.data, dtype=np.uint8)
    if h == 0 or w == 0:
        raise BadSample(what, f"an empty {w}x{h} image")
    if step < row or data.size < step * (h - 1) + row:
        raise BadSample(what, f"{msg.encoding} {w}x{h} needs {row} bytes a row, the message has step {step} and "
                              f"{data.size} bytes")
    if data.size < step * h:
        data = np.concatenate([data, np.zeros(step * h - data.size, np.uint8)])
    rows = data[:step * h].reshape(h, step)[:, :row].copy()  # writable, contiguous (the message's buffer is read-only)
    return rows.view(dt).reshape(h, w, channels).astype(dt.newbyteorder("="), copy=False)


def decode_color(msg, msgtype: str, topic: str = "colour") -> np.ndarray:
    """A colour message -> uint8 RGB [h,w,3]. ValueError for an encoding depthpack does not read;
    BadSample for one corrupt frame (skipped by the data set)."""
    if msgtype == IMAGE:
        enc = msg.encoding
        if enc not in COLOR_ENCODINGS:
            raise ValueError(f"colour topic {topic}: encoding {enc!r} is not one of {', '.join(COLOR_ENCODINGS)}"
                             + (" (that is a depth encoding: is it the depth topic?)" if enc in DEPTH_ENCODINGS else ""))
        a = _pixels(msg, COLOR_ENCODINGS[enc], np.uint8, topic)
        if enc == "mono8":
            return np.ascontiguousarray(np.repeat(a, 3, axis=2))
        return np.ascontiguousarray(a[..., 2::-1] if enc.startswith("bgr") else a[..., :3])
    if msgtype == COMPRESSED:
        fmt = msg.format.lower()
        if "compresseddepth" in fmt:
            raise ValueError(f"colour topic {topic}: format {msg.format!r} is compressedDepth (a depth image)")
        data = np.asarray(msg.data, dtype=np.uint8)
        if not any(k in fmt for k in ("jpeg", "jpg", "png")) and fmt.strip():
            raise ValueError(f"colour topic {topic}: CompressedImage format {msg.format!r}: depthpack reads jpeg and png")
        img = cv2.imdecode(data, cv2.IMREAD_UNCHANGED) if data.size else None
        if img is None:
            raise BadSample(topic, f"a CompressedImage ({msg.format!r}, {data.size} bytes) cannot be decoded")
        if img.dtype != np.uint8:
            raise ValueError(f"colour topic {topic}: a {img.dtype} compressed image; depthpack reads 8-bit colour")
        if img.ndim == 2:
            return cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
        return cv2.cvtColor(img, cv2.COLOR_BGRA2RGB if img.shape[2] == 4 else cv2.COLOR_BGR2RGB)
    raise ValueError(f"colour topic {topic} is {msgtype}, expected {IMAGE} or {COMPRESSED}")


def decode_depth(msg, msgtype: str, topic: str = "depth", scale: float = 1000.0) -> np.ndarray:
    """A depth message -> float32 meters [h,w], 0 where there is no measurement (0, NaN, inf)."""
    if msgtype == IMAGE:
        enc = msg.encoding
        if enc in ("16UC1", "mono16"):
            return decode_uint16(_pixels(msg, 1, np.uint16, topic)[..., 0], scale, invalid_raw=(0,))
        if enc == "32FC1":
            d = _pixels(msg, 1, np.float32, topic)[..., 0]
            return np.where(np.isfinite(d) & (d > 0), d, np.float32(0.0)).astype(np.float32)
        raise ValueError(f"depth topic {topic}: encoding {enc!r} is not one of {', '.join(DEPTH_ENCODINGS)}"
                         + (" (a colour encoding: is it the colour topic?)" if enc in COLOR_ENCODINGS else ""))
    if msgtype == COMPRESSED:
        return decode_compressed_depth(np.asarray(msg.data, dtype=np.uint8), msg.format, topic, scale)
    raise ValueError(f"depth topic {topic} is {msgtype}, expected {IMAGE} or {COMPRESSED} (compressedDepth)")


def decode_compressed_depth(data: np.ndarray, fmt: str, topic: str = "depth", scale: float = 1000.0) -> np.ndarray:
    """image_transport's compressedDepth (format "16UC1; compressedDepth [png]" or "32FC1; ..."): a
    12-byte header (int32 format, float32 a, b) and a 16-bit PNG; 32FC1 depth = a / (q - b), q = 0 invalid."""
    parts = [p.strip() for p in fmt.split(";")]
    enc, rest = parts[0], " ".join(parts[1:]).lower()
    if "compresseddepth" not in rest:
        raise ValueError(f"depth topic {topic}: CompressedImage format {fmt!r}: depthpack reads image_transport's "
                         f"compressedDepth (e.g. '16UC1; compressedDepth png')")
    if "rvl" in rest:
        raise ValueError(f"depth topic {topic}: compressedDepth 'rvl' is not read; record with png (the default)")
    if enc not in ("16UC1", "32FC1"):
        raise ValueError(f"depth topic {topic}: compressedDepth of {enc!r}; expected 16UC1 or 32FC1")
    if data.size >= 12 + 8 and bytes(data[12:20]) == PNG_MAGIC:
        _, a, b = struct.unpack("<iff", bytes(data[:12]))
        png = data[12:]
    elif bytes(data[:8]) == PNG_MAGIC:  # very old publishers: no header
        a, b, png = 0.0, 0.0, data
    else:
        raise BadSample(topic, f"compressedDepth message of {data.size} bytes holds no PNG")
    q = cv2.imdecode(png, cv2.IMREAD_UNCHANGED)
    if q is None or q.dtype != np.uint16 or q.ndim != 2:
        raise BadSample(topic, "compressedDepth PNG cannot be decoded as single-channel 16-bit")
    if enc == "16UC1":
        return decode_uint16(q, scale, invalid_raw=(0,))
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.float32(a) / (q.astype(np.float32) - np.float32(b))
    return np.where((q > 0) & np.isfinite(d) & (d > 0), d, np.float32(0.0)).astype(np.float32)


def encode_compressed_depth(depth: np.ndarray, encoding: str) -> tuple[bytes, str]:
    """float meters [h,w] -> (data, format) of image_transport's compressedDepth, as its C++ codec
    writes them (16UC1: round(mm); 32FC1: q = uint16(a / d + b) for d < DEPTH_MAX, else 0)."""
    d = np.asarray(depth, dtype=np.float32)
    ok = np.isfinite(d) & (d > 0)
    if encoding == "16UC1":
        mm = np.round(np.where(ok, d, 0).astype(np.float64) * 1000.0)
        q = np.where((mm > 0) & (mm <= 65535), mm, 0).astype(np.uint16)
        a = b = 0.0
    elif encoding == "32FC1":
        a = np.float32(DEPTH_QUANT * (DEPTH_QUANT + 1.0))
        b = np.float32(1.0 - a / np.float32(DEPTH_MAX))
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(ok & (d < DEPTH_MAX), np.float32(a) / d + b, 0).astype(np.uint16)
    else:
        raise ValueError(f"compressedDepth encodes 16UC1 or 32FC1, not {encoding!r}")
    good, png = cv2.imencode(".png", q)
    if not good:
        raise ValueError("cv2 cannot encode the compressedDepth PNG")
    return struct.pack("<iff", 0, float(a), float(b)) + png.tobytes(), f"{encoding}; compressedDepth png"


@dataclass(frozen=True)
class Camera:
    """One CameraInfo: (fx, fy, cx, cy) from K in the image's own pixels (ROS: pixel centres at
    integers), and the image size it describes."""
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int


def camera_from_info(msg, topic: str = "camera_info") -> Camera:
    K = np.asarray(getattr(msg, "k", None) if hasattr(msg, "k") else msg.K, dtype=np.float64).reshape(-1)
    if K.size != 9 or not np.isfinite(K).all() or not (K[0] > 0 and K[4] > 0):
        raise ValueError(f"CameraInfo on {topic}: K = {K.tolist()} has no focal length (fx, fy must be > 0): "
                         f"an uncalibrated camera; give data.focal, or leave the CameraInfo topic out")
    return Camera(float(K[0]), float(K[4]), float(K[2]), float(K[5]), int(msg.width), int(msg.height))


# ----------------------------------------------------------------------------- pairing and the index
def pair_stamps(a: np.ndarray, b: np.ndarray, tol_ns: int) -> list[tuple[int, int]]:
    """One-to-one pairs (i, j) of stamps a[i] (sorted) and b[j] (sorted) with |a_i - b_j| <= tol_ns,
    the nearest first: each of a is offered its nearest b and, where two claim one b, the closer wins."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if not a.size or not b.size:
        return []
    k = np.searchsorted(b, a)
    cands = []
    for j in (k - 1, k):  # the neighbours of each a in b
        jj = np.clip(j, 0, b.size - 1)
        gap = np.abs(b[jj] - a)
        sel = (j >= 0) & (j < b.size) & (gap <= tol_ns)
        cands += zip(gap[sel].tolist(), np.flatnonzero(sel).tolist(), jj[sel].tolist())
    cands.sort()
    used_a, used_b, out = set(), set(), []
    for _, i, j in cands:
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            out.append((i, j))
    return sorted(out)


@dataclass(frozen=True)
class BagTopics:
    image: str
    depth: str | None = None
    info: str | None = None  # None: the colour topic's sibling camera_info where the bag has it


@dataclass
class BagIndex:
    """What one pass over a bag's headers found: the paired frames and what was dropped."""
    path: Path
    format: str
    topics: BagTopics  # as resolved (info filled in when found)
    color_type: str
    depth_type: str | None
    frames: list[tuple[int, int | None, int]]  # (colour log time, depth log time or None, colour stamp), by stamp
    cameras: list[Camera | None]  # per frame: the nearest CameraInfo in time (None without one)
    n_color: int
    n_depth: int
    dropped_color: int
    dropped_depth: int
    tol_ms: float
    start_ns: int = 0  # first colour stamp
    worst_gap_ms: float = 0.0  # the largest |colour - depth| among the pairs
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return dict(bag=str(self.path), format=self.format, image_topic=self.topics.image, depth_topic=self.topics.depth,
                    info_topic=self.topics.info, colour_frames=self.n_color, depth_frames=self.n_depth,
                    paired=len(self.frames), dropped_colour=self.dropped_color, dropped_depth=self.dropped_depth,
                    tolerance_ms=self.tol_ms, worst_pair_gap_ms=round(self.worst_gap_ms, 3))


def sibling_info_topic(image_topic: str, topics) -> str | None:
    """/ns/image_raw -> /ns/camera_info (or /ns/image_raw/compressed -> /ns/camera_info) where the bag has it."""
    parts = image_topic.rstrip("/").split("/")
    for cut in (1, 2):
        cand = "/".join(parts[:-cut] + ["camera_info"])
        if cand in topics:
            return cand
    return None


def index_bag(path, topics: BagTopics, tol_ms: float = 10.0, need_depth: bool = True) -> BagIndex:
    """Read every colour, depth and CameraInfo header of one bag and pair colour with depth.

    ValueError (one line, naming the bag) for: a bag that cannot be read; a missing topic (the ones
    that exist are listed); a topic of another type; an empty colour topic; a CameraInfo whose K is
    zero or whose size differs from the colour images'; raw colour and depth of different sizes; no
    colour frame pairing with a depth frame within the tolerance."""
    tol_ns = int(round(tol_ms * 1e6))
    with BagReader(path) as r:
        if not r.topics:
            raise ValueError(f"bag {r.path}: empty (no topic, no message)")
        cc = r.require(topics.image, "colour", (IMAGE, COMPRESSED))
        dc = r.require(topics.depth, "depth", (IMAGE, COMPRESSED)) if topics.depth else []
        if need_depth and not topics.depth:
            raise ValueError("a depth topic is needed (data.depth_topic)")
        info = topics.info or sibling_info_topic(topics.image, r.topics)
        ic = r.require(info, "CameraInfo", (CAMERA_INFO,)) if info else []
        ctype, dtype_ = r.msgtype(topics.image), (r.msgtype(topics.depth) if topics.depth else None)
        cids, dids, iids = {c.id for c in cc}, {c.id for c in dc}, {c.id for c in ic}
        col, dep, cams = [], [], []
        sizes: dict[str, set] = {"colour": set(), "depth": set()}
        for c, t, raw in r.messages(connections=cc + dc + ic):
            m = r.deserialize(raw, c.msgtype)
            s = stamp_ns(m, t)
            if c.id in cids:
                col.append((s, t))
                if c.msgtype == IMAGE:
                    sizes["colour"].add((int(m.width), int(m.height)))
            elif c.id in dids:
                dep.append((s, t))
                if c.msgtype == IMAGE:
                    sizes["depth"].add((int(m.width), int(m.height)))
            elif c.id in iids:
                cams.append((s, camera_from_info(m, info)))
    where = f"bag {Path(path)}"
    if not col:
        raise ValueError(f"{where}: colour topic {topics.image} holds no message")
    if topics.depth and not dep:
        raise ValueError(f"{where}: depth topic {topics.depth} holds no message")
    if info and not cams:
        raise ValueError(f"{where}: CameraInfo topic {info} holds no message")
    if sizes["colour"] and sizes["depth"] and sizes["colour"] != sizes["depth"]:
        raise ValueError(f"{where}: colour {_sizes(sizes['colour'])} and depth {_sizes(sizes['depth'])} differ in size; "
                         f"depthpack needs depth registered to the colour image (e.g. aligned_depth_to_color)")
    for _, cam in cams:
        for w, h in sizes["colour"]:
            if (cam.width, cam.height) != (w, h):
                raise ValueError(f"{where}: CameraInfo on {info} describes {cam.width}x{cam.height} images, the colour "
                                 f"topic {topics.image} holds {w}x{h}")
    col.sort()
    dep.sort()
    if topics.depth:
        pairs = pair_stamps(np.array([s for s, _ in col]), np.array([s for s, _ in dep]), tol_ns)
        if not pairs:
            gap = _nearest_gap_ms(col, dep)
            raise ValueError(f"{where}: no colour frame of {topics.image} ({len(col)}) pairs with a depth frame of "
                             f"{topics.depth} ({len(dep)}) within {tol_ms:g} ms (the nearest are {gap:.1f} ms apart); "
                             f"raise the tolerance (data.pair_tol_ms / --tolerance-ms) if they belong together")
        frames = [(col[i][1], dep[j][1], col[i][0]) for i, j in pairs]
        worst = max(abs(col[i][0] - dep[j][0]) for i, j in pairs) / 1e6
    else:
        pairs, frames, worst = [], [(t, None, s) for s, t in col], 0.0
    cams.sort(key=lambda x: x[0])
    cstamps = [s for s, _ in cams]
    per_frame = [_nearest(cams, cstamps, s) for _, _, s in frames]
    n_pairs = len(frames)
    return BagIndex(Path(path), _format_name(bag_format(path)), BagTopics(topics.image, topics.depth, info), ctype, dtype_,
                    frames, per_frame, len(col), len(dep), len(col) - n_pairs if topics.depth else 0,
                    len(dep) - n_pairs if topics.depth else 0, tol_ms, col[0][0], worst)


def _format_name(fmt: str) -> str:
    return {"ros1": "ROS 1", "sqlite3": "ROS 2 sqlite3", "mcap": "ROS 2 MCAP"}[fmt]


def _sizes(s: set) -> str:
    return "/".join(f"{w}x{h}" for w, h in sorted(s))


def _nearest(cams, stamps, s):
    if not cams:
        return None
    k = bisect.bisect_left(stamps, s)
    best = min((j for j in (k - 1, k) if 0 <= j < len(cams)), key=lambda j: abs(stamps[j] - s))
    return cams[best][1]


def _nearest_gap_ms(col, dep) -> float:
    d = np.array([s for s, _ in dep], np.int64)
    gaps = []
    for s, _ in col:
        k = int(np.searchsorted(d, s))
        gaps += [abs(int(d[j]) - s) for j in (k - 1, k) if 0 <= j < d.size]
    return min(gaps) / 1e6


# ----------------------------------------------------------------------------- the split
def split_blocks(stamps_ns, split: str, block_s: float, val_every: int, gap_s: float) -> list[int]:
    """Indices of the frames (stamps of one recording, in order) in split "train" | "val" | "all".

    Time is cut into contiguous blocks of block_s seconds from the first frame; every val_every-th
    block (the last of each group: blocks val_every-1, 2*val_every-1, ...) is validation. Train frames
    closer than gap_s to a validation block are left out of both: neighbouring frames are near-copies,
    and a random split would put copies of the validation frames in training."""
    if split == "all":
        return list(range(len(stamps_ns)))
    t = (np.asarray(stamps_ns, np.int64) - int(stamps_ns[0])) / 1e9
    block = np.floor(t / block_s).astype(np.int64)
    is_val = block % val_every == val_every - 1
    if split == "val":
        return np.flatnonzero(is_val).tolist()
    pos = t - block * block_s  # seconds into its block
    near = ((block % val_every == val_every - 2) & (pos > block_s - gap_s)) | \
           ((block % val_every == 0) & (block > 0) & (pos < gap_s))
    return np.flatnonzero(~is_val & ~near).tolist()


# ----------------------------------------------------------------------------- the data set
def topics_of(cfg) -> BagTopics:
    return BagTopics(cfg.image_topic, cfg.depth_topic, cfg.info_topic)


class BagDataset(SkippingDataset):
    """Paired colour + depth frames of one or more bags (DataConfig kind "bag"), split by time blocks.

    Samples are those of every data set (depthpack.data.common.make_sample): the colour image and the
    depth resized to the model's size, focal from CameraInfo (data.focal / data.intrinsics override it).
    Without a cache every sample is read from its bag (a time query per message) and decoded. With
    data.cache_dir the frames are decoded and resized ONCE, by every core, into a row store on disk
    (depthpack.data.store's rows: image uint8, depth float16, focal float32), which later runs and
    DataLoader workers memory-map; data.device_cache then holds them on the training device. With
    data.cache (no cache_dir) the same rows are built in memory by prefill()."""

    def __init__(self, cfg, split: str, size, min_depth: float, max_depth: float):
        super().__init__(size, min_depth, max_depth, cfg)
        self.split = split
        self.paths = list_bags(cfg.root)
        topics = topics_of(cfg)
        self.indexes = [index_bag(p, topics, cfg.pair_tol_ms) for p in self.paths]
        self.frames: list[tuple[int, int]] = []  # (bag, frame of that bag's index)
        self.in_gaps = 0  # frames in neither split: train frames next to a validation block
        for b, idx in enumerate(self.indexes):
            stamps = [s for _, _, s in idx.frames]
            cut = {sp: split_blocks(stamps, sp, cfg.split_block_s, cfg.val_every, cfg.split_gap_s) for sp in ("train", "val")}
            self.frames += [(b, k) for k in (cut[split] if split in cut else range(len(stamps)))]
            self.in_gaps += len(stamps) - len(cut["train"]) - len(cut["val"])
        self.focal_override = dataset_focal(cfg)
        self._readers: dict[int, BagReader] = {}
        self._pid = None
        self.rows = None  # uint8 [n, row_bytes] once cached (memmap or array)
        self._bad_mask = np.zeros(len(self.frames), bool)  # rows that could not be decoded
        self.store = None
        self.layout = RowLayout(*self.size)
        if cfg.cache_dir and self.frames:
            self.store = self._open_store()
            self.rows = self.store.rows

    def __len__(self) -> int:
        return len(self.frames)

    def describe(self) -> str:
        return f"bags {', '.join(str(p) for p in self.paths)} [{self.split}] ({len(self.frames)} frames)"

    def report(self) -> dict:
        """What the data set holds and what it dropped, per bag."""
        return dict(split=self.split, frames=len(self.frames), in_split_gaps=self.in_gaps,
                    bags=[i.summary() for i in self.indexes])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_readers"] = {}
        return state

    def reader(self, b: int) -> BagReader:
        if self._pid != os.getpid():
            self._readers, self._pid = {}, os.getpid()
        if b not in self._readers:
            self._readers[b] = BagReader(self.paths[b])
        return self._readers[b]

    def _message(self, b: int, topic: str, t: int):
        r = self.reader(b)
        for c, _, raw in r.messages(connections=r.topics[topic], start=t, stop=t + 1):
            return r.deserialize(raw, c.msgtype), c.msgtype
        raise BadSample(self.paths[b], f"no message on {topic} at {t} ns (the bag changed since it was indexed?)")

    def native(self, i: int) -> tuple[np.ndarray, np.ndarray, tuple[float, float] | None, str]:
        """Frame i as the bag holds it: RGB uint8 [h,w,3], depth float32 m [h,w], (fx, fy) or None, name."""
        b, k = self.frames[i]
        idx = self.indexes[b]
        ct, dt, stamp = idx.frames[k]
        msg, mt = self._message(b, idx.topics.image, ct)
        rgb = decode_color(msg, mt, idx.topics.image)
        msg, mt = self._message(b, idx.topics.depth, dt)
        depth = decode_depth(msg, mt, idx.topics.depth, self.cfg.scale())
        check_frame(rgb.shape[:2], depth.shape, idx.cameras[k], idx)
        cam = idx.cameras[k]
        focal = self.focal_override or ((cam.fx, cam.fy) if cam else None)
        return rgb, depth, focal, f"{self.paths[b].name}@{stamp}"

    def load(self, i: int) -> dict:
        if self.rows is not None:
            if self._bad_mask[i]:
                raise BadSample(self.frame_name(i), "could not be decoded when the cache was built")
            image, depth, focal = _row_sample(self.rows, i, self.layout)
            return make_sample(image, depth, self.size, self.cfg, self.min_depth, self.max_depth, self.frame_name(i),
                               self.frame_name(i), focal=(focal, focal) if focal > 0 else None)
        rgb, depth, focal, name = self.native(i)
        return make_sample(rgb, depth, self.size, self.cfg, self.min_depth, self.max_depth, name, name, focal=focal)

    def frame_name(self, i: int) -> str:
        b, k = self.frames[i]
        return f"{self.paths[b].name}@{self.indexes[b].frames[k][2]}"

    # ---- the cache: decoded, resized rows --------------------------------------------------------
    def row(self, i: int) -> np.ndarray | None:
        """Frame i decoded and resized to the model's size as one store row (None if it is bad)."""
        try:
            rgb, depth, focal, _ = self.native(i)
        except BadSample as e:
            log.warning("bag cache: skipping frame %d (%s)", i, e)
            return None
        c = self.cfg
        img = resize_image(rgb, self.size, c.resize, c.image_interp)
        d = resize_nearest(depth, self.size, c.resize)
        f = 0.0
        if focal is not None:
            _, _, (sh, sw, _, _) = source_indices(rgb.shape[0], rgb.shape[1], self.size, c.resize)
            f = focal_at_size(focal[0], focal[1], rgb.shape[:2], (sh, sw))
        return encode_rows(dict(image=img[None], depth=d[None], K=np.diag([f, f, 1.0])[None]), self.layout)[0]

    def build_rows(self, processes: int = 1, progress: bool = False, out: np.ndarray | None = None) -> tuple[np.ndarray, list[int]]:
        """Every frame as a row (into out, or a new array), decoded by `processes` forked workers."""
        import multiprocessing as mp

        from tqdm import tqdm

        n = len(self.frames)
        rows = out if out is not None else np.zeros((n, self.layout.row_bytes), np.uint8)
        bad = []
        bar = tqdm(total=n, desc="decode bag frames", disable=not progress, dynamic_ncols=True)
        if processes > 1 and n > 1 and "fork" in mp.get_all_start_methods():
            _W["ds"] = self
            with mp.get_context("fork").Pool(processes) as pool:
                for i, r in pool.imap_unordered(_row_job, range(n), chunksize=4):
                    _put(rows, bad, i, r)
                    bar.update(1)
            _W.clear()
        else:
            for i in range(n):
                _put(rows, bad, i, self.row(i))
                bar.update(1)
        bar.close()
        return rows, sorted(bad)

    def prefill(self, processes: int, progress: bool = False) -> None:
        """data.cache: decode every frame once now, into rows in memory (the training loop calls this)."""
        if self.rows is not None:
            return
        rows, bad = self.build_rows(processes, progress)
        self._set_bad(bad)
        self.rows = rows

    def _set_bad(self, bad: list[int]) -> None:
        self._bad_mask = np.zeros(len(self.frames), bool)
        self._bad_mask[bad] = True

    def cache_key(self) -> str:
        c = self.cfg
        ident = [[str(p.resolve()), *_stat(p)] for p in self.paths]
        blob = json.dumps(dict(bags=ident, topics=[c.image_topic, c.depth_topic, c.info_topic], tol=c.pair_tol_ms,
                               split=[self.split, c.split_block_s, c.val_every, c.split_gap_s], size=list(self.size),
                               resize=c.resize, interp=c.image_interp, focal=c.focal, intrinsics=c.intrinsics,
                               scale=c.scale(), version=1), sort_keys=True)
        return f"bag_{self.split}_{self.size[0]}x{self.size[1]}_{hashlib.sha256(blob.encode()).hexdigest()[:16]}"

    def _open_store(self) -> SceneStore:
        """The rows of this split in cfg.cache_dir: opened if built before, else built now (every core).
        The JSON is written last (atomically): a killed build leaves no store that opens."""
        root = Path(self.cfg.cache_dir)
        root.mkdir(parents=True, exist_ok=True)
        key = self.cache_key()
        npy, js = root / f"{key}.npy", root / f"{key}.json"
        if js.is_file() and npy.is_file():
            meta = json.loads(js.read_text())
            store = SceneStore(npy, meta)
            self._set_bad(meta.get("bad", []))
            return store
        tmp = temporary_name(npy)
        try:
            rows = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(self.frames), self.layout.row_bytes))
            _, bad = self.build_rows(os.cpu_count() or 1, progress=False, out=rows)
            rows.flush()
            del rows
            os.replace(tmp, npy)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        meta = dict(version=1, key=key, size=list(self.size), row_bytes=self.layout.row_bytes, n=len(self.frames),
                    bad=bad, complete=True, bags=[str(p) for p in self.paths])
        atomic_write_json(js, meta)
        self._set_bad(bad)
        return SceneStore(npy, meta)


_W: dict = {}


def _row_job(i: int):
    return i, _W["ds"].row(i)


def _put(rows, bad, i, r) -> None:
    if r is None:
        bad.append(i)
    else:
        rows[i] = r


def _stat(p: Path) -> list:
    files = [p] if p.is_file() else sorted(q for q in p.iterdir() if q.is_file())
    return [[q.name, q.stat().st_size, q.stat().st_mtime_ns] for q in files]


def _row_sample(rows, i: int, layout: RowLayout) -> tuple[np.ndarray, np.ndarray, float]:
    from .store import decode_rows
    image, depth, focal = decode_rows(np.asarray(rows[i:i + 1]), layout)
    return np.ascontiguousarray(image[0].transpose(1, 2, 0)), depth[0].astype(np.float32), float(focal[0])


def check_frame(hw: tuple[int, int], depth_hw: tuple[int, int] | None, cam: Camera | None, idx: BagIndex) -> None:
    """ValueError if a decoded colour frame (h, w) disagrees with its depth or its CameraInfo in size."""
    h, w = hw
    if depth_hw is not None and tuple(depth_hw) != (h, w):
        raise ValueError(f"bag {idx.path}: colour {w}x{h} and depth {depth_hw[1]}x{depth_hw[0]} differ in size; "
                         f"depthpack needs depth registered to the colour image (e.g. aligned_depth_to_color)")
    if cam is not None and (cam.width, cam.height) != (w, h):
        raise ValueError(f"bag {idx.path}: CameraInfo on {idx.topics.info} describes {cam.width}x{cam.height} images, "
                         f"the colour topic {idx.topics.image} holds {w}x{h}")


# ----------------------------------------------------------------------------- writing
class BagWriter:
    """A bag written under a temporary name beside `path` and moved into place when the `with` block
    ends without an error (a file killed mid-write leaves only the hidden temporary, which no reader
    is pointed at, and which the next writer of the same path clears).

    fmt: "ros1" (one .bag file), "mcap" or "sqlite3" (a ROS 2 bag folder); default by the name: *.bag
    is ROS 1, anything else a ROS 2 MCAP folder. An existing `path` is replaced only if it is a bag
    (never another file or folder)."""

    def __init__(self, path, fmt: str | None = None):
        _rosbags()
        from rosbags.typesys import Stores, get_typestore

        self.path = Path(path)
        self.fmt = fmt or ("ros1" if self.path.suffix == ".bag" else "mcap")
        if self.fmt not in FORMATS:
            raise ValueError(f"bag format {self.fmt!r} is not one of {FORMATS}")
        if (self.fmt == "ros1") != (self.path.suffix == ".bag"):
            raise ValueError(f"output {self.path}: a ROS 1 bag is a *.bag file and a ROS 2 bag a folder not named *.bag "
                             f"(format {self.fmt})")
        check_output(self.path, self.fmt)
        self.typestore = get_typestore(Stores.ROS1_NOETIC if self.fmt == "ros1" else Stores.ROS2_HUMBLE)
        self.ros1 = self.fmt == "ros1"
        self.writer = None
        self._stage = None

    def __enter__(self) -> "BagWriter":
        from rosbags.rosbag1 import Writer as Writer1
        from rosbags.rosbag2 import StoragePlugin, Writer as Writer2

        if self.ros1:
            remove_stale_temporaries(self.path.parent)  # .NAME.tmpPID of killed writers
            self._stage = temporary_name(self.path)
            self._stage.unlink(missing_ok=True)
            self.writer = Writer1(self._stage)
        else:
            self._stage = staging_dir(self.path)  # .NAME.staging-PID (stale ones of dead writers removed)
            plugin = StoragePlugin.MCAP if self.fmt == "mcap" else StoragePlugin.SQLITE3
            self.writer = Writer2(self._stage / self.path.name, version=9, storage_plugin=plugin)
        try:
            self.writer.open()
        except Exception as e:
            self._discard()
            raise ValueError(f"output {self.path}: cannot be written ({_why(e)})") from None
        return self

    def add(self, topic: str, msgtype: str, like=None):
        """A connection for topic; `like` (a connection of a bag being copied) keeps its definition."""
        if like is not None:
            if self.ros1:
                return self.writer.add_connection(topic, msgtype, msgdef=like.msgdef.data, md5sum=like.digest,
                                                  callerid=like.ext.callerid, latching=like.ext.latching)
            if like.msgdef.data and like.digest:
                return self.writer.add_connection(topic, msgtype, msgdef=like.msgdef.data, rihs01=like.digest,
                                                  serialization_format=like.ext.serialization_format,
                                                  offered_qos_profiles=like.ext.offered_qos_profiles)
        return self.writer.add_connection(topic, msgtype, typestore=self.typestore)

    def write(self, connection, t_ns: int, msg) -> None:
        """A message object (from this writer's builders) or serialized bytes, at log time t_ns."""
        if not isinstance(msg, (bytes, bytearray, memoryview)):
            ser = self.typestore.serialize_ros1 if self.ros1 else self.typestore.serialize_cdr
            msg = ser(msg, connection.msgtype)
        self.writer.write(connection, int(t_ns), msg)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._discard()
            return False
        try:
            self.writer.close()
        except BaseException:
            self._discard()
            raise
        if self.ros1:
            with open(self._stage, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(self._stage, self.path)
            fsync_dir(self.path.parent)
        else:
            inner = self._stage / self.path.name
            for q in inner.iterdir():
                with open(q, "rb+") as f:
                    os.fsync(f.fileno())
            publish_dir(inner, self.path)  # one rename (or an atomic exchange with the previous bag)
            shutil.rmtree(self._stage, ignore_errors=True)
        return False

    def _discard(self) -> None:
        try:
            if self.writer is not None and getattr(self.writer, "bio", None) is not None:
                self.writer.bio.close()
        except Exception:
            pass
        if self._stage is not None:
            if self._stage.is_dir():
                shutil.rmtree(self._stage, ignore_errors=True)
            else:
                self._stage.unlink(missing_ok=True)

    # ---- message builders (the writer's typestore: ROS 1 or ROS 2 field names) ------------------
    def _new(self, msgtype: str, **fields):
        cls = self.typestore.types[msgtype]
        names = [n for n, _ in self.typestore.fielddefs[msgtype][1]]
        low = {n.lower(): n for n in names}
        return cls(**{low[k.lower()]: v for k, v in fields.items()})

    def header(self, t_ns: int, frame_id: str):
        stamp = self._new("builtin_interfaces/msg/Time", sec=int(t_ns // 1_000_000_000), nanosec=int(t_ns % 1_000_000_000))
        extra = {"seq": 0} if self.ros1 else {}
        return self._new("std_msgs/msg/Header", stamp=stamp, frame_id=frame_id, **extra)

    def image(self, array: np.ndarray, encoding: str, t_ns: int, frame_id: str = "camera"):
        """sensor_msgs/Image from RGB uint8 [h,w,3] (encoding rgb8, bgr8 or mono8: converted here) or
        depth meters [h,w] (16UC1: round(mm), 32FC1: meters, NaN where invalid)."""
        a = np.asarray(array)
        if encoding in ("rgb8", "bgr8"):
            data = a[..., ::-1] if encoding == "bgr8" else a
            data = np.ascontiguousarray(data, dtype=np.uint8)
        elif encoding == "mono8":
            data = np.ascontiguousarray(a if a.ndim == 2 else cv2.cvtColor(a, cv2.COLOR_RGB2GRAY), dtype=np.uint8)
        elif encoding == "16UC1":  # millimetres; 0 where invalid or beyond 65.535 m (as a sensor out of range)
            mm = np.round(np.nan_to_num(np.asarray(a, np.float64), nan=0.0, posinf=0.0) * 1000.0)
            data = np.where((mm > 0) & (mm <= 65535), mm, 0).astype("<u2")
        elif encoding == "32FC1":
            data = np.where(np.isfinite(a) & (a > 0), a, np.nan).astype("<f4")
        else:
            raise ValueError(f"image encoding {encoding!r} is not one of rgb8, bgr8, mono8, 16UC1, 32FC1")
        h, w = a.shape[:2]
        return self._new(IMAGE, header=self.header(t_ns, frame_id), height=h, width=w, encoding=encoding,
                         is_bigendian=0, step=data.nbytes // h, data=np.frombuffer(data.tobytes(), np.uint8))

    def compressed(self, array: np.ndarray, fmt: str, t_ns: int, frame_id: str = "camera", quality: int = 95):
        """sensor_msgs/CompressedImage: RGB uint8 in "jpeg" or "png" (image_transport "compressed"), or
        depth meters in "16UC1; compressedDepth" / "32FC1; compressedDepth" (image_transport's codec)."""
        if "compresseddepth" in fmt.lower():
            data, fmt_s = encode_compressed_depth(array, fmt.split(";")[0].strip())
        elif fmt in ("jpeg", "png"):
            bgr = cv2.cvtColor(np.asarray(array, np.uint8), cv2.COLOR_RGB2BGR)
            args = [cv2.IMWRITE_JPEG_QUALITY, quality] if fmt == "jpeg" else []
            good, enc = cv2.imencode(".jpg" if fmt == "jpeg" else ".png", bgr, args)
            if not good:
                raise ValueError(f"cv2 cannot encode {fmt}")
            data, fmt_s = enc.tobytes(), f"rgb8; {fmt} compressed bgr8"
        else:
            raise ValueError(f"compressed format {fmt!r} is not jpeg, png or 'ENC; compressedDepth'")
        return self._new(COMPRESSED, header=self.header(t_ns, frame_id), format=fmt_s,
                         data=np.frombuffer(data, np.uint8))

    def camera_info(self, K, width: int, height: int, t_ns: int, frame_id: str = "camera"):
        K = np.asarray(K, np.float64).reshape(3, 3)
        P = np.zeros((3, 4))
        P[:, :3] = K
        roi = self._new("sensor_msgs/msg/RegionOfInterest", x_offset=0, y_offset=0, height=0, width=0, do_rectify=False)
        return self._new(CAMERA_INFO, header=self.header(t_ns, frame_id), height=height, width=width,
                         distortion_model="plumb_bob", d=np.zeros(5), k=K.reshape(-1), r=np.eye(3).reshape(-1),
                         p=P.reshape(-1), binning_x=0, binning_y=0, roi=roi)

    def point_cloud(self, columns: dict[str, np.ndarray], t_ns: int, frame_id: str):
        """sensor_msgs/PointCloud2 of one row of points, a float32 field per column (in order)."""
        names = list(columns)
        data = np.stack([np.asarray(columns[n], np.float32) for n in names], axis=1)  # [N, F]
        pf = [self._new("sensor_msgs/msg/PointField", name=n, offset=4 * k, datatype=7, count=1)  # 7 = FLOAT32
              for k, n in enumerate(names)]
        n = data.shape[0]
        return self._new(POINTCLOUD2, header=self.header(t_ns, frame_id), height=1, width=n, fields=pf,
                         is_bigendian=False, point_step=4 * len(names), row_step=4 * len(names) * n,
                         data=np.frombuffer(np.ascontiguousarray(data, "<f4").tobytes(), np.uint8),
                         is_dense=bool(np.isfinite(data).all()))


def check_output(path: Path, fmt: str) -> None:
    """ValueError unless `path` can take a bag: its folder exists or can be made and is writable,
    and path is new or an earlier bag of the same kind (never another file or a folder)."""
    path = Path(path)
    if path.exists():
        if fmt == "ros1" and path.is_dir():
            raise ValueError(f"output {path} is a folder; a ROS 1 bag is one .bag file")
        if fmt != "ros1" and not (path.is_dir() and (path / "metadata.yaml").is_file()):
            raise ValueError(f"output {path} exists and is not a ROS 2 bag folder; refusing to replace it")
        if fmt == "ros1":
            bag_format(path)  # an earlier bag is replaced; anything else is refused by name
    check_writable_dir(path.parent, f"output {path}: the folder")  # made if missing; a file in the way, no rights: refused


def read_back(path, topic: str):
    """Every message of one topic as (log time, message type, message) — tests and tools."""
    with BagReader(path) as r:
        conns = r.topics.get(topic)
        if not conns:
            raise ValueError(f"bag {path}: no topic {topic!r}")
        return [(t, c.msgtype, r.deserialize(raw, c.msgtype)) for c, t, raw in r.messages(connections=conns)]
