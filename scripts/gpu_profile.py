"""Where the time of one packed forward goes: torch.profiler over the compiled packed forward.

    python scripts/gpu_profile.py --preset vits --dtype bfloat16 --batch 1 --queries 256 --out DIR

For the default Predictor (the fast recipe) and the plain compiled forward (compile + graph without the
recipe's kernels), it runs the un-graphed forward under torch.profiler and reports kernels per forward,
GPU busy time per forward (sum of kernel
durations) by category (GEMM, attention, Triton fused, selection/topk, elementwise, other) and the top
kernels; then times the CUDA graph replay of the same forward. Busy time close to replay time means
the kernels themselves are the cost (count x small-matrix inefficiency); a gap means bubbles between
dependent kernels. Last, where the host time of one captured call + sync goes (host_split): the torch
ops and CUDA runtime calls the host makes per call, against the call's wall time. Writes
DIR/profile.md (the JSON is the last line of stdout).
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import torch

from depthpack.core.fast import Recipe
from depthpack.core.model import create_model
from depthpack.runtime.predictor import Predictor

RECIPES = {"fast": True, "compile+graph": Recipe(compile=True, graph=True)}  # the Predictor's fast= for each

CATEGORIES = [  # first match wins
    ("hybrid block (depthpack)", r"_attn_proj_kernel|_fc2_res_kernel"),
    ("attention", r"flash|fmha|attention|sdpa"),
    ("conv (anchors)", r"convolve|conv2d|implicit_gemm"),
    ("gemm", r"gemm|cutlass|sm90|nvjet|cublas|matmul|\bmm\b|_mm_|splitk|xmma"),
    ("select/topk", r"topk|sort|radix|scatter|max_pool"),
    ("triton fused", r"^triton_"),
    ("layernorm/elementwise", r"layer_norm|norm|elementwise|vectorized|reduce|gelu|add|mul|copy|cat|fill|gather|index"),
]


def category(name: str) -> str:
    low = name.lower()
    for cat, pat in CATEGORIES:
        if re.search(pat, low):
            return cat
    return "other"


def profile_forward(fn, calls: int = 20) -> dict:
    """Kernels of `calls` calls of fn under torch.profiler -> per-call count, busy time, categories, top."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_name: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.lower().startswith(("memcpy", "memset")):
            per_name[e.name].append(e.device_time)
    cats: dict[str, float] = defaultdict(float)
    for name, ts in per_name.items():
        cats[category(name)] += sum(ts) / calls
    every = sorted(((sum(ts) / calls, len(ts) / calls, name) for name, ts in per_name.items()), reverse=True)
    return dict(kernels_per_call=sum(len(ts) for ts in per_name.values()) / calls,
                busy_us_per_call=sum(sum(ts) for ts in per_name.values()) / calls,
                categories_us={k: round(v, 2) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
                top=[dict(us_per_call=round(t, 2), per_call=c, name=n[:120]) for t, c, n in every[:15]],
                kernels=[dict(name=n[:200], us=round(t, 3), launches=c, category=category(n)) for t, c, n in every])


def host_split(fn, calls: int = 50) -> dict:
    """The host side of `calls` calls of fn, each followed by a device sync, under torch.profiler's CPU
    activity: per call, the wall time and the self time of each torch op and CUDA runtime call (what the
    host does besides waiting: the profiler's own cost inflates these a little)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    rows = sorted(((e.self_cpu_time_total / calls, e.count / calls, e.key) for e in prof.key_averages()), reverse=True)
    return dict(wall_us_per_call=round(1e6 * wall / calls, 1),
                host_top=[dict(us_per_call=round(t, 2), per_call=round(c, 2), name=n[:100]) for t, c, n in rows[:14]])


def model_and_inputs(preset: str, batch: int, queries: int):
    """The preset's model (seeded random weights: time does not depend on them) and one seeded input set on
    the GPU: (model, images [B,3,H,W], points [B,Q,2])."""
    torch.manual_seed(0)
    model = create_model(preset).eval()
    H, W = model.cfg.img_size
    g = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 3, H, W, generator=g).cuda()
    points = (torch.rand(batch, queries, 2, generator=g) * torch.tensor([W - 1e-3, H - 1e-3])).cuda()
    return model, images, points


def warmed_and_timed(model, images, points, **predictor) -> tuple[Predictor, int, dict, dict]:
    """A Predictor (keyword arguments: its own) warmed for the inputs' bucket, then timed before any profiler
    has been active in its life: (predictor, bucket, call + sync summary, back-to-back summary)."""
    from depthpack.runtime.graphs import summarize, time_calls

    batch, queries = points.shape[:2]
    pred = Predictor(model, device="cuda", batch_size=batch, validate=False, **predictor)
    bucket = pred.bucket_for(queries)
    pred.warmup(buckets=(bucket,))
    dev = torch.device("cuda")
    with torch.inference_mode():
        latency = summarize(time_calls(lambda i: pred.predict(images, points), dev, seconds=0.5))
        back_to_back = summarize(time_calls(lambda i: pred.predict(images, points), dev, seconds=0.5, sync_each=False))
    return pred, bucket, latency, back_to_back


def run(preset: str, dtype: torch.dtype, batch: int, queries: int, recipes=tuple(RECIPES)) -> dict:
    """For each recipe: the kernels of one un-replayed forward (Predictor.predict_uncaptured) under the
    profiler, the latency of the captured one, and the host side of a call."""
    report = dict(preset=preset, dtype=str(dtype).replace("torch.", ""), batch=batch, queries=queries, recipes={})
    model, images, points = model_and_inputs(preset, batch, queries)
    for name in recipes:
        pred, bucket, latency, back_to_back = warmed_and_timed(model, images, points, dtype=dtype, fast=RECIPES[name])
        with torch.inference_mode():
            prof = profile_forward(lambda: pred.predict_uncaptured(images, points))
            prof["host"] = host_split(lambda: pred.predict(images, points))
        prof.update(bucket=bucket, recipe=pred.recipe.describe(), graph_replay_ms=back_to_back["median_ms"],
                    latency_ms=latency["median_ms"])
        report["recipes"][name] = prof
    return report


def markdown(report: dict) -> str:
    r = report
    lines = [f"# Profile of the packed forward ({r['preset']} {r['dtype']}, batch {r['batch']}, {r['queries']} "
             f"queries)", ""]
    for name, p in r["recipes"].items():
        lines += [f"## {name} (bucket {p['bucket']})", "",
                  f"{p['kernels_per_call']:.0f} kernels per forward, GPU busy {p['busy_us_per_call']:.1f} us per "
                  f"forward under the profiler; predict with graph replay {1e3 * p['graph_replay_ms']:.1f} us "
                  f"back-to-back, {1e3 * p['latency_ms']:.1f} us as one call + sync", "",
                  "| category | us per forward |", "|---|---|"]
        lines += [f"| {c} | {v:.1f} |" for c, v in p["categories_us"].items()]
        lines += ["", "| us per forward | launches per forward | kernel |", "|---|---|---|"]
        lines += [f"| {t['us_per_call']:.1f} | {t['per_call']:.0f} | `{t['name']}` |" for t in p["top"]]
        if "host" in p:
            lines += ["", f"Host side of one captured call + sync under the profiler: {p['host']['wall_us_per_call']:.1f} "
                      "us wall per call", "", "| host us per call (self) | calls per call | op or runtime call |", "|---|---|---|"]
            lines += [f"| {t['us_per_call']:.1f} | {t['per_call']:.2f} | `{t['name']}` |" for t in p["host"]["host_top"]]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python scripts/gpu_profile.py", description="profile the packed forward (CUDA)")
    ap.add_argument("--preset", default="vits")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--recipes", default=",".join(RECIPES), help=f"comma list of {', '.join(RECIPES)}")
    ap.add_argument("--out", default="bench_out")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("scripts/gpu_profile.py needs a CUDA device")
    recipes = [r for r in args.recipes.split(",") if r]
    if not recipes or set(recipes) - set(RECIPES):
        raise SystemExit(f"--recipes {args.recipes!r}: choose from {', '.join(RECIPES)}")
    report = run(args.preset, getattr(torch, args.dtype), args.batch, args.queries, recipes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(report)
    (out / "profile.md").write_text(md)
    flat = [dict(p, recipe_name=name, preset=report["preset"], batch=report["batch"], dtype=report["dtype"],
                 device=torch.cuda.get_device_name()) for name, p in report["recipes"].items()]
    (out / "profile.json").write_text(json.dumps(flat, indent=1))
    print(md)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
