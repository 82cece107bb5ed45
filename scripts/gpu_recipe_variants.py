"""Recipe variants of the default Predictor's forward on the GPU, each timed as the benchmark does.

    OUT=DIR python3 scripts/gpu_recipe_variants.py [BxQ:variant,variant ...]   # default: 8x512:fast,no-fold
    OUT=DIR python3 scripts/gpu_recipe_variants.py 1x256:interleaved,fast,no-fold  # alternating spells

A variant is the fast recipe of its batch with one change (VARIANTS); each is compiled, captured and timed
(call + sync median and p90, back-to-back), its kernels counted and its output compared with the first
variant's of the same point; `interleaved` times the named variants in alternating spells instead. The
compiled dense forward is the benchmark's dense-fast row, a forward's per-kernel profile
scripts/roofline.py. Writes DIR/explore.json as it goes; BUDGET_S (default 420) skips what would start
after it. The figures of the runs so far are docs/results/h200_b8_variants.json.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import replace

import torch

from depthpack.bench.ladder import count_kernels
from depthpack.core.fast import fast_recipe
from depthpack.core.model import create_model
from depthpack.runtime.graphs import percentile, time_calls
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


COMBO = ("combo_kernels", True)
VARIANTS = {  # each: the fast recipe of the batch with these fields changed
    "fast": {},
    "no-fold": dict(fold_input=False),
    "no-gelu-epilogue": dict(gelu_epilogue=False),
    "no-combo": dict(inductor=()),
    "hybrid": dict(blocks="hybrid"),
    "timm": dict(blocks="timm"),
    "freezing": dict(inductor=(COMBO, ("freezing", True))),
    "cdt": dict(inductor=(COMBO, ("coordinate_descent_tuning", True))),
    "max-autotune": dict(inductor=(COMBO, ("max_autotune_gemm", True), ("max_autotune_gemm_backends", "CUBLAS,TRITON"))),
}


def inputs(B, Q, H, W, n=4):
    g = torch.Generator().manual_seed(Q)
    return [(torch.rand(B, 3, H, W, generator=g).to(dev),
             (torch.rand(B, Q, 2, generator=g) * torch.tensor([W - 1e-3, H - 1e-3])).to(dev)) for _ in range(n)]


def warmed(model, name: str, B: int, Q: int) -> Predictor:
    """The Predictor of variant `name` (the fast recipe of batch B with its changes), warmed for Q queries."""
    pred = Predictor(model, device=dev, dtype=torch.bfloat16, fast=replace(fast_recipe(dev, B), **VARIANTS[name]),
                     batch_size=B, validate=False)
    pred.warmup(buckets=(pred.bucket_for(Q),))
    return pred


def time_row(call, sets):
    time_calls(lambda i: call(*sets[i]), dev, len(sets), 0.25, sync_each=False)  # discarded: an idle GPU clocks down
    lat = time_calls(lambda i: call(*sets[i]), dev, len(sets), 0.4)
    lat += time_calls(lambda i: call(*sets[i]), dev, len(sets), 0.4)
    b2b = time_calls(lambda i: call(*sets[i]), dev, len(sets), 0.4, sync_each=False)
    return dict(median_ms=round(statistics.median(lat), 4), p90_ms=round(percentile(lat, 0.9), 4),
                b2b_ms=round(statistics.median(b2b), 4))


def variants(names, B=8, Q=512):
    torch.manual_seed(0)
    model = create_model("vits").eval()
    H, W = model.cfg.img_size
    sets = inputs(B, Q, H, W)
    ref = None  # the first variant's output
    for name in names:
        if time.time() > DEADLINE:
            log(f"variant_{name}_B{B}Q{Q}", dict(skipped="deadline"))
            continue
        try:
            t0 = time.time()
            pred = warmed(model, name, B, Q)
            compile_s = time.time() - t0
            with torch.inference_mode():
                out = pred.predict(*sets[0]).clone()
                ref = out if ref is None else ref
                row = time_row(pred.predict, sets)
                row.update(kernels=count_kernels(lambda: pred.predict_uncaptured(*sets[0]), dev),
                           compile_s=round(compile_s, 1), rel_err_vs_first=float((out - ref).norm() / ref.norm()))
            log(f"variant_{name}_B{B}Q{Q}", row)
            del pred
        except Exception as e:  # noqa: BLE001
            log(f"variant_{name}_B{B}Q{Q}", dict(error=f"{type(e).__name__}: {str(e)[:400]}"))


def interleaved(names, B, Q, rounds=6):
    """Two or more variants timed in alternating spells (A B A B ...), so that drift of the machine's state
    falls on all alike: per variant the median over rounds of each spell's call + sync and back-to-back medians."""
    torch.manual_seed(0)
    model = create_model("vits").eval()
    H, W = model.cfg.img_size
    sets = inputs(B, Q, H, W)
    preds = {name: warmed(model, name, B, Q) for name in names}
    spells = {n: dict(call=[], b2b=[]) for n in names}
    with torch.inference_mode():
        for _ in range(rounds):
            for n, pred in preds.items():
                row = time_row(pred.predict, sets)
                spells[n]["call"].append(row["median_ms"])
                spells[n]["b2b"].append(row["b2b_ms"])
    log(f"interleaved_B{B}Q{Q}", {n: dict(call_ms=statistics.median(v["call"]), b2b_ms=statistics.median(v["b2b"]),
                                          call_spells=v["call"], b2b_spells=v["b2b"]) for n, v in spells.items()})


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    log("device", dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       cudnn=torch.backends.cudnn.version()))
    from roofline import ceilings  # scripts/roofline.py, beside this script
    log("ceilings", ceilings(dev))
    for spec in sys.argv[1:] or ["8x512:fast,no-fold"]:
        point, names = spec.split(":")
        b, q = (int(v) for v in point.split("x"))
        names = names.split(",")
        if names[0] == "interleaved":
            interleaved(names[1:], b, q)
            continue
        variants(names, B=b, Q=q)
