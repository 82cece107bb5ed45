"""The synthetic renderer's speed: scenes per second at a size and batch, on the CPU or a GPU.

    python scripts/render_bench.py --size 64 64 --batch 64 --threads 1           # the demo's size, one core
    python scripts/render_bench.py --size 420 560 --batch 64 --device cuda       # the scale runs' size

Each batch is timed whole (draw the scenes on the host, pack them, cast and shade on the device,
synchronized) and in its parts; the median over --repeats batches of fresh scenes is reported. The
last line of output is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from depthpack.data import raycast
from depthpack.data.synthetic import NO_FAMILIES, Families, draw


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_batch(seed: int, start: int, batch: int, size, scene: str, rig: str, families, device: str) -> dict:
    t0 = time.perf_counter()
    drawn = [draw(seed, i, size, scene, "train", rig, families)[:2] for i in range(start, start + batch)]
    t1 = time.perf_counter()
    b = raycast.pack(drawn, device)
    sync(device)
    t2 = time.perf_counter()
    raycast.cast_and_shade(b, *size)
    sync(device)
    t3 = time.perf_counter()
    return {"draw_ms": 1e3 * (t1 - t0), "pack_ms": 1e3 * (t2 - t1), "render_ms": 1e3 * (t3 - t2), "total_ms": 1e3 * (t3 - t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, nargs=2, default=(64, 64), metavar=("H", "W"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scenes", nargs="+", default=["indoor", "outdoor", "mixed"], choices=("indoor", "outdoor", "mixed"))
    ap.add_argument("--rig", default="fixed", choices=("fixed", "varied", "lens"))
    ap.add_argument("--no-families", action="store_true", help="the rooms and streets alone")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    families = NO_FAMILIES if a.no_families else Families()
    size = tuple(a.size)
    rows = {}
    for scene in a.scenes:
        time_batch(0, 10_000_000, a.batch, size, scene, a.rig, families, a.device)  # warm-up
        runs = [time_batch(0, r * a.batch, a.batch, size, scene, a.rig, families, a.device) for r in range(a.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows[scene] = {**{k: round(v / a.batch, 3) for k, v in med.items()},
                       "scenes_per_s": round(1e3 * a.batch / med["total_ms"], 1)}
        print(f"{scene}: {rows[scene]['total_ms']:.2f} ms/scene ({rows[scene]['scenes_per_s']:.0f} scenes/s): draw "
              f"{rows[scene]['draw_ms']:.2f}, pack {rows[scene]['pack_ms']:.2f}, cast + shade {rows[scene]['render_ms']:.2f}",
              flush=True)
    device = torch.cuda.get_device_name(a.device) if a.device.startswith("cuda") else platform.processor() or platform.machine()
    print(json.dumps({"size": list(size), "batch": a.batch, "rig": a.rig, "families": not a.no_families,
                      "device": device, "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "load_avg_1min": round(os.getloadavg()[0], 2), "per_scene_ms": rows}))


if __name__ == "__main__":
    main()
