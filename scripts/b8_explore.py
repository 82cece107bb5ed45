"""Exploration on the GPU: ceilings at the B8 Q512 shapes, recipe variants of the B8 forward, a profiler trace.

    OUT=DIR python3 scripts/b8_explore.py [variant ...]

Writes DIR/explore.json (every figure, as it comes) and DIR/trace_*.json (chrome traces with shapes).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

from depthpack.core.fast import Recipe, fast_recipe
from depthpack.core.model import create_model
from depthpack.runtime.graphs import capture, time_calls
from depthpack.runtime.predictor import Predictor

OUT = os.environ.get("OUT", "explore_out")
DEADLINE = time.time() + float(os.environ.get("BUDGET_S", "420"))
dev = torch.device("cuda")
results: dict = {}


def log(key, value):
    results[key] = value
    print(key, json.dumps(value), flush=True)
    with open(f"{OUT}/explore.json", "w") as f:
        json.dump(results, f, indent=1)


def loop_ms(fn, inner=20, outer=15) -> float:
    """Median over `outer` spells of `inner` back-to-back calls, per call (launch cost amortized)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    spells = []
    for _ in range(outer):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        torch.cuda.synchronize()
        spells.append(a.elapsed_time(b) / inner)
    return statistics.median(spells)


def ceilings():
    x = torch.empty(2**29, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms = loop_ms(lambda: y.copy_(x), inner=5, outer=10)
    log("copy_tb_s", 2 * x.numel() / ms / 1e9)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ms = loop_ms(lambda: a @ a, inner=5, outer=6)
    log("gemm8192_tflops", 2 * 8192**3 / ms / 1e9)
    del x, y, a
    for B, S in ((8, 577), (16, 321)):
        M = B * S
        x = torch.randn(M, 384, device=dev, dtype=torch.bfloat16)
        h = torch.randn(M, 1536, device=dev, dtype=torch.bfloat16)
        rows = {}
        for name, inp, n in (("qkv", x, 1152), ("proj", x, 384), ("fc1", x, 1536), ("fc2", h, 384)):
            w = torch.randn(n, inp.shape[1], device=dev, dtype=torch.bfloat16) * 0.05
            bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
            f = (lambda inp=inp, w=w, bias=bias: torch._addmm_activation(bias, inp, w.t(), use_gelu=True)) \
                if name == "fc1" else (lambda inp=inp, w=w, bias=bias: F.linear(inp, w, bias))
            ms = loop_ms(f)
            rows[name] = dict(us=round(ms * 1e3, 2), tflops=round(2 * M * inp.shape[1] * n / ms / 1e9, 1))
        ln = torch.nn.LayerNorm(384, eps=1e-6).to(dev, torch.bfloat16)
        ms = loop_ms(lambda: ln(x))
        rows["layernorm"] = dict(us=round(ms * 1e3, 2), gb_s=round(2 * x.numel() * 2 / ms / 1e6, 1))
        q, k, v = torch.randn(B, S, 3, 6, 64, device=dev, dtype=torch.bfloat16).permute(2, 0, 3, 1, 4).unbind(0)
        fl = 4 * B * 6 * S * S * 64
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                         ("cudnn_sdpa", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    ms = loop_ms(lambda: F.scaled_dot_product_attention(q, k, v))
                rows[name] = dict(us=round(ms * 1e3, 2), tflops=round(fl / ms / 1e9, 1))
            except Exception as e:  # noqa: BLE001
                rows[name] = dict(error=str(e)[:200])
        try:
            ms = loop_ms(lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False)[0])
            rows["cudnn_op"] = dict(us=round(ms * 1e3, 2), tflops=round(fl / ms / 1e9, 1))
        except Exception as e:  # noqa: BLE001
            rows["cudnn_op"] = dict(error=str(e)[:200])
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
            ms = loop_ms(lambda: flex(q, k, v))
            rows["flex"] = dict(us=round(ms * 1e3, 2), tflops=round(fl / ms / 1e9, 1))
        except Exception as e:  # noqa: BLE001
            rows["flex"] = dict(error=str(e)[:200])
        log(f"ops_B{B}_S{S}", rows)


VARIANTS = {
    "fast": {},
    "no-fold": dict(fold_input=False),
    "max-autotune": dict(inductor=(("combo_kernels", True), ("max_autotune_gemm", True),
                                   ("max_autotune_gemm_backends", "CUBLAS,TRITON"))),
}


def inputs(B, Q, H, W, n=4):
    g = torch.Generator().manual_seed(Q)
    return [(torch.rand(B, 3, H, W, generator=g).to(dev),
             (torch.rand(B, Q, 2, generator=g) * torch.tensor([W - 1e-3, H - 1e-3])).to(dev)) for _ in range(n)]


def kernels_of(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.lower().startswith(("memcpy", "memset")))


def time_row(call, sets):
    lat = time_calls(lambda i: call(*sets[i]), dev, len(sets), 0.4)
    lat += time_calls(lambda i: call(*sets[i]), dev, len(sets), 0.4)
    b2b = time_calls(lambda i: call(*sets[i]), dev, len(sets), 0.4, sync_each=False)
    return dict(median_ms=round(statistics.median(lat), 4), p90_ms=round(sorted(lat)[int(0.9 * len(lat))], 4),
                b2b_ms=round(statistics.median(b2b), 4))


def variants(names, B=8, Q=512):
    torch.manual_seed(0)
    model = create_model("vits").eval()
    H, W = model.cfg.img_size
    sets = inputs(B, Q, H, W)
    base = fast_recipe(dev, B)
    ref = None  # the first variant's output
    for name in names:
        if time.time() > DEADLINE:
            log(f"variant_{name}_B{B}Q{Q}", dict(skipped="deadline"))
            continue
        try:
            recipe = replace(base, **VARIANTS[name])
            t0 = time.time()
            pred = Predictor(model, device=dev, dtype=torch.bfloat16, fast=recipe, batch_size=B, validate=False)
            pred.warmup(buckets=(pred.bucket_for(Q),))
            compile_s = time.time() - t0
            with torch.inference_mode():
                out = pred.predict(*sets[0]).clone()
                ref = out if ref is None else ref
                row = time_row(pred.predict, sets)
                row.update(kernels=kernels_of(lambda: pred.predict_uncaptured(*sets[0])), compile_s=round(compile_s, 1),
                           rel_err_vs_first=float((out - ref).norm() / ref.norm()))
                if name in ("fast", "max-autotune") and B == 8:
                    trace(pred, sets[0], f"{name}_B{B}Q{Q}")
            log(f"variant_{name}_B{B}Q{Q}", row)
            del pred
        except Exception as e:  # noqa: BLE001
            log(f"variant_{name}_B{B}Q{Q}", dict(error=f"{type(e).__name__}: {str(e)[:400]}"))


def trace(pred, inp, tag):
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        pred.predict_uncaptured(*inp)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(3):
            pred.predict_uncaptured(*inp)
        torch.cuda.synchronize()
    prof.export_chrome_trace(f"{OUT}/trace_{tag}.json")


def dense(names, B=8):
    """The dense path compiled + CUDA graph, with the fast recipe's kernels (FLOP realization's other side)."""
    torch.manual_seed(0)
    model = create_model("vits").eval()
    H, W = model.cfg.img_size
    sets = inputs(B, 512, H, W)
    for name in names:
        if time.time() > DEADLINE:
            continue
        try:
            recipe = replace(fast_recipe(dev, B), **VARIANTS[name])
            m = model.deployed(recipe, dev, torch.bfloat16)
            fn = torch.compile(m.forward_dense_core, dynamic=False, fullgraph=True, options=dict(recipe.inductor))
            static = [sets[0][0].clone(), sets[0][1].clone()]
            with torch.inference_mode():
                graph, out = capture(lambda: fn(*static), device=dev)

                def call(im, pts):
                    static[0].copy_(im, non_blocking=True)
                    static[1].copy_(pts, non_blocking=True)
                    graph.replay()
                    return out
                row = time_row(call, sets)
            log(f"dense_{name}_B{B}", row)
        except Exception as e:  # noqa: BLE001
            log(f"dense_{name}_B{B}", dict(error=f"{type(e).__name__}: {str(e)[:400]}"))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    log("device", dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       cudnn=torch.backends.cudnn.version()))
    variants(["fast", "no-fold"], B=1, Q=256)
    variants(["fast", "no-fold"])
    variants(["max-autotune"])
