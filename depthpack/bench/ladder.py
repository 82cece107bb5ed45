"""python -m depthpack.bench: latency of the packed forward as a ladder, beside the masked and dense baselines.

    python -m depthpack.bench --preset vits --pairs 1x256,8x512 --out DIR   # the H200's two points
    python -m depthpack.bench --preset tiny --device cpu                     # the CI smoke run (CPU rows)

The top row, `fast`, is the default Predictor: what `Predictor(model, device="cuda")` runs (the fast
recipe, core.fast). Below it the ladder (segment-anything-fast's): each row is an earlier row plus one
thing, packed eager -> + CUDA graph -> + torch.compile -> + each kernel of the fast recipe; beside it
the baselines the model replaces, called from the model itself: every token with the keys masked to
the packed selection (masked), every token (dense), and Depth Anything V2 Small's architecture (random
weights, same image size, sampled at the same points), the dense model users pick instead.

Inputs: float images already on the device (the model's own figure), or, in the @frames rows, uint8
BGR camera frames of --frame-size on the host with points in frame pixels (what a robot has).
Protocol: warmup (compile and capture) excluded and reported apart; every row of a point is built first,
then timed round-robin (repeat r of every row before repeat r + 1: drift of the machine falls on all rows
alike), after a discarded back-to-back spell of each (an idle GPU clocks down); inputs rotated among --sets
sets; each row timed two ways: latency = one call followed by a device sync on the host clock (what a
caller meets; median and p90), and back-to-back = CUDA events around each call without a sync between
(throughput); --repeats repeats and the spread of the repeat medians; FLOPs with torch.utils.flop_counter
over one eager call of the same path; kernels per forward with torch.profiler over one call that is not
replayed from a graph.
Writes DIR/bench.json, DIR/bench.md and DIR/bench.png; the last line of stdout is a JSON summary;
the exit code is 1 when a row failed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..core import cli
from ..core.checkpoint import load_model
from ..core.config import PRESETS
from ..core.provenance import commit
from ..core.fast import REFERENCE, Recipe, fast_recipe
from ..core.files import atomic_write_json, atomic_write_text, check_writable_dir
from ..core.model import DepthPack, create_model
from ..core.packing import run_chunked
from ..core.preprocess import parse_frame_size
from ..runtime.graphs import capture, percentile, time_calls
from ..runtime.engines import compile_counter
from ..runtime.predictor import Predictor


@dataclass(frozen=True)
class Row:
    """One configuration: a Predictor's recipe (packed rows), or a baseline called from the model."""
    name: str
    path: str = "packed"  # packed | masked | dense | dav2
    recipe: Recipe | None = REFERENCE  # packed rows; None: the fast recipe of the device and batch
    graph: bool = False  # masked, dense and dav2 rows: replayed from a CUDA graph
    compile: bool = False  # dense and dav2 rows: torch.compile
    base: str | None = None  # the row this one adds a step to
    switch: str = ""  # what it adds, in words
    default: bool = True  # in the default sweep
    input: str = "device"  # device: float images already on the device | frames: uint8 BGR camera frames on the host

    @property
    def cuda_only(self) -> bool:
        return self.graph or (self.recipe is not None and self.recipe.graph)


def step(prev: Row, name: str, switch: str, default: bool = True, **changes) -> Row:
    return replace(prev, name=name, base=prev.name, switch=switch, default=default, **changes)


def _kernel_steps(base: Row) -> tuple[Row, ...]:
    """compile+graph plus, one at a time, each kernel of the fast recipe (its B1 form)."""
    rows, prev = [], base
    for name, what, change in (("count-selection", "token selection by counting instead of topk", {"selection": "count"}),
                               ("gelu-epilogue", "fc1 + bias + GELU in one cuBLASLt GEMM", {"gelu_epilogue": True}),
                               ("combo-kernels", "Inductor combo kernels (horizontal fusion)", {"combo_kernels": True}),
                               ("fold-input", "input normalization folded into the patch embedding, K padded to a "
                                "multiple of 8", {"fold_input": True}),
                               ("hybrid-blocks", "attention+proj+residual and fc2+residual as 2 Triton kernels a block",
                                {"blocks": "hybrid"})):
        prev = step(prev, f"+{name}", what, default=False, recipe=replace(prev.recipe, **change))
        rows.append(prev)
    return tuple(rows)


FAST = Row("fast", recipe=None, switch="the default Predictor: the fast recipe for this device and batch")
MASKED = Row("masked-eager", path="masked", switch="baseline: every token, keys masked to the selection")
DENSE = Row("dense-eager", path="dense", switch="every token, no mask")
PACKED = Row("packed-eager", switch="the packed buffer: cls + anchors + selected patches")
PACKED_GRAPH = step(PACKED, "packed-graph", "CUDA graph", recipe=Recipe(graph=True))
PACKED_CG = step(PACKED_GRAPH, "packed-compile+graph", "torch.compile (Inductor)", recipe=Recipe(compile=True, graph=True))
DAV2 = Row("dav2-eager", path="dav2", recipe=None, switch="Depth Anything V2 Small (ViT-S + DPT), a full map")
LADDER: tuple[Row, ...] = (
    FAST,
    step(FAST, "fast@frames", "camera frames from the host (uint8 BGR, preprocessed in the graph)", input="frames"),
    MASKED, step(MASKED, "masked-graph", "CUDA graph", graph=True),
    DENSE, step(DENSE, "dense-graph", "CUDA graph", graph=True),
    step(DENSE, "dense-fast", "torch.compile + CUDA graph with the fast recipe's kernels (timm blocks)", graph=True,
         compile=True),
    PACKED, PACKED_GRAPH, PACKED_CG, *_kernel_steps(PACKED_CG),
    DAV2, step(DAV2, "dav2-graph", "CUDA graph", graph=True),
    step(DAV2, "dav2-compile+graph", "torch.compile + CUDA graph", graph=True, compile=True),
)
ROWS = {r.name: r for r in LADDER}
GROUPS = {"kernels": ("packed-compile+graph",) + tuple(r.name for r in _kernel_steps(PACKED_CG)) + ("fast",)}
DEFAULT_GPU_ROWS = tuple(r.name for r in LADDER if r.default)
# on a CPU: the rows without CUDA graphs or Inductor's compile (the fast recipe there is the eager reference)
DEFAULT_CPU_ROWS = tuple(r.name for r in LADDER if r.default and not r.cuda_only and r.path != "dav2"
                         and (r.recipe is None or not r.recipe.compile))


# ---- measurements ---------------------------------------------------------------------------------
def count_flops(fn: Callable) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    def addmm_activation(bias_shape, a_shape, b_shape, *args, **kwargs) -> int:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]

    # the fused fc1 + bias + GELU GEMM (mlp_epilogue) counts as its GEMM; torch has no formula for it
    formulas = {torch.ops.aten._addmm_activation: addmm_activation}
    with FlopCounterMode(display=False, custom_mapping=formulas) as counter:
        fn()
    return int(counter.get_total_flops())


def count_kernels(fn: Callable, device: torch.device) -> int | None:
    """GPU kernels launched by one call (memcpy/memset excluded); None on CPU."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(1 for n in names if not n.lower().startswith(("memcpy", "memset")))


def gpu_info(device: torch.device) -> dict:
    info = dict(torch=torch.__version__, python=platform.python_version(), device=str(device), cpu=platform.machine())
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                    capability=f"{p.major}.{p.minor}")
        try:
            q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu"
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20).stdout.strip().splitlines()
            info["nvidia_smi"] = dict(zip(q.split(","), [s.strip() for s in out[0].split(",")])) if out else None
        except (OSError, subprocess.SubprocessError):
            info["nvidia_smi"] = None
    info["commit"] = commit()
    return info


# ---- Depth Anything V2 Small (transformers, random weights) ----------------------------------------
def dav2_small(image_size: tuple[int, int]):
    """Depth Anything V2 Small's architecture: DINOv2-small backbone + DPT head (as the -hf config)."""
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config

    backbone = Dinov2Config(image_size=image_size[0], patch_size=14, hidden_size=384, num_hidden_layers=12,
                            num_attention_heads=6, mlp_ratio=4, out_indices=[3, 6, 9, 12],
                            out_features=["stage3", "stage6", "stage9", "stage12"], reshape_hidden_states=False,
                            apply_layernorm=True, layerscale_value=1.0)
    cfg = DepthAnythingConfig(backbone_config=backbone, patch_size=14, reassemble_hidden_size=384,
                              reassemble_factors=[4, 2, 1, 0.5], neck_hidden_sizes=[48, 96, 192, 384],
                              fusion_hidden_size=64, head_hidden_size=32, head_in_index=-1,
                              depth_estimation_type="relative")
    torch.manual_seed(0)
    return DepthAnythingForDepthEstimation(cfg).eval()


def dav2_forward(model, mean, std, compiled: bool = False):
    """images [B,3,H,W] 0..1, points [B,Q,2] -> depth map sampled at the points' pixels [B,Q]."""
    def depth_map(images):
        x = ((images - mean) / std).to(next(model.parameters()).dtype)
        return model(pixel_values=x).predicted_depth  # [B,h,w]

    if compiled:
        depth_map = torch.compile(depth_map, dynamic=False)

    def fwd(images, points):
        depth = depth_map(images)
        B, h, w = depth.shape
        ix = points[..., 0].long().clamp(0, w - 1)
        iy = points[..., 1].long().clamp(0, h - 1)
        return torch.gather(depth.reshape(B, h * w), 1, iy * w + ix).float()
    return fwd


# ---- building rows ----------------------------------------------------------------------------------
def raise_recompile_limit(limit: int = 256) -> None:
    """Dynamo keeps at most `recompile_limit` (default 8) compiled entries per code object, and every
    (model instance, bucket, batch) is one entry of packed_core: the benchmark's many predictors in one
    process would exceed it and fall back. Raise it; recompiles are still counted."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < limit:
            setattr(cfg, name, limit)


def uncaptured(pred: Predictor, kind: str, size: tuple[int, int]) -> Callable:
    """The predictor's static function called directly, chunked and padded as it is: the same kernels one by
    one instead of a graph replay, for the profiler that counts them."""
    fn = pred.engine.function(kind, size, pred.color)
    # the static function reads staged device tensors: a camera's numpy frames are copied there first, as predict does
    return lambda im, pts: run_chunked(fn, torch.as_tensor(im).to(pred.device), torch.as_tensor(pts).to(pred.device),
                                       pred.buckets)



def replayed(fn: Callable, images: torch.Tensor, points: torch.Tensor, pool) -> tuple[Callable, object]:
    """fn(images, points) captured in a CUDA graph over static copies of the inputs; (run, graph)."""
    static = [images.clone(), points.clone()]
    graph, out = capture(lambda: fn(*static), pool=pool, device=images.device)

    def run(im, pts):
        static[0].copy_(im, non_blocking=True)
        static[1].copy_(pts, non_blocking=True)
        graph.replay()
        return out
    return run, graph


class Rows:
    """The functions of every row for one (model, dtype, batch): predictors are made once and reused for
    every query count (buckets warmed as they are first needed)."""

    def __init__(self, model: DepthPack, device, dtype, batch: int, args):
        self.model, self.device, self.dtype, self.B, self.args = model, device, dtype, batch, args
        self.preds: dict[tuple, Predictor] = {}
        self.plain = model.deployed(REFERENCE, device, dtype)  # the masked and dense baselines, and every FLOP count
        self.dav2: DepthPack | None = None
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.compile_s: dict[str, float] = {}
        self.keep: list = []  # every graph of the shared pool stays alive

    def predictor(self, row: Row) -> Predictor:
        recipe = row.recipe or fast_recipe(self.device, self.B)  # the default's recipe: one compile with its twin row
        key = (recipe, row.input)
        if key not in self.preds:
            self.preds[key] = Predictor(self.model, device=self.device, dtype=self.dtype, recipe=recipe, batch_size=self.B,
                                        validate=row.input == "frames", cache_dir=self.args.cache_dir, color="bgr")
        return self.preds[key]

    def build(self, row: Row, Q: int, images, points) -> tuple[Callable, Callable, Callable]:
        """(timed, profiled, flop-counted) functions of (images, points); warmup time into compile_s."""
        t0 = time.perf_counter()
        if row.path == "packed":
            pred = self.predictor(row)
            frame_size = tuple(images.shape[1:3]) if row.input == "frames" else None
            k = pred.bucket_for(min(Q, pred.buckets[-1]))
            pred.warmup(batch_size=self.B, buckets=sorted({k, pred.buckets[-1]} if Q > pred.buckets[-1] else {k}),
                        frame_size=frame_size)
            fn, prof = pred.predict, uncaptured(pred, row.input, frame_size or pred.image_size)
            plain = lambda im, pts: run_chunked(self.plain.packed_core, im, pts, self.plain.cfg.buckets)  # noqa: E731
            flop = (lambda im, pts: Predictor(self.plain, self.device, recipe="reference", color="bgr").predict(im, pts)) \
                if row.input == "frames" else plain
        else:
            fn = prof = self._baseline(row)
            # FlopCounterMode does not see inside a compiled dense forward: count the plain one
            flop = self._baseline(replace(row, compile=False)) if row.path == "dense" else prof
            if row.graph:
                fn, graph = replayed(prof, images, points, self.pool)
                self.keep.append(graph)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.compile_s[f"{row.name}@{Q}"] = time.perf_counter() - t0
        return fn, prof, flop

    def _baseline(self, row: Row) -> Callable:
        m = self.plain
        if row.path == "masked":
            return lambda im, pts: run_chunked(m.masked_core, im, pts, m.cfg.buckets)
        if row.path == "dense":
            if row.compile:  # the fastest dense forward: the fast recipe's kernels, compiled (FLOP realization)
                recipe = replace(fast_recipe(self.device, self.B), blocks="timm")
                fast = self.model.deployed(recipe, self.device, self.dtype)
                return torch.compile(fast.dense_core, dynamic=False, fullgraph=True, options=recipe.inductor_options())
            return lambda im, pts: m.dense_core(im, pts)
        if self.dav2 is None:
            self.dav2 = dav2_small(m.cfg.img_size).to(self.device, self.dtype)
        mean = torch.tensor(m.cfg.mean, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(m.cfg.std, device=self.device).view(1, 3, 1, 1)
        return dav2_forward(self.dav2, mean, std, compiled=row.compile)


@dataclass
class Prepared:
    """One row at one query count, built (compiled, captured) and counted, waiting for its timed spells."""
    row: Row
    call: Callable[[int], object]
    flops: int
    kernels: int | None
    reps: list = field(default_factory=list)  # one list of call + sync milliseconds per repeat
    b2b: list | None = None
    error: Exception | None = None  # the first failure of a timed call: the row is reported failed


def prepare_row(rb: Rows, row: Row, Q: int, sets, device) -> Prepared:
    sets = sets[row.input]
    with torch.inference_mode():
        fn, prof_fn, flop_fn = rb.build(row, Q, *sets[0])
        flops = count_flops(lambda: flop_fn(*sets[0]))
        kernels = count_kernels(lambda: prof_fn(*sets[0]), device)
    return Prepared(row, lambda i: fn(*sets[i]), flops, kernels)


def time_rows(prepared: list[Prepared], device, args, progress=None) -> None:
    """The timed spells, round-robin: repeat r of every row, then repeat r + 1, so that drift of the machine's
    state (seen on the H200 as spells of one predictor 15% apart) falls on every row alike, not on one row's
    repeats; then each row's back-to-back spell (CUDA). A row whose call fails keeps its error and drops out;
    the others are timed."""
    def spell(p: Prepared, seconds: float, sync_each: bool = True):
        if p.error is not None:
            return None
        try:
            return time_calls(p.call, device, args.sets, seconds, sync_each=sync_each)
        except Exception as e:  # noqa: BLE001
            p.error = e
            return None

    with torch.inference_mode():
        for p in prepared:  # a discarded back-to-back spell first: an idle GPU's clocks start low
            spell(p, min(0.25, args.seconds), sync_each=False)
        for _ in range(args.repeats):
            for p in prepared:
                p.reps.append(spell(p, args.seconds))
        for p in prepared:
            if device.type == "cuda":
                p.b2b = spell(p, args.seconds, sync_each=False)
            if progress is not None and p.error is None:
                progress.update(1)


def row_result(rb: Rows, p: Prepared, Q: int) -> dict:
    meds = [statistics.median(r) for r in p.reps]
    allt = [t for r in p.reps for t in r]
    med = statistics.median(allt)
    row = p.row
    recipe = rb.predictor(row).recipe.describe() if row.path == "packed" else None
    return dict(preset=rb.model.cfg_name, dtype=str(rb.dtype).replace("torch.", ""), batch=rb.B, queries=Q,
                row=row.name, base=row.base, switch=row.switch, recipe=recipe, median_ms=med,
                p90_ms=percentile(allt, 0.9), back_to_back_ms=statistics.median(p.b2b) if p.b2b else None,
                calls=len(allt), repeat_medians_ms=meds, spread=(max(meds) - min(meds)) / min(meds),
                kernels=p.kernels, gflop=p.flops / 1e9, tflops=p.flops / (med * 1e-3) / 1e12)


def make_model(preset: str, checkpoint: str | None) -> DepthPack:
    torch.manual_seed(0)
    if checkpoint:  # a trained model's shape (latency does not depend on the weights' values)
        model = load_model(checkpoint).float().eval()
    else:
        model = create_model(preset).eval()
    model.cfg_name = preset
    return model


def run_group(preset: str, dtype: torch.dtype, batch: int, queries: list[int], rows: list[Row], device, args,
              progress) -> list[dict]:
    model = make_model(preset, args.checkpoint)
    H, W = model.cfg.img_size
    raise_recompile_limit()  # every row's predictor compiles packed_core anew
    rb = Rows(model, device, dtype, batch, args)
    results = []
    dt = str(dtype).replace("torch.", "")
    for Q in queries:
        g = torch.Generator().manual_seed(Q)
        sets = {"device": [(torch.rand(batch, 3, H, W, generator=g).to(device),
                            (torch.rand(batch, Q, 2, generator=g) * torch.tensor([W - 1e-3, H - 1e-3])).to(device))
                           for _ in range(args.sets)]}
        if any(r.input == "frames" for r in rows):  # what a camera driver hands over: host memory, uint8 HWC BGR
            fh, fw = args.frame_size
            sets["frames"] = [(torch.randint(0, 256, (batch, fh, fw, 3), generator=g, dtype=torch.uint8).numpy(),
                               (torch.rand(batch, Q, 2, generator=g) * torch.tensor([fw - 1e-3, fh - 1e-3])).numpy())
                              for _ in range(args.sets)]
        prepared = []

        def failed(row, e):  # one broken row must not take the sweep's other rows with it
            print(f"row {row.name} B={batch} Q={Q} failed: {type(e).__name__}: {e}", file=sys.stderr)
            results.append(dict(preset=preset, dtype=dt, batch=batch, queries=Q, row=row.name,
                                error=f"{type(e).__name__}: {str(e)[:300]}"))
            progress.update(1)
        for row in rows:
            if row.path == "dav2" and (H % 14 or W % 14):
                progress.update(1)
                continue  # DAv2 needs multiples of its patch size 14
            progress.set_description(f"{preset} {dt} B={batch} Q={Q} build {row.name}")
            try:
                prepared.append(prepare_row(rb, row, Q, sets, device))
            except Exception as e:  # noqa: BLE001
                failed(row, e)
        progress.set_description(f"{preset} {dt} B={batch} Q={Q} timing {len(prepared)} rows")
        time_rows(prepared, device, args, progress)
        for p in prepared:
            if p.error is not None:
                failed(p.row, p.error)
            else:
                results.append(row_result(rb, p, Q))
    comp = {k: round(v, 2) for k, v in rb.compile_s.items()}
    for r in results:
        if "error" not in r:
            r["compile_s"] = comp.get(f"{r['row']}@{r['queries']}")
    return results


# ---- compile time: cold and warm processes ---------------------------------------------------------
def child_warmup(args) -> None:
    """In a fresh process: warm every bucket of the default Predictor from cache_dir; print JSON."""
    t0 = time.perf_counter()
    model = create_model(args.preset[0]).eval()
    pred = Predictor(model, device=torch.device(args.device), dtype=getattr(torch, args.dtype[0]),
                     batch_size=args.batch[0], cache_dir=args.cache_dir)
    times = pred.warmup()
    print(json.dumps(dict(per_bucket_s={str(k): round(v, 2) for k, v in sorted(times.items())},
                          total_s=round(time.perf_counter() - t0, 2), graphs_compiled=compile_counter())))


def compile_times(args, device) -> dict:
    """Cold (empty cache dir) then warm (same dir, new process) warmup of every bucket at batch 1."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        # an empty --cache-dir is used (and left warm for the sweep that follows); anything else: a temp dir
        given = Path(args.cache_dir) if args.cache_dir else None
        cache = str(given) if given is not None and (not given.exists() or not any(given.iterdir())) else tmp
        for phase in ("cold", "warm"):
            cmd = [sys.executable, "-m", "depthpack.bench", "--child-warmup", "--preset", args.preset[0],
                   "--device", str(device), "--dtype", args.dtype[0], "--batch", str(args.batch[0]),
                   "--cache-dir", cache]
            env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            try:
                out[phase] = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                out[phase] = dict(error=(p.stderr or p.stdout)[-2000:])
    out.update(preset=args.preset[0], dtype=args.dtype[0], batch=args.batch[0], predictor="default (fast recipe)")
    return out


# ---- outputs ----------------------------------------------------------------------------------------
def summary_checks(results: list[dict]) -> dict:
    """Per (preset, dtype, B, Q, input): the default Predictor (fast) against the best packed row, and the
    packed path's speedup over masked divided by its FLOP cut (1.0: every FLOP cut shows on the clock)."""
    ok = [r for r in results if "error" not in r]
    out = {}
    for r in ok:
        if not r["row"].startswith("fast"):
            continue
        frames = r["row"].endswith("@frames")
        same = [x for x in ok if (x["preset"], x["dtype"], x["batch"], x["queries"]) ==
                (r["preset"], r["dtype"], r["batch"], r["queries"]) and ROWS.get(x["row"], FAST).path == "packed"
                and x["row"].endswith("@frames") == frames]
        best = min(same, key=lambda x: x["median_ms"])
        key = f"{r['preset']} {r['dtype']} B{r['batch']} Q{r['queries']}" + (" @frames" if frames else "")
        out[key] = dict(default_ms=r["median_ms"], best_row=best["row"], best_ms=best["median_ms"],
                        default_over_best=r["median_ms"] / best["median_ms"])
        dense = next((x for x in ok if x["row"] == "dense-fast" and (x["preset"], x["dtype"], x["batch"], x["queries"])
                      == (r["preset"], r["dtype"], r["batch"], r["queries"])), None)
        if dense and not frames:  # (dense ms / packed ms) / (dense GFLOP / packed GFLOP), both the fastest recipe
            cut = dense["gflop"] / r["gflop"]
            out[key]["flop_realization"] = dense["median_ms"] / r["median_ms"] / cut
            if dense.get("back_to_back_ms") and r.get("back_to_back_ms"):
                out[key]["flop_realization_back_to_back"] = dense["back_to_back_ms"] / r["back_to_back_ms"] / cut
    return out


def add_speedups(results: list[dict]) -> None:
    """x_masked_eager / x_masked_graph: speedup over the masked rows of the same preset, dtype, B and Q."""
    key = lambda r: (r["preset"], r["dtype"], r["batch"], r["queries"])  # noqa: E731
    ok = [r for r in results if "error" not in r]
    for r in ok:
        for base in ("masked-eager", "masked-graph"):
            ref = next((x for x in ok if x["row"] == base and key(x) == key(r)), None)
            r[f"x_{base.replace('-', '_')}"] = ref["median_ms"] / r["median_ms"] if ref else None


def markdown(results: list[dict], info: dict, comp: dict | None, checks: dict) -> str:
    lines = [f"# depthpack latency ({info.get('gpu', 'CPU')})", "",
             f"torch {info['torch']}, commit {info.get('commit')}, device {info['device']}", ""]
    head = ("| preset | dtype | B | Q | row | + step (over row) | median ms | p90 ms | back-to-back ms | spread "
            "| kernels | GFLOP | x masked eager | x masked graph | warmup s |")
    lines += [head, "|" + "---|" * 15]
    f = lambda v, d=3: "" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))  # noqa: E731
    for r in results:
        if "error" in r:
            lines.append(f"| {r['preset']} | {r['dtype']} | {r['batch']} | {r['queries']} | {r['row']} | "
                         f"| failed: {r['error'][:120].replace('|', '/')} |" + " |" * 8)
            continue
        sw = f"{r.get('switch', '')}" + (f" (over {r['base']})" if r.get("base") else "")
        lines.append(f"| {r['preset']} | {r['dtype']} | {r['batch']} | {r['queries']} | {r['row']} | {sw} "
                     f"| {f(r['median_ms'])} | {f(r['p90_ms'])} | {f(r.get('back_to_back_ms'))} "
                     f"| {100 * r['spread']:.1f}% | {f(r['kernels'])} | {f(r['gflop'], 2)} "
                     f"| {f(r.get('x_masked_eager'), 2)} | {f(r.get('x_masked_graph'), 2)} | {f(r.get('compile_s'), 1)} |")
    if checks:
        lines += ["", "## The default against the best row", "", "| point | default ms | best row | best ms | default / best "
                  "| FLOP realization (dense-fast / default, over the FLOP cut): call, back-to-back |", "|---|---|---|---|---|---|"]
        lines += [f"| {k} | {v['default_ms']:.3f} | {v['best_row']} | {v['best_ms']:.3f} | {v['default_over_best']:.3f} "
                  f"| {f(v.get('flop_realization'))}, {f(v.get('flop_realization_back_to_back'))} |" for k, v in checks.items()]
    if comp:
        lines += ["", f"## Compile time per bucket ({comp['predictor']}, {comp['preset']} {comp['dtype']} batch "
                  f"{comp['batch']})", "", "| bucket | cold s | warm s |", "|---|---|---|"]
        cold, warm = comp.get("cold", {}).get("per_bucket_s", {}), comp.get("warm", {}).get("per_bucket_s", {})
        for k in sorted(set(cold) | set(warm), key=int):
            lines.append(f"| {k} | {cold.get(k, '')} | {warm.get(k, '')} |")
        lines.append(f"| process total | {comp.get('cold', {}).get('total_s', '')} | {comp.get('warm', {}).get('total_s', '')} |")
    lines += ["", "median / p90 ms: one call followed by a device sync, host clock (latency as a caller meets it). "
              "back-to-back ms: CUDA events around each call, no sync between calls (throughput). spread = (max - "
              "min) / min of the repeat medians. warmup s = compile and capture time of the buckets this row uses. "
              "Kernels: one call of the same forward without graph replay, under torch.profiler. Masked rows: SDPA "
              "with a mask never takes the flash kernel, and the mask becomes an additive one on every call."]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, info: dict, args, results: list[dict], comp: dict | None) -> tuple[str, dict]:
    """bench.json, bench.md and bench.png in out (each atomically); returns (markdown, checks)."""
    order = {r.name: i for i, r in enumerate(LADDER)}
    results.sort(key=lambda r: (r["preset"], r["dtype"], r["batch"], r["queries"], order.get(r["row"], 99)))
    add_speedups(results)
    checks = summary_checks(results)
    report = dict(info=info, args={k: v for k, v in vars(args).items()}, results=results, checks=checks,
                  compile_time=comp)
    atomic_write_json(out / "bench.json", report, sort_keys=False)
    md = markdown(results, info, comp, checks)
    atomic_write_text(out / "bench.md", md)
    plot(results, out / "bench.png")
    return md, checks


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in results if "error" not in r]
    groups = sorted({(r["preset"], r["dtype"], r["batch"]) for r in results})
    if not groups:
        fig = plt.figure(figsize=(4, 2))
        fig.text(0.5, 0.5, "no rows measured", ha="center")
    else:
        fig, axes = plt.subplots(1, len(groups), figsize=(7.5 * len(groups), 4.8), squeeze=False)
        names = list(dict.fromkeys(r["row"] for r in results))
        cmap = plt.get_cmap("tab20")
        color = {n: cmap(i % 20) for i, n in enumerate(names)}  # one color per row in every panel
        for ax, (preset, dtype, b) in zip(axes[0], groups):
            rs = [r for r in results if (r["preset"], r["dtype"], r["batch"]) == (preset, dtype, b)]
            for name in dict.fromkeys(r["row"] for r in rs):
                pts = sorted((r["queries"], r["median_ms"]) for r in rs if r["row"] == name)
                ax.plot(*zip(*pts), marker="o", label=name, color=color[name],
                        linestyle="--" if "eager" in name else ":" if name.startswith(("dense", "dav2")) else "-")
            ax.set(xscale="log", yscale="log", xlabel="queries per image", ylabel="median latency, call + sync (ms)",
                   title=f"{preset} {dtype} batch {b}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


# ---- CLI --------------------------------------------------------------------------------------------
def _csv(kind, what: str, lo: int | None = None):
    def parse(text: str):
        try:
            vals = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}") from None
        if not vals:
            raise argparse.ArgumentTypeError(f"{text!r}: give at least one")
        if lo is not None and min(vals) < lo:
            raise argparse.ArgumentTypeError(f"{text!r}: each must be >= {lo}")
        return vals
    return parse


def _pairs(text: str) -> list[tuple[int, int]]:
    """'1x256,8x512' -> [(1, 256), (8, 512)]."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        b, x, q = item.partition("x")
        if not (x and b.isdigit() and q.isdigit() and int(b) >= 1 and int(q) >= 1):
            raise argparse.ArgumentTypeError(f"{item!r} is not BATCHxQUERIES with positive integers (e.g. 1x256)")
        out.append((int(b), int(q)))
    if not out:
        raise argparse.ArgumentTypeError("give at least one BATCHxQUERIES point")
    return out


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 < v < float("inf"):  # nan and inf too: a row that never ends is no measurement
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
        return v
    return parse


def parse_args(argv=None):
    ap = cli.Parser(prog="python -m depthpack.bench", description=__doc__.split("\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter, name="bench")
    ap.add_argument("--preset", type=_csv(str, "presets"), default=["vits"], help="comma list of presets")
    ap.add_argument("--checkpoint", default=None, help="benchmark this checkpoint's model instead of a preset")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--dtype", type=_csv(str, "dtypes"), default=None, help="comma list: bfloat16,float16,float32")
    ap.add_argument("--batch", type=_csv(int, "integers", 1), default=None, help="comma list of batch sizes (default 1,8; CPU 1)")
    ap.add_argument("--queries", type=_csv(int, "integers", 1), default=None, help="comma list of query counts")
    ap.add_argument("--pairs", type=_pairs, default=None, metavar="BxQ,...",
                    help="only these (batch, queries) points, e.g. 1x256,8x512 (instead of --batch x --queries)")
    ap.add_argument("--rows", type=_csv(str, "rows"), default=None,
                    help=f"comma list of rows from {', '.join(ROWS)}; or a group ({', '.join(GROUPS)}); or none")
    ap.add_argument("--out", default="bench_out", help="output folder (bench.json, bench.md, bench.png)")
    ap.add_argument("--seconds", type=_positive(float), default=0.5, help="about how long each repeat of a row runs")
    ap.add_argument("--repeats", type=_positive(int), default=3, help="repeats of each row's measurement (spread)")
    ap.add_argument("--sets", type=_positive(int), default=4, help="input sets rotated among the calls")
    ap.add_argument("--frame-size", type=parse_frame_size, default=(480, 640), metavar="WxH",
                    help="camera frames of the @frames rows (default 640x480)")
    ap.add_argument("--cache-dir", default=None, help="compile cache folder (Inductor + save_cache_artifacts)")
    ap.add_argument("--compile-time", action="store_true", help="also measure cold and warm compile per bucket")
    ap.add_argument("--child-warmup", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.checkpoint:
        args.preset = [Path(args.checkpoint).name]  # the label of its rows
    else:
        bad = [p for p in args.preset if p not in PRESETS]
        if bad:
            ap.error(f"unknown preset(s) {bad}; choose from {sorted(PRESETS)}")
    if args.device is not None:
        try:
            dev = torch.device(args.device)
        except RuntimeError:
            ap.error(f"--device {args.device!r}: use cpu, cuda or cuda:N")
        if dev.type not in ("cpu", "cuda"):
            ap.error(f"--device {args.device!r}: use cpu, cuda or cuda:N")
        if dev.type == "cuda" and not torch.cuda.is_available():
            ap.error(f"--device {args.device}: CUDA is not available on this machine")
    cuda = torch.cuda.is_available() if args.device is None else args.device.startswith("cuda")
    args.device = args.device or ("cuda" if cuda else "cpu")
    args.dtype = args.dtype or (["bfloat16"] if cuda else ["float32"])
    bad = [d for d in args.dtype if d not in ("float32", "bfloat16", "float16")]
    if bad:
        ap.error(f"--dtype {','.join(bad)}: choose from float32, bfloat16, float16")
    if args.pairs and (args.batch or args.queries):
        ap.error("--pairs names the (batch, queries) points itself: leave out --batch and --queries")
    args.batch = args.batch or ([1, 8] if cuda else [1])
    args.queries = args.queries or ([16, 64, 256, 1024] if cuda else [16, 64, 256])
    # the (batch, [queries]) groups to measure, each one model and Rows set
    args.groups = ([(b, [q for bb, q in args.pairs if bb == b]) for b in dict.fromkeys(b for b, _ in args.pairs)]
                   if args.pairs else [(b, list(args.queries)) for b in args.batch])
    rows = args.rows or list(DEFAULT_GPU_ROWS if cuda else DEFAULT_CPU_ROWS)
    rows = [] if rows == ["none"] else rows  # --rows none: only --compile-time
    rows = [name for r in rows for name in GROUPS.get(r, (r,))]
    bad = [r for r in rows if r not in ROWS]
    if bad:
        ap.error(f"unknown rows {bad}; choose from {', '.join(ROWS)}")
    if not cuda:
        gpu_only = [r for r in rows if ROWS[r].cuda_only]
        if gpu_only and args.rows:
            ap.error(f"rows {gpu_only} need a CUDA device (CUDA graphs); this run is on {args.device}")
        rows = [r for r in rows if not ROWS[r].cuda_only]
    if any(ROWS[r].path == "dav2" for r in rows) and not _have("transformers"):
        if args.rows:
            ap.error("the dav2 rows need the transformers package")
        rows = [r for r in rows if ROWS[r].path != "dav2"]
    if not rows and not args.compile_time:
        ap.error("no row to measure (--rows none, or every row needs what this machine lacks) and no compile "
                 "time asked for: an empty table is no benchmark; add rows or --compile-time")
    args.rows = rows
    return args


def _have(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child_warmup:
        child_warmup(args)
        return {}
    from tqdm import tqdm

    device = torch.device(args.device)
    out = check_writable_dir(args.out, "--out")
    if args.checkpoint:
        make_model(args.preset[0], args.checkpoint)  # a corrupt checkpoint is refused before anything runs
    info = gpu_info(device)
    comp = compile_times(args, device) if args.compile_time else None
    results: list[dict] = []
    rows = [ROWS[r] for r in args.rows]
    total = len(args.preset) * len(args.dtype) * sum(len(qs) for _, qs in args.groups) * len(rows)
    with tqdm(total=total, file=sys.stderr) as bar:
        for preset in args.preset:
            for dt in args.dtype:
                for b, queries in args.groups:
                    results += run_group(preset, getattr(torch, dt), b, queries, rows, device, args, bar)
                    write_outputs(out, info, args, results, comp)  # partial results survive a kill
    if device.type == "cuda":
        info["clocks_after"] = gpu_info(device).get("nvidia_smi")
    md, checks = write_outputs(out, info, args, results, comp)
    print(md)
    failed = [f"{r['row']}@B{r['batch']}Q{r['queries']}" for r in results if "error" in r]
    summary = dict(out=str(out), rows=len(results), gpu=info.get("gpu"), failed=failed,
                   default_over_best={k: round(v["default_over_best"], 4) for k, v in checks.items()},
                   **{f"{r['row']}@B{r['batch']}Q{r['queries']}": round(r["median_ms"], 4)
                      for r in results if "error" not in r})
    print(json.dumps(summary))
    if failed:
        raise SystemExit(1)
    return dict(info=info, results=results, checks=checks, compile_time=comp)
