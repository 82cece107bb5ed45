"""The benchmark's CPU smoke run: outputs exist, the last stdout line is JSON, the numbers are sane."""
import json
import subprocess
import sys

from depthpack.bench.ladder import targets
from depthpack.runtime.graphs import percentile


def test_bench_cpu_smoke(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "depthpack.bench", "--preset", "tiny", "--device", "cpu", "--queries", "8,100",
           "--seconds", "0.05", "--repeats", "2", "--sets", "2", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 6
    for name in ("bench.json", "bench.md", "bench.png"):
        assert (out / name).stat().st_size > 100, name
    report = json.loads((out / "bench.json").read_text())
    rows = {(r["row"], r["queries"]): r for r in report["results"]}
    assert set(rows) == {(n, q) for n in ("dense-eager", "masked-eager", "packed-eager") for q in (8, 100)}
    for r in rows.values():
        assert 0 < r["median_ms"] <= r["p90_ms"] and r["calls"] >= 2 * 20 and r["gflop"] > 0
        assert abs(r["x_masked_eager"] * r["median_ms"] - rows[("masked-eager", r["queries"])]["median_ms"]) < 1e-9
    # packing spends fewer FLOPs than the masked path at few queries (tiny: 64 patches, bucket 8)
    assert rows[("packed-eager", 8)]["gflop"] < 0.5 * rows[("masked-eager", 8)]["gflop"]
    # beyond the largest bucket (64) the masked path runs once per chunk, like the packed path
    assert rows[("masked-eager", 100)]["gflop"] > rows[("masked-eager", 8)]["gflop"]
    assert "| tiny | float32 | 1 | 8 | packed-eager |" in (out / "bench.md").read_text()
    # a later run merges these rows and measures only what is missing (here: nothing)
    merged = tmp_path / "merged"
    p = subprocess.run([sys.executable, "-m", "depthpack.bench", "--device", "cpu", "--rows", "none",
                        "--merge-from", str(out), "--out", str(merged)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    again = json.loads((merged / "bench.json").read_text())["results"]
    assert [(r["row"], r["queries"], r["median_ms"]) for r in again] == \
        [(r["row"], r["queries"], r["median_ms"]) for r in report["results"]]


def test_p90_and_targets():
    assert percentile(list(range(1, 11)), 0.9) == 9 and percentile([5.0], 0.9) == 5.0
    assert percentile(list(range(1, 101)), 0.5) == 50
    res = [dict(preset="vits", dtype="bfloat16", batch=1, queries=256, row="packed-compile+graph", median_ms=0.25,
                x_masked_eager=10.0, spread=0.01, gflop=1.0),
           dict(preset="vits", dtype="bfloat16", batch=8, queries=512, row="packed-graph", median_ms=1.0, gflop=10.0,
                spread=0.02),
           dict(preset="vits", dtype="bfloat16", batch=8, queries=512, row="masked-graph", median_ms=2.0, gflop=32.0,
                spread=0.07)]
    t = targets(res)
    assert t["b1_q256_compile_graph_ms"]["met"] and t["b1_q256_speedup_over_masked_eager"]["met"]
    assert abs(t["b8_q512_graph_speedup_over_flop_ratio"]["value"] - 2.0 / 3.2) < 1e-9
    assert not t["b8_q512_graph_speedup_over_flop_ratio"]["met"]
    assert not t["graph_run_to_run_spread_max"]["met"]


def test_flop_count_is_the_same_with_the_gemm_epilogue():
    """The fused fc1 + bias + GELU GEMM counts as the GEMM it replaces (the profiler knows no formula)."""
    import torch

    from depthpack.bench.ladder import count_flops
    from depthpack.core.model import create_model

    torch.manual_seed(0)
    model = create_model("tiny").eval()
    images, points = torch.rand(1, 3, 64, 64), torch.rand(1, 16, 2) * 63
    plain = count_flops(lambda: model.forward_packed(images, points, 16))
    fused = count_flops(lambda: model.set_switches(mlp_epilogue=True).forward_packed(images, points, 16))
    assert plain > 0 and fused == plain
