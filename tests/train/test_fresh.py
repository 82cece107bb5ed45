"""data.fresh: every training step renders new scenes on the training device from (seed, step, rank):
a tiny run trains on the CPU, ranks draw disjoint scenes, a resumed run continues the same stream."""
from __future__ import annotations

import pytest
import torch

from depthpack.data import DataConfig
from depthpack.data.synthetic import render_batch
from depthpack.train import train
from depthpack.train.device_data import FreshScenes
from test_train import Killed, kill_at, tiny_cfg, weights

FRESH = ("data.fresh=true", "steps=5", "ckpt_every=2", "hflip=true", "queries.extra_points=2",
         "queries.edge_source=depth")


def test_a_tiny_run_trains_on_fresh_scenes(tmp_path):
    cfg = tiny_cfg(tmp_path / "run", *FRESH)
    summary = train(cfg)
    assert summary["step"] == 5 and summary["throughput"]["data_path"] == "fresh"
    assert summary["throughput"]["scenes"] == "fresh" and summary["val"]["abs_rel"] > 0


def test_steps_read_the_train_stream_in_order_and_ranks_draw_disjoint_scenes(tmp_path):
    cfg = tiny_cfg(tmp_path, *FRESH)
    mcfg = cfg.model_config()
    B = cfg.batch_size
    ranks = [FreshScenes(cfg, mcfg, torch.device("cpu"), 2, r) for r in (0, 1)]
    seen = [i for step in (1, 2, 3) for f in ranks for i in f.indices(step)]
    assert seen == list(range(3 * 2 * B))  # no scene twice, none skipped
    # a step's images are the stream's scenes, rendered as render_batch renders them (quantized as a camera's)
    b = next(ranks[1].batches(0))
    want = render_batch(cfg.data.seed, range(B, 2 * B), mcfg.img_size, cfg.data.scene, "train", cfg.data.rig,
                        cfg.data.families())["image"]
    got, plain = b.images.permute(0, 2, 3, 1), torch.round(want * 255) / 255
    for j in range(B):  # each image as rendered, or mirrored (hflip)
        assert any(torch.allclose(g, plain[j], atol=1.5 / 255) for g in (got[j], got[j].flip(1)))


def test_a_resumed_run_draws_the_scenes_of_an_uninterrupted_one(tmp_path):
    cfg = tiny_cfg(tmp_path / "a", *FRESH)
    mcfg = cfg.model_config()
    whole = list(FreshScenes(cfg, mcfg, torch.device("cpu"), 1, 0).batches(0))
    resumed = list(FreshScenes(cfg, mcfg, torch.device("cpu"), 1, 0).batches(3))
    assert [b.step for b in resumed] == [4, 5]
    for a, b in zip(whole[3:], resumed):
        assert torch.equal(a.images, b.images) and torch.equal(a.points, b.points) and torch.equal(a.target, b.target)
    # and the run itself: killed after step 3, resumed, it ends with the weights of the uninterrupted run
    train(cfg)
    cut = tiny_cfg(tmp_path / "b", *FRESH)
    with pytest.raises(Killed):
        train(cut, hook=kill_at(3))
    train(tiny_cfg(tmp_path / "b", *FRESH, "resume=true"))
    for k, v in weights(tmp_path / "a").items():
        assert torch.equal(v, weights(tmp_path / "b")[k]), k


@pytest.mark.parametrize("over, match", [(dict(kind="folder", root="/x"), "fresh needs kind='synthetic'"),
                                         (dict(cache=True), "fresh needs"), (dict(thin_structures=-1.0), "thin_structures must lie")])
def test_fresh_and_family_settings_are_checked(over, match):
    with pytest.raises(ValueError, match=match):
        DataConfig(fresh="thin_structures" not in over, **over)
