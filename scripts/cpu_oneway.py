"""One-way against shared glance stream on the CPU, call by call: B1 latency of the default Predictor (the CPU recipe)
for two models of the same weights that differ only in model.glance_stream, and of the one-way model with its chunks
run whole (recipe reference: the prefix again in every chunk), their calls interleaved in one process (the order
drawn afresh every round) so that a drift of the machine's speed lands on all; the median of each and of the paired
ratios. A second figure beside the benchmark's rows (scripts/cpu_oneway.sh), whose spells drift by 20-30% on a
shared 2-core machine.

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


def predictors(over: dict) -> dict[str, Predictor]:
    """The Predictors of one set of random weights: one-way and shared (the CPU recipe), and one-way with its chunks
    run whole (the reference recipe)."""
    models = {s: random_weights_(create_model("small", glance_stream=s, **over), seed=0).eval() for s in ("oneway", "shared")}
    models["shared"].load_state_dict(models["oneway"].state_dict())
    return {"oneway": Predictor(models["oneway"], device="cpu"), "shared": Predictor(models["shared"], device="cpu"),
            "oneway, chunks whole": Predictor(models["oneway"], device="cpu", recipe="reference")}


def interleaved(preds: dict[str, Predictor], q: int, rounds: int, g: torch.Generator) -> dict:
    """Per stream the median and p90 of `rounds` calls, the calls alternating in a random order each round."""
    h, w = preds["oneway"].image_size
    images, points = torch.rand(1, 3, h, w, generator=g), torch.rand(1, q, 2, generator=g) * torch.tensor([w - 1, h - 1])
    times: dict[str, list[float]] = {s: [] for s in preds}
    for _ in range(3):  # warm
        for p in preds.values():
            p.predict(images, points)
    for _ in range(rounds):
        order = [list(preds)[i] for i in torch.randperm(len(preds), generator=g)]
        for s in order:
            t0 = time.perf_counter()
            preds[s].predict(images, points)
            times[s].append(1e3 * (time.perf_counter() - t0))
    def ratio(other: str) -> float:
        return round(statistics.median(a / b for a, b in zip(times["oneway"], times[other])), 4)
    out = {s: {"median_ms": round(statistics.median(t), 4), "p90_ms": round(statistics.quantiles(t, n=10)[-1], 4)}
           for s, t in times.items()}
    return {**out, "oneway_over_shared": ratio("shared"), "oneway_over_chunks_whole": ratio("oneway, chunks whole"),
            "calls": rounds}


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
        preds = predictors(over)
        for q in a.queries:
            r = interleaved(preds, q, a.rounds if q <= 256 else max(20, a.rounds // 10), g)
            rows.append({"model": name, "queries": q, **r})
            print(f"{name} Q{q}: one-way {r['oneway']['median_ms']:.3f} ms, shared {r['shared']['median_ms']:.3f} ms "
                  f"(paired {r['oneway_over_shared']:.3f}); one-way, chunks whole {r['oneway, chunks whole']['median_ms']:.3f} "
                  f"ms (paired {r['oneway_over_chunks_whole']:.3f})", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    atomic_write_json(a.out, {"what": __doc__.split("\n\n")[0].replace("\n", " "), "info": {
        "cpu": f"{platform.machine()}, {torch.get_num_threads()} threads", "torch": torch.__version__, "commit": commit},
        "rows": rows})


if __name__ == "__main__":
    main()
