"""python -m depthpack.data: benchmark the synthetic renderer (one thread); optionally save a figure
or write synthetic samples to disk in the generic folder format (rgb/NAME.png + depth/NAME.png).

The last line of output is JSON: per scene kind, the median / max wall time and the median CPU time
per image (each scene rendered 3 times, fastest kept).
"""
import argparse
import json
import os
import platform

from . import DataConfig, make_dataset, write_folder_sample
from .synthetic import benchmark, figure

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--n", type=int, default=20, help="scenes per kind")
ap.add_argument("--size", type=int, nargs=2, default=(256, 256), metavar=("H", "W"))
ap.add_argument("--figure", default=None, help="write a PNG of sample scenes here")
ap.add_argument("--write", default=None, metavar="DIR", help="write --count synthetic samples here and exit")
ap.add_argument("--count", type=int, default=16)
ap.add_argument("--scene", default="mixed", choices=("indoor", "outdoor", "mixed"))
ap.add_argument("--depth-scale", type=float, default=256.0, help="uint16 per meter (256 keeps 0-255 m)")
args = ap.parse_args()
if args.write:
    from tqdm import tqdm

    ds = make_dataset(DataConfig(scene=args.scene, num_samples=args.count), "train", tuple(args.size), 1e-3, 250.0)
    for i in tqdm(range(args.count), desc="writing"):
        write_folder_sample(ds[i], args.write, f"{i:06d}", args.depth_scale)
    print(f"wrote {args.count} samples to {args.write} (read with DataConfig(kind='folder', root=..., "
          f"depth_scale={args.depth_scale}))")
    raise SystemExit(0)
if args.figure:
    figure(args.figure)
    print(f"wrote {args.figure}")
res = benchmark(args.n, tuple(args.size))
print(json.dumps({"size": list(args.size), "scenes": args.n, "machine": platform.machine(),
                  "threads": os.environ.get("OMP_NUM_THREADS", "default"),
                  "load_avg_1min": round(os.getloadavg()[0], 2), **res}))
