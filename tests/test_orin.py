"""The Jetson latency model (scripts/orin.py): its inventory counts the FLOPs the real model spends, its H200
calibration reproduces the committed measurements it was fitted to, its predictions move the right way, and its
command writes what it promises. CPU only, no network."""
import importlib.util
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from depthpack.core.config import model_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "orin.py"
_spec = importlib.util.spec_from_file_location("orin", SCRIPT)
orin = importlib.util.module_from_spec(_spec)
sys.modules["orin"] = orin  # dataclasses look their module up by name
_spec.loader.exec_module(orin)


@pytest.fixture(scope="module")
def h200():
    return orin.calibrate_h200(model_config("vits", **orin.LAYOUT))


def _counted(model, fn):
    """FLOPs of one call by torch's FlopCounterMode, attention through the math backend so that its two
    batched matmuls are counted: (total, GEMM-only)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        fn()
    ops = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    gemm = sum(v for k, v in ops.items() if k in ("aten.addmm", "aten.mm"))
    return fc.get_total_flops(), gemm


@pytest.mark.parametrize("preset,bucket,queries", [("tiny", 8, 5), ("tiny", 64, 64), ("vits", 256, 200)])
def test_packed_inventory_flops_equal_flop_counter(preset, bucket, queries):
    from depthpack.core.model import create_model

    torch.manual_seed(0)
    m = create_model(preset, **orin.LAYOUT).eval()
    cfg = m.cfg
    H, W = cfg.img_size
    images = torch.rand(1, 3, H, W)
    points = torch.rand(1, queries, 2) * torch.tensor([W - 1.0, H - 1.0])
    total, gemm = _counted(m, lambda: m.packed_core(images, points, bucket))
    inv = orin.packed_inventory(cfg, 1, bucket, queries)
    assert orin.total_flops(inv, ("gemm",)) == pytest.approx(gemm, rel=0.01)
    assert orin.total_flops(inv) == pytest.approx(total, rel=0.01)


def test_dense_inventory_flops_equal_flop_counter():
    from depthpack.core.model import create_model

    m = create_model("tiny", **orin.LAYOUT).eval()
    H, W = m.cfg.img_size
    points = torch.rand(2, 7, 2) * (H - 1)
    total, gemm = _counted(m, lambda: m.forward_dense(torch.rand(2, 3, H, W), points))
    inv = orin.dense_inventory(m.cfg, 2, 7)
    assert orin.total_flops(inv, ("gemm",)) == pytest.approx(gemm, rel=0.01)
    assert orin.total_flops(inv) == pytest.approx(total, rel=0.01)


def test_inventories_equal_the_benchmarks_gflop_and_kernel_counts():
    """Every committed H200 row's GFLOP (FlopCounterMode on the H200) and, for the graph rows, kernel count."""
    cfg = model_config("vits", **orin.LAYOUT)
    seen = 0
    for results in orin.h200_results().values():
        for r in results:
            b, q, row = r["batch"], r["queries"], r["row"]
            if q > cfg.buckets[-1] or row.startswith("masked"):
                continue
            form = "compiled" if "compile" in row else "eager"
            if row.startswith("packed"):
                k = orin._bucket(cfg, q)
                inv = orin.packed_inventory(cfg, b, k, k, form)
            elif row.startswith("dense"):
                inv = orin.dense_inventory(cfg, b, q, form)
            else:
                inv = orin.depth_anything_inventory(518, "v2", form, b)
            assert orin.total_flops(inv) / 1e9 == pytest.approx(r["gflop"], rel=0.005), (row, b, q)
            if row in ("packed-compile+graph", "packed-graph", "dense-graph", "dav2-graph", "dav2-compile+graph"):
                assert abs(orin.kernel_count(inv) - r["kernels"]) <= 1, (row, b, q)
            seen += 1
    assert seen > 40


def test_depth_anything_head_flops():
    """DA V2 Small = ViT-S (1370 tokens) + DPT head: 115.27 GFLOP at 518 (the bench's count of the HF model);
    the DA3 head is larger (dual fusion chain), and both scale with the image area."""
    v2 = orin.total_flops(orin.depth_anything_inventory(518, "v2")) / 1e9
    assert v2 == pytest.approx(115.27, rel=0.002)
    da3 = orin.total_flops(orin.depth_anything_inventory(518, "da3")) / 1e9
    da3_plain = orin.total_flops(orin.depth_anything_inventory(518, "da3", da3_aux=False)) / 1e9
    assert v2 < da3_plain < da3
    assert orin.total_flops(orin.depth_anything_inventory(308, "v1")) / 1e9 < v2 / 3


def test_calibration_reads_the_committed_results(tmp_path, monkeypatch):
    """Every fitted H200 point is one row of docs/results/h200_calibration.json, whose runs name the GPU, the torch
    and the commit; a results file that lacks a point is one clear error, not a silently smaller fit."""
    cal = json.loads(orin.CALIBRATION.read_text())
    assert cal["info"]["gpu"] == "NVIDIA H200" and cal["info"]["torch"].startswith("2.11")
    assert all(run["commit"] for run in cal["runs"].values())
    points = orin.h200_bench()
    assert [p[:3] + p[4:] for p in points] == [tuple(k) for k in orin.H200_BENCH]
    assert all(0.3 < ms < 5.0 for _, _, _, ms, _ in points)
    for prof in orin.h200_profiles():  # the busy time of a replay cannot exceed the replay
        assert sum(prof["categories_us"].values()) < 1e3 * prof["graph_replay_ms"]
    lacking = dict(cal, runs=dict(cal["runs"], targets=dict(cal["runs"]["targets"], results=[])))
    (tmp_path / "cal.json").write_text(json.dumps(lacking))
    monkeypatch.setattr(orin, "CALIBRATION", tmp_path / "cal.json")
    with pytest.raises(ValueError, match="run 'targets' has 0 rows packed-compile\\+graph B1 Q256"):
        orin.h200_bench()


def test_h200_calibration_reproduces_its_inputs(h200):
    params, errs = h200
    assert len(errs) >= 30
    rms = math.sqrt(sum(math.log(1 + e["error_pct"] / 100) ** 2 for e in errs) / len(errs))
    assert rms < 0.07, rms
    for e in errs:
        # whole forwards (graph replays) within 12%; a profiler category or kernel line within 20%
        limit = 20 if "busy" in e["id"] else 12
        assert abs(e["error_pct"]) <= limit, e
    assert 0 < params.gemm_eff <= 1 and 0 < params.mem_eff <= 1 and params.floor_gemm_us > params.launch_us


def test_fit_finds_the_same_optimum_from_elsewhere(h200):
    """The committed defaults sit near the optimum (to keep the CLI fast); a fit from a start 40% off lands on
    (about) the same loss."""
    params, errs = h200
    pts = orin.h200_points(model_config("vits", **orin.LAYOUT))
    start = replace(orin.Params(), **{n: getattr(orin.Params(), n) * (1.4 if i % 2 else 0.7)
                                      for i, n in enumerate(orin.FIT_NAMES) if n != "sharp"})
    p2 = orin.fit(pts, orin.DEVICES["h200"], start, orin.FIT_NAMES)
    loss = lambda p: sum(math.log(orin.predict_point(pt, orin.DEVICES["h200"], p) / pt.measured) ** 2 for pt in pts)
    assert loss(p2) <= 1.3 * loss(params) + 1e-3


def _corners(h200):
    params, _ = h200
    return {c: orin._target(params, e, orin.CORNERS[c]) for c, e in
            (("optimistic", 0.75), ("central", 0.62), ("pessimistic", 0.45))}


def test_more_queries_never_faster(h200):
    cfg = model_config("vits", **orin.LAYOUT)
    qs = [1, 16, 63, 64, 65, 200, 256, 257, 512, 700, 1024]
    for p in _corners(h200).values():
        for key in orin.TARGETS + ("h200",):
            dev = orin.DEVICES[key]
            for path in ("packed", "dense"):
                ms = [orin.predict(cfg, dev, p, path, q) for q in qs]
                assert all(b >= a for a, b in zip(ms, ms[1:])), (key, path, ms)
            b1, b8 = (orin.predict(cfg, dev, p, "packed", 256, batch) for batch in (1, 8))
            assert b8 > b1


def test_a_bigger_device_is_never_slower(h200):
    cfg = model_config("vits", **orin.LAYOUT)
    agx, nx, nano = (orin.DEVICES[k] for k in orin.TARGETS)
    bigger = replace(nano, key="nano_x2", sms=16, clock_ghz=1.3, peak_tflops=orin._orin_peak(16, 1.3), mem_gbs=204.8,
                     l2_mb=4.0)
    for p in _corners(h200).values():
        for path in ("packed", "dense"):
            for q in (16, 256, 1024):
                t = {d.key: orin.predict(cfg, d, p, path, q) for d in (agx, nx, nano, bigger)}
                assert t["agx_orin_64"] <= min(t["orin_nx_16"], t["orin_nano_super"]), t
                assert t["nano_x2"] <= t["orin_nano_super"], t
                # and any single resource more never hurts (more SMs of the same kind bring their tensor rate)
                for change in (dict(sms=16, peak_tflops=2 * nano.peak_tflops), dict(clock_ghz=1.2),
                               dict(mem_gbs=150.0), dict(l2_mb=8.0), dict(peak_tflops=30.0)):
                    assert orin.predict(cfg, replace(nano, **change), p, path, q) <= t["orin_nano_super"] + 1e-9


def test_orin_calibration_errors_are_reported(h200):
    params, _ = h200
    cal = orin.calibrate_orin(params)
    assert {pt["id"] for pt in cal["points"]} == {p["id"] for p in orin.PUBLISHED}
    for pt in cal["points"]:
        assert pt["predicted_ms"] > 0 and math.isfinite(pt["error_pct"])
        if pt["stack"] == "trt8.5":
            assert abs(pt["error_pct"]) < 25, pt
    st = cal["stacks"]
    assert 0.2 < st["trt10.3"]["target_eff"] < orin.EFF_MAX and st["trt10.3"]["host_ms"] >= 0
    assert st["trt8.5"]["target_eff"] < st["trt10.3"]["target_eff"]
    assert len(cal["cross_check"]["variants"]) == 2


def _profile_file(tmp_path):
    """The committed compile+graph profile as the measured-profile format that --profile reads."""
    p = orin.h200_profiles()[0]
    kernels = [dict(name=f"{c} kernels", us=us, launches=1.0, category=c) for c, us in p["categories_us"].items()]
    data = dict(kernels=kernels, kernels_per_call=121, graph_replay_ms=p["graph_replay_ms"], backend="compile+graph",
                preset="vits", batch=1, bucket=256, dtype="bfloat16", device="NVIDIA H200")
    f = tmp_path / "prof.json"
    f.write_text(json.dumps(data))
    return f


def test_profile_file_becomes_calibration_points(tmp_path):
    f = _profile_file(tmp_path)
    profs = orin.load_profiles([str(f)])
    assert profs[0]["categories_us"]["gemm"] == 234.7 and profs[0]["graph_replay_ms"] == 0.5024
    pts = orin.h200_points(model_config("vits", **orin.LAYOUT), profs)
    ids = [p.id for p in pts]
    assert any("gemm busy" in i for i in ids) and any("graph replay" in i for i in ids)
    assert len(pts) == len(orin.H200_BENCH) + 5  # 4 category groups + the replay (no kernel-line roles)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(kernels=[dict(name="x", us=1.0, launches=1, category="nope")], kernels_per_call=1,
                                   graph_replay_ms=0.1)))
    with pytest.raises(ValueError, match="unknown category"):
        orin.load_profiles([str(bad)])
    bad.write_text(json.dumps(dict(kernels=[])))
    with pytest.raises(ValueError, match="lacks"):
        orin.load_profiles([str(bad)])


def test_cli_writes_the_predictions_and_the_figure_and_ends_with_json(tmp_path):
    out = tmp_path / "orin.json"
    fig = tmp_path / "orin.png"
    p = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out), "--figure", str(fig), "--profile",
                        str(_profile_file(tmp_path))], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    last = json.loads(p.stdout.strip().splitlines()[-1])
    assert last["predicted_not_measured"] is True and last["goal_ms"] > 0
    assert last["band_ms"][0] <= last["goal_ms"] <= last["band_ms"][1]
    rep = json.loads(out.read_text())
    assert "nothing was measured on a Jetson" in rep["note"]
    assert rep["inputs"]["h200"]["gpu"] == "NVIDIA H200" and rep["inputs"]["profile"] == [str(_profile_file(tmp_path))]
    rows = rep["predictions"]
    assert {(r["device"], r["path"], r["queries"]) for r in rows} == \
        {(d, p_, q) for d in orin.TARGETS for p_ in ("packed", "dense") for q in orin.QUERIES}
    for r in rows:
        assert 0 < r["ms_low"] <= r["ms"] <= r["ms_high"], r
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < fig.stat().st_size < 200_000
