"""The benchmark's CPU smoke run: outputs exist, the last stdout line is JSON, the numbers are sane."""
import json
import subprocess
import sys

from depthpack.bench.ladder import summary_checks
from depthpack.runtime.graphs import percentile


def test_bench_cpu_smoke(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "depthpack.bench", "--preset", "tiny", "--device", "cpu", "--queries", "8,100",
           "--seconds", "0.05", "--repeats", "2", "--sets", "2", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)  # a hang's guard, not a speed bound
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 10
    for name in ("bench.json", "bench.md", "bench.png"):
        assert (out / name).stat().st_size > 100, name
    report = json.loads((out / "bench.json").read_text())
    rows = {(r["row"], r["queries"]): r for r in report["results"]}
    assert set(rows) == {(n, q) for n in ("fast", "fast@frames", "dense-eager", "masked-eager", "packed-eager")
                         for q in (8, 100)}
    assert rows[("fast", 8)]["recipe"]["compile"] is False  # on a CPU the default is the eager reference
    for r in rows.values():
        assert 0 < r["median_ms"] <= r["p90_ms"] and r["calls"] >= 2 * 20 and r["gflop"] > 0
        assert abs(r["x_masked_eager"] * r["median_ms"] - rows[("masked-eager", r["queries"])]["median_ms"]) < 1e-9
    # packing spends fewer FLOPs than the masked path at few queries (tiny: 64 patches, bucket 8)
    assert rows[("packed-eager", 8)]["gflop"] < 0.5 * rows[("masked-eager", 8)]["gflop"]
    # beyond the largest bucket (64) the masked path runs once per chunk, like the packed path
    assert rows[("masked-eager", 100)]["gflop"] > rows[("masked-eager", 8)]["gflop"]
    assert "| tiny | float32 | 1 | 8 | packed-eager |" in (out / "bench.md").read_text()
    assert summary["default_over_best"]["tiny float32 B1 Q8"] >= 1.0


def test_p90_and_the_default_against_the_best_row():
    assert percentile(list(range(1, 11)), 0.9) == 9 and percentile([5.0], 0.9) == 5.0
    assert percentile(list(range(1, 101)), 0.5) == 50
    point = dict(preset="vits", dtype="bfloat16", batch=8, queries=512)
    res = [dict(point, row="fast", median_ms=1.0, gflop=10.0), dict(point, row="packed-compile+graph", median_ms=0.9,
                                                                    gflop=10.0),
           dict(point, row="masked-graph", median_ms=2.0, gflop=32.0), dict(point, row="dav2-graph", median_ms=0.1,
                                                                              gflop=1.0),
           dict(point, row="dense-fast", median_ms=2.4, back_to_back_ms=2.0, gflop=30.0),
           dict(point, row="fast@frames", median_ms=1.1, gflop=10.0)]
    c = summary_checks(res)
    b8 = c["vits bfloat16 B8 Q512"]
    assert b8["best_row"] == "packed-compile+graph" and abs(b8["default_over_best"] - 1.0 / 0.9) < 1e-9
    assert abs(b8["flop_realization"] - 2.4 / 3.0) < 1e-9  # the baselines are not packed rows
    assert "flop_realization_back_to_back" not in b8  # the default row has no back-to-back figure here
    assert c["vits bfloat16 B8 Q512 @frames"]["default_over_best"] == 1.0


def test_flop_count_is_the_same_with_the_gemm_epilogue():
    """The fused fc1 + bias + GELU GEMM counts as the GEMM it replaces (the profiler knows no formula)."""
    import torch

    from depthpack.bench.ladder import count_flops
    from depthpack.core.fast import Recipe
    from depthpack.core.model import create_model

    torch.manual_seed(0)
    model = create_model("tiny").eval()
    images, points = torch.rand(1, 3, 64, 64), torch.rand(1, 16, 2) * 63
    plain = count_flops(lambda: model.packed_core(images, points, 16))
    fused = count_flops(lambda: model.deployed(Recipe(gelu_epilogue=True)).packed_core(images, points, 16))
    assert plain > 0 and fused == plain


def test_rows_are_timed_round_robin_and_a_failing_row_drops_out_alone(monkeypatch):
    """Repeat r of every row runs before repeat r + 1 (drift falls on all rows alike); a row whose call raises
    keeps its error, and the other rows are still timed. A fake clock on which every call takes one tick (2^-10 s,
    exact in binary): a spell is then 3 warm-up + 1 probe + seconds / tick calls, on any machine under any load."""
    from types import SimpleNamespace

    import torch

    import depthpack.runtime.graphs as graphs
    from depthpack.bench.ladder import ROWS, Prepared, time_rows

    TICK = 2.0 ** -10
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(graphs, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    log = []

    def make(name, fail_after=None):
        def call(i):
            clock.now += TICK
            log.append(name)
            if fail_after is not None and log.count(name) > fail_after:
                raise RuntimeError("boom")
        return Prepared(ROWS["packed-eager"], call, 1, None, reps=[])

    per_spell = 3 + 1 + 25  # seconds = 25 ticks
    a, b, c = make("a"), make("b", fail_after=2 * per_spell), make("c")  # b fails in its second timed spell
    args = SimpleNamespace(sets=1, seconds=25 * TICK, repeats=3)
    time_rows([a, b, c], torch.device("cpu"), args)
    spells = [name for i, name in enumerate(log) if i == 0 or log[i - 1] != name]  # one entry per spell
    assert spells == ["a", "b", "c"] * 3 + ["a", "c"]  # the discarded spells a b c, then repeat 1: a b c, ...
    assert log.count("a") == log.count("c") == 4 * per_spell and log.count("b") == 2 * per_spell + 1
    assert [len(r) for r in a.reps + c.reps] == [25] * 6 and all(t == 1e3 * TICK for r in a.reps for t in r)
    assert isinstance(b.error, RuntimeError) and a.error is None and c.error is None
    assert len(b.reps[0]) == 25 and b.reps[1:] == [None, None]  # its later spells were not run


def test_the_kernel_count_runs_a_static_function_on_a_cameras_numpy_frames():
    """An @frames row's profiled function (the predictor's static function called directly) takes what the row
    times: numpy uint8 frames and numpy points from the host, copied to the device as predict copies them (it
    failed on a GPU: numpy has no .to); on a CPU, the same depths as predict."""
    import numpy as np
    import torch

    from depthpack import create_model
    from depthpack.bench.ladder import uncaptured
    from depthpack.core.fast import Recipe
    from depthpack.runtime.predictor import Predictor

    torch.manual_seed(0)
    pred = Predictor(create_model("tiny").eval(), device="cpu", recipe=Recipe(compile=True, backend="aot_eager"),
                     color="bgr")
    g = np.random.default_rng(0)
    frames, points = g.integers(0, 256, (1, 48, 80, 3), dtype=np.uint8), g.uniform(0, 47, (1, 12, 2)).astype(np.float32)
    pred.warmup(frame_size=(48, 80))
    got = uncaptured(pred, "frames", (48, 80))(frames, points)
    torch.testing.assert_close(got, pred.predict(frames, points), rtol=1e-5, atol=1e-5)
