"""The export folder's contract: what export/export.py writes and every runner reads.

One home for it: the exporter (depthpack.deploy.build), the Python loader (depthpack.runtime.aoti),
the tests and the C++ runner (deploy_cpp/manifest.h, held to this module by a test) all follow it.

A folder holds manifest.json (FORMAT), one AOTInductor package per bucket (package_name), the
reference files and optionally ONNX models. The packages hold compiled code; their weights are one
file beside them (WEIGHTS, manifest "weights": {"file", "sha256"}): every constant the packages
need, named by the package's constant FQNs, in the packages' dtypes, shared by every bucket. A
runner loads it into each package before the first call (a package run without its constants
reads unset memory). New weights of the same model need no recompile (the exporter's
reuse_packages). "weights": null: the weights are compiled into each package. Each package runs the packed forward (token selection
included) for one bucket K: its inputs are listed by name in the manifest, in call order, each a
contiguous tensor of a fixed shape and dtype, one of
    images  float32 [B,3,H,W]  RGB in [0,1] at the model's size (manifest "frame": null), or
    frames  uint8   [B,h,w,3]  camera frames of one size and channel order (manifest "frame":
                               {"size": [h, w], "color": "bgr" | "rgb"}), preprocessed inside
                               (depthpack.core.preprocess)
    points  float32 [B,K,2]    (x, y) pixels of those images or frames
    focal   float32 [B]        only for models with a focal input (manifest "focal" not null): each
                               row's focal length sqrt(fx * fy) in pixels of those images or frames
                               (0 = unknown: the model's default), scaled inside like the points
and it returns depth float32 [B,K] meters and, for a model with a glance depth (manifest "map" not null,
format 4), the glance's depth map float32 [B,rows,cols] of the same buffer; normalization and the
compute dtype are inside. Format 3 manifests (before the map) are read as packages without one. Each
package also carries its bucket and input specs in its own metadata (PACKAGE_METADATA), so a
manifest entry that names the wrong package is caught when it loads.

Format 5 (the one-way glance stream, model_config.glance_stream): a one-way model's map is one map per
image whatever the points, so its export adds a map-only package (MAP_PACKAGE; "map" then also holds
its MAP_PACKAGE_KEYS): the buckets' inputs without the points -> map float32 [B,rows,cols]; its
PACKAGE_BUCKET is MAP_BUCKET. A map-only call (no points) runs it; without one (a shared-stream model,
or a format 3 or 4 manifest, whose packages are shared-stream packages) every runner runs one point,
the centre of its input (w/2, h/2) in the input's pixels, and returns that buffer's map.
"""
from __future__ import annotations

import math
import platform
import re
from pathlib import Path

import torch

from ..core.files import sha256_file
from ..core.preprocess import focal_factor

FORMAT = "depthpack-manifest/5"
FORMAT_SHARED = "depthpack-manifest/4"  # before the one-way stream: read as shared-stream packages, no map-only package
FORMAT_NO_MAP = "depthpack-manifest/3"  # the same contract before the map: read as packages without one
FORMATS_READ = (FORMAT_NO_MAP, FORMAT_SHARED, FORMAT)
MANIFEST = "manifest.json"
REFERENCE = "reference.safetensors"
REFERENCE_IMAGE = "reference.png"
REFERENCE_POINTS = "reference_points.csv"
WEIGHTS = "weights.safetensors"

# the manifest's keys, in the order the exporter writes them; deploy_cpp/manifest.h lists the same
REQUIRED_KEYS = ("format", "preset", "model_config", "image_size", "patch_size", "batch_size", "device",
                 "compute_capability", "arch", "dtype", "torch_version", "min_depth", "max_depth", "frame",
                 "preprocess", "tolerance", "buckets", "reference", "weights")
OPTIONAL_KEYS = ("onnx", "build", "focal", "map")  # build: the fast paths and Inductor settings asked for;
# map: {"size": [rows, cols]}, present when the packages also return the glance's depth map;
# focal: {"default": f, "canonical": c, "units": FOCAL_UNITS}, both in pixels of the package's input
# (frames: the frame; images: the model's image), present when the packages take a "focal" input
FOCAL_UNITS = "pixels of the input"
BUCKET_KEYS = ("bucket", "file", "sha256", "inputs", "outputs")
MAP_PACKAGE_KEYS = ("file", "sha256", "inputs", "outputs")  # in "map" beside "size" (format 5): the map-only package
MAP_PACKAGE, MAP_BUCKET = "depthpack_map.pt2", "map"  # its file name, and its PACKAGE_BUCKET metadata

TENSOR_DTYPES = ("float32", "uint8")
FRAME_FORMATS = {"bgr8": "bgr", "rgb8": "rgb"}  # the exporter's --frame-format -> the manifest's frame color
# keys of the package's own metadata (aot_inductor.metadata): its bucket, its inputs as JSON, and the
# constants it expects from the weights file as JSON {fqn: {"dtype": "bfloat16", "shape": [..]}}
PACKAGE_BUCKET, PACKAGE_INPUTS, PACKAGE_CONSTANTS = "depthpack.bucket", "depthpack.inputs", "depthpack.constants"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# |package - eager| <= atol + rtol * |eager|, depth in meters. float32 packages differ from eager only by
# kernel fusion order; bf16/fp16 by rounding inside fused kernels, amplified by the exp(sigmoid) depth
# head (d depth / depth <= 0.25 * log(max/min) * d logit).
TOLERANCE = {"float32": {"atol": 1e-3, "rtol": 1e-3},
             "float16": {"atol": 2e-2, "rtol": 2e-2},
             "bfloat16": {"atol": 5e-2, "rtol": 5e-2}}
PREPROCESS = {"frame": "uint8 HWC in the frame's channel order", "to_rgb": True, "resize": "bilinear",
              "align_corners": False, "antialias": False, "scale": 1.0 / 255.0, "layout": "NCHW",
              "normalize_inside": True, "points": "(x, y) in the frame's pixels, scaled by (W/w, H/h) in float32",
              "definition": "depthpack.core.preprocess.frames_to_images"}


def package_name(bucket: int) -> str:
    return f"depthpack_k{bucket}.pt2"


def onnx_name(bucket: int) -> str:
    return f"depthpack_k{bucket}.onnx"


def package_tag(bucket: int | None) -> str:
    """The suffix of a package's tensors in the self-check's inputs file: k{K}, or map (the map-only package)."""
    return f"k{bucket}" if bucket else MAP_BUCKET


def tensor_spec(name: str, shape, dtype: str = "float32") -> dict:
    return {"name": name, "shape": [int(s) for s in shape], "dtype": dtype}


def map_specs(image_size: tuple[int, int], batch: int, frame: dict | None, focal: bool,
              map_size: tuple[int, int]) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of the map-only package: the buckets' inputs without the points -> the map."""
    inputs, outputs = io_specs(image_size, batch, 1, frame, focal, map_size)
    return [t for t in inputs if t["name"] != "points"], outputs[1:]


def io_specs(image_size: tuple[int, int], batch: int, bucket: int, frame: dict | None = None,
             focal: bool = False, map_size: tuple[int, int] | None = None) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of the package of one bucket, in call order; frame: the manifest's "frame";
    focal: the packages take a focal input (the manifest's "focal" is not null); map_size: (rows, cols)
    of the glance's map, the second output (the manifest's "map")."""
    H, W = image_size
    first = (tensor_spec("frames", [batch, *frame["size"], 3], "uint8") if frame
             else tensor_spec("images", [batch, 3, H, W]))
    inputs = [first, tensor_spec("points", [batch, bucket, 2])] + ([tensor_spec("focal", [batch])] if focal else [])
    outputs = [tensor_spec("depth", [batch, bucket])] + ([tensor_spec("map", [batch, *map_size])] if map_size else [])
    return inputs, outputs


def input_scale(image_size: tuple[int, int], frame: dict | None) -> float:
    """A focal in pixels of the packages' input times this is the focal in the model image's pixels
    (core.preprocess.scale_focal's factor; 1 for packages that take images)."""
    return focal_factor(frame["size"], image_size) if frame else 1.0


def focal_entry(canonical: float, default: float, image_size: tuple[int, int], frame: dict | None) -> dict:
    """The manifest's "focal" for a model of this canonical and default focal (pixels of the model's
    image), both converted to pixels of the packages' input."""
    s = input_scale(image_size, frame)
    return {"default": float(default) / s, "canonical": float(canonical) / s, "units": FOCAL_UNITS}


class ManifestError(ValueError):
    """A manifest that is missing, malformed or inconsistent (the message names the file and the key)."""


def read_manifest(path: str | Path) -> dict:
    """The manifest at path, with every key the runners rely on checked: one ManifestError naming the
    file and what is wrong, never a KeyError later."""
    m = _load(Path(path))
    w = f"manifest {path}"
    _check_model(m, w)
    _check_inputs(m, w)
    _check_buckets(m, w)
    _check_map_package(m, w)
    _check_files(m, w)
    return m


def _load(path: Path) -> dict:
    """The file as a JSON object of a format this reader knows, with every required key."""
    import json

    if path.is_dir():  # an export folder where its manifest is meant: name the file to give
        inside = path / MANIFEST
        raise ManifestError(f"manifest {path} is a folder; " + (f"its manifest is {inside}" if inside.is_file()
                                                                 else f"it holds no {MANIFEST} (not an export folder)"))
    if not path.is_file():
        raise ManifestError(f"manifest {path}: no such file")
    if path.stat().st_size > (1 << 24):
        raise ManifestError(f"manifest {path}: {path.stat().st_size} bytes is too large for a manifest")
    try:
        m = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested beyond reason
        raise ManifestError(f"manifest {path}: not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(m, dict) or m.get("format") not in FORMATS_READ:
        got = m.get("format") if isinstance(m, dict) else type(m).__name__
        raise ManifestError(f"manifest {path}: not a {FORMAT} manifest (format {got!r}); re-export with this depthpack")
    missing = [k for k in REQUIRED_KEYS if k not in m]
    if missing:
        raise ManifestError(f"manifest {path}: missing keys {missing}")
    return m


def _check_model(m: dict, w: str) -> None:
    """Sizes, batch, the device and build the packages are for, dtype, the depth range, the tolerance."""
    _need(isinstance(m["image_size"], list) and len(m["image_size"]) == 2
          and all(_pos_int(v, MAX_SIZE) for v in m["image_size"]), w, f"image_size must be [H, W], each in [1, {MAX_SIZE}]")
    _need(_pos_int(m["patch_size"]) and all(s % m["patch_size"] == 0 for s in m["image_size"]), w,
          "patch_size must be a positive integer that divides image_size")
    _need(_pos_int(m["batch_size"], MAX_BATCH), w, f"batch_size must be an integer in [1, {MAX_BATCH}]")
    _need(m["device"] in ("cpu", "cuda"), w, f"device must be 'cpu' or 'cuda', got {m['device']!r}")
    _need(isinstance(m["arch"], str) and m["arch"], w, "arch must name a CPU architecture")
    _need(isinstance(m["torch_version"], str) and re.match(r"\d+\.\d+", m["torch_version"]) is not None, w,
          "torch_version must be a version string")
    cc = m["compute_capability"]
    _need(cc is None if m["device"] == "cpu" else isinstance(cc, str) and re.fullmatch(r"\d+\.\d+", cc) is not None, w,
          "compute_capability must be null for cpu packages and 'X.Y' for cuda ones")
    _need(isinstance(m["dtype"], str) and m["dtype"] in DTYPES, w, f"dtype must be one of {sorted(DTYPES)}, got {m['dtype']!r}")
    _need(_finite(m["min_depth"]) and _finite(m["max_depth"]) and 0 < m["min_depth"] < m["max_depth"], w,
          "need numbers 0 < min_depth < max_depth")
    tol = m["tolerance"]
    _need(isinstance(tol, dict) and all(_finite(tol.get(k)) and tol[k] >= 0 for k in ("atol", "rtol")), w,
          "tolerance must hold finite numbers atol and rtol >= 0")


def _check_inputs(m: dict, w: str) -> None:
    """What the packages take and give besides images and points: frames, a focal input, the map."""
    frame = m["frame"]
    _need(frame is None or (isinstance(frame, dict) and frame.get("color") in FRAME_FORMATS.values()
                            and isinstance(frame.get("size"), list) and len(frame["size"]) == 2
                            and all(_pos_int(v, MAX_SIZE) for v in frame["size"])), w,
          f'frame must be null or {{"size": [h, w], "color": "bgr" | "rgb"}}, sizes in [1, {MAX_SIZE}]')
    focal = m.get("focal")
    _need(focal is None or (isinstance(focal, dict) and _finite(focal.get("default")) and focal["default"] > 0
                            and _finite(focal.get("canonical")) and focal["canonical"] > 0
                            and focal.get("units") == FOCAL_UNITS), w,
          f'focal must be null or {{"default": f, "canonical": c, "units": "{FOCAL_UNITS}"}} with f, c > 0')
    dmap = m.get("map")
    _need(dmap is None or (isinstance(dmap, dict) and isinstance(dmap.get("size"), list) and len(dmap["size"]) == 2
                           and all(_pos_int(v, MAX_SIZE) for v in dmap["size"])), w,
          f'map must be null or {{"size": [rows, cols]}}, sizes in [1, {MAX_SIZE}]')


def map_size(m: dict) -> tuple[int, int] | None:
    """(rows, cols) of the packages' second output, the glance's map (None: they have none)."""
    return tuple(m["map"]["size"]) if m.get("map") else None


def map_package(m: dict) -> dict | None:
    """The map-only package's entry (file, sha256, inputs, outputs) of a read manifest, or None."""
    return m["map"] if m.get("map") and "file" in m["map"] else None


def glance_stream(m: dict) -> str:
    """The packages' glance stream: model_config's, "shared" where it is absent (format 3 and 4 manifests)."""
    mc = m["model_config"]
    return (mc.get("glance_stream") or "shared") if isinstance(mc, dict) else "shared"


def _check_map_package(m: dict, w: str) -> None:
    """The map-only package, where "map" names one: format 5, a one-way model, the keys, its specs."""
    dmap = m.get("map") or {}
    present = [k for k in MAP_PACKAGE_KEYS if k in dmap]
    if not present:
        return
    _need(m["format"] == FORMAT, w, f"map: a map-only package ({', '.join(present)}) needs format {FORMAT}, "
                                    f"this is {m['format']}")
    _need(len(present) == len(MAP_PACKAGE_KEYS), w,
          f"map: missing keys {[k for k in MAP_PACKAGE_KEYS if k not in dmap]} of the map-only package")
    _need(glance_stream(m) == "oneway", w, "map: a map-only package needs the one-way glance stream "
                                           "(model_config.glance_stream 'oneway')")
    _need(_plain_name(dmap["file"]), w, f"map: file must be a plain file name, got {dmap['file']!r}")
    _need(_sha256(dmap["sha256"]), w, "map: sha256 must be 64 lowercase hex digits")
    first = m["buckets"][0]["inputs"]
    want_in, want_out = map_specs(tuple(m["image_size"]), m["batch_size"], m["frame"], m.get("focal") is not None,
                                  map_size(m))
    _need(dmap["inputs"] == want_in and dmap["outputs"] == want_out, w,
          f"map: the map-only package's tensors {_shapes(dmap['inputs'])!r} -> {_shapes(dmap['outputs'])!r} are not "
          f"{_shapes(want_in)} -> {_shapes(want_out)} (the buckets' inputs {_shapes(first)} without the points)")


def _shapes(specs):
    return [t.get("shape") if isinstance(t, dict) else t for t in specs] if isinstance(specs, list) else specs


def _check_buckets(m: dict, w: str) -> None:
    """One package per bucket, ascending, each with the inputs and outputs io_specs gives its bucket."""
    patches = (m["image_size"][0] // m["patch_size"]) * (m["image_size"][1] // m["patch_size"])
    buckets = m["buckets"]
    _need(isinstance(buckets, list) and buckets, w, "buckets must list at least one package")
    prev = 0
    for i, b in enumerate(buckets):
        wb = f"{w}: buckets[{i}]"
        _need(isinstance(b, dict), wb, "must be an object")
        missing = [k for k in BUCKET_KEYS if k not in b]
        _need(not missing, wb, f"missing keys {missing}")
        _need(_pos_int(b["bucket"], patches) and b["bucket"] > prev, wb,
              f"buckets must be ascending integers in [1, {patches}] (the image's patches)")
        prev = b["bucket"]
        _need(_plain_name(b["file"]), wb, f"file must be a plain file name, got {b['file']!r}")
        _need(_sha256(b["sha256"]), wb, "sha256 must be 64 lowercase hex digits")
        want_in, want_out = io_specs(tuple(m["image_size"]), m["batch_size"], b["bucket"], m["frame"],
                                     m.get("focal") is not None, map_size(m))
        if b["inputs"] != want_in or b["outputs"] != want_out:
            raise ManifestError(f"{wb}: tensor shapes {_shapes(b['inputs'])!r} -> {_shapes(b['outputs'])!r} are not those "
                                f"of bucket {b['bucket']}: {_shapes(want_in)} -> {_shapes(want_out)}")


def _check_files(m: dict, w: str) -> None:
    """The reference, weights and ONNX files: plain names inside the folder, with their sha256."""
    ref = m["reference"]
    _need(isinstance(ref, dict) and _plain_name(ref.get("file")) and _sha256(ref.get("sha256")), w,
          "reference must hold a plain file name and its sha256")
    weights = m["weights"]
    _need(weights is None or (isinstance(weights, dict) and _plain_name(weights.get("file"))
                              and _sha256(weights.get("sha256"))), w,
          'weights must be null or {"file": plain file name, "sha256": 64 hex digits}')
    onnx = m.get("onnx", [])
    _need(isinstance(onnx, list) and all(isinstance(o, dict) and _pos_int(o.get("bucket")) and _plain_name(o.get("file"))
                                         and _sha256(o.get("sha256")) for o in onnx), w,
          "onnx must list {bucket, file, sha256} entries with plain file names")


MAX_SIZE, MAX_BATCH = 1 << 14, 1 << 12  # beyond any camera and any batch a package is built for


def _pos_int(v, most: int | None = None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and (most is None or v <= most)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _plain_name(v) -> bool:
    """A file name inside the export folder: no folder part, nothing that leaves the folder."""
    return isinstance(v, str) and v not in ("", ".", "..") and "/" not in v and "\\" not in v and "\0" not in v


def _sha256(v) -> bool:
    return isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ManifestError(f"{where}: {what}")


def verify_file(path: Path, expected: str, what: str) -> None:
    """A clear ValueError when a file the manifest lists is missing or its sha256 differs."""
    if not path.is_file():
        raise ManifestError(f"{what} {path} is listed in the manifest but missing")
    actual = sha256_file(path)
    if actual != expected:
        raise ManifestError(f"{what} {path}: sha256 mismatch (manifest {expected[:16]}..., file {actual[:16]}...): "
                            f"the file changed after export or is corrupt; re-export it")


def minor_version(v: str) -> str:
    return ".".join(v.split("+")[0].split(".")[:2])


def check_device(manifest: dict, device: torch.device) -> None:
    """Refuse, with one clear message, packages this process cannot run (before the loader sees them)."""
    built, arch = manifest["device"], platform.machine()
    if manifest["arch"] != arch:
        raise ManifestError(f"the packages were built for {manifest['arch']}, this machine is {arch}: "
                            f"a .pt2 holds native code for one CPU architecture; export on this machine")
    if built != device.type:
        raise ManifestError(f"the packages were built for {built}, asked to run them on {device.type}")
    if built == "cuda":
        if not torch.cuda.is_available():
            raise ManifestError("the packages were built for CUDA, but CUDA is not available in this process")
        cc = "{}.{}".format(*torch.cuda.get_device_capability(device))
        if cc != manifest["compute_capability"]:
            raise ManifestError(f"the packages were built for compute capability {manifest['compute_capability']}, "
                                f"this GPU is {cc}: export on a GPU of the same kind")
    if minor_version(manifest["torch_version"]) != minor_version(torch.__version__):
        raise ManifestError(f"the packages were built with torch {manifest['torch_version']}, this is torch "
                            f"{torch.__version__}: AOTInductor packages are tied to the torch they were built with")


def within(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> tuple[bool, float]:
    """(all |a - e| <= atol + rtol*|e| and a finite, max |a - e|), on float32 copies on the CPU."""
    a, e = actual.detach().float().cpu(), expected.detach().float().cpu()
    if a.shape != e.shape:
        return False, float("inf")
    diff = (a - e).abs()
    ok = bool(torch.isfinite(a).all()) and bool((diff <= atol + rtol * e.abs()).all())
    return ok, float(diff.max()) if diff.numel() else 0.0
