"""One-way against shared glance stream on the CPU, call by call: B1 latency of the default Predictor (the CPU recipe)
for two models of the same weights that differ only in model.glance_stream, their calls interleaved in one process
(the order drawn afresh every round) so that a drift of the machine's speed lands on both; the median of each and of
the paired ratio. A second figure beside the benchmark's rows (scripts/cpu_oneway.sh), whose spells drift by 20-30%
on a shared 2-core machine.

    python scripts/cpu_oneway.py --out docs/results/cpu_oneway_ab.json
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time

import torch

from depthpack.core.files import atomic_write_json
from depthpack.core.model import create_model, random_weights_
from depthpack.runtime.predictor import Predictor

MODELS = {  # the demo's model and the CPU frontier's (configs/demo.yaml, configs/frontier_cpu.yaml)
    "demo 64x64": dict(img_size=(64, 64), buckets=(8, 16, 32, 64), max_depth=80.0, init_values=None),
    "frontier 128x128": dict(img_size=(128, 128), buckets=(16, 32, 64, 128, 256), glance_grid=(8, 8), max_depth=80.0,
                             init_values=None),
}


def pair(over: dict) -> dict[str, Predictor]:
    """The two Predictors (one-way, shared) of one set of random weights."""
    models = {s: random_weights_(create_model("small", glance_stream=s, **over), seed=0).eval() for s in ("oneway", "shared")}
    models["shared"].load_state_dict(models["oneway"].state_dict())
    return {s: Predictor(m, device="cpu") for s, m in models.items()}


def interleaved(preds: dict[str, Predictor], q: int, rounds: int, g: torch.Generator) -> dict:
    """Per stream the median and p90 of `rounds` calls, the calls alternating in a random order each round."""
    h, w = preds["oneway"].image_size
    images, points = torch.rand(1, 3, h, w, generator=g), torch.rand(1, q, 2, generator=g) * torch.tensor([w - 1, h - 1])
    times: dict[str, list[float]] = {s: [] for s in preds}
    for _ in range(3):  # warm
        for p in preds.values():
            p.predict(images, points)
    for _ in range(rounds):
        order = list(preds) if torch.rand((), generator=g) < 0.5 else list(reversed(preds))
        for s in order:
            t0 = time.perf_counter()
            preds[s].predict(images, points)
            times[s].append(1e3 * (time.perf_counter() - t0))
    ratio = [a / b for a, b in zip(times["oneway"], times["shared"])]
    out = {s: {"median_ms": round(statistics.median(t), 4), "p90_ms": round(statistics.quantiles(t, n=10)[-1], 4)}
           for s, t in times.items()}
    return {**out, "oneway_over_shared": round(statistics.median(ratio), 4), "calls": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/results/cpu_oneway_ab.json")
    ap.add_argument("--queries", type=int, nargs="+", default=[16, 64, 256, 2048])
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    rows = []
    for name, over in MODELS.items():
        preds = pair(over)
        for q in a.queries:
            r = interleaved(preds, q, a.rounds if q <= 256 else max(20, a.rounds // 10), g)
            rows.append({"model": name, "queries": q, **r})
            print(f"{name} Q{q}: one-way {r['oneway']['median_ms']:.3f} ms, shared {r['shared']['median_ms']:.3f} ms, "
                  f"paired ratio {r['oneway_over_shared']:.3f}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    atomic_write_json(a.out, {"what": __doc__.split("\n\n")[0].replace("\n", " "), "info": {
        "cpu": f"{platform.machine()}, {torch.get_num_threads()} threads", "torch": torch.__version__, "commit": commit},
        "rows": rows})


if __name__ == "__main__":
    main()
