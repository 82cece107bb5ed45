"""scripts/gpu_ab.sh end to end on the CPU at the tiny size: a packed run, a dense-trained equal-tokens
baseline at a smaller image size and an untrained layout's latency, every step the GPU call runs."""
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_ab_script_smoke(tmp_path):
    env = {**os.environ, "CFG": "configs/tiny.yaml", "STEPS": "2", "QUERIES": "4 16", "PY": sys.executable,
           "OUT": str(tmp_path / "out"), "RENDER_S": "10", "EVAL_S": "120", "LAT_Q": "16",
           "BENCH_ROWS": "fast,dense-eager",  # the CPU's rows: dense-graph needs CUDA
           "RUNS": "base:model.anchor_grid=2 small:model.img_size=[32,32]+model.buckets=[16]+train_path=dense",
           "LAYOUTS": "glance:model.context=glance+model.glance_grid=[2,2]+model.registers=4"}
    subprocess.run(["bash", "scripts/gpu_ab.sh"], cwd=ROOT, env=env, check=True, timeout=900,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = (tmp_path / "out" / "ab.log").read_text()
    for name in ("base", "small"):
        assert f"[{name}] eval exit 0" in log, log
    assert "[base] gap curve exit 0" in log and "[small] gap curve" not in log  # no packed path to compare
    for name in ("base", "small", "glance"):
        assert f"[{name}] bench exit 0" in log, log
    assert "| small | bfloat16 | 1 | 16 | dense-eager |" in log and "| small | bfloat16 | 1 | 16 | fast |" not in log
    assert "| glance | bfloat16 | 1 | 16 | fast |" in log
    with tarfile.open(tmp_path / "out" / "results.tgz") as t:
        names = t.getnames()
    assert {"./base/eval/eval.json", "./small/eval/eval.json", "./base/gap/gap.json"} <= set(names), names
