"""The frontier tool: a plan's runs trained, evaluated on the same images and band, rows and figure;
finished runs read, not trained again; costs that follow the buffer."""
import json
from pathlib import Path

import pytest

from depthpack.core.config import model_config
from depthpack.eval.frontier import dense_cost, load_plan, main, packed_cost

ROOT = Path(__file__).resolve().parents[2]


def write_plan(tmp_path: Path, runs: list[dict], **kw) -> Path:
    import yaml

    plan = {"base": str(ROOT / "configs" / "tiny.yaml"), "common": ["steps=2", "data.num_samples=8", "data.num_val=2"],
            "image": [64, 64], "queries": [8, 64], "band_radius": 8, "max_images": 2, "device": "cpu", "runs": runs, **kw}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def test_costs_follow_the_buffer():
    cfg = model_config("tiny")  # 64 patches, buckets 8..64
    t8, g8 = packed_cost(cfg, 8)
    t64, g64 = packed_cost(cfg, 64)
    assert t8 == cfg.num_prefix + 8 and t64 == cfg.num_prefix + 64 and g8 < g64
    assert dense_cost(cfg) == (t64, pytest.approx(g64))  # 64 slots hold every patch: the dense buffer
    shared = model_config("tiny", glance_stream="shared")
    assert packed_cost(shared, 100)[1] == pytest.approx(2 * packed_cost(shared, 64)[1])  # two chunks of 64
    assert packed_cost(cfg, 100)[1] < 2 * g64  # one-way (the default): the prefix runs once for both chunks


@pytest.mark.parametrize("runs, match", [
    ([{"name": "a", "path": "sparse"}], "path packed or dense"),
    ([{"name": "a", "path": "packed"}, {"name": "a", "path": "dense"}], "a name of its own"),
    ([{"name": "a", "path": "packed", "lever": 1}], "only"),
])
def test_bad_plans_are_refused(tmp_path, runs, match):
    with pytest.raises(ValueError, match=match):
        load_plan(write_plan(tmp_path, runs))


@pytest.mark.slow
def test_a_plan_trains_evaluates_and_reads_finished_runs(tmp_path):
    runs = [{"name": "packed default", "path": "packed", "default": True, "overrides": []},
            {"name": "dense 32x32", "path": "dense", "overrides": ["train_path=dense", "model.img_size=[32,32]",
                                                                   "model.buckets=[16]"]}]
    plan = write_plan(tmp_path, runs)
    args = ["--plan", str(plan), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "new" / "f.json"),
            "--figure", str(tmp_path / "f.png"), "--jobs", "2"]
    doc = main(args)
    rows = {(r["name"], r["path"], r["q"]): r for r in doc["rows"]}
    # the packed model: its packed sweep, its own dense path and its glance depth; the dense model: dense only
    assert set(rows) == {("packed default", p, q) for p in ("packed", "dense", "glance") for q in (8, 64)} | \
        {("dense 32x32", "dense", q) for q in (8, 64)}
    for r in doc["rows"]:
        assert 0 < r["absrel_uniform"] < 10 and 0 < r["absrel_edge"] < 10 and r["steps"] == 2 and r["device"]
        assert r["default"] == (r["name"] == "packed default" and r["path"] == "packed")
    assert rows[("dense 32x32", "dense", 8)]["image"] == "32x32" and rows[("dense 32x32", "dense", 8)]["patches"] == 16
    assert rows[("packed default", "packed", 8)]["encoder_gflop"] < rows[("packed default", "dense", 8)]["encoder_gflop"]
    assert (tmp_path / "f.png").stat().st_size > 0
    assert json.loads((tmp_path / "new" / "f.json").read_text()) == doc  # its folder made

    summary = tmp_path / "runs" / "packed_default" / "summary.json"
    before = summary.stat().st_mtime_ns
    again = main(args + ["--only", "packed default", "--no-train"])  # read, not trained; the other rows kept
    assert summary.stat().st_mtime_ns == before
    assert sorted(map(json.dumps, again["rows"])) == sorted(map(json.dumps, doc["rows"]))
    with pytest.raises(ValueError, match="not runs of"):
        main(args + ["--only", "nobody"])
