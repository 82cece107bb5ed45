"""Training throughput of a config: images/s with the data path included, and where a step's time goes.

    python scripts/train_throughput.py --config configs/scale.yaml --batch 16 64 --seconds 15 --out thr.json

For each batch size it runs the training loop itself (depthpack.train.train) for --seconds of steps
(max_time_s) into a scratch folder and reads the loop's own measurement (summary.json "throughput":
CUDA events around the batch preparation and around forward + backward + optimizer, warm-up steps and
each bucket's first step left out). The JSON is rewritten after every batch size, so a run stopped by
a time limit keeps what it measured. The last line of output is that JSON.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from depthpack.core.files import atomic_write_json
from depthpack.train.config import load_train_config
from depthpack.train.loop import train


def measure(config: str, overrides: list[str], batches: list[int], seconds: float, out: str | None,
            work: str | None = None) -> dict:
    work = Path(work or tempfile.mkdtemp(prefix="depthpack_thr_"))
    result: dict = {"config": config, "overrides": overrides, "seconds_each": seconds, "runs": [],
                    "torch": torch.__version__, "machine": platform.machine(),
                    "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    for b in batches:
        cfg = load_train_config(config, [*overrides, f"batch_size={b}", "steps=100000000", f"max_time_s={seconds}",
                                         f"out_dir={work / f'b{b}'}", "ckpt_every=100000000", "eval_every=0",
                                         "eval_images=1", "progress=false", "resume=false"])
        t0 = time.perf_counter()
        s = train(cfg)
        result["runs"].append({"steps": s["step"], "process_s": round(time.perf_counter() - t0, 1), **s["throughput"]})
        mcfg = cfg.model_config()
        result.update(img_size=list(mcfg.img_size), patches=mcfg.num_patches, embed_dim=mcfg.embed_dim, depth=mcfg.depth,
                      amp=cfg.amp and torch.cuda.is_available(), compile=cfg.compile, graph=cfg.graph)
        if out:
            atomic_write_json(out, result)
        print(json.dumps(result["runs"][-1]), flush=True)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python scripts/train_throughput.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    ap.add_argument("--batch", type=int, nargs="+", default=[16])
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of steps per batch size")
    ap.add_argument("--out", default=None, help="write the JSON here (after every batch size)")
    ap.add_argument("--work", default=None, help="scratch folder for the runs (default: a new temporary one)")
    a = ap.parse_args(argv)
    r = measure(a.config, a.overrides, a.batch, a.seconds, a.out, a.work)
    print(json.dumps(r))
    return r


if __name__ == "__main__":
    main()
