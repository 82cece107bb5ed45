"""Predictor: the packed forward as a runtime, fed what a robot has (camera frames on the host).

    pred = Predictor(model, device="cuda", color="bgr")   # compiled and captured with the fast recipe
    depth = pred.predict(frame, points)        # frame uint8 [h,w,3] (OpenCV), points [Q,2] frame pixels
    depth = pred.predict(images, points)       # or float images [B,3,H,W] in [0,1] at the model's size
    depth = pred.predict(frame, points, focal=525.0)  # the camera's focal length, pixels of the input
    pred = Predictor.from_packages("export/manifest.json", device="cuda")   # an export's packages

Inside ONE static graph per bucket and input kind: preprocessing (depthpack.core.preprocess: channel
swap, resize, scale; points and focal scaled to the model's pixels), token selection, the blocks, the head.
On the host: checks (no value scan of uint8 frames), the bucket from Q, chunking, staging into pinned
buffers made once, asynchronous copies. In steady state a call with out= allocates nothing on the
device or in pinned memory.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..core.fast import REFERENCE, Recipe, fast_recipe
from ..core.files import atomic_write_bytes, check_writable_dir
from ..core.packing import bucket_for, chunk_plan, run_chunked
from ..core.preprocess import frames_to_images, scale_focal, scale_points
from ..core.validation import check_focal, check_points_in_image
from .frames import Batch, as_batch, check_color
from .graphs import capture

CACHE_FILE = "depthpack_compile_cache.bin"  # torch.compiler.save_cache_artifacts, inside cache_dir
COMPILE_BACKEND = "inductor"  # the tests on a CPU set "aot_eager": the static path without Inductor's compile
_LOADED: set[str] = set()  # cache blobs already loaded in this process


def compile_counter() -> int:
    """Number of graphs Dynamo has compiled in this process (recompilations included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def configure_compile_cache(cache_dir: str | os.PathLike) -> Path:
    """Point Inductor's and Triton's on-disk caches into cache_dir and load the saved artifacts
    (torch.compiler.load_cache_artifacts) so a second process warms every bucket from disk."""
    cache_dir = check_writable_dir(cache_dir, "cache_dir")  # a file in the way: one ValueError naming it
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str((cache_dir / "inductor").resolve())
    os.environ["TRITON_CACHE_DIR"] = str((cache_dir / "triton").resolve())
    blob = cache_dir / CACHE_FILE
    if blob.is_file() and str(blob) not in _LOADED:
        torch.compiler.load_cache_artifacts(blob.read_bytes())
        _LOADED.add(str(blob))
    return cache_dir


def save_compile_cache(cache_dir: str | os.PathLike) -> None:
    """Write torch.compiler.save_cache_artifacts() into cache_dir atomically."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is not None:
        atomic_write_bytes(Path(cache_dir) / CACHE_FILE, saved[0])


def _device(device) -> torch.device:
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device}: CUDA is not available on this machine")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _dtype(dtype) -> torch.dtype:
    """A compute dtype, given as a torch.dtype or its name ("float16"); a ValueError naming it otherwise (a
    string went on to fail at the first call as an "Invalid device string")."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), dtype)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {[str(d).removeprefix('torch.') for d in _DTYPES]} "
                         f"(a torch.dtype or its name)")
    return dtype


class _Staged:
    """A device buffer and, for a CUDA device, its pinned host mirror (made once): host data is
    copied into the mirror, then asynchronously to the device; an event guards the mirror's reuse."""

    def __init__(self, shape, dtype, device: torch.device):
        self.dev = torch.zeros(shape, dtype=dtype, device=device)
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=True) if device.type == "cuda" else None
        self.done = torch.cuda.Event() if device.type == "cuda" else None

    def wait(self) -> None:
        """Until the previous upload from the mirror has left it (no wait once it has: the usual case)."""
        if not self.done.query():
            self.done.synchronize()

    def load(self, src, rows: int) -> None:
        """dev[:rows] <- src: a tensor or a list of rows, on any device, any strides."""
        on_host = (src[0] if isinstance(src, list) else src).device.type == "cpu"
        if self.host is None or not on_host:
            _copy_rows(self.dev, src, rows)
            return
        self.wait()
        _copy_rows(self.host, src, rows)
        self.dev[:rows].copy_(self.host[:rows], non_blocking=True)
        self.done.record()

    def load_points(self, chunk: torch.Tensor, rows: int) -> torch.Tensor:
        """points [rows,q,2] -> dev[:rows] padded to the bucket with each row's first point (packing's
        pad_points rule, written in place); returns the staged [rows,q] points for checking."""
        q = chunk.shape[1]
        buf = self.dev if self.host is None or chunk.device.type != "cpu" else self.host
        if buf is self.host:
            self.wait()
        buf[:rows, :q].copy_(chunk)
        if q < buf.shape[1]:
            buf[:rows, q:].copy_(buf[:rows, :1].expand(rows, buf.shape[1] - q, 2))
        if buf is self.host:
            self.dev[:rows].copy_(self.host[:rows], non_blocking=True)
            self.done.record()
        return buf[:rows, :q]


def _copy_rows(dst: torch.Tensor, src, rows: int) -> None:
    if isinstance(src, list):
        for i, row in enumerate(src):
            dst[i].copy_(row, non_blocking=True)
    else:
        dst[:rows].copy_(src, non_blocking=True)


@dataclass
class _Bucket:
    points: _Staged
    out: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None


@dataclass
class _Mode:
    """One input kind at one size: its static input buffer, its function, its buckets."""
    kind: str  # "frames" | "images"
    size: tuple[int, int]  # (h, w) the points refer to
    color: str | None
    inputs: _Staged
    fn: Callable
    focal: _Staged | None = None  # [Bg] float32 in the inputs' pixels (0 = unknown), for a focal input
    buckets: dict[int, _Bucket] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.kind} {self.size[0]}x{self.size[1]}" + (f" {self.color}" if self.color else "")


class Predictor:
    """The packed forward behind one call: predict(frames or images, points) -> depth [B,Q].

    Predictor(model, device, dtype, fast, batch_size, color, cache_dir, validate)
    device     cuda or cpu (default: cuda when there is one)
    dtype      the compute dtype of the Predictor's copy of the model (default: bfloat16 on CUDA with the
               fast recipe, else the model's)
    fast       True: the fast recipe for the device and batch size (core.fast.fast_recipe: on CUDA
               torch.compile + one CUDA graph per bucket and the measured kernels; on a CPU the plain
               model); False: the plain model, eagerly (the reference, for debugging); or a core.fast.Recipe
    color      the channel order of uint8 frames (bgr from OpenCV, or rgb); predict(color=) overrides
    cache_dir  compile caches on disk, so a second process warms from them
    validate   points and focal checked on the host (False: the caller promises)
    Predictor.from_packages(manifest, device, color, validate) runs an export's packages instead (their
    own batch size, dtype and recipe), captured in CUDA graphs on a GPU; everything else is shared.

    focal: predict(..., focal=) takes each frame's focal length sqrt(fx * fy) in pixels of the input
    given (frame pixels for frames, image pixels for images; 0 = unknown: the model's default), a
    number, a sequence or a [B] tensor. It is a staged input of the static graphs like the points
    (scaled to the model's pixels inside them), so another focal needs no recompile or recapture.
    A model (or packages) without a focal input ignores it, after the same check.

    A compiled or captured Predictor runs at a fixed batch size (the first call's, or warmup's): other
    batch sizes run in groups of it, and one frame size (the first frame's, or warmup's): a frame of
    another size is one ValueError naming both; make one Predictor per camera. The caller's model is
    never modified: the Predictor runs its own copy.

    Threads: calls from several threads are served one at a time (a lock around each call: the staging
    buffers and captured graphs are the Predictor's one copy); for calls in parallel make one Predictor
    per thread.

    Synchronization: host points are checked on the host for free; device points are copied to the
    host to be checked (a sync) unless validate=False. Float images are value-checked on the host
    only; uint8 frames need no value check. With out= on the device a call returns without waiting
    for the GPU; with out= on the host (or none and a CPU device) the result is ready on return.
    """

    def __init__(self, model, device=None, dtype: torch.dtype | None = None, fast: bool | Recipe = True,
                 batch_size: int | None = None, color: str | None = None,
                 cache_dir: str | os.PathLike | None = None, validate: bool = True):
        if model is None or not hasattr(model, "forward_packed"):
            raise ValueError("Predictor(model, ...) takes a DepthPack model; for an export use "
                             "Predictor.from_packages(DIR/manifest.json)")
        if not isinstance(fast, (bool, Recipe)):
            raise ValueError(f"fast must be True, False or a depthpack.core.fast.Recipe, got {fast!r}")
        self._setup(device, batch_size, color, validate, cache_dir)
        if isinstance(fast, Recipe) and fast.graph and self.device.type != "cuda":
            raise ValueError(f"a recipe with CUDA graphs needs a CUDA device, got {self.device}")
        self._fast, self._source = fast, model
        if dtype is None:
            dtype = torch.bfloat16 if fast is True and self.device.type == "cuda" else next(model.parameters()).dtype
        self.dtype = _dtype(dtype)
        cfg = model.cfg
        self.patch_size, self.image_size, self.buckets = cfg.patch_size, tuple(cfg.img_size), tuple(cfg.buckets)
        self.uses_focal, self.frame_packages, self.manifest = cfg.uses_focal, None, None
        self.recipe = self._recipe_for(batch_size) if batch_size is not None or fast is not True else None
        self.model = None  # the deployed copy, made with the recipe once the batch size is known

    @classmethod
    def from_packages(cls, manifest, device=None, color: str | None = None, validate: bool = True) -> "Predictor":
        """A Predictor over an export folder's packages (DIR/manifest.json), loaded and checked now."""
        from .aoti import load_runners

        self = cls.__new__(cls)
        self._setup(device, None, color, validate, None)
        manifest, runners = load_runners(str(manifest), self.device)
        self.model, self.manifest, self._source, self._fast = None, manifest, None, None
        self.dtype = getattr(torch, manifest["dtype"])
        self.patch_size = int(manifest["patch_size"])
        self.image_size = tuple(int(s) for s in manifest["image_size"])
        self.buckets = tuple(sorted(int(k) for k in runners))
        self.batch_size = int(manifest["batch_size"])
        frame = manifest.get("frame")
        self.frame_packages = (tuple(frame["size"]), frame["color"]) if frame else None
        if self.frame_packages and self.color is None:
            self.color = self.frame_packages[1]
        self.uses_focal = manifest.get("focal") is not None  # the packages' third input
        self.recipe = Recipe(graph=self.device.type == "cuda")
        self._core = lambda inputs, points, k, *focal: runners[k](inputs, points, *focal)
        return self

    def _setup(self, device, batch_size, color, validate: bool, cache_dir) -> None:
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if color is not None:
            check_color(color)
        self.device, self.batch_size, self.color, self.validate = _device(device), batch_size, color, validate
        self.cache_dir = configure_compile_cache(cache_dir) if cache_dir is not None else None
        self.captures = 0  # CUDA graphs captured by this predictor
        self.warmup_seconds: dict[int, float] = {}  # per bucket, the last warmup's time (compile + capture)
        self._modes: dict[str, _Mode] = {}  # "images" and/or "frames"
        self._pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self._lo, self._hi = torch.empty(2), torch.empty(2)  # the host check's min and max, made once
        self._lock = threading.Lock()

    # ---- setup ----------------------------------------------------------------------------------
    def _recipe_for(self, batch: int | None) -> Recipe:
        if self._fast is True:
            return fast_recipe(self.device, batch or 1)
        return REFERENCE if self._fast is False else self._fast

    def _deploy(self, batch: int) -> None:
        """The recipe for this batch size and the model's copy that runs it (model predictors, once)."""
        if self.recipe is None:
            self.recipe = self._recipe_for(batch)
        if self.model is None and self._source is not None:
            self.model = self._source.deployed(self.recipe, self.device, self.dtype)
            self._core = self.model.forward_packed

    @property
    def static_batch(self) -> bool:
        """Fixed batch and input size: packages, a compiled forward or captured graphs."""
        return self.manifest is not None or (self.recipe is not None and (self.recipe.compile or self.recipe.graph))

    @property
    def graphs(self) -> bool:
        return self.recipe is not None and self.recipe.graph and self.device.type == "cuda"

    def _compiled(self, fn: Callable) -> Callable:
        if not self.recipe.compile:
            return fn
        _raise_recompile_limit()
        if COMPILE_BACKEND != "inductor":
            return torch.compile(fn, dynamic=False, fullgraph=True, backend=COMPILE_BACKEND)
        return torch.compile(fn, dynamic=False, fullgraph=True, options=dict(self.recipe.inductor))

    def _function(self, kind: str, size: tuple[int, int], color: str | None) -> Callable:
        """fn(inputs, points, bucket[, focal]) -> depth [Bg,bucket]: preprocessing + the core, one graph;
        focal [Bg] in the inputs' pixels, only for a focal input."""
        core, model_size = self._core, self.image_size
        if kind == "images" or self.frame_packages is not None:  # images, or packages that preprocess inside
            return self._compiled(core)

        def frames_fn(frames, points, k, *focal):
            return core(frames_to_images(frames, model_size, color), scale_points(points, size, model_size), k,
                        *(scale_focal(f, size, model_size) for f in focal))
        return self._compiled(frames_fn)

    def _mode(self, batch: Batch, color: str | None) -> _Mode:
        """The static mode for this input kind and size: made on first use; a size change is an error."""
        if batch.kind == "frames":
            color = check_color(color or self.color)
            if self.frame_packages is not None and (batch.size, color) != self.frame_packages:
                (h, w), c = self.frame_packages
                raise ValueError(f"the packages take {c} frames of {h}x{w} (HxW); got {color} frames of "
                                 f"{batch.size[0]}x{batch.size[1]}: re-export with --frame-size for this camera")
        elif self.frame_packages is not None:
            raise ValueError("these packages take uint8 camera frames, not float images")
        mode = self._modes.get(batch.kind)
        if mode is not None:
            if (mode.size, mode.color) != (batch.size, color if batch.kind == "frames" else None):
                raise ValueError(f"this predictor's graphs take {mode.describe()}; got {batch.kind} "
                                 f"{batch.size[0]}x{batch.size[1]}" + (f" {color}" if batch.kind == "frames" else "")
                                 + ": make one Predictor per camera (frame size)")
            return mode
        if batch.kind == "images" and batch.size != self.image_size:
            raise ValueError(f"images are {batch.size[0]}x{batch.size[1]} but this predictor's static graphs run "
                             f"{self.image_size[0]}x{self.image_size[1]}; pass uint8 frames (resized inside) or "
                             f"use fast=False")
        Bg = self.batch_size
        h, w = batch.size
        shape, dtype = ((Bg, h, w, 3), torch.uint8) if batch.kind == "frames" else ((Bg, 3, h, w), torch.float32)
        inputs = _Staged(shape, dtype, self.device)
        g = torch.Generator().manual_seed(0)
        init = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8) if dtype == torch.uint8 else torch.rand(shape, generator=g)
        inputs.dev.copy_(init)
        mode = _Mode(batch.kind, batch.size, color if batch.kind == "frames" else None, inputs,
                     self._function(batch.kind, batch.size, color),
                     _Staged((Bg,), torch.float32, self.device) if self.uses_focal else None)
        self._modes[batch.kind] = mode
        return mode

    # ---- warmup ---------------------------------------------------------------------------------
    def warmup(self, batch_size: int | None = None, buckets=None, frame_size: tuple[int, int] | None = None,
               color: str | None = None) -> dict[int, float]:
        """Compile and/or capture every bucket (or the given ones) at batch_size, for float images at
        the model's size or, with frame_size=(h, w), for uint8 frames of that size; returns the seconds
        each bucket took. The batch size (and the frame size) are fixed from here on."""
        with self._lock:
            return self._warmup(batch_size, buckets, frame_size, color)

    def _warmup(self, batch_size, buckets, frame_size, color) -> dict[int, float]:
        bs = batch_size or self.batch_size or 1
        if (self._modes or self.manifest is not None) and bs != self.batch_size:
            raise ValueError(f"this predictor runs batch size {self.batch_size}, not {bs}")
        self.batch_size = bs
        self._deploy(bs)
        wanted = self.buckets if buckets is None else tuple(buckets)
        unknown = [k for k in wanted if k not in self.buckets]
        if unknown:
            raise ValueError(f"{unknown} are not buckets {self.buckets}")
        if not self.static_batch:
            return {}
        if frame_size is not None:
            h, w = frame_size
            probe = Batch("frames", torch.zeros(1, h, w, 3, dtype=torch.uint8), torch.zeros(1, 0, 2))
        else:
            probe = Batch("images", torch.zeros(1, 3, *self.image_size), torch.zeros(1, 0, 2))
        mode = self._mode(probe, color)
        times = {}
        with torch.inference_mode():
            for k in sorted(wanted, reverse=True):  # largest first: the shared pool is sized by it
                st = mode.buckets.get(k)
                if st is not None and (st.graph is not None or not self.graphs):
                    continue
                t0 = time.perf_counter()
                self._prepare(mode, k)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                times[k] = self.warmup_seconds[k] = time.perf_counter() - t0
        if times and self.cache_dir is not None and self.recipe.compile:
            save_compile_cache(self.cache_dir)
        return times

    def _prepare(self, mode: _Mode, k: int) -> _Bucket:
        """Static points for bucket k (valid points), run the function (compiles), capture its graph."""
        st = mode.buckets.get(k)
        if st is None:
            h, w = mode.size
            g = torch.Generator().manual_seed(k)
            st = mode.buckets[k] = _Bucket(_Staged((self.batch_size, k, 2), torch.float32, self.device))
            st.points.dev.copy_(torch.rand(self.batch_size, k, 2, generator=g) * torch.tensor([w - 1, h - 1]))
        if not self.graphs:
            mode.fn(*self._args(mode, st, k))
            return st
        st.graph, st.out = capture(lambda: mode.fn(*self._args(mode, st, k)), pool=self._pool, device=self.device)
        self.captures += 1
        return st

    @staticmethod
    def _args(mode: _Mode, st: _Bucket, k: int) -> tuple:
        """The function's static arguments: inputs, points, bucket[, focal]."""
        return (mode.inputs.dev, st.points.dev, k) + ((mode.focal.dev,) if mode.focal is not None else ())

    # ---- predict --------------------------------------------------------------------------------
    def predict(self, inputs, points, out: torch.Tensor | None = None, color: str | None = None,
                focal=None) -> torch.Tensor:
        """Depth [B,Q] float32 meters at each (x, y) point of each frame (or image).

        inputs: uint8 frames [h,w,3] / [B,h,w,3] / a list of [h,w,3] (numpy or torch, any strides; channel
        order `color`, default the predictor's), or float images [B,3,H,W] in [0,1]. points [B,Q,2]
        (or [Q,2] with one frame) in the inputs' pixels. out: an optional [B,Q] float32 tensor to write
        (on the device, or on the host: then the call waits for the result); by default a new tensor
        on self.device. focal: None (the model's default), a number, or one per frame ([B] sequence or
        tensor): sqrt(fx * fy) in the inputs' pixels, finite and >= 0 (0 = unknown: the default);
        ignored by a model without a focal input (see the class docstring)."""
        return self._predict(inputs, points, out, color, replay=True, focal=focal)

    def predict_uncaptured(self, inputs, points, out=None, color: str | None = None, focal=None) -> torch.Tensor:
        """predict, calling the function directly where predict would replay a captured graph: the same
        kernels one by one, for profilers that count them."""
        return self._predict(inputs, points, out, color, replay=False, focal=focal)

    def _focal(self, focal, B: int) -> torch.Tensor | None:
        """focal -> [B] float32 (None stays None; None too for a model without a focal input). Checked
        on the host unless validate=False (a device tensor is then copied to be checked: a sync)."""
        if focal is None:
            return None
        if self.validate:
            focal = check_focal(focal, B)
        elif not isinstance(focal, torch.Tensor):
            focal = torch.as_tensor(focal, dtype=torch.float32)
        return focal.to(torch.float32).reshape(-1).expand(B) if self.uses_focal else None

    def _predict(self, inputs, points, out, color, replay: bool, focal=None) -> torch.Tensor:
        batch = as_batch(inputs, points, self.patch_size, check_values=self.validate)
        B, Q = batch.points.shape[:2]
        focal = self._focal(focal, B)
        if out is None:
            out = torch.empty(B, Q, device=self.device, dtype=torch.float32)
        elif out.shape != (B, Q) or out.dtype != torch.float32:
            raise ValueError(f"out must be float32 [{B},{Q}], got {out.dtype} {list(out.shape)}")
        if Q == 0 or B == 0:
            return out
        with self._lock, torch.inference_mode():
            if self.batch_size is None:
                self.batch_size = B if self._recipe_for(B).compile or self._recipe_for(B).graph else None
            self._deploy(self.batch_size or B)
            if not self.static_batch:
                self._predict_eager(batch, color, out, focal)
            else:
                self._predict_static(batch, color, out, replay, focal)
            if out.device.type == "cpu" and self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
        return out

    def _predict_static(self, batch: Batch, color, out: torch.Tensor, replay: bool, focal: torch.Tensor | None) -> None:
        mode = self._mode(batch, color)
        h, w = mode.size
        Bg, Q = self.batch_size, batch.points.shape[1]
        host_points = batch.points.device.type == "cpu"
        if self.validate and not host_points:
            check_points_in_image(batch.points, h, w)  # on the host: a sync
        for b0 in range(0, batch.points.shape[0], Bg):
            n = min(batch.points.shape[0] - b0, Bg)
            mode.inputs.load(batch.rows(b0, n), n)
            if mode.focal is not None and focal is not None:
                mode.focal.load(focal[b0:b0 + n], n)
            elif mode.focal is not None:  # 0 = unknown: the model's default, inside the graph
                mode.focal.dev[:n].zero_()
            for s, e, k in chunk_plan(Q, self.buckets):
                st = mode.buckets.get(k)
                if st is None or (self.graphs and st.graph is None):  # first use of this bucket
                    self._warmup(None, (k,), mode.size if mode.kind == "frames" else None, mode.color)
                    st = mode.buckets[k]
                staged = st.points.load_points(batch.points[b0:b0 + n, s:e], n)
                if self.validate and host_points:
                    self._check_staged(staged, h, w)
                if self.graphs and replay:
                    st.graph.replay()
                    res = st.out
                else:
                    res = mode.fn(*self._args(mode, st, k))
                out[b0:b0 + n, s:e].copy_(res[:n, : e - s], non_blocking=True)

    def _predict_eager(self, batch: Batch, color, out: torch.Tensor, focal: torch.Tensor | None) -> None:
        data = batch.stacked().to(self.device, non_blocking=True)
        points = batch.points
        if self.validate:
            check_points_in_image(points, *batch.size)
        points = points.to(self.device, non_blocking=True)
        if focal is not None:
            focal = focal.to(self.device, non_blocking=True)
        if batch.kind == "frames":
            images = frames_to_images(data, self.image_size, check_color(color or self.color))
            points = scale_points(points, batch.size, self.image_size)
            focal = scale_focal(focal, batch.size, self.image_size) if focal is not None else None
        else:
            images = data
        extra = (focal,) if focal is not None else ()
        out.copy_(run_chunked(self._core, images, points, self.buckets, *extra), non_blocking=True)

    def _check_staged(self, points: torch.Tensor, h: int, w: int) -> None:
        """Points staged on the host: in [0,w) x [0,h) and finite, by a min/max into buffers made once
        (NaN fails every comparison); the detailed message only when they are not."""
        torch.amin(points, dim=(0, 1), out=self._lo)
        torch.amax(points, dim=(0, 1), out=self._hi)
        x0, y0, x1, y1 = self._lo.tolist() + self._hi.tolist()
        if not (x0 >= 0 and y0 >= 0 and x1 < w and y1 < h):
            check_points_in_image(points, h, w)
            raise ValueError(f"points outside the {w}x{h} frame")  # the checks agree: not reached

    # ---- introspection --------------------------------------------------------------------------
    def bucket_for(self, q: int) -> int:
        """The bucket a call with q queries (q <= the largest bucket) runs on; from q alone."""
        return bucket_for(q, self.buckets)

    def describe(self) -> dict:
        return dict(source="packages" if self.manifest is not None else "model", device=str(self.device),
                    dtype=str(self.dtype).replace("torch.", ""), batch_size=self.batch_size, buckets=list(self.buckets),
                    recipe=self.recipe.describe() if self.recipe is not None else "fast (chosen at the first call)",
                    captures=self.captures, color=self.color, inputs=[m.describe() for m in self._modes.values()],
                    focal_input=self.uses_focal, warmup_seconds={str(k): round(v, 3) for k, v in self.warmup_seconds.items()})

    def __repr__(self) -> str:
        return f"Predictor({json.dumps(self.describe())})"


def _raise_recompile_limit(limit: int = 256) -> None:
    """Dynamo keeps at most `recompile_limit` (default 8) compiled entries per code object, and every
    (model instance, bucket, batch) is one entry of forward_packed: several predictors in one process
    (the benchmark) would exceed it and fall back. Raise it; recompiles are still counted."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < limit:
            setattr(cfg, name, limit)
