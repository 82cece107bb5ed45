"""File formats of depth data sets, decoded exactly as their users know them.

- 16-bit PNG depth: meters = value / depth_scale (1000 NYU / 7-Scenes, 256 KITTI, 5000 TUM); the raw
  values in invalid_raw (default 0 and 65535, 7-Scenes' sentinel) mean "no measurement".
- SUN RGB-D PNG (decode="sunrgbd"): the uint16 is mm rotated by 3 bits: mm = (v >> 3) | (v << 13).
- .npy: float meters (allow_pickle=False: nothing is unpickled).
- .pfm: float32 (negative scale = little-endian, rows bottom-to-top). With decode="middlebury" it is
  disparity and calib.txt beside it gives depth_mm = baseline * f / (d + doffs); +inf = unknown.
- .pgm: NYU Depth v2's raw Kinect dump (P5, 16-bit samples, maxval 65535): 11-bit disparity, 2047 =
  no measurement. The NYU toolbox reads it with swapbytes(imread(...)): the samples are little-endian
  although the PGM spec says big-endian (a file re-saved big-endian by a spec-following tool is
  recognized too: whichever byte order keeps every value <= 2047). meters = 351.3 / (1092.5 - d)
  (the toolbox's depth_rel2depth_abs), clamped to 10 m as the toolbox does; d = 2047 or a
  non-positive result = invalid. The raw depth is in the depth camera's frame, not registered to
  the RGB image (the toolbox's project_depth_map does that); pair it knowingly.
Invalid pixels come back as 0 meters. Every failure is a BadSample naming the file; an extension no
loader knows is a ValueError (a file misread as another format would be silently wrong).
"""
from __future__ import annotations

import re
from pathlib import Path

import cv2
import numpy as np

from ..core import preprocess
from .errors import BadSample


def read_rgb(path) -> np.ndarray:
    """uint8 RGB [h,w,3] (JPEG, PNG, PPM, ... whatever OpenCV decodes): the same decode as inference
    (depthpack.preprocess.read_rgb), with a bad file reported as a skippable BadSample."""
    try:
        return preprocess.read_rgb(path)
    except ValueError as e:  # "image PATH: reason"
        raise BadSample(path, str(e).split(": ", 1)[-1]) from None


def decode_uint16(raw: np.ndarray, scale: float, decode: str = "linear",
                  invalid_raw: tuple[int, ...] = (0, 65535)) -> np.ndarray:
    """uint16 depth values -> float32 meters, 0 where the value means "no measurement"."""
    raw = np.asarray(raw)
    if raw.dtype != np.uint16:
        raise ValueError(f"expected uint16 depth values, got {raw.dtype}")
    if decode == "sunrgbd":
        raw = (raw >> np.uint16(3)) | (raw << np.uint16(13))  # uint16 arithmetic wraps, as intended
    elif decode != "linear":
        raise ValueError(f"decode={decode!r} does not apply to 16-bit PNG depth")
    meters = (raw.astype(np.float64) / float(scale)).astype(np.float32)
    if invalid_raw:
        meters[np.isin(raw, np.asarray(invalid_raw, dtype=np.int64))] = 0.0
    return meters


def read_png_depth(path, scale: float, decode: str = "linear", invalid_raw=(0, 65535)) -> np.ndarray:
    path = Path(path)
    if not path.is_file():
        raise BadSample(path, "no such file")
    raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if raw is None:
        raise BadSample(path, "cannot be decoded as a PNG (corrupt or not an image)")
    if raw.dtype != np.uint16 or raw.ndim != 2:
        raise BadSample(path, f"expected a single-channel 16-bit depth PNG, got {raw.dtype} {raw.shape}")
    return decode_uint16(raw, scale, decode, invalid_raw)


def read_pfm(path) -> np.ndarray:
    """PFM -> float32 [h,w] (or [h,w,3] for 'PF'), top row first."""
    path = Path(path)
    if not path.is_file():
        raise BadSample(path, "no such file")
    with open(path, "rb") as f:
        try:
            kind = f.readline().strip()
            w, h = (int(x) for x in f.readline().split())
            scale = float(f.readline().strip())
        except ValueError as e:
            raise BadSample(path, f"bad PFM header ({e})") from None
        if kind not in (b"Pf", b"PF"):
            raise BadSample(path, f"not a PFM file (magic {kind[:8]!r})")
        c = 3 if kind == b"PF" else 1
        data = np.frombuffer(f.read(), dtype="<f4" if scale < 0 else ">f4")
    if data.size != h * w * c:
        raise BadSample(path, f"PFM holds {data.size} values, header says {h}x{w}x{c}")
    img = data.reshape(h, w, c) if c == 3 else data.reshape(h, w)
    return np.ascontiguousarray(np.flipud(img)).astype(np.float32)


def read_middlebury_calib(path) -> dict[str, float]:
    """f (cam0[0,0]), doffs, baseline (mm) from a Middlebury calib.txt; tolerant of extra spaces."""
    path = Path(path)
    if not path.is_file():
        raise BadSample(path, "no such file (Middlebury depth needs calib.txt beside the PFM)")
    text = path.read_text()
    vals = dict(re.findall(r"(\w+)\s*=\s*([^\n]+)", text))
    try:
        f = float(re.findall(r"[-+0-9.eE]+", vals["cam0"])[0])
        return dict(f=f, doffs=float(vals["doffs"].strip()), baseline=float(vals["baseline"].strip()))
    except (KeyError, IndexError, ValueError) as e:
        raise BadSample(path, f"cannot read f, doffs and baseline ({e!r})") from None


DEPTH_FORMATS = {".png": "16-bit PNG", ".npy": "float meters (.npy)", ".pfm": "PFM",
                 ".pgm": "NYU Depth v2 raw Kinect disparity (PGM)"}
KINECT_INVALID = 2047
NYU_RAW_MAX_M = 10.0


def check_depth_extension(path) -> None:
    """ValueError for a depth file whose extension no loader knows (before anything is read)."""
    ext = Path(path).suffix.lower()
    if ext not in DEPTH_FORMATS:
        known = ", ".join(f"{e} ({what})" for e, what in DEPTH_FORMATS.items())
        raise ValueError(f"depth file {path}: unknown extension {ext or '(none)'!r}; depthpack reads {known}")


def read_pgm16(path) -> np.ndarray:
    """A binary 16-bit PGM (P5, maxval > 255) -> its samples as uint16 [h,w], in the byte order of
    NYU's raw dump (see the module docstring); BadSample if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise BadSample(path, "no such file")
    data = path.read_bytes()
    fields, pos = [], 0
    while len(fields) < 4:  # magic, width, height, maxval; '#' comments between them
        while pos < len(data) and data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.find(b"\n", pos) + 1 or len(data)
            continue
        end = pos
        while end < len(data) and not data[end:end + 1].isspace():
            end += 1
        if end == pos:
            raise BadSample(path, "truncated PGM header")
        fields.append(data[pos:end])
        pos = end
    pos += 1  # the single whitespace byte before the samples
    if fields[0] != b"P5":
        raise BadSample(path, f"not a binary PGM (magic {fields[0][:8]!r}, expected b'P5')")
    try:
        w, h, maxval = (int(f) for f in fields[1:])
    except ValueError:
        raise BadSample(path, f"bad PGM header {b' '.join(fields)!r}") from None
    if maxval <= 255:
        raise BadSample(path, f"an 8-bit PGM (maxval {maxval}): not a 16-bit depth dump")
    if len(data) - pos != 2 * w * h:
        raise BadSample(path, f"PGM holds {len(data) - pos} bytes of samples, header says {w}x{h}x2")
    little = np.frombuffer(data, dtype="<u2", count=w * h, offset=pos)
    if little.max(initial=0) <= KINECT_INVALID:  # NYU's byte order
        return little.reshape(h, w).copy()
    big = little.byteswap()
    if big.max(initial=0) <= KINECT_INVALID:  # re-saved as the spec says
        return big.reshape(h, w).copy()
    raise BadSample(path, f"values up to {int(little.max())} (little-endian) / {int(big.max())} (big-endian) are "
                          f"not 11-bit Kinect disparities (<= {KINECT_INVALID}): not NYU's raw depth")


def kinect_disparity_to_meters(raw: np.ndarray) -> np.ndarray:
    """NYU raw Kinect disparity -> float32 meters (NYU toolbox depth_rel2depth_abs), 0 where invalid."""
    d = raw.astype(np.float64)
    with np.errstate(divide="ignore"):
        m = 351.3 / (1092.5 - d)
    ok = (raw < KINECT_INVALID) & (m > 0)
    return np.where(ok, np.minimum(m, NYU_RAW_MAX_M), 0.0).astype(np.float32)


def read_depth(path, scale: float = 1000.0, decode: str = "linear", invalid_raw=(0, 65535)) -> np.ndarray:
    """Any supported depth file -> float32 meters [h,w], 0 where invalid. ValueError for an extension
    no loader knows, or a decode that does not apply to the file's format."""
    path = Path(path)
    ext = path.suffix.lower()
    check_depth_extension(path)
    if ext == ".pgm":
        if decode != "linear":
            raise ValueError(f"depth file {path}: decode={decode!r} does not apply to NYU's raw .pgm (it has its own "
                             f"conversion); leave decode at 'linear'")
        return kinect_disparity_to_meters(read_pgm16(path))
    if ext == ".npy":
        if not path.is_file():
            raise BadSample(path, "no such file")
        try:
            d = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise BadSample(path, f"cannot be read as .npy ({e})") from None
        d = np.squeeze(d) if d.ndim == 3 and 1 in (d.shape[0], d.shape[-1]) else d
        if d.ndim != 2 or not np.issubdtype(d.dtype, np.number):
            raise BadSample(path, f"expected a 2-D numeric array of meters, got {d.dtype} {d.shape}")
        d = d.astype(np.float32)
    elif ext == ".pfm":
        d = read_pfm(path)
        if d.ndim != 2:
            raise BadSample(path, "expected a single-channel PFM")
        if decode == "middlebury":
            cal = read_middlebury_calib(path.parent / "calib.txt")
            with np.errstate(divide="ignore", invalid="ignore"):
                d = (cal["baseline"] * cal["f"] / (d.astype(np.float64) + cal["doffs"]) / 1000.0).astype(np.float32)
    else:
        return read_png_depth(path, scale, decode, invalid_raw)
    d = np.where(np.isfinite(d) & (d > 0), d, np.float32(0.0)).astype(np.float32)
    return d


def encode_uint16(depth: np.ndarray, scale: float) -> np.ndarray:
    """float meters [h,w] (0 / non-finite = invalid) -> uint16 round(depth * scale), 0 where invalid.

    ValueError if a valid depth does not fit below 65535 at this scale (no silent clamp).
    """
    d = np.asarray(depth, dtype=np.float64)
    ok = np.isfinite(d) & (d > 0)
    v = np.where(ok, np.round(d * scale), 0.0)
    if v.max(initial=0) > 65534:
        raise ValueError(f"depth up to {d[ok].max():.3f} m does not fit in uint16 at depth_scale {scale} "
                         f"(max {65534 / scale:.3f} m); use a smaller depth_scale (e.g. 256)")
    if ok.any() and v[ok].min() < 1:
        raise ValueError(f"depth down to {d[ok].min():.6f} m rounds to 0 (invalid) at depth_scale {scale}")
    return v.astype(np.uint16)
