"""Predictor: the packed forward as a runtime, fed what a robot has (camera frames on the host).

    pred = Predictor(model, device="cuda", color="bgr")   # compiled and captured with the fast recipe
    depth = pred.predict(frame, points)        # frame uint8 [h,w,3] (OpenCV), points [Q,2] frame pixels
    depth = pred.predict(images, points)       # or float images [B,3,H,W] in [0,1] at the model's size
    depth = pred.predict(frame, points, focal=525.0)      # the camera's focal length, pixels of the input
    depth, dmap = pred.predict(frame, points, return_map=True)   # and the glance's coarse depth map
    pred = Predictor.from_packages("export/manifest.json", device="cuda")   # an export's packages

It decides at construction (the recipe, the engine: a deployed model copy or the packages, the batch
size) and in warmup() (the frame size, each bucket's compile and capture); predict() checks, stages
and replays. Inside ONE static graph per bucket and input kind: preprocessing (depthpack.core.preprocess:
channel swap, resize, scale; points and focal scaled to the model's pixels), token selection, the
blocks, the head. On the host: checks (no value scan of uint8 frames), the bucket from Q, chunking,
staging into pinned buffers made once, asynchronous copies. In steady state a call with out= allocates
nothing on the device or in pinned memory.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..core.fast import resolve
from ..core.packing import bucket_for, chunk_plan, pad_points
from ..core.preprocess import frames_to_images, scale_focal, scale_points
from ..core.validation import check_focal, check_points_in_image
from .engines import (ModelEngine, PackageEngine, configure_compile_cache, resolve_device, resolve_dtype,
                      save_compile_cache)
from .frames import Batch, as_batch, check_color
from .graphs import capture
from .staging import Staged

@dataclass
class _Bucket:
    points: Staged
    out: object = None  # the captured graph's output: depth [Bg,k] (and map)
    graph: torch.cuda.CUDAGraph | None = None


@dataclass
class _Mode:
    """One input kind at one size (and with or without the map): its staged inputs, function, buckets."""
    kind: str  # "frames" | "images"
    size: tuple[int, int]  # (h, w) the points refer to
    color: str | None
    inputs: Staged
    fn: Callable
    focal: Staged | None = None  # [Bg] float32 in the inputs' pixels (0 = unknown), for a focal input
    buckets: dict[int, _Bucket] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.kind} {self.size[0]}x{self.size[1]}" + (f" {self.color}" if self.color else "")


class Predictor:
    """The packed forward behind one call: predict(frames or images, points) -> depth [B,Q].

    Predictor(model, device, dtype, recipe, batch_size, frame_size, color, cache_dir, validate)
    device      cuda or cpu (default: cuda when there is one)
    dtype       the compute dtype of the Predictor's copy of the model (default: bfloat16 with the fast
                recipe on CUDA, else the model's); a torch.dtype or its name
    recipe      "fast": the fastest measured recipe for the device and batch size (core.fast: on CUDA
                torch.compile, one CUDA graph per bucket and the measured kernels; on a CPU the plain
                model); "reference": the plain model, eagerly (what every fast path is tested against); or
                a core.fast.Recipe
    batch_size  the batch a static recipe's graphs run (default 1); other batch sizes run in groups of it
    frame_size  (h, w) of the camera's uint8 frames, when known; else the first frames call (or
                warmup(frame_size=)) settles it
    color       the channel order of uint8 frames (bgr from OpenCV, or rgb); predict(color=) overrides
    cache_dir   compile caches on disk, so a second process warms from them
    validate    points and focal checked on the host (False: the caller promises)
    Predictor.from_packages(manifest, device, color, validate) runs an export's packages instead (their
    own batch size, dtype, recipe and input kind), captured in CUDA graphs on a GPU.

    Settled and refused: a static predictor (compiled, captured, packages) runs one frame size and one
    colour order; a frame of another size (or order) is one ValueError naming both: make one Predictor
    per camera. warmup(batch_size=) re-settles the batch size explicitly, rebuilding the engine (the fast
    recipe depends on it). A plain (reference) predictor takes any batch and frame size. The caller's
    model is never modified.

    focal: predict(..., focal=) takes each frame's focal length sqrt(fx * fy) in pixels of the input
    (0 = unknown: the model's default), a number, a sequence or a [B] tensor; a staged input of the
    graphs like the points, so another focal needs no recompile. A model without a focal input ignores it.
    return_map: also the glance's depth map [B, rows, cols] (a model with model.glance_depth, or packages
    exported from one); with more queries than the largest bucket, the first chunk's buffer's map. With no
    points (Q = 0) a one-way model runs its glance alone (DepthPack.glance_map_core, or the export's map-only
    package); a shared-stream model (or packages without a map-only package) runs one point, the input's
    centre (w/2, h/2) in its pixels, as the C++ runner does. An empty batch gives [0, Q] (and [0, rows, cols]).

    Threads: calls from several threads are served one at a time (one lock); make one Predictor per thread
    for calls in parallel. Synchronization: host points are checked on the host for free; device points
    are copied to the host to be checked (a sync) unless validate=False. With out= on the device a call
    returns without waiting for the GPU; with out= on the host (or a CPU device) the result is ready.
    """

    def __init__(self, model, device=None, dtype=None, recipe="fast", batch_size: int = 1,
                 frame_size: tuple[int, int] | None = None, color: str | None = None, cache_dir=None,
                 validate: bool = True):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.device, self.validate = resolve_device(device), validate
        self.color = check_color(color) if color is not None else None
        self.cache_dir = configure_compile_cache(cache_dir) if cache_dir is not None else None
        if isinstance(model, PackageEngine):
            engine = model
        elif model is None or not hasattr(model, "packed_core"):
            raise ValueError("Predictor(model, ...) takes a DepthPack model; for an export use "
                             "Predictor.from_packages(DIR/manifest.json)")
        else:
            dtype = resolve_dtype(dtype)
            if dtype is None:
                dtype = torch.bfloat16 if recipe == "fast" and self.device.type == "cuda" else next(model.parameters()).dtype
            self._source = (model, recipe, dtype)
            engine = ModelEngine(model, resolve(recipe, self.device, batch_size), self.device, dtype)
        self._use(engine, batch_size)
        self.frame_size = tuple(frame_size) if frame_size is not None else None
        self._frame_color = None  # the colour order of the frames the graphs were built for
        self._lock = threading.Lock()

    @classmethod
    def from_packages(cls, manifest, device=None, color: str | None = None, validate: bool = True) -> "Predictor":
        """A Predictor over an export folder's packages (DIR/manifest.json), loaded and checked now."""
        engine = PackageEngine(manifest, resolve_device(device))
        frame = engine.frame
        return cls(engine, device, color=color or (frame[1] if frame else None), batch_size=engine.batch_size,
                   frame_size=frame[0] if frame else None, validate=validate)

    def _use(self, engine, batch_size: int) -> None:
        """Settle the engine and its batch size; every staged buffer and capture starts anew."""
        self.engine, self.recipe, self.dtype, self.manifest = engine, engine.recipe, engine.dtype, getattr(engine, "manifest", None)
        self.model = getattr(engine, "model", None)
        self.patch_size, self.image_size, self.buckets = engine.patch_size, engine.image_size, engine.buckets
        self.uses_focal, self.frame_packages = engine.uses_focal, engine.frame
        self.batch_size = batch_size if engine.static else None
        self.graphs = engine.recipe.graph and self.device.type == "cuda"
        self.captures = 0  # CUDA graphs captured by this predictor
        self.warmup_seconds: dict[int, float] = {}  # per bucket, the last warmup's time (compile + capture)
        self._modes: dict[tuple[str, bool, bool], _Mode] = {}  # (input kind, with the map, the map alone)
        self._pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self._lo, self._hi = torch.empty(2), torch.empty(2)  # the host check's min and max, made once

    # ---- settling ---------------------------------------------------------------------------------
    def warmup(self, batch_size: int | None = None, buckets=None, frame_size: tuple[int, int] | None = None,
               color: str | None = None, return_map: bool = False) -> dict[int, float]:
        """Compile and/or capture every bucket (or the given ones) for float images at the model's size or,
        with frame_size=(h, w), for uint8 frames of that size (with return_map: the function that also
        returns the map, and where the engine has one the map-only function, as bucket 0); returns the seconds
        each bucket took. batch_size re-settles the batch size."""
        with self._lock:
            if batch_size is not None and batch_size != self.batch_size and self.engine.static:
                self._resettle(batch_size)
            wanted = self.buckets if buckets is None else tuple(buckets)
            unknown = [k for k in wanted if k not in self.buckets]
            if unknown:
                raise ValueError(f"{unknown} are not buckets {self.buckets}")
            if not self.engine.static:
                return {}
            kind = "frames" if frame_size is not None or self.frame_packages else "images"
            size = tuple(frame_size or self.frame_size or self.image_size)
            mode = self._mode(kind, size, color, return_map)
            times = {k: self._prepare(mode, k)[1] for k in sorted(wanted, reverse=True)  # the largest sizes the pool
                     if not self._ready(mode, k)}
            if return_map and self.engine.map_only and not self._ready(self._mode(kind, size, color, True, True), 0):
                times[0] = self._prepare(self._mode(kind, size, color, True, True), 0)[1]
            if times and self.cache_dir is not None and self.recipe.compile:
                save_compile_cache(self.cache_dir)
            return times

    def _resettle(self, batch_size: int) -> None:
        if self.manifest is not None:
            raise ValueError(f"these packages run batch size {self.batch_size}, not {batch_size}: re-export with --batch")
        model, recipe, dtype = self._source
        self._use(ModelEngine(model, resolve(recipe, self.device, batch_size), self.device, dtype), batch_size)

    def _mode(self, kind: str, size: tuple[int, int], color: str | None, with_map: bool, map_only: bool = False) -> _Mode:
        """The static mode of an input kind and size (map_only: the map with no points, one bucket 0); the first
        use of frames settles the frame size."""
        color = check_color(color or self.color) if kind == "frames" else None
        if self.frame_packages is not None and (kind, size, color) != ("frames", *self.frame_packages):
            (h, w), c = self.frame_packages
            raise ValueError(f"the packages take {c} frames of {h}x{w} (HxW); got {color or 'float'} {kind} of "
                             f"{size[0]}x{size[1]}: re-export with --frame-size for this camera")
        if kind == "images" and size != self.image_size:
            raise ValueError(f"images are {size[0]}x{size[1]} but this predictor's static graphs run "
                             f"{self.image_size[0]}x{self.image_size[1]}; pass uint8 frames (resized inside) or use "
                             f"recipe='reference'")
        if kind == "frames" and self.frame_size is not None and (size, color) != (self.frame_size, self._frame_color or color):
            h, w = self.frame_size
            raise ValueError(f"this predictor's graphs take frames {h}x{w} {self._frame_color or color}; got frames "
                             f"{size[0]}x{size[1]} {color}: make one Predictor per camera (frame size)")
        mode = self._modes.get((kind, with_map, map_only))
        if mode is None:
            if kind == "frames":
                self.frame_size, self._frame_color = size, color
            Bg, (h, w) = self.batch_size, size
            shape, dtype = ((Bg, h, w, 3), torch.uint8) if kind == "frames" else ((Bg, 3, h, w), torch.float32)
            inputs = Staged(shape, dtype, self.device)
            g = torch.Generator().manual_seed(0)
            inputs.dev.copy_(torch.randint(0, 256, shape, generator=g, dtype=torch.uint8) if dtype == torch.uint8
                             else torch.rand(shape, generator=g))
            focal = Staged((Bg,), torch.float32, self.device) if self.uses_focal else None
            fn = self.engine.function(kind, size, color, with_map, map_only)
            mode = self._modes[(kind, with_map, map_only)] = _Mode(kind, size, color, inputs, fn, focal)
        return mode

    def _ready(self, mode: _Mode, k: int) -> bool:
        """Bucket k of the mode has run (compiled) and, with graphs, is captured."""
        return k in mode.buckets and not (self.graphs and mode.buckets[k].graph is None)

    def _prepare(self, mode: _Mode, k: int) -> tuple[_Bucket, float]:
        """Bucket k of a mode: static points (valid ones), its function run once (compiles), its graph captured."""
        t0 = time.perf_counter()
        st = mode.buckets.get(k)
        if st is None:
            h, w = mode.size
            g = torch.Generator().manual_seed(k)
            st = mode.buckets[k] = _Bucket(Staged((self.batch_size, k, 2), torch.float32, self.device))
            st.points.dev.copy_(torch.rand(self.batch_size, k, 2, generator=g) * torch.tensor([w - 1, h - 1]))
        args = (mode.inputs.dev, st.points.dev, k) + ((mode.focal.dev,) if mode.focal is not None else ())
        with torch.inference_mode():
            if self.graphs:
                st.graph, st.out = capture(lambda: mode.fn(*args), pool=self._pool, device=self.device)
                self.captures += 1
            else:
                mode.fn(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.warmup_seconds[k] = time.perf_counter() - t0
        return st, self.warmup_seconds[k]

    # ---- predict --------------------------------------------------------------------------------
    def predict(self, inputs, points, out: torch.Tensor | None = None, color: str | None = None, focal=None,
                return_map: bool = False):
        """Depth [B,Q] float32 meters at each (x, y) point of each frame (or image); with return_map,
        (depth, map [B, rows, cols]).

        inputs: uint8 frames [h,w,3] / [B,h,w,3] / a list of [h,w,3] (numpy or torch, any strides; channel
        order `color`, default the predictor's), or float images [B,3,H,W] in [0,1]. points [B,Q,2]
        (or [Q,2] with one frame) in the inputs' pixels. out: an optional [B,Q] float32 tensor to write
        (on the device, or on the host: then the call waits for the result); by default a new tensor
        on self.device. focal: None (the model's default), a number, or one per frame ([B] sequence or
        tensor), sqrt(fx * fy) in the inputs' pixels (see the class docstring)."""
        batch = as_batch(inputs, points, self.patch_size, check_values=self.validate)
        B, Q = batch.points.shape[:2]
        focal = self._focal(focal, B)
        if out is None:
            out = torch.empty(B, Q, device=self.device, dtype=torch.float32)
        elif out.shape != (B, Q) or out.dtype != torch.float32:
            raise ValueError(f"out must be float32 [{B},{Q}], got {out.dtype} {list(out.shape)}")
        if self.validate:
            h, w = batch.size
            if batch.points.device.type != "cpu" or not self.engine.static:
                check_points_in_image(batch.points, h, w)  # device points: a sync
        if B == 0 or (Q == 0 and not return_map):
            return (out, self._empty_map()) if return_map else out
        with self._lock, torch.inference_mode():
            run = self._run_static if self.engine.static else self._run_eager
            dmap = run(batch, color, out, focal, return_map)
            if out.device.type == "cpu" and self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
        return (out, dmap) if return_map else out

    def _empty_map(self) -> torch.Tensor:
        """The map of an empty batch, [0, rows, cols] (refused, naming why, where the engine has no map)."""
        self.engine.core(with_map=True)
        return torch.empty(0, *self.engine.map_size, device=self.device, dtype=torch.float32)

    def _focal(self, focal, B: int) -> torch.Tensor | None:
        """focal -> [B] float32 (None stays None; None too for a model without a focal input)."""
        if focal is None:
            return None
        focal = check_focal(focal, B) if self.validate else torch.as_tensor(focal, dtype=torch.float32)
        return focal.to(torch.float32).reshape(-1).expand(B) if self.uses_focal else None

    def _run_static(self, batch: Batch, color, out: torch.Tensor, focal, with_map: bool):
        Bg, Q = self.batch_size, batch.points.shape[1]
        map_only = with_map and Q == 0 and self.engine.map_only  # the map alone: one run, no points (bucket 0)
        mode = self._mode(batch.kind, batch.size, color, with_map, map_only)
        plan = [(0, 0, 0)] if map_only else chunk_plan(max(Q, 1), self.buckets)
        check = self.validate and batch.points.device.type == "cpu"
        maps = []
        for b0 in range(0, batch.points.shape[0], Bg):
            n = min(batch.points.shape[0] - b0, Bg)
            mode.inputs.load(batch.rows(b0, n), n)
            if mode.focal is not None:  # 0 = unknown: the model's default, inside the graph
                mode.focal.load(focal[b0:b0 + n], n) if focal is not None else mode.focal.dev[:n].zero_()
            for s, e, k in plan:
                st = mode.buckets[k] if self._ready(mode, k) else self._prepare(mode, k)[0]  # its first use
                if k:  # no points: the input's centre (a map-only call of a shared-stream model)
                    staged = st.points.load_points(batch.points[b0:b0 + n, s:e] if Q else self._centre(batch, n), n)
                    if check:
                        self._check_staged(staged, *mode.size)
                if self.graphs:
                    st.graph.replay()
                res = st.out if self.graphs else mode.fn(mode.inputs.dev, st.points.dev, k,
                                                         *((mode.focal.dev,) if mode.focal is not None else ()))
                if Q:
                    out[b0:b0 + n, s:e].copy_((res[0] if with_map else res)[:n, :e - s], non_blocking=True)
                if with_map and s == 0:
                    maps.append((res if map_only else res[1])[:n].clone())
        return (maps[0] if len(maps) == 1 else torch.cat(maps)) if maps else None

    def _run_eager(self, batch: Batch, color, out: torch.Tensor, focal, with_map: bool):
        images, points = batch.stacked().to(self.device, non_blocking=True), batch.points.to(self.device)
        focal = (focal.to(self.device),) if focal is not None else ()
        if batch.kind == "frames":
            images = frames_to_images(images, self.image_size, check_color(color or self.color))
            points = scale_points(points, batch.size, self.image_size)
            focal = tuple(scale_focal(f, batch.size, self.image_size) for f in focal)
        Q = points.shape[1]
        if with_map and Q == 0 and self.engine.map_only:  # the map alone, no points
            return self.engine.map_core()(images, points, 0, *focal)
        if Q > self.buckets[-1] and self.engine.prefix_once and (self.engine.map_only or not with_map):  # prefix once
            out.copy_(self.engine.model.packed_chunks(images, points, *focal), non_blocking=True)
            return self.engine.map_core()(images, points, 0, *focal) if with_map else None
        if Q == 0:  # a map-only call of a shared-stream model runs one point, the input's centre
            points = self._centre(batch, points.shape[0]).to(self.device)
            points = scale_points(points, batch.size, self.image_size) if batch.kind == "frames" else points
        core, dmap = self.engine.core(with_map), None
        for s, e, k in chunk_plan(points.shape[1], self.buckets):
            res = core(images, pad_points(points[:, s:e], k), k, *focal)
            if Q:
                out[:, s:e].copy_((res[0] if with_map else res)[:, :e - s], non_blocking=True)
            if with_map and s == 0:
                dmap = res[1]
        return dmap

    @staticmethod
    def _centre(batch: Batch, n: int) -> torch.Tensor:
        """[n,1,2]: one point, the input's centre (w/2, h/2) in its pixels: the buffer a map-only call (Q = 0)
        of a shared-stream model runs (the C++ runner's too)."""
        h, w = batch.size
        return torch.tensor([[[w / 2, h / 2]]], dtype=torch.float32).expand(n, 1, 2)

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
        return dict(**self.engine.describe(), device=str(self.device), dtype=str(self.dtype).replace("torch.", ""),
                    batch_size=self.batch_size, buckets=list(self.buckets), captures=self.captures, color=self.color,
                    inputs=sorted({m.describe() for m in self._modes.values()}), focal_input=self.uses_focal,
                    map=self.engine.has_map, warmup_seconds={str(k): round(v, 3) for k, v in self.warmup_seconds.items()})

    def __repr__(self) -> str:
        return f"Predictor({json.dumps(self.describe())})"
