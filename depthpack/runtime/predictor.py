"""Predictor: the packed forward as a runtime (buckets, chunking, compile, CUDA graphs, AOTInductor).

    pred = Predictor(model, device="cuda", dtype=torch.bfloat16, backend="compile+graph")
    pred.warmup()                         # compiles / captures every bucket at the batch size given
    depth = pred.predict(images, points)  # [B,Q] float32 meters, on pred.device

Host side (costs no device time, never waits on the GPU): validation, the bucket from Q alone,
chunking and padding (depthpack.core.packing). Device side, inside ONE static graph per bucket: token
selection, packing, the blocks and the head. Graph backends copy inputs into static buffers shared by
all buckets, replay, and copy the [:Q] part of the static output into the result.

Switches (each off by default except where named):
    backend        eager | compile | graph | compile+graph | aoti
                     compile: torch.compile(fullgraph, static shapes, mode=compile_mode)
                     graph: one CUDA graph per bucket, all in one memory pool
                     compile+graph: the compiled forward captured the same way, or with
                       compile_mode="reduce-overhead" Inductor's own CUDA graphs
                     aoti: exported packages (depthpack.runtime.aoti), captured in graphs on a GPU
    path           packed (default) | masked | dense: which core of the model runs (the baselines)
    dtype          the compute dtype of the Predictor's copy of the model
    buckets        another bucket ladder than the model's (its cores run any bucket)
    fused_embed    the Triton gather+embed kernel (depthpack.kernels)
Every backend but eager runs at the batch size fixed at warmup: other batch sizes are split into
groups of it (the last group padded with stale rows whose results are dropped).

The caller's model is never modified: the Predictor runs its own copy (moved, cast, eval mode).

Synchronization: points given as CPU tensors are validated on the host for free and copied
non_blocking from pinned memory. Points given on the device are copied to the host to be validated,
which is a device sync: pass validate=False to skip it (then their values must be valid). Image
values are checked only when the images are on the CPU (shapes and dtypes always).
"""
from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..core.files import atomic_write_bytes
from ..core.packing import bucket_for, chunk_plan, pad_points
from ..core.validation import as_points, check_images, check_points_in_image
from .graphs import capture

BACKENDS = ("eager", "compile", "graph", "compile+graph", "aoti")
PATHS = ("packed", "masked", "dense")
CACHE_FILE = "depthpack_compile_cache.bin"  # torch.compiler.save_cache_artifacts, inside cache_dir
_LOADED: set[str] = set()  # cache blobs already loaded in this process


@dataclass
class _Static:
    """Static buffers of one bucket: points [Bg,K,2] in, depth [Bg,K] out; the graph that links them."""
    points: torch.Tensor
    out: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None


def compile_counter() -> int:
    """Number of graphs Dynamo has compiled in this process (recompilations included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def configure_compile_cache(cache_dir: str | os.PathLike) -> Path:
    """Point Inductor's and Triton's on-disk caches into cache_dir and load the saved artifacts
    (torch.compiler.load_cache_artifacts) so a second process warms every bucket from disk."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
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


class Predictor:
    def __init__(self, model=None, device=None, dtype: torch.dtype | None = None, backend: str = "eager",
                 batch_size: int | None = None, compile_mode: str | None = None,
                 cache_dir: str | os.PathLike | None = None, validate: bool = True,
                 packages: str | os.PathLike | None = None, fused_embed: bool | None = None,
                 compile_backend: str = "inductor", path: str = "packed", buckets: tuple[int, ...] | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if path not in PATHS:
            raise ValueError(f"unknown path {path!r}; choose one of {', '.join(PATHS)}")
        if (backend == "aoti") != (model is None):
            raise ValueError("backend 'aoti' takes packages=DIR/manifest.json and no model; "
                             "every other backend needs a model")
        if backend == "aoti" and path != "packed":
            raise ValueError("backend 'aoti' runs the packed path only (the packages hold it)")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.backend, self.path = backend, path
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {self.device}: CUDA is not available on this machine")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
        self.graphs = backend in ("graph", "compile+graph", "aoti") and self.device.type == "cuda"
        self.compile_mode = compile_mode
        self.compile_backend = compile_backend  # "inductor"; tests on CPU use "aot_eager" to stay fast
        self.inductor_graphs = backend == "compile+graph" and compile_mode == "reduce-overhead"
        if self.inductor_graphs:
            self.graphs = False  # Inductor captures and replays; we only stage the inputs
        if backend in ("graph", "compile+graph") and self.device.type != "cuda":
            raise ValueError(f"backend {backend!r} needs a CUDA device, got {self.device}")
        self.validate = validate
        self.cache_dir = configure_compile_cache(cache_dir) if cache_dir is not None else None
        self.batch_size = batch_size
        self.captures = 0  # CUDA graphs captured by this predictor
        self.warmup_seconds: dict[int, float] = {}  # per bucket, the last warmup's time (compile + capture)
        self._static: dict[int, _Static] = {}
        self._images: torch.Tensor | None = None  # static images [Bg,3,H,W] float32, shared by the buckets
        self._pool = None
        if backend == "aoti":
            self._init_aoti(packages)
        else:
            self._init_model(model, dtype, fused_embed)
            if buckets is not None:  # another ladder (the benchmark's dense rows: one bucket of Q)
                self.buckets = tuple(sorted(int(b) for b in buckets))

    # ---- setup ----------------------------------------------------------------------------------
    def _init_model(self, model, dtype, fused_embed) -> None:
        model = copy.deepcopy(model).to(self.device).eval()  # the caller's model stays as it was
        if dtype is not None:
            model = model.to(dtype)  # selection priorities and offset frequencies stay exact (int buffers)
        if fused_embed is not None:
            model.fused_embed = bool(fused_embed)
        self.model = model
        self.dtype = dtype or next(model.parameters()).dtype
        cfg = model.cfg
        self.patch_size, self.image_size, self.buckets = cfg.patch_size, tuple(cfg.img_size), tuple(cfg.buckets)
        self.manifest = None
        fn = {"packed": model.forward_packed, "masked": model.forward_masked_core,
              "dense": model.forward_dense_core}[self.path]
        if self.backend in ("compile", "compile+graph"):
            _raise_recompile_limit()
            mode = self.compile_mode if self.compile_backend == "inductor" else None
            fn = torch.compile(fn, dynamic=False, fullgraph=True, mode=mode, backend=self.compile_backend)
        self._fn: Callable = fn

    def _init_aoti(self, packages) -> None:
        if packages is None:
            raise ValueError("backend 'aoti' needs packages=DIR/manifest.json")
        from .aoti import load_runners

        manifest, runners = load_runners(str(packages), self.device)
        self.model, self.manifest = None, manifest
        self.dtype = getattr(torch, manifest["dtype"])
        self.patch_size = int(manifest["patch_size"])
        self.image_size = tuple(int(s) for s in manifest["image_size"])
        self.buckets = tuple(sorted(int(k) for k in runners))
        mb = int(manifest["batch_size"])
        if self.batch_size is not None and self.batch_size != mb:
            raise ValueError(f"the packages were exported for batch size {mb}, not {self.batch_size}")
        self.batch_size = mb
        self._runners = runners
        self._fn = lambda images, points, k: self._runners[k](images, points)

    @property
    def static_batch(self) -> bool:
        return self.backend != "eager"

    # ---- warmup ---------------------------------------------------------------------------------
    def warmup(self, batch_size: int | None = None, buckets=None) -> dict[int, float]:
        """Compile and/or capture every bucket (or the given ones) at batch_size; returns the seconds
        each bucket took (compile + capture). The batch size is fixed from here on."""
        bs = batch_size or self.batch_size or 1
        if self._images is not None and bs != self.batch_size:
            raise ValueError(f"this predictor is warmed up at batch size {self.batch_size}, not {bs}")
        self.batch_size = bs
        wanted = self.buckets if buckets is None else tuple(buckets)
        unknown = [k for k in wanted if k not in self.buckets]
        if unknown:
            raise ValueError(f"{unknown} are not buckets {self.buckets}")
        self._ensure_images()
        times = {}
        with torch.inference_mode():
            for k in sorted(wanted, reverse=True):  # largest first: the shared pool is sized by it
                if k in self._static and (self._static[k].graph is not None or not self.graphs):
                    continue
                t0 = time.perf_counter()
                self._prepare(k)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                times[k] = self.warmup_seconds[k] = time.perf_counter() - t0
        if times and self.cache_dir is not None and self.backend in ("compile", "compile+graph"):
            save_compile_cache(self.cache_dir)
        return times

    def _ensure_images(self) -> None:
        if self._images is None:
            H, W = self.image_size
            g = torch.Generator().manual_seed(0)
            self._images = torch.rand(self.batch_size, 3, H, W, generator=g).to(self.device)
            if self.graphs:
                self._pool = torch.cuda.graph_pool_handle()

    def _prepare(self, k: int) -> _Static:
        """Static points for bucket k (valid points), run the function (compiles), capture its graph."""
        st = self._static.get(k)
        if st is None:
            H, W = self.image_size
            g = torch.Generator().manual_seed(k)
            pts = torch.rand(self.batch_size, k, 2, generator=g) * torch.tensor([W - 1, H - 1])
            st = self._static[k] = _Static(points=pts.to(self.device))
        if not self.graphs:
            for _ in range(2 if self.inductor_graphs else 1):  # reduce-overhead records on its 2nd call
                self._call(k, st)
            return st
        st.graph, st.out = capture(lambda: self._fn(self._images, st.points, k), pool=self._pool, device=self.device)
        self.captures += 1
        return st

    def _call(self, k: int, st: _Static) -> torch.Tensor:
        if self.inductor_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return self._fn(self._images, st.points, k)

    # ---- predict --------------------------------------------------------------------------------
    def check(self, images, points) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes and dtypes always; values as the class docstring says. Returns float32 points."""
        on_host = isinstance(images, torch.Tensor) and images.device.type == "cpu"
        images = check_images(images, self.patch_size, check_values=self.validate and on_host)
        points = as_points(points, batch=images.shape[0])
        H, W = images.shape[-2:]
        if self.static_batch and (H, W) != self.image_size:
            raise ValueError(f"images are {H}x{W} but backend {self.backend!r} runs {self.image_size[0]}x"
                             f"{self.image_size[1]}; resize them (depthpack.core.preprocess) or use backend 'eager'")
        if self.validate:
            check_points_in_image(points, H, W)  # on the host: a sync if points are on the device
        return images, points

    def predict(self, images: torch.Tensor, points) -> torch.Tensor:
        """Depth [B,Q] float32 meters at each (x, y) point, on self.device."""
        return self._predict(images, points, replay=True)

    def predict_uncaptured(self, images: torch.Tensor, points) -> torch.Tensor:
        """predict, calling the backend's function directly where predict would replay a captured
        graph: the same kernels one by one, for profilers that count them."""
        return self._predict(images, points, replay=False)

    def _predict(self, images, points, replay: bool) -> torch.Tensor:
        images, points = self.check(images, points)
        B, Q = points.shape[:2]
        with torch.inference_mode():
            out = torch.empty(B, Q, device=self.device, dtype=torch.float32)
            if Q == 0 or B == 0:
                return out
            if not self.static_batch:
                self._predict_eager(_pinned(images, self.device).to(self.device, non_blocking=True), points, out)
                return out
            if self._images is None:
                self.warmup(batch_size=self.batch_size or B, buckets=())
            Bg = self.batch_size
            for b0 in range(0, B, Bg):
                b1 = min(B, b0 + Bg)
                self._images[: b1 - b0].copy_(_pinned(images[b0:b1], self.device), non_blocking=True)
                for s, e, k in chunk_plan(Q, self.buckets):
                    st = self._static.get(k)
                    if st is None or (self.graphs and st.graph is None):
                        self.warmup(buckets=(k,))  # first use of this bucket (not steady state)
                        st = self._static[k]
                    self._stage_points(st.points, points[b0:b1, s:e], k)
                    if self.graphs and replay:
                        st.graph.replay()
                        res = st.out
                    else:
                        res = self._call(k, st)
                    out[b0:b1, s:e].copy_(res[: b1 - b0, : e - s], non_blocking=True)
        return out

    def _predict_eager(self, images: torch.Tensor, points: torch.Tensor, out: torch.Tensor) -> None:
        for s, e, k in chunk_plan(points.shape[1], self.buckets):
            buf = pad_points(points[:, s:e], k).to(self.device, non_blocking=True)
            out[:, s:e] = self._fn(images, buf, k)[:, : e - s]

    def _stage_points(self, dst: torch.Tensor, chunk: torch.Tensor, k: int) -> None:
        """dst [Bg,K,2] <- chunk [b,q,2] padded to K (packing.pad_points; rows beyond b kept)."""
        b = chunk.shape[0]
        dst[:b].copy_(_pinned(pad_points(chunk, k), dst.device), non_blocking=True)

    # ---- introspection --------------------------------------------------------------------------
    def bucket_for(self, q: int) -> int:
        """The bucket a call with q queries (q <= the largest bucket) runs on; from q alone."""
        return bucket_for(q, self.buckets)

    def describe(self) -> dict:
        return dict(backend=self.backend, path=self.path, device=str(self.device),
                    dtype=str(self.dtype).replace("torch.", ""), batch_size=self.batch_size, buckets=list(self.buckets),
                    compile_mode=self.compile_mode, captures=self.captures,
                    fused_embed=bool(getattr(self.model, "fused_embed", False)),
                    warmup_seconds={str(k): round(v, 3) for k, v in self.warmup_seconds.items()})

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


def _pinned(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor headed for a GPU goes through pinned memory so the copy is asynchronous."""
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory()
    return t
