"""Where one CUDA package's compile time goes: the demo model (untrained), one bucket, compiled as the
exporter compiles it (weights outside, C++ runtime linked in) with extra Inductor settings, under
cProfile. Run each variant in its own process with its own cache folders (cold) to compare them:

    TORCHINDUCTOR_CACHE_DIR=/tmp/c1 TRITON_CACHE_DIR=/tmp/t1 python scripts/aoti_compile_probe.py \
        --configs '{"triton.autotune_pointwise": false}' --out probe.json

Prints (and writes) seconds, Inductor's own phase timers and cProfile's top functions by cumulative
time; the package itself goes to a temporary folder.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--configs", default="{}", help="extra Inductor settings, JSON")
    ap.add_argument("--out", default=None)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from depthpack.core.checkpoint import load_model
    from depthpack.demo import untrained_checkpoint
    from depthpack.deploy.package import compile_package, export_program

    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="aoti_probe_"))
    model = load_model(untrained_checkpoint(a.config, tmp / "ckpt")).to(a.device).eval()
    ep = export_program(model, a.bucket, 1, torch.device(a.device), torch.Generator().manual_seed(0))
    t_export = time.perf_counter() - t_start
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    compile_package(ep, tmp / "probe.pt2", json.loads(a.configs), static_cxx_runtime=True, weights_outside=True)
    prof.disable()
    seconds = time.perf_counter() - t0
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(a.top)
    try:
        from torch._dynamo.utils import compile_times
        phases = compile_times(repr="str")
    except Exception as e:  # the timer's API moves between torch versions
        phases = f"unavailable: {e}"
    r = {"configs": json.loads(a.configs), "bucket": a.bucket, "export_s": round(t_export, 2),
         "compile_s": round(seconds, 2), "torch": torch.__version__}
    print(json.dumps(r))
    print(phases)
    print(s.getvalue())
    if a.out:
        Path(a.out).write_text(json.dumps({**r, "phases": phases, "profile": s.getvalue()}, indent=1))


if __name__ == "__main__":
    main()
