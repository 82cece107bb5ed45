"""The roofline of one packed forward: each kernel's time, FLOPs and bytes, against the device's ceilings.

    python scripts/roofline.py --batch 8 --queries 512 --out DIR    # CUDA; DIR/roofline.{md,json}

The default Predictor's forward runs un-replayed under torch.profiler with the shapes recorded. Each
kernel is tied to the op that launched it (an aten op, or the Triton kernel Inductor launched with its
arguments), and gets:
    FLOPs   GEMMs (mm, addmm, _addmm_activation, bmm): 2 M N K; attention forwards: 2 B H Sq Sk (Dqk + Dv);
            everything else 0 (its arithmetic is not what bounds it)
    bytes   every tensor argument once, plus the output of a GEMM or attention (which the profiler does not
            list): the traffic of reading each input and writing each output once. A kernel that reads part
            of an argument (the patch gather reads the selected patches of the image) is over-counted:
            its GB/s is an upper bound there.
The ceilings are measured in the same process: a 1 GiB device-to-device copy (bytes read + written) and an
8192^3 bf16 GEMM. A kernel's floor is the larger of FLOPs / GEMM rate and bytes / copy rate; `roof` is
floor / measured time, the share of the ceiling that kernel reaches. Kernels repeat per block: rows group
the launches of one kernel at one shape, per forward. The JSON is the last line of stdout.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from gpu_profile import category

DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
               "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1}
GEMMS = ("aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::bmm")


def _numel(dims) -> int:
    return math.prod(dims) if isinstance(dims, list) and all(isinstance(d, int) for d in dims) else 0


def op_cost(name: str, dims: list, types: list) -> tuple[float, float]:
    """(FLOPs, bytes) of one launch of op `name` with the profiler's Input Dims and Input type."""
    sizes = [_numel(d) * DTYPE_BYTES.get(t, 0) for d, t in zip(dims, types)]
    nbytes = float(sum(sizes))
    tensors = [(d, t) for d, t in zip(dims, types) if isinstance(d, list) and d and t in DTYPE_BYTES]
    if name in GEMMS:
        mats = [i for i, (d, _) in enumerate(tensors) if len(d) == (3 if name == "aten::bmm" else 2)]
        if len(mats) >= 2:
            a, b = tensors[mats[0]][0], tensors[mats[1]][0]
            batch = a[0] if name == "aten::bmm" else 1
            m, k, n = a[-2], a[-1], b[-1]
            out_shape = [batch, m, n] if name == "aten::bmm" else [m, n]
            listed = any(d == out_shape for d, _ in tensors[mats[1] + 1:])  # Inductor's out= form lists the output
            out = 0 if listed else batch * m * n * DTYPE_BYTES.get(tensors[0][1], 2)
            return 2.0 * batch * m * n * k, nbytes + out
    if "attention" in name and len(tensors) >= 3:
        (q, tq), (k, _), (v, _) = tensors[:3]
        if len(q) == 4 and len(k) == 4 and len(v) == 4:  # [B,H,S,D]
            b, h, sq, dqk = q
            sk, dv = k[2], v[3]
            out = b * h * sq * dv * DTYPE_BYTES.get(tq, 2)
            return 2.0 * b * h * sq * sk * (dqk + dv), nbytes + out
    return 0.0, nbytes


def analyze(events: list[dict], calls: int, peak_tflops: float, peak_gb_s: float) -> dict:
    """Chrome-trace events of `calls` forwards -> the roofline: per kernel (name, op, shapes) per forward,
    per category, and the whole forward."""
    ops = {}
    for e in events:
        if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {}):
            ops.setdefault(e["args"]["External id"], e)
    groups: dict[tuple, dict] = defaultdict(lambda: dict(us=0.0, launches=0, flops=0.0, bytes=0.0))
    for e in events:
        if e.get("cat") != "kernel" or e["name"].lower().startswith(("memcpy", "memset")):
            continue
        op = ops.get(e.get("args", {}).get("External id"))
        op_name = op["name"] if op else ""
        dims = op["args"].get("Input Dims", []) if op else []
        types = op["args"].get("Input type", []) if op else []
        flops, nbytes = op_cost(op_name, dims, types)
        key = (e["name"], op_name if op_name != e["name"] else "", json.dumps(dims))
        g = groups[key]
        g["us"] += e["dur"]
        g["launches"] += 1
        g["flops"] += flops
        g["bytes"] += nbytes
    rows = []
    for (kernel, op_name, dims), g in groups.items():
        us, fl, by = g["us"] / calls, g["flops"] / calls, g["bytes"] / calls
        compute_us, memory_us = fl / (peak_tflops * 1e6), by / (peak_gb_s * 1e3)
        floor_us = max(compute_us, memory_us)
        rows.append(dict(kernel=kernel[:160], op=op_name, shapes=json.loads(dims), category=category(kernel),
                         launches=g["launches"] / calls, us=us, gflop=fl / 1e9, mb=by / 1e6,
                         tflops=fl / us / 1e6 if us else 0.0, gb_s=by / us / 1e3 if us else 0.0,
                         bound="compute" if compute_us >= memory_us else "memory",
                         floor_us=floor_us, roof=floor_us / us if us else 0.0))
    rows.sort(key=lambda r: -r["us"])
    busy = sum(r["us"] for r in rows)
    for r in rows:
        r["share"] = r["us"] / busy if busy else 0.0
    cats: dict[str, dict] = defaultdict(lambda: dict(us=0.0, floor_us=0.0, gflop=0.0, mb=0.0, launches=0.0))
    for r in rows:
        c = cats[r["category"]]
        for f in ("us", "floor_us", "gflop", "mb", "launches"):
            c[f] += r[f]
    categories = {k: dict(v, share=v["us"] / busy if busy else 0.0, roof=v["floor_us"] / v["us"] if v["us"] else 0.0)
                  for k, v in sorted(cats.items(), key=lambda kv: -kv[1]["us"])}
    floor = sum(r["floor_us"] for r in rows)
    return dict(kernels_per_forward=sum(r["launches"] for r in rows), busy_us=busy, floor_us=floor,
                gflop=sum(r["gflop"] for r in rows), mb=sum(r["mb"] for r in rows),
                roof=floor / busy if busy else 0.0, peak_tflops=peak_tflops, peak_gb_s=peak_gb_s,
                categories=categories, kernels=rows)


def ceilings(device) -> dict:
    """The device's copy bandwidth (GB/s, read + write) and bf16 GEMM rate (TFLOP/s), measured with events
    over back-to-back launches large enough that launch cost does not count."""
    import torch

    def timed(fn, n):
        for _ in range(3):
            fn()
        torch.cuda.synchronize(device)
        spells = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n):
                fn()
            b.record()
            torch.cuda.synchronize(device)
            spells.append(a.elapsed_time(b) / n)
        return statistics.median(spells)

    x = torch.empty(2**30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    copy_ms = timed(lambda: y.copy_(x), 5)
    del x, y
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    gemm_ms = timed(lambda: a @ b, 5)
    return dict(copy_gb_s=2 * 2**30 / copy_ms / 1e6, gemm_tflops=2 * 8192**3 / gemm_ms / 1e9)


def run(preset: str, batch: int, queries: int, calls: int = 5) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gpu_profile import model_and_inputs, warmed_and_timed

    dev = torch.device("cuda")
    model, images, points = model_and_inputs(preset, batch, queries)
    pred, bucket, latency, b2b = warmed_and_timed(model, images, points)  # the default Predictor
    with torch.inference_mode():
        for _ in range(3):
            pred.predict_uncaptured(images, points)
        torch.cuda.synchronize(dev)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for _ in range(calls):
                pred.predict_uncaptured(images, points)
            torch.cuda.synchronize(dev)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    peaks = ceilings(dev)
    report = analyze(events, calls, peaks["gemm_tflops"], peaks["copy_gb_s"])
    report.update(preset=preset, dtype=str(pred.dtype).replace("torch.", ""), batch=batch, queries=queries,
                  bucket=bucket, recipe=pred.recipe.describe(), ceilings=peaks, latency_ms=latency["median_ms"],
                  latency_p90_ms=latency["p90_ms"], back_to_back_ms=b2b["median_ms"], gpu=torch.cuda.get_device_name(),
                  torch=torch.__version__)
    return report


def markdown(r: dict, top: int = 24) -> str:
    c = r["ceilings"]
    lines = [f"# Roofline of the packed forward ({r['preset']} {r['dtype']}, batch {r['batch']}, {r['queries']} queries, "
             f"bucket {r['bucket']}, {r['gpu']})", "",
             f"Ceilings measured here: {c['gemm_tflops']:.0f} TFLOP/s (bf16 GEMM 8192^3), {c['copy_gb_s']:.0f} GB/s "
             f"(device copy, read + write). One call + sync {r['latency_ms']:.3f} ms, back-to-back "
             f"{r['back_to_back_ms']:.3f} ms; kernels busy {r['busy_us']:.1f} us per forward ({r['kernels_per_forward']:.0f} "
             f"kernels), their floor at the ceilings {r['floor_us']:.1f} us ({100 * r['roof']:.0f}% of the ceiling "
             f"overall); {r['gflop']:.1f} GFLOP, {r['mb']:.0f} MB.", "",
             "| category | us per forward | share | launches | GFLOP | MB | floor us | roof |", "|---|---|---|---|---|---|---|---|"]
    for k, v in r["categories"].items():
        lines.append(f"| {k} | {v['us']:.1f} | {100 * v['share']:.1f}% | {v['launches']:.0f} | {v['gflop']:.2f} | "
                     f"{v['mb']:.1f} | {v['floor_us']:.1f} | {100 * v['roof']:.0f}% |")
    lines += ["", "| kernel | op, first shapes | launches | us per forward | share | TFLOP/s | GB/s | bound | roof |",
              "|---|---|---|---|---|---|---|---|---|"]
    for k in r["kernels"][:top]:
        shapes = ", ".join("x".join(map(str, s)) for s in k["shapes"][:3] if isinstance(s, list) and s)
        lines.append(f"| `{k['kernel'][:64]}` | {k['op'] or '(Triton)'} {shapes} | {k['launches']:.0f} | {k['us']:.1f} | "
                     f"{100 * k['share']:.1f}% | {k['tflops']:.0f} | {k['gb_s']:.0f} | {k['bound']} | {100 * k['roof']:.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python scripts/roofline.py",
                                 description="per-kernel roofline of the default Predictor's packed forward (CUDA)")
    ap.add_argument("--preset", default="vits")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--queries", type=int, default=512)
    ap.add_argument("--out", default="bench_out")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("scripts/roofline.py needs a CUDA device")
    report = run(args.preset, args.batch, args.queries)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(report)
    from depthpack.core.files import atomic_write_json, atomic_write_text
    atomic_write_text(out / "roofline.md", md)
    atomic_write_json(out / "roofline.json", report)
    print(md)
    print(json.dumps({k: v for k, v in report.items() if k != "kernels"}))
    return report


if __name__ == "__main__":
    main()
