"""python -m depthpack.bench: latency of the dense, masked and packed paths as a ladder of switches.

    python -m depthpack.bench --preset vits --dtype bfloat16 --batch 1,8 --queries 16,64,256,1024,4096 --out DIR
    python -m depthpack.bench --preset tiny --device cpu          # the CI smoke run (CPU rows)

Each row is a declared Predictor configuration, and each row but the baselines is an earlier row plus
one switch (LADDER; segment-anything-fast's ladder): masked eager -> + CUDA graph; dense likewise;
packed eager -> + graph -> + compile, and the ablations (Inductor's reduce-overhead, max-autotune,
the Triton embed kernel) on top. Depth Anything V2 Small's architecture (random weights, same image
size, sampled at the same points) is the dense model users pick instead.

Inputs: float images already on the device (the model's own figure), or, in the @frames rows, uint8
BGR camera frames of --frame-size on the host with points in frame pixels (what a robot has).
Protocol: warmup (compile and capture) excluded and reported apart; a discarded back-to-back spell before
each row (an idle GPU clocks down); inputs rotated among --sets sets;
each row timed two ways: latency = one call followed by a device sync on the host clock (what a
caller meets; median and p90), and back-to-back = CUDA events around each call without a sync
between (throughput); --repeats repeats and the spread of the repeat medians (run-to-run variation);
FLOPs with torch.utils.flop_counter over one eager call of the same path; kernels per forward with
torch.profiler over Predictor.predict_uncaptured (the same kernels, not replayed from a graph).
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from ..core import cli
from ..core.checkpoint import load_model
from ..core.config import PRESETS
from ..core.files import atomic_write_json, atomic_write_text, check_writable_dir
from ..core.model import DepthPack, create_model
from ..core.preprocess import parse_frame_size
from ..runtime.graphs import capture, percentile, time_calls
from ..runtime.predictor import Predictor, compile_counter


@dataclass(frozen=True)
class Row:
    """One configuration of the ladder: a Predictor's switches (or the DAv2 comparison)."""
    name: str
    path: str = "packed"  # packed | masked | dense | dav2
    backend: str = "eager"  # Predictor backend (dav2: eager | graph | compile+graph)
    compile_mode: str | None = None
    switches: tuple = ()  # the model's fast paths, (name, value) pairs (depthpack.core.model.SWITCHES)
    compile_options: tuple = ()  # Inductor settings, (name, value) pairs
    base: str | None = None  # the row this one adds a switch to
    switch: str = ""  # what it adds, in words
    default: bool = True  # in the default GPU sweep
    input: str = "device"  # device: float images already on the device | frames: uint8 BGR camera frames on the host

    @property
    def cuda_only(self) -> bool:
        return self.backend in ("graph", "compile+graph")


def step(prev: Row, name: str, switch: str, default: bool = True, switches: tuple = (), compile_options: tuple = (),
         **changes) -> Row:
    """prev plus one switch (model switches and Inductor options add to prev's)."""
    return replace(prev, name=name, base=prev.name, switch=switch, default=default,
                   switches=prev.switches + switches, compile_options=prev.compile_options + compile_options, **changes)


MASKED_EAGER = Row("masked-eager", path="masked", switch="baseline: every token, keys masked to the selection")
DENSE_EAGER = Row("dense-eager", path="dense", switch="every token, no mask")
PACKED_EAGER = Row("packed-eager", switch="the packed buffer: cls + anchors + selected patches")
PACKED_GRAPH = step(PACKED_EAGER, "packed-graph", "CUDA graph", backend="graph")
PACKED_CG = step(PACKED_GRAPH, "packed-compile+graph", "torch.compile (Inductor)", backend="compile+graph")
DAV2_EAGER = Row("dav2-eager", path="dav2", switch="Depth Anything V2 Small (ViT-S + DPT), a full map")
LADDER: tuple[Row, ...] = (
    MASKED_EAGER,
    step(MASKED_EAGER, "masked-graph", "CUDA graph", backend="graph"),
    DENSE_EAGER,
    step(DENSE_EAGER, "dense-graph", "CUDA graph", backend="graph"),
    PACKED_EAGER,
    step(PACKED_EAGER, "packed-compile", "torch.compile (Inductor)", backend="compile"),
    PACKED_GRAPH,
    PACKED_CG,
    step(PACKED_CG, "packed-reduce-overhead", "Inductor's own cudagraph trees instead of ours",
         default=False, compile_mode="reduce-overhead"),
    step(PACKED_CG, "packed-autotune+graph", "max-autotune (Triton GEMM templates, fused epilogues)",
         default=False, compile_mode="max-autotune-no-cudagraphs"),
    step(PACKED_GRAPH, "packed-graph+kernel", "Triton gather+embed kernel", switches=(("fused_embed", True),)),
    step(PACKED_CG, "packed-compile+graph+kernel", "Triton gather+embed kernel", default=False,
         switches=(("fused_embed", True),)),
    step(PACKED_CG, "packed-compile+graph@frames", "camera frames from the host (uint8 BGR, preprocessed in the graph)",
         input="frames"),
    DAV2_EAGER,
    step(DAV2_EAGER, "dav2-graph", "CUDA graph", backend="graph"),
    step(DAV2_EAGER, "dav2-compile+graph", "torch.compile + CUDA graph", backend="compile+graph"),
)
# the fewer-kernels levers, each the previous plus one switch (opt-in: --rows levers)
_L1 = step(PACKED_CG, "lever-count-selection", "token selection by counting instead of topk", default=False,
           switches=(("selection", "count"),))
_L2 = step(_L1, "lever-mlp-epilogue", "fc1 + bias + GELU in one cuBLASLt GEMM", default=False,
           switches=(("mlp_epilogue", True),))
_L3 = step(_L2, "lever-combo-kernels", "Inductor combo kernels (horizontal fusion)", default=False,
           compile_options=(("combo_kernels", True),))
_L4 = step(_L3, "lever-coordinate-descent", "Inductor coordinate-descent tuning", default=False,
           compile_options=(("coordinate_descent_tuning", True),))
_L5 = step(_L4, "lever-pdl", "programmatic dependent launch (Hopper only)", default=False,
           compile_options=(("triton.enable_pdl", True),))
_L6 = step(_L1, "lever-fused-blocks", "each ViT block as 4 Triton kernels (LN+QKV, attention+proj, LN+fc1+GELU, fc2+residual)",
           default=False, switches=(("fused_blocks", True),))
_L7 = step(_L6, "lever-fused-blocks+embed", "Triton gather+embed kernel", default=False,
           switches=(("fused_embed", True),))
_L8 = step(_L7, "lever-fused-blocks+combo", "Inductor combo kernels (horizontal fusion)", default=False,
           compile_options=(("combo_kernels", True),))
_L9 = step(_L2, "lever-hybrid-blocks", "attention+proj+residual and fc2+residual as 2 Triton kernels a block, "
           "LayerNorms, QKV and fc1 left to Inductor and cuBLAS", default=False, switches=(("fused_blocks", "hybrid"),))
_L10 = step(_L9, "lever-hybrid-blocks+combo", "Inductor combo kernels (horizontal fusion)", default=False,
            compile_options=(("combo_kernels", True),))
_L11 = step(_L1, "lever-persistent-blocks", "each ViT block as one persistent Triton kernel (the four as phases, "
            "grid barriers between them)", default=False, switches=(("fused_blocks", "persistent"),))
_L12 = step(_L11, "lever-persistent-blocks+combo", "Inductor combo kernels (horizontal fusion)", default=False,
            compile_options=(("combo_kernels", True),))
LEVERS = (_L1, _L2, _L3, _L4, _L5, _L6, _L7, _L8, _L9, _L10, _L11, _L12)
LADDER = LADDER + LEVERS
ROWS = {r.name: r for r in LADDER}
GROUPS = {"levers": ("packed-compile+graph",) + tuple(r.name for r in LEVERS)}
DEFAULT_GPU_ROWS = tuple(r.name for r in LADDER if r.default)
# on a CPU: the eager rows (no CUDA graphs; Inductor on 2 cores compiles slowly: compile rows on request)
DEFAULT_CPU_ROWS = tuple(r.name for r in LADDER if r.default and r.backend == "eager")


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
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        timeout=10, cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
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


def dav2_forward(model, mean, std, compile_mode=None, compiled: bool = False):
    """images [B,3,H,W] 0..1, points [B,Q,2] -> depth map sampled at the points' pixels [B,Q]."""
    def depth_map(images):
        x = ((images - mean) / std).to(next(model.parameters()).dtype)
        return model(pixel_values=x).predicted_depth  # [B,h,w]

    if compiled:
        depth_map = torch.compile(depth_map, dynamic=False, mode=compile_mode)

    def fwd(images, points):
        depth = depth_map(images)
        B, h, w = depth.shape
        ix = points[..., 0].long().clamp(0, w - 1)
        iy = points[..., 1].long().clamp(0, h - 1)
        return torch.gather(depth.reshape(B, h * w), 1, iy * w + ix).float()
    return fwd


# ---- building rows ----------------------------------------------------------------------------------
class Rows:
    """The functions of every row for one (model, dtype, batch): predictors are made once and reused for
    every query count (buckets warmed as they are first needed)."""

    def __init__(self, model: DepthPack, device, dtype, batch: int, args):
        self.model, self.device, self.dtype, self.B, self.args = model, device, dtype, batch, args
        self.preds: dict[tuple, Predictor] = {}
        self.dav2: dict[str, Callable] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.compile_s: dict[str, float] = {}
        self.keep: list = []  # every graph of the shared pool stays alive

    def predictor(self, row: Row, Q: int) -> Predictor:
        # the dense path's cost does not depend on the bucket: one "bucket" of Q, no chunking
        buckets = (Q,) if row.path == "dense" else None
        key = (row.path, row.backend, row.compile_mode, row.switches, row.compile_options, buckets, row.input)
        if key not in self.preds:
            self.preds[key] = Predictor(self.model, device=self.device, dtype=self.dtype, backend=row.backend,
                                        path=row.path, batch_size=self.B, compile_mode=row.compile_mode,
                                        validate=row.input == "frames", switches=dict(row.switches),
                                        compile_options=dict(row.compile_options), cache_dir=self.args.cache_dir,
                                        buckets=buckets, color="bgr")
        return self.preds[key]

    def build(self, row: Row, Q: int, images, points) -> tuple[Callable, Callable, Callable]:
        """(timed, profiled, flop-counted) functions of (images, points); warmup time into compile_s."""
        if row.path == "dav2":
            return self._dav2(row, Q, images, points)
        pred = self.predictor(row, Q)
        if pred.backend != "eager":
            buckets = sorted({pred.bucket_for(min(Q, pred.buckets[-1]))} | ({pred.buckets[-1]} if Q > pred.buckets[-1] else set()))
            t0 = time.perf_counter()
            frame_size = tuple(images.shape[1:3]) if row.input == "frames" else None
            pred.warmup(batch_size=self.B, buckets=buckets, frame_size=frame_size)
            self.compile_s[f"{row.name}@{Q}"] = time.perf_counter() - t0
        eager = self.predictor(replace(row, backend="eager", compile_mode=None, compile_options=()), Q)
        return pred.predict, pred.predict_uncaptured, eager.predict

    def _dav2(self, row: Row, Q: int, images, points):
        if "model" not in self.dav2:
            self.dav2["model"] = dav2_small(self.model.cfg.img_size).to(self.device, self.dtype)
        mean = torch.tensor(self.model.cfg.mean, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(self.model.cfg.std, device=self.device).view(1, 3, 1, 1)
        base = dav2_forward(self.dav2["model"], mean, std)
        if row.backend == "eager":
            return base, base, base
        t0 = time.perf_counter()
        fwd = dav2_forward(self.dav2["model"], mean, std, self.args.compile_mode, compiled=True) \
            if row.backend == "compile+graph" else base
        static = [images.clone(), points.clone()]
        graph, out = capture(lambda: fwd(*static), pool=self.pool, device=self.device)
        self.keep.append(graph)

        def run(im, pts):
            static[0].copy_(im, non_blocking=True)
            static[1].copy_(pts, non_blocking=True)
            graph.replay()
            return out
        torch.cuda.synchronize(self.device)
        self.compile_s[f"{row.name}@{Q}"] = time.perf_counter() - t0
        return run, fwd, base


def measure_row(rb: Rows, row: Row, Q: int, sets, device, args) -> dict:
    sets = sets[row.input]
    with torch.inference_mode():
        fn, prof_fn, flop_fn = rb.build(row, Q, *sets[0])
        call = lambda i: fn(*sets[i])  # noqa: E731
        flops = count_flops(lambda: flop_fn(*sets[0]))
        kernels = count_kernels(lambda: prof_fn(*sets[0]), device)
        # a discarded back-to-back spell first: an idle GPU's clocks start low (345 MHz on the H200), which
        # inflated the first row of a run by 20% before
        time_calls(call, device, args.sets, min(0.25, args.seconds), sync_each=False)
        reps = [time_calls(call, device, args.sets, args.seconds) for _ in range(args.repeats)]
        b2b = time_calls(call, device, args.sets, args.seconds, sync_each=False) if device.type == "cuda" else None
    meds = [statistics.median(r) for r in reps]
    allt = [t for r in reps for t in r]
    med = statistics.median(allt)
    return dict(preset=rb.model.cfg_name, dtype=str(rb.dtype).replace("torch.", ""), batch=rb.B, queries=Q,
                row=row.name, base=row.base, switch=row.switch, median_ms=med, p90_ms=percentile(allt, 0.9),
                back_to_back_ms=statistics.median(b2b) if b2b else None, calls=len(allt), repeat_medians_ms=meds,
                spread=(max(meds) - min(meds)) / min(meds), kernels=kernels, gflop=flops / 1e9,
                tflops=flops / (med * 1e-3) / 1e12)


def make_model(preset: str, checkpoint: str | None) -> DepthPack:
    torch.manual_seed(0)
    if checkpoint:  # a trained model's shape (latency does not depend on the weights' values)
        model = load_model(checkpoint).float().eval()
    else:
        model = create_model(preset).eval()
    model.cfg_name = preset
    return model


def run_group(preset: str, dtype: torch.dtype, batch: int, queries: list[int], rows: list[Row], device, args,
              progress, done=frozenset()) -> list[dict]:
    model = make_model(preset, args.checkpoint)
    H, W = model.cfg.img_size
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
        for row in rows:
            if (row.path == "dav2" and (H % 14 or W % 14)) or (preset, dt, batch, Q, row.name) in done:
                progress.update(1)
                continue  # DAv2 needs multiples of its patch size 14; rows merged from an earlier run
            progress.set_description(f"{preset} {dt} B={batch} Q={Q} {row.name}")
            try:
                results.append(measure_row(rb, row, Q, sets, device, args))
            except Exception as e:  # one broken row must not take the sweep's other rows with it
                print(f"row {row.name} B={batch} Q={Q} failed: {type(e).__name__}: {e}", file=sys.stderr)
                results.append(dict(preset=preset, dtype=dt, batch=batch, queries=Q, row=row.name,
                                    error=f"{type(e).__name__}: {str(e)[:300]}"))
            progress.update(1)
    comp = {k: round(v, 2) for k, v in rb.compile_s.items()}
    for r in results:
        if "error" not in r:
            r["compile_s"] = comp.get(f"{r['row']}@{r['queries']}")
    return results


# ---- compile time: cold and warm processes ---------------------------------------------------------
def child_warmup(args) -> None:
    """In a fresh process: warm every bucket of a compile+graph predictor from cache_dir; print JSON."""
    t0 = time.perf_counter()
    model = create_model(args.preset[0]).eval()
    pred = Predictor(model, device=torch.device(args.device), dtype=getattr(torch, args.dtype[0]),
                     backend="compile+graph", batch_size=args.batch[0], compile_mode=args.compile_mode,
                     cache_dir=args.cache_dir)
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
            if args.compile_mode:
                cmd += ["--compile-mode", args.compile_mode]
            env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            try:
                out[phase] = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                out[phase] = dict(error=(p.stderr or p.stdout)[-2000:])
    out.update(preset=args.preset[0], dtype=args.dtype[0], batch=args.batch[0], backend="compile+graph",
               mode=args.compile_mode or "default")
    return out


# ---- outputs ----------------------------------------------------------------------------------------
def targets(results: list[dict]) -> dict:
    """The H200 targets (vits, bf16), evaluated on whatever rows this run has (latency = call + sync)."""
    def get(b, q, row):
        return next((r for r in results if r["preset"] == "vits" and r["dtype"] == "bfloat16" and r["batch"] == b
                     and r["queries"] == q and r["row"] == row and "error" not in r), None)
    t = {}
    cg = get(1, 256, "packed-compile+graph")
    if cg:
        t["b1_q256_compile_graph_ms"] = dict(value=cg["median_ms"], target="<= 0.30", met=cg["median_ms"] <= 0.30)
        if cg.get("x_masked_eager"):
            t["b1_q256_speedup_over_masked_eager"] = dict(value=cg["x_masked_eager"], target=">= 8",
                                                          met=cg["x_masked_eager"] >= 8)
    cg8 = get(8, 512, "packed-compile+graph")
    if cg8:
        t["b8_q512_compile_graph_ms"] = dict(value=cg8["median_ms"], target="<= 0.9", met=cg8["median_ms"] <= 0.9)
    pg, mg = get(8, 512, "packed-graph"), get(8, 512, "masked-graph")
    if pg and mg:
        eff = (mg["median_ms"] / pg["median_ms"]) / (mg["gflop"] / pg["gflop"])
        t["b8_q512_graph_speedup_over_flop_ratio"] = dict(value=eff, speedup=mg["median_ms"] / pg["median_ms"],
                                                          flop_ratio=mg["gflop"] / pg["gflop"], target=">= 0.8",
                                                          met=eff >= 0.8)
    spreads = [r["spread"] for r in results if "error" not in r and ROWS.get(r["row"], Row("?")).cuda_only]
    if spreads:
        t["graph_run_to_run_spread_max"] = dict(value=max(spreads), target="< 0.05", met=max(spreads) < 0.05)
    return t


def add_speedups(results: list[dict]) -> None:
    """x_masked_eager / x_masked_graph: speedup over the masked rows of the same preset, dtype, B and Q."""
    key = lambda r: (r["preset"], r["dtype"], r["batch"], r["queries"])  # noqa: E731
    ok = [r for r in results if "error" not in r]
    for r in ok:
        for base in ("masked-eager", "masked-graph"):
            ref = next((x for x in ok if x["row"] == base and key(x) == key(r)), None)
            r[f"x_{base.replace('-', '_')}"] = ref["median_ms"] / r["median_ms"] if ref else None


def markdown(results: list[dict], info: dict, comp: dict | None, tgt: dict) -> str:
    lines = [f"# depthpack latency ({info.get('gpu', 'CPU')})", "",
             f"torch {info['torch']}, commit {info.get('commit')}, device {info['device']}"
             + (f", clocks {info.get('nvidia_smi')}" if info.get("nvidia_smi") else ""), ""]
    head = ("| preset | dtype | B | Q | row | + switch (over row) | median ms | p90 ms | back-to-back ms | spread "
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
    if tgt:
        lines += ["", "## Targets", "", "| target | value | goal | met |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['value']:.3f} | {v['target']} | {'yes' if v['met'] else 'NO'} |" for k, v in tgt.items()]
    if comp:
        lines += ["", f"## Compile time per bucket ({comp['backend']}, mode {comp['mode']}, {comp['preset']} "
                  f"{comp['dtype']} batch {comp['batch']})", "", "| bucket | cold s | warm s |", "|---|---|---|"]
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
    """bench.json, bench.md and bench.png in out (each atomically); returns (markdown, targets)."""
    order = {r.name: i for i, r in enumerate(LADDER)}
    results.sort(key=lambda r: (r["preset"], r["dtype"], r["batch"], r["queries"], order.get(r["row"], 99)))
    add_speedups(results)
    tgt = targets(results)
    report = dict(info=info, args={k: v for k, v in vars(args).items()}, results=results, targets=tgt,
                  compile_time=comp)
    atomic_write_json(out / "bench.json", report, sort_keys=False)
    md = markdown(results, info, comp, tgt)
    atomic_write_text(out / "bench.md", md)
    plot(results, out / "bench.png")
    return md, tgt


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
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default Inductor's; max-autotune opt-in)")
    ap.add_argument("--frame-size", type=parse_frame_size, default=(480, 640), metavar="WxH",
                    help="camera frames of the @frames rows (default 640x480)")
    ap.add_argument("--cache-dir", default=None, help="compile cache folder (Inductor + save_cache_artifacts)")
    ap.add_argument("--compile-time", action="store_true", help="also measure cold and warm compile per bucket")
    ap.add_argument("--merge-from", action="append", help="folder of an earlier bench.json whose rows to include")
    ap.add_argument("--predict", choices=("jetson-orin",), default=None,
                    help="no measurement: predict the Jetson Orins' latency from the per-kernel model calibrated "
                         "on the H200 (depthpack.bench.orin; --profile FILE calibrates on a measured profile)")
    ap.add_argument("--profile", action="append", default=[], metavar="FILE", help="with --predict: profile.json")
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
    args.queries = args.queries or ([16, 64, 256, 1024, 4096] if cuda else [16, 64, 256])
    # the (batch, [queries]) groups to measure, each one model and Rows set
    args.groups = ([(b, [q for bb, q in args.pairs if bb == b]) for b in dict.fromkeys(b for b, _ in args.pairs)]
                   if args.pairs else [(b, list(args.queries)) for b in args.batch])
    rows = args.rows or list(DEFAULT_GPU_ROWS if cuda else DEFAULT_CPU_ROWS)
    rows = [] if rows == ["none"] else rows  # --rows none: only --compile-time / --merge-from
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
    if not rows and not (args.compile_time or args.merge_from):
        ap.error("no row to measure (--rows none, or every row needs what this machine lacks) and nothing to "
                 "merge or time: an empty table is no benchmark; add rows, --compile-time or --merge-from")
    args.rows = rows
    for other in args.merge_from or []:
        if not (Path(other) / "bench.json").is_file():
            ap.error(f"--merge-from {other}: no bench.json there")
    return args


def _have(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.predict:
        from . import orin
        return orin.main(["--out", str(check_writable_dir(args.out, "--out"))]
                         + [a for f in args.profile for a in ("--profile", f)])
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
    results = []
    for other in args.merge_from or []:  # rows measured by an earlier run (ablation points, compile time)
        earlier = json.loads((Path(other) / "bench.json").read_text())
        results += earlier["results"]
        comp = comp or earlier.get("compile_time")
    done = {(r["preset"], r["dtype"], r["batch"], r["queries"], r["row"]) for r in results if "error" not in r}
    rows = [ROWS[r] for r in args.rows]
    total = len(args.preset) * len(args.dtype) * sum(len(qs) for _, qs in args.groups) * len(rows)
    with tqdm(total=total, file=sys.stderr) as bar:
        for preset in args.preset:
            for dt in args.dtype:
                for b, queries in args.groups:
                    results += run_group(preset, getattr(torch, dt), b, queries, rows, device, args, bar, done)
                    write_outputs(out, info, args, results, comp)  # partial results survive a kill
    if device.type == "cuda":
        info["clocks_after"] = gpu_info(device).get("nvidia_smi")
    md, tgt = write_outputs(out, info, args, results, comp)
    print(md)
    failed = [f"{r['row']}@B{r['batch']}Q{r['queries']}" for r in results if "error" in r]
    summary = dict(out=str(out), rows=len(results), gpu=info.get("gpu"), targets={k: v["met"] for k, v in tgt.items()},
                   failed=failed, **{f"{r['row']}@B{r['batch']}Q{r['queries']}": round(r["median_ms"], 4)
                                     for r in results if "error" not in r})
    print(json.dumps(summary))
    if failed:
        raise SystemExit(1)
    return dict(info=info, results=results, targets=tgt, compile_time=comp)
