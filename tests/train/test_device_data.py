"""The device-resident data path (data.device_cache): scene stores, batches made with tensor ops,
determinism and exact resume, the throughput split in the summary, max_time_s, compile."""
from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from depthpack.data import DataConfig, make_dataset
from depthpack.data.store import decode_rows, find_store, open_store
from depthpack.data.synthetic import render, render_batch
from depthpack.train.device_data import DeviceScenes, device_stream, gumbel_topk, sample_points
from test_train import Killed, kill_at, tiny_cfg, weights

SIZE = (16, 24)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    cfg = DataConfig(scene="mixed", rig="varied", num_samples=10, num_val=3, cache_dir=str(tmp_path_factory.mktemp("st")))
    return cfg, open_store(cfg, "train", SIZE, render_batch, processes=2)


def test_store_rows_round_trip_and_match_the_renderer(store):
    cfg, st = store
    assert st.n == 10 and st.meta["complete"] and st.rows.dtype == np.uint8 and st.layout.row_bytes % 4 == 0
    for i in (0, 7):
        r = render(cfg.seed, i, SIZE, cfg.scene, "train", rig=cfg.rig)
        img, depth, focal = st.sample(i)
        # within one level: a colour rendered in a batch rounds within float32 rounding of one rendered alone
        assert np.abs(img.astype(int) - np.round(r["image"] * 255).astype(int)).max() <= 1
        np.testing.assert_allclose(depth, r["depth"], rtol=1e-3)
        assert focal == pytest.approx(float(r["K"][0, 0]), rel=1e-6)
    # torch views of a gathered batch give the same parts as numpy
    rows = torch.from_numpy(np.asarray(st.rows[2:5]).copy())
    ti, td, tf = decode_rows(rows, st.layout)
    ni, nd, nf = decode_rows(np.asarray(st.rows[2:5]), st.layout)
    assert np.array_equal(ti.numpy(), ni) and np.array_equal(td.numpy(), nd) and np.array_equal(tf.numpy(), nf)
    # a second open finds it on disk (no rendering), and the data set reads the same bytes
    assert find_store(cfg, "train", SIZE, 10).n == 10
    ds = make_dataset(cfg, "train", SIZE, 0.1, 80.0)
    s = ds[3]
    assert torch.equal(s["image"], ti.new_tensor(np.asarray(st.sample(3)[0])).permute(2, 0, 1).float() / 255.0)
    assert float(s["focal"]) == pytest.approx(st.sample(3)[2])


def test_store_cut_by_its_budget_keeps_the_first_scenes(tmp_path):
    cfg = DataConfig(scene="indoor", num_samples=50, cache_dir=str(tmp_path))
    st = open_store(cfg, "train", SIZE, render_batch, processes=1, budget_s=1e-9)  # spent at the first scene
    assert 1 <= st.n < 50 and not st.meta["complete"] and st.meta["wanted"] == 50
    again = open_store(cfg, "train", SIZE, render_batch, processes=1)  # accepted as it is: not rendered again
    assert again.n == st.n and again.meta["seconds"] == st.meta["seconds"]
    assert len(make_dataset(cfg, "train", SIZE, 0.1, 80.0)) == st.n


def test_gumbel_topk_draws_without_replacement_where_allowed():
    g = torch.Generator().manual_seed(0)
    logw = torch.full((3, 100), float("-inf"))
    logw[:, 10:30] = 0.0
    idx = gumbel_topk(logw, 20, g)
    for row in idx:
        assert sorted(row.tolist()) == list(range(10, 30))  # all 20 allowed, each once
    w = torch.tensor([[0.0, 1.0, 3.0, 6.0]]).log().expand(4000, 4)
    first = gumbel_topk(w, 1, g)[:, 0]
    freq = torch.bincount(first, minlength=4).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.0, 0.1, 0.3, 0.6]), atol=0.03)


def test_points_are_valid_and_edges_weigh_where_asked():
    g = torch.Generator().manual_seed(1)
    valid = torch.zeros(2, 16, 24, dtype=torch.bool)
    valid[:, 4:12, 6:18] = True
    images = torch.zeros(2, 3, 16, 24)
    images[..., 12:] = 1.0  # one vertical edge between columns 11 and 12
    p = sample_points(valid, images, 40, 0.0, g)
    assert p.shape == (2, 40, 2) and torch.equal(p, p.round())
    assert valid[torch.arange(2)[:, None], p[..., 1].long(), p[..., 0].long()].all()
    assert all(len(set(map(tuple, row.tolist()))) == 40 for row in p)  # uniform part: without replacement
    e = sample_points(valid, images, 16, 1.0, g)
    assert ((e[..., 0] >= 10) & (e[..., 0] <= 13)).float().mean() > 0.95


def test_batches_made_on_the_device_are_the_samples_with_their_points(store, tmp_path):
    cfg_d, st = store
    cfg = tiny_cfg(tmp_path, "hflip=true", "queries.extra_points=2", "queries.edge_frac=0.5", "model.img_size=[16,24]",
                   "batch_size=4")
    mcfg = cfg.model_config()
    data = DeviceScenes(st, torch.device("cpu"), cfg, mcfg)
    assert data.rows.shape == (10, st.layout.row_bytes)  # one tensor
    idx = torch.tensor([3, 0, 9, 3])
    q, bucket = 5, 8
    b = data.batch(idx, q, bucket, step=7)
    assert (b.q, b.bucket, b.step) == (q, bucket, 7)
    again = data.batch(idx, q, bucket, step=7)
    other = data.batch(idx, q, bucket, step=8)
    assert all(torch.equal(x, y) for x, y in zip((b.images, b.points, b.target, b.valid), (again.images, again.points,
                                                                                            again.target, again.valid)))
    assert not torch.equal(b.points, other.points)
    assert b.images.shape == (4, 3, 16, 24) and b.points.shape == (4, bucket, 2) and b.valid.shape == (4, bucket)
    assert torch.equal(b.points[:, q:], b.points[:, :1].expand(4, bucket - q, 2)) and not b.valid[:, q:].any()
    for k, i in enumerate(idx.tolist()):
        img, depth, focal = st.sample(i)
        plain = torch.from_numpy(img).permute(2, 0, 1).float() / 255.0
        flipped = not torch.equal(b.images[k], plain)
        assert torch.equal(b.images[k], plain.flip(-1) if flipped else plain)
        d = torch.from_numpy(depth)
        d = d.flip(-1) if flipped else d
        xy = b.points[k, :q].long()
        want = d[xy[:, 1], xy[:, 0]]
        ok = (want >= mcfg.min_depth) & (want <= mcfg.max_depth)
        assert torch.equal(b.valid[k, :q], ok)
        torch.testing.assert_close(b.target[k, :q][ok], want[ok], rtol=1e-3, atol=0)
        assert float(b.focal[k]) == pytest.approx(focal)
    xp, parent, xt, xv = b.extra
    assert xp.shape == (4, 2 * bucket, 2) and (parent < q).all() and not xv[:, 2 * q:].any()
    p = mcfg.patch_size
    own = torch.gather(b.points, 1, parent.unsqueeze(-1).expand(-1, -1, 2))
    assert torch.equal(torch.div(xp, p, rounding_mode="floor"), torch.div(own, p, rounding_mode="floor"))


def test_device_batches_of_a_larger_store_keep_supervision_in_the_models_patches(store, tmp_path):
    """data_size: a store made larger than the model (16x24 scenes, a 8x16 model) feeds the device path; each
    supervision point lies in its query's patch as the model sees it after the step's rescale; a store of another
    size than data_size is refused, naming both."""
    _, st = store
    cfg = tiny_cfg(tmp_path, "queries.extra_points=2", "model.img_size=[8,16]", "data_size=[16,24]", "batch_size=4")
    mcfg = cfg.model_config()
    b = DeviceScenes(st, torch.device("cpu"), cfg, mcfg).batch(torch.tensor([1, 2, 5, 8]), 5, 8, step=3)
    assert b.images.shape == (4, 3, 16, 24)
    xp, parent, _, _ = b.extra
    xy = torch.tensor([16 / 24, 8 / 16])  # the model's pixels per data pixel, as the step scales the points
    own = torch.gather(b.points, 1, parent.unsqueeze(-1).expand(-1, -1, 2))
    p = mcfg.patch_size
    assert torch.equal(torch.div(xp * xy, p, rounding_mode="floor"), torch.div(own * xy, p, rounding_mode="floor"))
    with pytest.raises(ValueError, match=r"holds 16x24 scenes, the run takes \(8, 16\)"):
        DeviceScenes(st, torch.device("cpu"), tiny_cfg(tmp_path, "model.img_size=[8,16]"), mcfg)


def test_stream_matches_the_host_streams_order(store, tmp_path):
    from depthpack.train.config import draw_q

    cfg = tiny_cfg(tmp_path, "steps=7", "batch_size=4")
    got = list(device_stream(10, cfg, 1, 0, 2, cfg.model_config().buckets, torch.device("cpu")))
    assert [s for s, _, _ in got] == [3, 4, 5, 6, 7]
    assert [q for _, q, _ in got] == [draw_q(cfg, cfg.model_config().buckets, s) for s in range(3, 8)]
    epoch_of = [torch.utils.data.DistributedSampler(range(10), 1, 0, True, cfg.seed, True) for _ in range(4)]
    for e, smp in enumerate(epoch_of):
        smp.set_epoch(e)
    perms = [list(s) for s in epoch_of]
    # 2 batches of 4 per epoch: step 3 = epoch 1 batch 0, step 4 = epoch 1 batch 1, step 5 = epoch 2 ...
    assert got[0][2].tolist() == perms[1][0:4] and got[1][2].tolist() == perms[1][4:8]
    assert got[2][2].tolist() == perms[2][0:4]


DEV = ["data.device_cache=true", "data.scene=mixed", "hflip=true", "queries.extra_points=2", "model.img_size=[16,24]",
       "data.num_samples=12", "data.num_val=2", "batch_size=4", "steps=6", "ckpt_every=3"]


def test_device_path_trains_resumes_exactly_and_reports_throughput(tmp_path):
    from depthpack.train import train

    cache = f"data.cache_dir={tmp_path / 'cache'}"
    summary = train(tiny_cfg(tmp_path / "full", cache, *DEV))
    t = summary["throughput"]
    assert t["data_path"] == "device" and t["scenes"] == 12 and t["timed_steps"] >= 1
    assert t["imgs_per_s"] > 0 and 0 <= t["data_share"] <= 1 and set(t["first_step_s"]) <= {8, 16, 32, 64}
    assert json.loads((tmp_path / "full" / "summary.json").read_text())["throughput"]["batch_size"] == 4
    header = (tmp_path / "full" / "log.csv").read_text().splitlines()[0].split(",")
    assert header[-2:] == ["data_ms", "compute_ms"]

    with pytest.raises(Killed):
        train(tiny_cfg(tmp_path / "part", cache, *DEV), hook=kill_at(5))
    resumed = train(tiny_cfg(tmp_path / "part", cache, *DEV, "resume=true"))
    assert resumed["resumed_from"] == 3 and resumed["step"] == 6
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_max_time_stops_with_a_checkpoint_and_says_so(tmp_path):
    from depthpack.core import checkpoint as ck
    from depthpack.train import train

    s = train(tiny_cfg(tmp_path, f"data.cache_dir={tmp_path / 'cache'}", *DEV, "steps=50", "log_every=2",
                       "max_time_s=1e-6"))
    assert s["stopped_early"] == {"reason": "max_time_s=1e-06 reached", "at_step": 2} and s["step"] == 2
    assert ck.latest_checkpoint(tmp_path)[0].name == "step_00000002" and "abs_rel" in s["val"]


@pytest.mark.slow
def test_compiled_step_matches_eager(tmp_path):
    from depthpack.train import train

    common = [f"data.cache_dir={tmp_path / 'cache'}", *DEV, "steps=2", "queries.counts=[6]", "log_every=1"]
    train(tiny_cfg(tmp_path / "eager", *common))
    comp = train(tiny_cfg(tmp_path / "comp", *common, "compile=true"))
    assert comp["throughput"]["compile"] and comp["throughput"]["first_step_s"][8] > 0
    la = [float(r.split(",")[1]) for r in (tmp_path / "eager" / "log.csv").read_text().splitlines()[1:]]
    lb = [float(r.split(",")[1]) for r in (tmp_path / "comp" / "log.csv").read_text().splitlines()[1:]]
    assert la == pytest.approx(lb, rel=1e-4)


@pytest.mark.gpu
def test_device_path_on_cuda(store, tmp_path):
    """The CUDA-only pieces: the generator on the GPU, CUDA-event timing, fused AdamW, bf16 autocast."""
    from depthpack.train import train

    _, st = store
    cfg = tiny_cfg(tmp_path, "hflip=true", "queries.extra_points=2", "model.img_size=[16,24]", "batch_size=4",
                   "device=cuda")
    data = DeviceScenes(st, torch.device("cuda"), cfg, cfg.model_config())
    idx = torch.tensor([1, 2, 3, 4], device="cuda")
    b = data.batch(idx, 5, 8, step=3)
    again = data.batch(idx, 5, 8, step=3)
    assert b.images.is_cuda and torch.equal(b.points, again.points) and torch.equal(b.valid, again.valid)
    xy = b.points[:, :5].long()
    img_valid = (b.target[:, :5] > 0) == b.valid[:, :5]
    assert img_valid.all() and (xy[..., 0] < 24).all() and (xy[..., 1] < 16).all()
    s = train(tiny_cfg(tmp_path / "run", f"data.cache_dir={tmp_path / 'cache'}", *DEV, "device=cuda", "steps=30",
                       "log_every=5"))
    t = s["throughput"]
    assert t["clock"] == "cuda events" and t["timed_steps"] > 0 and t["imgs_per_s"] > 0 and s["device"].startswith("cuda")
    assert 0 < t["data_ms"] and 0 < t["compute_ms"]


def test_graph_step_refuses_where_it_cannot_run(tmp_path):
    from depthpack.train import train
    from depthpack.train.step import check_graph_config

    with pytest.raises(ValueError, match="needs a CUDA device, not cpu"):
        train(tiny_cfg(tmp_path, f"data.cache_dir={tmp_path / 'cache'}", *DEV, "device=cpu", "graph=true"))
    cuda = torch.device("cuda", 0)  # the checks read the device's type only: no GPU needed
    graph = tiny_cfg(tmp_path, f"data.cache_dir={tmp_path / 'cache'}", *DEV, "graph=true")
    with pytest.raises(ValueError, match="needs data.device_cache=true"):
        check_graph_config(tiny_cfg(tmp_path, "graph=true"), device=cuda, world=1)
    with pytest.raises(ValueError, match="runs one process; this run has 2"):
        check_graph_config(graph, device=cuda, world=2)
    with pytest.raises(ValueError, match="graph=true and compile=true together are not supported"):
        check_graph_config(replace(graph, compile=True), device=cuda, world=1)
    check_graph_config(graph, device=cuda, world=1)  # where it can run
    check_graph_config(tiny_cfg(tmp_path), device=torch.device("cpu"), world=2)  # off: nothing to check


def test_checkpoints_hold_learning_rates_as_floats_whatever_the_optimizer_holds():
    from depthpack.train.run_folder import plain_lr_state

    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([{"params": [p], "lr": torch.tensor(0.01)}], foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    o, s = plain_lr_state(opt.state_dict(), sched.state_dict())
    assert o["param_groups"][0]["lr"] == pytest.approx(0.005) and type(o["param_groups"][0]["lr"]) is float
    assert all(type(v) is float for v in s["base_lrs"] + s["_last_lr"])
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)  # the live optimizer is untouched
    assert torch.load(io.BytesIO(_saved({"o": o, "s": s})), weights_only=True)["o"]["param_groups"][0]["lr"] == o["param_groups"][0]["lr"]


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.gpu
def test_graph_step_equals_eager_and_resumes(tmp_path):
    """Each bucket's step replayed from a CUDA graph trains as the eager step does (float32, two
    buckets interleaved: warm-up, capture, replays), and a graph run killed and resumed ends where
    the uninterrupted one does."""
    from depthpack.train import train

    common = [f"data.cache_dir={tmp_path / 'cache'}", *DEV, "device=cuda", "amp=false", "steps=24", "queries.counts=[5,12]",
              "ckpt_every=12", "log_every=1"]
    eager = train(tiny_cfg(tmp_path / "eager", *common))
    graph = train(tiny_cfg(tmp_path / "graph", *common, "graph=true"))
    assert graph["throughput"]["graph"] and set(graph["throughput"]["graph_capture_s"]) == {8, 16}
    la = [float(r.split(",")[1]) for r in (tmp_path / "eager" / "log.csv").read_text().splitlines()[1:]]
    lb = [float(r.split(",")[1]) for r in (tmp_path / "graph" / "log.csv").read_text().splitlines()[1:]]
    assert len(la) == 24 and la == pytest.approx(lb, rel=1e-4, abs=1e-6)
    a, b = weights(tmp_path / "eager"), weights(tmp_path / "graph")
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)
    assert eager["val"]["abs_rel"] == pytest.approx(graph["val"]["abs_rel"], rel=1e-3)

    with pytest.raises(Killed):
        train(tiny_cfg(tmp_path / "part", *common, "graph=true"), hook=kill_at(17))
    resumed = train(tiny_cfg(tmp_path / "part", *common, "graph=true", "resume=true"))
    assert resumed["resumed_from"] == 12 and resumed["step"] == 24
    c = weights(tmp_path / "part")
    assert all(torch.allclose(b[k], c[k], rtol=1e-4, atol=1e-5) for k in b)
