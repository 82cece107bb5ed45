"""scripts/gpu_scale.sh end to end on the CPU at the tiny size (SCALE_SMOKE=1): the GPU run has one
chance, so every step of it (render + cache, throughput, train, evaluate) runs here first."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_scale_script_smoke(tmp_path):
    env = {**os.environ, "SCALE_SMOKE": "1", "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
           "PY": sys.executable, "EXTRA": "model.anchor_grid=3 seed=1"}  # overrides reach every step
    subprocess.run(["bash", "scripts/gpu_scale.sh"], cwd=ROOT, env=env, check=True, timeout=1500,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "out"
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["scale.log", "throughput.json", "train_summary.json", "train_log.csv", "eval.md",
                            "eval.json", "curve.png", "eval.png"])  # 8 files at most come back from the GPU
    thr = json.loads((out / "throughput.json").read_text())
    assert [r["batch_size"] for r in thr["runs"]] == [4, 8] and all(r["data_path"] == "device" for r in thr["runs"])
    assert {"model.anchor_grid=3", "seed=1"} <= set(thr["overrides"])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["throughput"]["data_path"] == "device" and summary["step"] == summary["steps"] > 0
    ev = json.loads((out / "eval.json").read_text())
    assert {r["queries"] for r in ev["rows"]} == {4, 16, 64} and ev["dense_map"] and ev["shares"]
    paths = ("packed", "masked", "dense", "packed@32", "packed@64")  # packed@K: --context 32 64 (SCALE_SMOKE)
    # the default layout's residual head corrects the glance depth: it has no answer with the anchors off
    assert {(r["path"], r["anchors"]) for r in ev["rows"]} == {(p, True) for p in paths}
    log = (out / "scale.log").read_text()
    assert "train exit 0" in log and "eval exit 0" in log
