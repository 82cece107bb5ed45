"""A bag through the whole pipeline, as NYU goes: train a tiny model on it (data.kind=bag, cached rows),
evaluate packed / masked / dense against the bag's depth, and run the checkpoint over the bag."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_bag import write_bag

ROOT = Path(__file__).resolve().parents[2]
TOPICS = ["data.kind=bag", "data.image_topic=/cam/jpeg", "data.depth_topic=/depth/cd16", "data.split_block_s=1.0",
          "data.val_every=2", "data.split_gap_s=0.1"]


@pytest.mark.slow  # about 18 s on 2 shared cores
def test_train_evaluate_and_run_on_a_bag(tmp_path):
    from depthpack.bag import main as bag_main
    from depthpack.eval.evaluate import main as eval_main
    from depthpack.train.config import load_train_config
    from depthpack.train.loop import train

    bag = tmp_path / "rec"
    write_bag(bag, "mcap", n=40)  # 4 s at 10 fps: blocks of 1 s, every second one held out
    cfg = load_train_config(ROOT / "configs" / "tiny.yaml",
                            [f"out_dir={tmp_path / 'run'}", "eval_images=2", "steps=3", f"data.root={bag}",
                             "data.cache=true", *TOPICS])
    summary = train(cfg)
    assert summary["step"] == 3
    result = eval_main(["--checkpoint", str(tmp_path / "run"), "--queries", "16", "--max-images", "3",
                        "--figure-images", "0", "--no-progress", "--out", str(tmp_path / "eval")])
    rows = {(r["path"], r["anchors"], r["queries"]): r for r in result["rows"]}
    assert {p for p, _, _ in rows} == {"packed", "masked", "dense"}
    assert all(math.isfinite(r["abs_rel"]) for r in rows.values())
    assert bag_main(["run", str(bag), "--image-topic", "/cam/jpeg", "--depth-topic", "/depth/cd16", "--points",
                     "grid:4x4", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "out"),
                     "--no-progress"]) == 0
    assert (tmp_path / "out" / "metadata.yaml").is_file() and (tmp_path / "out.csv").is_file()
