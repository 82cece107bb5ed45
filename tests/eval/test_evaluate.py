"""Accuracy evaluation: the table of packed / masked / dense rows, the best constant, determinism."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from depthpack.train import load_train_config
from depthpack.eval.evaluate import METRICS, best_constant, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from depthpack.train import train

    out = tmp_path_factory.mktemp("evalrun")
    train(load_train_config(ROOT / "configs" / "tiny.yaml", [f"out_dir={out}", "steps=3", "eval_images=2"]))
    return out


def test_best_constant_is_the_true_optimum():
    g = torch.Generator().manual_seed(0)
    targets = [torch.rand(n, generator=g) * 9 + 0.5 for n in (5, 17, 40)]

    def abs_rel(c):  # per image, then averaged: the reported AbsRel
        return sum(float(((c - t).abs() / t).mean()) for t in targets) / len(targets)

    c = best_constant(targets)
    grid = torch.linspace(0.5, 9.5, 9001)
    assert abs_rel(c) <= min(abs_rel(float(x)) for x in grid) + 1e-9
    assert abs_rel(c) < abs_rel(float(torch.cat(targets).median())) + 1e-12


def test_evaluate_writes_the_table_and_is_deterministic(run_dir, tmp_path):
    args = ["--checkpoint", str(run_dir), "--queries", "8", "32", "100", "--max-images", "3", "--batch-size", "2",
            "--figure-images", "1", "--no-progress"]
    r1 = main(args + ["--out", str(tmp_path / "a")])
    r2 = main(args + ["--out", str(tmp_path / "b"), "--figure-images", "0"])
    for name in ("eval.md", "eval.json", "eval.png"):
        assert (tmp_path / "a" / name).stat().st_size > 0
    md = (tmp_path / "a" / "eval.md").read_text()
    assert all(f"| {p} | on |" in md for p in ("packed", "masked", "dense")) and "| constant" in md
    # the residual head corrects the glance depth: the default model has no answer without its anchors,
    # so --anchors both runs them on alone
    assert "| off |" not in md
    rows = {(r["path"], r["anchors"], r["queries"]): r for r in r1["rows"]}
    assert len(rows) == 3 * 1 * 3 and all(r["images"] == 3 for r in rows.values())
    for a in (True,):
        for q in (8, 32, 100):
            packed, masked = rows[("packed", a, q)], rows[("masked", a, q)]
            for k in METRICS:  # the same function computed two ways
                assert packed[k] == pytest.approx(masked[k], rel=1e-4, abs=1e-5), (a, q, k)
    # Q=100 > the largest bucket (64 = every patch of the tiny model): chunks of all 64 patches == dense
    assert rows[("packed", True, 100)]["abs_rel"] == pytest.approx(rows[("dense", True, 100)]["abs_rel"], rel=1e-4)
    const = {c["queries"]: c for c in r1["constant"]}
    assert set(const) == {8, 32, 100} and all(c["constant_m"] > 0 for c in const.values())
    assert json.loads((tmp_path / "a" / "eval.json").read_text())["rows"] == r1["rows"] == r2["rows"]


def test_data_option_accepts_a_training_yaml_and_overrides(run_dir, tmp_path):
    from depthpack.eval.evaluate import data_config

    y = tmp_path / "d.yaml"
    y.write_text("data: {scene: outdoor, num_val: 3}\n")
    d = data_config(run_dir, str(y), ["data.seed=4"])
    assert (d.scene, d.num_val, d.seed) == ("outdoor", 3, 4)
    assert data_config(run_dir, None, []).num_val == 4  # the checkpoint's own data (tiny.yaml)
    with pytest.raises(ValueError, match="data.KEY=VALUE"):
        data_config(run_dir, None, ["seed=1"])
    with pytest.raises(ValueError, match="unknown DataConfig"):
        data_config(run_dir, None, ["data.nope=1"])


def test_dense_map_and_curve_options(run_dir, tmp_path):
    from depthpack.core.checkpoint import load_model
    from depthpack.data import make_dataset
    from depthpack.eval.metrics import MetricAccumulator
    from depthpack.eval.evaluate import data_config

    args = ["--checkpoint", str(run_dir), "--queries", "8", "16", "100", "--max-images", "3", "--batch-size", "2",
            "--figure-images", "0", "--no-progress", "--anchors", "on"]
    plain = main(args + ["--out", str(tmp_path / "plain")])
    assert "dense_map" not in plain and "shares" not in plain  # the defaults are unchanged
    assert "Dense map" not in (tmp_path / "plain" / "eval.md").read_text()
    r = main(args + ["--out", str(tmp_path / "x"), "--dense-map", "--curve", "--context", "32", "64"])
    assert [x for x in r["rows"] if "@" not in x["path"]] == plain["rows"]
    rows = {(x["path"], x["queries"]): x["abs_rel"] for x in r["rows"]}
    assert set(p for p, _ in rows) == {"packed", "masked", "dense", "packed@32", "packed@64"}
    assert ("packed@32", 100) not in rows  # only buffers larger than the Q's own bucket
    assert rows[("packed@64", 8)] == pytest.approx(rows[("dense", 8)], rel=1e-5)  # 64 slots: every patch
    assert (tmp_path / "x" / "curve.png").stat().st_size > 0
    md = (tmp_path / "x" / "eval.md").read_text()
    assert "| dense map | on |" in md and "| Q | buffer share |" in md
    shares = {e["queries"]: e for e in r["shares"]}
    # tiny: 64 patches, buckets 8..64; Q=100 runs two chunks (64 + 64 slots: 200% of the dense path's patches)
    assert [shares[q]["buffer_share"] for q in (8, 16, 100)] == [8 / 64, 16 / 64, 128 / 64]
    assert 0 < shares[8]["queried_share"] <= 8 / 64 and shares[100]["tokens_dense"] == 1 + 16 + 64
    # the dense map's AbsRel: every valid pixel of each image, computed here independently
    model = load_model(run_dir)
    ds = make_dataset(data_config(run_dir, None, []), "val", model.cfg.img_size, model.cfg.min_depth, model.cfg.max_depth)
    acc = MetricAccumulator()
    for i in range(3):
        s = ds[i]
        with torch.no_grad():
            pred = model.forward_dense(s["image"][None])[0]
        m = s["valid"] & s["eval_mask"]
        acc.update(pred[m], s["depth"][m])
    assert r["dense_map"][0]["abs_rel"] == pytest.approx(acc.compute()["abs_rel"], rel=1e-5)
    assert r["focal"]["mode"] == "data" and r["focal"]["images_with_focal"] == 3


def test_curve_with_an_empty_edge_band_says_nothing(run_dir, tmp_path):
    """No image has a depth-edge band (no neighbour ratio above 100): the curve has no rows to plot, and is
    drawn without a warning (matplotlib's legend warned that it had no labels)."""
    import warnings

    args = ["--checkpoint", str(run_dir), "--queries", "8", "--max-images", "2", "--figure-images", "0", "--no-progress",
            "--points", "edge", "--band-threshold", "100", "--curve", "--out", str(tmp_path / "x")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = main(args)
    assert r["bands"]["edge"]["rows"] == [] and r["bands"]["edge"]["skipped_images"] == 2
    assert (tmp_path / "x" / "curve.png").read_bytes().startswith(b"\x89PNG")


def test_scenes_of_another_size_run_the_model_at_its_own(run_dir, tmp_path):
    """--image-size: the held-out images at 96x96 are resized to the tiny model's 64x64 and their points
    scaled; the answers equal the model's on images resized by hand."""
    from depthpack.core.checkpoint import load_model
    from depthpack.eval.evaluate import run_path, to_model_size

    r = main(["--checkpoint", str(run_dir), "--queries", "16", "--max-images", "2", "--figure-images", "1",
              "--image-size", "96x96", "--paths", "packed", "dense", "--dense-map", "--no-progress",
              "--out", str(tmp_path / "e")])
    assert r["image_size"] == [96, 96] and all(row["images"] == 2 for row in r["rows"])
    model = load_model(run_dir)
    g = torch.Generator().manual_seed(0)
    images, points = torch.rand(2, 3, 96, 96, generator=g), torch.rand(2, 9, 2, generator=g) * 95.9
    small, spts, _ = to_model_size(model, images, points)
    assert small.shape[-2:] == (64, 64) and float(spts.max()) < 64
    torch.testing.assert_close(run_path(model, "packed", images, points), run_path(model, "packed", small, spts))


def test_resizing_to_the_model_keeps_images_in_range():
    """The antialiased filter's weights sum to 1 only up to rounding: a white image came out a hair past 1
    (420x560 -> 252x336 on the GPU, 480x640 -> 252x336 here), which the model's input check refuses; the
    resize keeps [0, 1] and changes nothing else."""
    from types import SimpleNamespace

    from depthpack.core.preprocess import to_model_size

    images = torch.rand(2, 3, 480, 640, generator=torch.Generator().manual_seed(0))
    images[0] = 1.0  # a white frame
    model = SimpleNamespace(cfg=SimpleNamespace(img_size=(252, 336)))
    raw = torch.nn.functional.interpolate(images, size=(252, 336), mode="bilinear", align_corners=False, antialias=True)
    assert float(raw.max()) > 1.0  # what the filter alone gives
    out, _, _ = to_model_size(model, images)
    assert out.shape == (2, 3, 252, 336) and 0.0 <= float(out.min()) and float(out.max()) <= 1.0
    torch.testing.assert_close(out, raw, rtol=0, atol=1e-6)
