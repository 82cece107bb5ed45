"""The two engines under the Predictor, each a function of (inputs, points, bucket[, focal]):

    ModelEngine(model, recipe, device, dtype)   the model's packed forward as the recipe runs it (a deployed
                                                copy, compiled when the recipe compiles)
    PackageEngine(manifest, device)             an export folder's AOTInductor packages

Both say what they take (patch size, image size, buckets, batch size, frames or images, focal, map,
map_only) and build, per input kind and size, the function the Predictor stages inputs for and replays:
fn(inputs, points, k[, focal]) -> depth [B,k], or (depth, map [B,rows,cols]) with the glance's map, or
(map_only: a one-way model's glance alone, DepthPack.glance_map_core or the map-only package) the map
with no points (points and k unused).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from ..core.fast import Recipe
from ..core.files import atomic_write_bytes, check_writable_dir
from ..core.preprocess import frames_to_images, scale_focal, scale_points

CACHE_FILE = "depthpack_compile_cache.bin"  # torch.compiler.save_cache_artifacts, inside cache_dir
_LOADED: set[str] = set()  # cache blobs already loaded in this process


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def resolve_device(device) -> torch.device:
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device}: CUDA is not available on this machine")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(dtype) -> torch.dtype | None:
    """A compute dtype, a torch.dtype or its name ("float16"); else one ValueError naming it."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), dtype)
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {[str(d).removeprefix('torch.') for d in _DTYPES]} "
                         f"(a torch.dtype or its name)")
    return dtype


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


def without_points(fn: Callable) -> Callable:
    """fn(inputs[, focal]) -> map in the buckets' signature fn(inputs, points, k[, focal]), points and k
    unused: from_frames, the compile and the Predictor's staging take it as they take the others."""
    def map_only(inputs, points, k, *focal):
        return fn(inputs, *focal)
    return map_only


def from_frames(core: Callable, size: tuple[int, int], model_size: tuple[int, int], color: str) -> Callable:
    """core over images at the model's size, fed uint8 frames of size (h, w): resized inside, the points and
    the focal scaled to the model's pixels (depthpack.core.preprocess, the same in every runner)."""
    def fn(frames, points, k, *focal):
        return core(frames_to_images(frames, model_size, color), scale_points(points, size, model_size), k,
                    *(scale_focal(f, size, model_size) for f in focal))
    return fn


class ModelEngine:
    """A DepthPack model's packed forward run by a recipe (core.fast): its deployed copy on device in dtype."""

    def __init__(self, model, recipe: Recipe, device: torch.device, dtype: torch.dtype):
        if recipe.graph and device.type != "cuda":
            raise ValueError(f"a recipe with CUDA graphs needs a CUDA device, got {device}")
        self.recipe, self.dtype = recipe, dtype
        self.model = model.deployed(recipe, device, dtype)
        cfg = model.cfg
        self.patch_size, self.image_size, self.buckets = cfg.patch_size, tuple(cfg.img_size), tuple(cfg.buckets)
        self.uses_focal, self.has_map, self.frame = cfg.uses_focal, cfg.glance_depth, None
        self.map_size = tuple(cfg.glance_map_size) if cfg.glance_depth else None
        self.map_only = bool(cfg.glance_depth) and cfg.oneway  # the map needs no points: the glance alone
        self.static = recipe.compile or recipe.graph  # a fixed batch and input size
        self.prefix_once = recipe.prefix_once and cfg.oneway  # chunks read the prefix run once (packed_chunks)

    def core(self, with_map: bool = False) -> Callable:
        check_map(with_map, self.has_map, "the model has no glance depth (model.glance_depth)")
        return self.model.packed_map_core if with_map else self.model.packed_core

    def map_core(self) -> Callable:
        """The map with no points (map_only), in the buckets' signature (without_points)."""
        check_map(True, self.map_only, "a map with no points needs the one-way glance stream (model.glance_stream)")
        return without_points(self.model.glance_map_core)

    def function(self, kind: str, size: tuple[int, int], color: str | None, with_map: bool = False,
                 map_only: bool = False) -> Callable:
        fn = self.map_core() if map_only else self.core(with_map)
        if kind == "frames":
            fn = from_frames(fn, size, self.image_size, color)
        if not self.recipe.compile:
            return fn
        if self.recipe.backend != "inductor":
            return torch.compile(fn, dynamic=False, fullgraph=True, backend=self.recipe.backend)
        return torch.compile(fn, dynamic=False, fullgraph=True, options=self.recipe.inductor_options())

    def describe(self) -> dict:
        return {"source": "model", "recipe": self.recipe.describe()}


class PackageEngine:
    """An export folder's packages (DIR/manifest.json), loaded and checked now: their own batch size,
    dtype, recipe and input kind; replayed from CUDA graphs on a GPU."""

    def __init__(self, manifest: str | os.PathLike, device: torch.device):
        from ..deploy.contract import map_size
        from .aoti import load_packages

        self.manifest, self.runners, self.map_fn = load_packages(str(manifest), device)
        m = self.manifest
        self.dtype = getattr(torch, m["dtype"])
        self.patch_size, self.image_size = int(m["patch_size"]), tuple(int(s) for s in m["image_size"])
        self.buckets = tuple(sorted(int(k) for k in self.runners))
        self.batch_size = int(m["batch_size"])
        self.frame = (tuple(m["frame"]["size"]), m["frame"]["color"]) if m.get("frame") else None
        self.uses_focal = m.get("focal") is not None  # the packages' third input
        self.has_map = len(m["buckets"][0]["outputs"]) > 1  # manifests before the map have one output
        self.map_size, self.map_only = map_size(m), self.map_fn is not None  # the map-only package
        self.recipe = Recipe(graph=device.type == "cuda")
        self.static, self.prefix_once = True, False

    def core(self, with_map: bool = False) -> Callable:
        check_map(with_map, self.has_map, "these packages have no map (exported before the glance depth, or "
                                          "from a model without one)")
        runners, has_map = self.runners, self.has_map

        def run(inputs, points, k, *focal):
            out = runners[k](inputs, points, *focal)
            return out if with_map or not has_map else out[0]
        return run

    def map_core(self) -> Callable:
        """The map-only package (map_only), in the buckets' signature (without_points)."""
        check_map(True, self.map_only, "these packages have no map-only package (a shared-stream model, or "
                                       "exported before depthpack-manifest/5)")
        return without_points(self.map_fn)

    def function(self, kind: str, size: tuple[int, int], color: str | None, with_map: bool = False,
                 map_only: bool = False) -> Callable:
        fn = self.map_core() if map_only else self.core(with_map)
        if kind == "frames" and self.frame is None:  # image packages: frames resized here, as the C++ runner does
            return from_frames(fn, size, self.image_size, color)
        return fn

    def describe(self) -> dict:
        return {"source": "packages", "recipe": self.recipe.describe()}


def check_map(with_map: bool, has_map: bool, why: str) -> None:
    if with_map and not has_map:
        raise ValueError(f"return_map: {why}")
