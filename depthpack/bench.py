"""python -m depthpack.bench: latency of the dense, masked and packed paths (and Depth Anything V2 Small).

    python -m depthpack.bench --preset vits --dtype bfloat16 --batch 1,8 --queries 16,64,256,1024,4096 --out DIR
    python -m depthpack.bench --preset tiny --device cpu          # the CI smoke test (CPU rows)

Rows (a ladder; --rows selects): dense / masked eager and graph (the mask has a fixed shape, so it is
captured too), packed eager / compile / graph / compile+graph through depthpack.Predictor, the
ablations packed reduce-overhead (Inductor's cudagraph trees), packed autotune+graph (max-autotune-no-
cudagraphs: Triton GEMM templates with fused epilogues; opt-in, about 100 s of compile per bucket) and
+kernel (the Triton gather+embed kernel on), and Depth Anything
V2 Small's architecture (transformers, random weights, same image size, sampled at the same points).

Protocol: warmup (compile and capture) excluded and reported apart; each call timed with CUDA events
(perf_counter on CPU); inputs rotated among --sets sets; median and p90 of the calls; the whole
measurement repeated --repeats times and the spread of the repeat medians reported (run-to-run
variation); FLOPs counted with torch.utils.flop_counter over one eager call; kernels per forward from
torch.profiler over one un-graphed call of the same forward; the GPU name and clocks recorded.
Writes DIR/bench.json, DIR/bench.md and DIR/bench.png; the last line of stdout is the JSON summary.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from .model import DepthPack, create_model
from .packing import patch_of_points
from .predictor import Predictor, compile_counter

GRAPH_ROWS = ("dense-graph", "masked-graph", "packed-graph", "packed-compile+graph", "packed-reduce-overhead",
              "packed-autotune+graph", "packed-graph+kernel", "packed-compile+graph+kernel", "dav2-graph", "dav2-compile+graph")
ALL_ROWS = ("dense-eager", "dense-graph", "masked-eager", "masked-graph", "packed-eager", "packed-compile",
            "packed-graph", "packed-compile+graph", "packed-reduce-overhead", "packed-autotune+graph",
            "packed-graph+kernel", "packed-compile+graph+kernel", "dav2-eager", "dav2-graph", "dav2-compile+graph")
DEFAULT_GPU_ROWS = tuple(r for r in ALL_ROWS if r not in ("packed-reduce-overhead", "packed-autotune+graph",
                                                           "packed-compile+graph+kernel"))
DEFAULT_CPU_ROWS = ("dense-eager", "masked-eager", "packed-eager", "dav2-eager")


# ---- helpers ------------------------------------------------------------------------------------------
def capture(fn: Callable, pool=None, device=None) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm fn on a side stream, then capture one call of it in a CUDA graph; returns (graph, its output)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def graphed(fn: Callable, static: list[torch.Tensor], pool=None) -> Callable:
    """A function of inputs (same shapes as static) that copies them in and replays fn's graph."""
    graph, out = capture(lambda: fn(*static), pool=pool)

    def run(*inputs):
        for s, x in zip(static, inputs):
            s.copy_(x, non_blocking=True)
        graph.replay()
        return out

    return run


def count_flops(fn: Callable) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
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


def time_calls(fn: Callable[[int], object], n_sets: int, device: torch.device, seconds: float,
               min_calls: int = 20, max_calls: int = 300) -> list[float]:
    """Milliseconds of each call, inputs rotated among n_sets; about `seconds` of calls."""
    for i in range(3):
        fn(i % n_sets)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn(0)
    if cuda:
        torch.cuda.synchronize(device)
    one = max(time.perf_counter() - t0, 1e-6)
    n = int(min(max_calls, max(min_calls, seconds / one)))
    times = []
    if cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for i, (a, b) in enumerate(events):
            a.record()
            fn(i % n_sets)
            b.record()
        torch.cuda.synchronize(device)
        times = [a.elapsed_time(b) for a, b in events]
    else:
        for i in range(n):
            t = time.perf_counter()
            fn(i % n_sets)
            times.append((time.perf_counter() - t) * 1e3)
    return times


def p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(math.ceil(0.9 * len(s))) - 1)]


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


# ---- Depth Anything V2 Small (transformers, random weights) -------------------------------------------
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
    """images [B,3,H,W] 0..1, points [B,Q,2] -> depth map sampled at the points' pixels [B,Q].
    compiled: the map (normalize + model) through torch.compile once per image shape; the sampling
    stays eager so a new Q does not recompile the model."""
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


# ---- rows ---------------------------------------------------------------------------------------------
class Rows:
    """Builds each row's function for one (preset, dtype, batch): predictors and graphs are made once
    per batch size and reused for every query count (buckets warmed as they are first needed)."""

    def __init__(self, model: DepthPack, device, dtype, batch: int, args):
        self.model, self.device, self.dtype, self.B, self.args = model, device, dtype, batch, args
        self.preds: dict[str, Predictor] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.dav2: dict[bool, Callable] = {}
        self.compile_s: dict[str, float] = {}
        self.keep: list = []  # every graph of the shared pool stays alive (torch 2.11 asserts otherwise)

    def predictor(self, name: str) -> Predictor:
        if name == "packed-compile" and name not in self.preds and self.device.type == "cuda":
            # the same compiled forward as compile+graph, called without the graph: one compile, not two
            cg = self.predictor("packed-compile+graph")
            pred = Predictor(cg.model, device=self.device, dtype=self.dtype, backend="compile", batch_size=self.B,
                             validate=False, compile_mode=self.args.compile_mode)
            pred._fn = cg._fn
            self.preds[name] = pred
        if name not in self.preds:
            kernel = name.endswith("+kernel")
            m = copy.deepcopy(self.model)
            backend = {"packed-eager": "eager", "packed-compile": "compile", "packed-graph": "graph",
                       "packed-compile+graph": "compile+graph", "packed-reduce-overhead": "compile+graph",
                       "packed-autotune+graph": "compile+graph",
                       "packed-graph+kernel": "graph", "packed-compile+graph+kernel": "compile+graph",
                       "packed-eager+kernel": "eager", "packed-compile+kernel": "compile"}[name]
            mode = {"packed-reduce-overhead": "reduce-overhead",  # Inductor's own cudagraph trees
                    "packed-autotune+graph": "max-autotune-no-cudagraphs",  # Triton GEMM templates + epilogues
                    }.get(name, self.args.compile_mode)
            self.preds[name] = Predictor(m, device=self.device, dtype=self.dtype, backend=backend,
                                         batch_size=self.B, compile_mode=mode, validate=False, fused_embed=kernel,
                                         cache_dir=self.args.cache_dir)
        return self.preds[name]

    def packed(self, name: str, Q: int):
        pred = self.predictor(name)
        if pred.backend != "eager":
            caps = sorted({k for _, _, k in pred.chunks(Q)})
            pred.warmup(batch_size=self.B, capacities=caps)
            self.compile_s[f"{name}@{Q}"] = sum(pred.warmup_seconds[k] for k in caps)
        fn = pred.predict
        if pred.backend == "eager" or pred.inductor_graphs:
            prof = fn
        else:  # the same forward, un-graphed: the predictor's own (compiled) function on its static buffers
            def prof(images, points, pred=pred):
                return [pred._fn(pred._images, pred._static[k].points, k) for _, _, k in pred.chunks(Q)]
        flops = self.predictor("packed-eager").predict
        return fn, prof, flops

    def core(self, path: str):
        m = self.predictor("packed-eager").model  # cast to dtype on the device
        p = m.cfg.patch_size
        if path == "dense":
            return lambda im, pts: m._decode(m.dense_features(im), patch_of_points(pts, p, m.grid_of(im)), pts)
        return lambda im, pts: m.chunked(m.forward_masked_core, im, pts)

    def dav2_fn(self, compiled: bool = False):
        if compiled not in self.dav2:
            if not self.dav2:
                self._dav2 = dav2_small(self.model.cfg.img_size).to(self.device, self.dtype)
            mean = torch.tensor(self.model.cfg.mean, device=self.device).view(1, 3, 1, 1)
            std = torch.tensor(self.model.cfg.std, device=self.device).view(1, 3, 1, 1)
            self.dav2[compiled] = dav2_forward(self._dav2, mean, std, self.args.compile_mode, compiled)
        return self.dav2[compiled]

    def build(self, name: str, Q: int, images, points):
        """(fn, profile_fn, flops_fn), each of (images, points): the timed call, the un-graphed call whose
        kernels are counted, the eager call whose FLOPs are counted. Warmup time goes to compile_s."""
        if name.startswith("packed"):
            return self.packed(name, Q)
        fam, kind = name.split("-", 1)
        base = self.core(fam) if fam in ("dense", "masked") else self.dav2_fn()
        if kind == "eager":
            return base, base, base
        t0 = time.perf_counter()
        fwd = base
        if kind == "compile+graph":  # only DAv2 has this row among the non-packed paths
            fwd = self.dav2_fn(compiled=True)
        static = [images.clone(), points.clone()]
        fn = graphed(fwd, static, pool=self.pool)
        self.keep.append(fn)
        torch.cuda.synchronize(self.device)
        self.compile_s[f"{name}@{Q}"] = time.perf_counter() - t0
        return fn, fwd, base


def measure_row(rb: "Rows", name: str, Q: int, sets, device, args) -> dict:
    with torch.inference_mode():
        fn, prof_fn, flop_fn = rb.build(name, Q, *sets[0])
        call = lambda i: fn(*sets[i])  # noqa: E731
        flops = count_flops(lambda: flop_fn(*sets[0]))
        kernels = count_kernels(lambda: prof_fn(*sets[0]), device)
        reps = [time_calls(call, args.sets, device, args.seconds) for _ in range(args.repeats)]
    meds = [statistics.median(r) for r in reps]
    allt = [t for r in reps for t in r]
    med = statistics.median(allt)
    return dict(preset=rb.model.cfg_name, dtype=str(rb.dtype).replace("torch.", ""), batch=rb.B, queries=Q, row=name,
                median_ms=med, p90_ms=p90(allt), calls=len(allt), repeat_medians_ms=meds,
                spread=(max(meds) - min(meds)) / min(meds), kernels=kernels, gflop=flops / 1e9,
                tflops=flops / (med * 1e-3) / 1e12)


def run_group(preset: str, dtype: torch.dtype, batch: int, queries: list[int], rows: list[str], device, args,
              progress, done=frozenset()) -> list[dict]:
    torch.manual_seed(0)
    if args.checkpoint:  # a trained model's shape (latency does not depend on the weights' values)
        from .checkpoint import load_model
        model = load_model(args.checkpoint).float().eval()
    else:
        model = create_model(preset).eval()
    model.cfg_name = preset
    H, W = model.cfg.img_size
    rb = Rows(model, device, dtype, batch, args)
    results = []
    for Q in queries:
        g = torch.Generator().manual_seed(Q)
        sets = [(torch.rand(batch, 3, H, W, generator=g).to(device),
                 (torch.rand(batch, Q, 2, generator=g) * torch.tensor([W - 1e-3, H - 1e-3])).to(device))
                for _ in range(args.sets)]
        for name in rows:
            if (name.startswith("dav2") and (H % 14 or W % 14)) or (
                    (preset, str(dtype).replace("torch.", ""), batch, Q, name) in done):
                progress.update(1)
                continue  # DAv2 needs multiples of its patch size 14; rows merged from an earlier run
            progress.set_description(f"{preset} {str(dtype)[6:]} B={batch} Q={Q} {name}")
            try:
                results.append(measure_row(rb, name, Q, sets, device, args))
            except Exception as e:  # one broken row must not take the sweep's other rows with it
                print(f"row {name} B={batch} Q={Q} failed: {type(e).__name__}: {e}", file=sys.stderr)
                results.append(dict(preset=preset, dtype=str(dtype).replace("torch.", ""), batch=batch, queries=Q,
                                    row=name, error=f"{type(e).__name__}: {str(e)[:300]}"))
            progress.update(1)
    ok = [r for r in results if "error" not in r]
    comp = {k: round(v, 2) for k, v in rb.compile_s.items()}
    for r in ok:
        r["compile_s"] = comp.get(f"{r['row']}@{r['queries']}")
    return results


# ---- compile time: cold and warm processes -----------------------------------------------------------
def child_warmup(args) -> None:
    """In a fresh process: warm every bucket of a compile+graph predictor from cache_dir; print JSON."""
    t0 = time.perf_counter()
    model = create_model(args.preset[0]).eval()
    device = torch.device(args.device)
    pred = Predictor(model, device=device, dtype=getattr(torch, args.dtype[0]), backend=args.child_backend,
                     batch_size=args.batch[0], compile_mode=args.compile_mode, cache_dir=args.cache_dir)
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
                   "--cache-dir", cache, "--child-backend", args.child_backend]
            if args.compile_mode:
                cmd += ["--compile-mode", args.compile_mode]
            env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            try:
                out[phase] = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                out[phase] = dict(error=(p.stderr or p.stdout)[-2000:])
    out.update(preset=args.preset[0], dtype=args.dtype[0], batch=args.batch[0], backend=args.child_backend,
               mode=args.compile_mode or "default")
    return out


# ---- outputs ------------------------------------------------------------------------------------------
def targets(results: list[dict]) -> dict:
    """The issue's H200 targets (vits, bf16), evaluated on whatever rows this run has."""
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
    pg, mg = get(8, 512, "packed-graph"), get(8, 512, "masked-graph")
    if pg and mg:
        eff = (mg["median_ms"] / pg["median_ms"]) / (mg["gflop"] / pg["gflop"])
        t["b8_q512_graph_speedup_over_flop_ratio"] = dict(value=eff, speedup=mg["median_ms"] / pg["median_ms"],
                                                          flop_ratio=mg["gflop"] / pg["gflop"], target=">= 0.8",
                                                          met=eff >= 0.8)
    spreads = [r["spread"] for r in results if r["row"] in GRAPH_ROWS and "error" not in r]
    if spreads:
        t["graph_replay_run_to_run_spread_max"] = dict(value=max(spreads), target="< 0.05", met=max(spreads) < 0.05)
    return t


def markdown(results: list[dict], info: dict, comp: dict | None, tgt: dict) -> str:
    lines = [f"# depthpack latency ({info.get('gpu', 'CPU')})", "",
             f"torch {info['torch']}, commit {info.get('commit')}, device {info['device']}"
             + (f", clocks {info.get('nvidia_smi')}" if info.get("nvidia_smi") else ""), ""]
    head = ("| preset | dtype | B | Q | row | median ms | p90 ms | spread | kernels | GFLOP | TFLOP/s "
            "| x masked eager | x masked graph | warmup s |")
    lines += [head, "|" + "---|" * 14]
    f = lambda v, d=3: "" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))  # noqa: E731
    for r in results:
        if "error" in r:
            lines.append(f"| {r['preset']} | {r['dtype']} | {r['batch']} | {r['queries']} | {r['row']} "
                         f"| failed: {r['error'][:120].replace('|', '/')} |" + " |" * 9)
            continue
        lines.append(f"| {r['preset']} | {r['dtype']} | {r['batch']} | {r['queries']} | {r['row']} | {f(r['median_ms'])} "
                     f"| {f(r['p90_ms'])} | {100 * r['spread']:.1f}% | {f(r['kernels'])} | {f(r['gflop'], 2)} "
                     f"| {f(r['tflops'], 2)} | {f(r.get('x_masked_eager'), 2)} | {f(r.get('x_masked_graph'), 2)} "
                     f"| {f(r.get('compile_s'), 1)} |")
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
    lines += ["", "spread = (max - min) / min of the repeat medians (run-to-run variation). warmup s = compile and "
              "capture time of the buckets (or graph) this row uses, in the benchmark process (Inductor's on-disk "
              "cache may already be warm; the compile-time table above is the cold/warm measurement). Kernels: one un-graphed "
              "call of the same forward under torch.profiler. Masked rows: SDPA with a mask never takes the flash "
              "kernel, and the boolean mask becomes an additive one on every call."]
    return "\n".join(lines) + "\n"


def add_speedups(results: list[dict]) -> None:
    """x_masked_eager / x_masked_graph: speedup over the masked rows of the same preset, dtype, B and Q."""
    key = lambda r: (r["preset"], r["dtype"], r["batch"], r["queries"])  # noqa: E731
    ok = [r for r in results if "error" not in r]
    for r in ok:
        for base in ("masked-eager", "masked-graph"):
            ref = next((x for x in ok if x["row"] == base and key(x) == key(r)), None)
            r[f"x_{base.replace('-', '_')}"] = ref["median_ms"] / r["median_ms"] if ref else None


def write_outputs(out: Path, info: dict, args, results: list[dict], comp: dict | None) -> tuple[str, dict]:
    """bench.json (atomic), bench.md and bench.png in out; returns (markdown, targets)."""
    order = {name: i for i, name in enumerate(ALL_ROWS)}
    results.sort(key=lambda r: (r["preset"], r["dtype"], r["batch"], r["queries"], order.get(r["row"], 99)))
    add_speedups(results)
    tgt = targets(results)
    report = dict(info=info, args=dict(vars(args)), results=results, targets=tgt, compile_time=comp)
    tmp = out / "bench.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, out / "bench.json")
    md = markdown(results, info, comp, tgt)
    (out / "bench.md").write_text(md)
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
        fig.savefig(path)
        plt.close(fig)
        return
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
        ax.set(xscale="log", yscale="log", xlabel="queries per image", ylabel="median latency (ms)",
               title=f"{preset} {dtype} batch {b}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- CLI ----------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda t: (lambda s: [t(x) for x in s.split(",") if x])  # noqa: E731
    ap.add_argument("--preset", type=csv(str), default=["vits"], help="comma list of presets")
    ap.add_argument("--checkpoint", default=None, help="benchmark this checkpoint's model instead of a preset")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--dtype", type=csv(str), default=None, help="comma list: bfloat16,float16,float32")
    ap.add_argument("--batch", type=csv(int), default=None, help="comma list of batch sizes (default 1,8; CPU 1)")
    ap.add_argument("--queries", type=csv(int), default=None, help="comma list of query counts")
    ap.add_argument("--rows", type=csv(str), default=None,
                    help=f"comma list of rows from {', '.join(ALL_ROWS)}; or none")
    ap.add_argument("--out", default="bench_out", help="output folder (bench.json, bench.md, bench.png)")
    ap.add_argument("--seconds", type=float, default=0.5, help="about how long each repeat of a row runs")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each row's measurement (spread)")
    ap.add_argument("--sets", type=int, default=4, help="input sets rotated among the calls")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default Inductor's; max-autotune opt-in)")
    ap.add_argument("--cache-dir", default=None, help="compile cache folder (Inductor + save_cache_artifacts)")
    ap.add_argument("--compile-time", action="store_true", help="also measure cold and warm compile per bucket")
    ap.add_argument("--merge-from", action="append", help="folder of an earlier bench.json whose rows to include")
    ap.add_argument("--child-warmup", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-backend", default="compile+graph", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.checkpoint:
        args.preset = [Path(args.checkpoint).name]  # the label of its rows
    cuda = torch.cuda.is_available() if args.device is None else args.device.startswith("cuda")
    args.device = args.device or ("cuda" if cuda else "cpu")
    args.dtype = args.dtype or (["bfloat16"] if cuda else ["float32"])
    args.batch = args.batch or ([1, 8] if cuda else [1])
    args.queries = args.queries or ([16, 64, 256, 1024, 4096] if cuda else [16, 64, 256])
    have_tf = _have("transformers")
    rows = args.rows or list(DEFAULT_GPU_ROWS if cuda else DEFAULT_CPU_ROWS)
    rows = [] if rows == ["none"] else rows  # --rows none: only --compile-time / --merge-from
    bad = [r for r in rows if r not in ALL_ROWS]
    if bad:
        ap.error(f"unknown rows {bad}; choose from {', '.join(ALL_ROWS)}")
    if not cuda:  # no CUDA graphs on the CPU; compile rows only when asked for (Inductor on 2 cores is slow)
        rows = [r for r in rows if r not in GRAPH_ROWS]
    args.rows = [r for r in rows if have_tf or not r.startswith("dav2")]
    for d in args.dtype:
        if not isinstance(getattr(torch, d, None), torch.dtype):
            ap.error(f"unknown dtype {d}")
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = gpu_info(device)
    comp = compile_times(args, device) if args.compile_time else None
    results = []
    for other in args.merge_from or []:  # rows measured by an earlier run (ablation points, compile time)
        earlier = json.loads((Path(other) / "bench.json").read_text())
        results += earlier["results"]
        comp = comp or earlier.get("compile_time")
    done = {(r["preset"], r["dtype"], r["batch"], r["queries"], r["row"]) for r in results if "error" not in r}
    total = len(args.preset) * len(args.dtype) * len(args.batch) * len(args.queries) * len(args.rows)
    with tqdm(total=total, file=sys.stderr) as bar:
        for preset in args.preset:
            for dt in args.dtype:
                for b in args.batch:
                    results += run_group(preset, getattr(torch, dt), b, args.queries, args.rows, device, args, bar,
                                         done)
                    md, tgt = write_outputs(out, info, args, results, comp)  # partial results survive a kill
    if device.type == "cuda":
        info["clocks_after"] = gpu_info(device).get("nvidia_smi")
    md, tgt = write_outputs(out, info, args, results, comp)
    print(md)
    summary = dict(out=str(out), rows=len(results), gpu=info.get("gpu"), targets={k: v["met"] for k, v in tgt.items()},
                   failed=[f"{r['row']}@B{r['batch']}Q{r['queries']}" for r in results if "error" in r],
                   **{f"{r['row']}@B{r['batch']}Q{r['queries']}": round(r["median_ms"], 4) for r in results
                      if "error" not in r})
    print(json.dumps(summary))
    return dict(info=info, results=results, targets=tgt, compile_time=comp)


if __name__ == "__main__":
    main()
