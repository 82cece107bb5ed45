"""Training: config merging, a loss that falls, atomic checkpoints, exact resume, safe loading, gloo DDP."""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from conftest import randomize_

from depthpack.core import checkpoint as ck
from depthpack.core.packing import bucket_for
from depthpack.core.config import to_dict
from depthpack.train.config import QueryConfig, TrainConfig, load_train_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"


def tiny_cfg(tmp_path, *over: str) -> TrainConfig:
    return load_train_config(TINY, [f"out_dir={tmp_path}", "eval_images=2", *over])


# ---- config -------------------------------------------------------------------------------------
def test_yaml_and_overrides_merge(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("preset: tiny\nsteps: 3\nmodel: {depth: 1}\ndata: {num_samples: 10}\n")
    cfg = load_train_config(y, ["model.embed_dim=32", "data.seed=5", "lr=0.01"])
    assert (cfg.steps, cfg.lr, cfg.data.num_samples, cfg.data.seed) == (3, 0.01, 10, 5)
    mc = cfg.model_config()
    assert (mc.depth, mc.embed_dim, mc.patch_size) == (1, 32, 8)  # tiny preset + overrides
    assert cfg.batch_size == TrainConfig.__dataclass_fields__["batch_size"].default  # untouched default
    # YAML 1.1 reads 1e-3 as a string; numeric fields still get numbers, or an error naming them
    cfg = load_train_config(y, ["lr=1e-3", "model.init_values=1e-5", "data.depth_scale=1e3"])
    assert (cfg.lr, cfg.model_config().init_values, cfg.data.depth_scale) == (1e-3, 1e-5, 1000.0)
    with pytest.raises(ValueError, match="TrainConfig.lr must be a number"):
        load_train_config(y, ["lr=fast"])


@pytest.mark.parametrize("bad, name", [("stepz=3", "stepz"), ("model.dept=3", "dept"), ("data.kindd=x", "kindd")])
def test_unknown_keys_are_errors(bad, name):
    with pytest.raises(ValueError, match=name):
        load_train_config(TINY, [bad])


def test_invalid_values_are_errors():
    with pytest.raises(ValueError, match="query counts"):
        load_train_config(TINY, ["queries.counts=[8, 1000]"])
    with pytest.raises(ValueError, match="kind"):
        load_train_config(TINY, ["data.kind=imagenet"])


@pytest.mark.parametrize("name", ["tiny", "demo", "vits_nyu", "vits_kitti"])
def test_shipped_configs_hold_only_differences(name):
    from depthpack.core.config import model_config
    from depthpack.data.config import DataConfig

    raw = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    cfg = load_train_config(ROOT / "configs" / f"{name}.yaml")
    bases = {"model": to_dict(model_config(raw.get("preset", TrainConfig.preset))), "data": to_dict(DataConfig()),
             "queries": to_dict(QueryConfig())}
    default = to_dict(TrainConfig())
    for key, value in raw.items():
        for k, v in (value.items() if key in bases else [(None, value)]):
            base = bases[key] if k is not None else default
            name_ = k if k is not None else key
            assert base.get(name_, object()) != v, f"{name}.yaml: {key}{'.' + k if k else ''} repeats the default {v!r}"
    assert cfg.model_config().num_patches > 0


# ---- the objective ------------------------------------------------------------------------------
def host_batch(ds, q: int, n: int, extra_points: int = 0, **kw):
    """A Batch of the first n samples of ds with q points each, as the host data path makes it (step 1)."""
    from depthpack.train.batches import WithQueries, to_batch

    wq = WithQueries(ds, seed=0, rank=0, queries=QueryConfig(edge_frac=0.5, extra_points=extra_points), **kw)
    batch = torch.utils.data.default_collate([wq[(i, 1, i, q)] for i in range(n)])
    return to_batch(batch, 1, q, q, torch.device("cpu")), batch, wq


def test_a_few_steps_reduce_the_loss_on_a_fixed_batch():
    from depthpack.data import make_dataset
    from depthpack.train.losses import PackedObjective
    from depthpack.train.loop import build_model
    from depthpack.train.optim import make_optimizer

    cfg = load_train_config(TINY, ["lr=2e-3", "warmup_steps=0"])
    mc = cfg.model_config()
    ds = make_dataset(cfg.data, split="train", img_size=mc.img_size, min_depth=mc.min_depth, max_depth=mc.max_depth)
    b, _, _ = host_batch(ds, 32, 4)
    model = build_model(cfg, torch.device("cpu"))
    obj, opt = PackedObjective(model, 0.5), make_optimizer(model, cfg)
    losses = []
    for _ in range(15):
        loss, _ = obj(b.images, b.points, b.target, b.valid, bucket_for(32, model.cfg.buckets))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_dense_objective_is_the_dense_paths_silog_whatever_the_bucket():
    """train_path=dense (the equal-tokens baseline): every patch in the buffer, so the loss is the SILog of
    dense_core at the points, at any bucket; the packed objective at a small bucket differs."""
    from depthpack.data import make_dataset
    from depthpack.train.losses import PackedObjective, SiLogLoss
    from depthpack.train.loop import build_model

    cfg = load_train_config(TINY, ["train_path=dense"])
    mc = cfg.model_config()
    ds = make_dataset(cfg.data, split="train", img_size=mc.img_size, min_depth=mc.min_depth, max_depth=mc.max_depth)
    b, _, _ = host_batch(ds, 16, 2)
    model = randomize_(build_model(cfg, torch.device("cpu")))
    want = SiLogLoss(0.5)(model.dense_core(b.images, b.points), b.target, b.valid)
    dense = PackedObjective(model, 0.5)
    for bucket in (16, mc.num_patches):
        torch.testing.assert_close(dense(b.images, b.points, b.target, b.valid, bucket, dense=True)[0], want)
    packed = PackedObjective(model, 0.5)(b.images, b.points, b.target, b.valid, 16)[0]
    assert abs(float(packed) - float(want)) > 1e-4
    with pytest.raises(ValueError, match="train_path must be packed or dense"):
        load_train_config(TINY, ["train_path=masked"])


def test_data_size_trains_on_scenes_made_larger_and_area_resized(tmp_path):
    """data_size: the training scenes are made at (H, W) and each step area-resizes them to the model's size (what
    downscale-and-run-dense feeds a small model); the step's loss is the objective on the resized batch."""
    import torch.nn.functional as F

    from depthpack.train.config import step_path
    from depthpack.train.loop import _training_set, build_model
    from depthpack.train.losses import PackedObjective
    from depthpack.train.distributed import Dist

    cfg = tiny_cfg(tmp_path, "data_size=[96,128]", "train_path=dense")
    assert step_path(cfg, 1) == ("dense", (64, 64)) and step_path(tiny_cfg(tmp_path), 1) == ("packed", None)
    ds = _training_set(cfg, Dist(), cfg.steps)
    b, _, _ = host_batch(ds, 16, 2)
    assert b.images.shape[-2:] == (96, 128)
    model = randomize_(build_model(cfg, torch.device("cpu")))
    obj = PackedObjective(model, 0.5)
    small = F.interpolate(b.images, size=(64, 64), mode="area")
    pts = b.points * torch.tensor([64 / 128, 64 / 96])
    torch.testing.assert_close(obj(b.images, b.points, b.target, b.valid, 16, dense=True, size=(64, 64))[0],
                               obj(small, pts, b.target, b.valid, 16, dense=True)[0])
    # supervision points stay inside their query's patch as the model sees it, at any ratio of the sizes
    from depthpack.train.batches import in_patch
    pts = torch.cat([torch.rand(500, 2) * torch.tensor([127.9, 95.9]), torch.arange(0, 96, 4.0)[:, None].expand(-1, 2)])
    for ratio in ((1.0, 1.0), (0.5, 0.5), (96 / 128, 96 / 128), (0.5, 64 / 96)):
        xy = torch.tensor(ratio)  # as the objective scales the points to the model's pixels
        for offset in (torch.randint(8, (524, 2)), torch.zeros(524, 2, dtype=torch.long)):
            xp = in_patch(pts, offset, 8, ratio)
            assert torch.equal(torch.div(xp * xy, 8, rounding_mode="floor"), torch.div(pts * xy, 8, rounding_mode="floor"))
    for bad, match in ((["data_size=[0,64]"], "data_size must be"), (["data_size=[64,64]", "data.fresh=true"],
                                                                        "data_size needs stored scenes")):
        with pytest.raises(ValueError, match=match):
            tiny_cfg(tmp_path, *bad)


def test_random_budgets_draw_every_bucket_that_holds_q():
    from depthpack.train.config import draw_bucket

    cfg = load_train_config(TINY, ["queries.random_budgets=true"])
    buckets = cfg.model_config().buckets  # 8 16 32 64
    seen = {draw_bucket(cfg, buckets, 9, s) for s in range(200)}
    assert seen == {16, 32, 64}
    assert draw_bucket(load_train_config(TINY), buckets, 9, 3) == 16
    assert draw_bucket(cfg, buckets, 9, 7) == draw_bucket(cfg, buckets, 9, 7)  # the same on every rank


def test_every_bucket_is_drawn():
    from depthpack.train.config import draw_q

    cfg = load_train_config(TINY)
    buckets = cfg.model_config().buckets
    qs = [draw_q(cfg, buckets, s) for s in range(400)]
    assert {min(b for b in buckets if b >= q) for q in qs} == set(buckets)
    assert qs == [draw_q(cfg, buckets, s) for s in range(400)]  # a function of (seed, step)


def test_batches_do_not_depend_on_workers_or_on_where_the_stream_starts():
    """The data position is the step: a stream started at step 3 (a resume, mid-epoch) with a worker
    process yields what the stream from step 0 without workers yields at steps 4-5."""
    from depthpack.data import make_dataset
    from depthpack.train.batches import batch_order, host_batches

    cfg = load_train_config(TINY, ["steps=5", "data.num_samples=8"])  # 2 batches per epoch
    mc = cfg.model_config()
    ds = make_dataset(cfg.data, split="train", img_size=mc.img_size, min_depth=mc.min_depth, max_depth=mc.max_depth)
    cpu = torch.device("cpu")
    full = list(host_batches(ds, cfg, 0, 1, 0, cpu))
    cfg.num_workers = 1
    tail = list(host_batches(ds, cfg, 0, 1, 3, cpu))
    assert [b.step for b in full] == [1, 2, 3, 4, 5] and [b.step for b in tail] == [4, 5]
    for b1, b2 in zip(full[3:], tail):
        assert (b1.q, b1.bucket) == (b2.q, b2.bucket) == (b1.points.shape[1], bucket_for(b1.q, mc.buckets))
        assert all(torch.equal(getattr(b1, k), getattr(b2, k)) for k in ("images", "points", "target", "valid"))
    epochs = list(batch_order(8, cfg, 1, 0, 0, "the data set"))  # every epoch a new permutation of all samples
    assert [(list(steps), offset) for _, steps, offset in epochs] == [([1, 2], 0), ([3, 4], 0), ([5], 0)]
    assert all(sorted(perm) == list(range(8)) for perm, _, _ in epochs) and epochs[0][0] != epochs[1][0]
    assert [(list(s), o) for _, s, o in batch_order(8, cfg, 1, 0, 3, "x")] == [([4], 1), ([5], 0)]
    with pytest.raises(ValueError, match="the data set has 8 samples: fewer than one batch of 16"):
        next(batch_order(8, load_train_config(TINY, ["batch_size=16"]), 1, 0, 0, "the data set"))


# ---- training runs, checkpoints, resume ---------------------------------------------------------
def weights(model_or_dir) -> dict[str, torch.Tensor]:
    return ck.load_model(model_or_dir).state_dict()


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """One uninterrupted tiny run (6 steps, checkpoints at 3 and 6); tests copy it before changing it."""
    from depthpack.train import train

    out = tmp_path_factory.mktemp("done") / "run"
    summary = train(tiny_cfg(out))
    return out, summary


def copy_run(done, dst: Path) -> Path:
    shutil.copytree(done[0], dst)
    return dst


def test_run_writes_config_log_and_checkpoints(done, tmp_path):
    from depthpack.train import train

    tmp_path = copy_run(done, tmp_path / "run")
    cfg = load_train_config(tmp_path / "config.yaml", [f"out_dir={tmp_path}"])
    summary = done[1]
    assert summary["step"] == cfg.steps
    written = load_train_config(tmp_path / "config.yaml")
    assert to_dict(written) == to_dict(tiny_cfg(done[0]))
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert latest["step"] == cfg.steps
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000003", "step_00000006"]  # keep 2
    rows = (tmp_path / "log.csv").read_text().strip().splitlines()
    assert rows[0].startswith("step,loss") and len(rows) == 1 + cfg.steps
    assert "abs_rel" in json.loads((tmp_path / "summary.json").read_text())["val"]
    with pytest.raises(ValueError, match="resume=true"):  # never silently mixes two runs
        train(cfg)


class Killed(Exception):
    pass


def kill_at(n: int):
    """A training hook that stops the run after step n, as a kill would."""
    def hook(step, info):
        if step == n:
            raise Killed
    return hook


def test_killed_run_resumes_to_the_same_weights(done, tmp_path):
    """Uninterrupted 6 steps == (killed after step 5, checkpoint at 3) + resume, bit for bit on CPU."""
    from depthpack.train import train

    part = tiny_cfg(tmp_path / "part")
    with pytest.raises(Killed):
        train(part, hook=kill_at(5))
    assert json.loads((tmp_path / "part" / "latest.json").read_text())["step"] == 3  # lost steps 4-5 only
    summary = train(tiny_cfg(tmp_path / "part", "resume=true"))
    assert summary["resumed_from"] == 3 and summary["step"] == 6
    a, b = weights(done[0]), weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the log holds each step once: rows 4-5 of the killed attempt were dropped on resume
    steps = [int(r.split(",")[0]) for r in (tmp_path / "part" / "log.csv").read_text().strip().splitlines()[1:]]
    assert steps == list(range(1, 7))


def test_truncated_checkpoint_is_detected_and_the_previous_one_used(done, tmp_path):
    from depthpack.train import train

    tmp_path = copy_run(done, tmp_path / "run")
    last = ck.step_dir(tmp_path, 6) / ck.WEIGHTS
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 3])
    with pytest.raises(ck.CheckpointError, match=r"step_00000006/model\.safetensors is truncated"):
        ck.load_model(last.parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d, _ = ck.latest_checkpoint(tmp_path)
        model = ck.load_model(tmp_path)
    assert d.name == "step_00000003"
    assert any("step_00000006" in str(w.message) and "truncated" in str(w.message) for w in caught)
    assert torch.equal(model.state_dict()["head.tok.weight"], weights(ck.step_dir(tmp_path, 3))["head.tok.weight"])
    # resuming continues from step 3 and ends at the configured step count
    summary = train(tiny_cfg(tmp_path, "resume=true"))
    assert (summary["resumed_from"], summary["step"]) == (3, 6)
    ck.verify_checkpoint(ck.step_dir(tmp_path, 6))  # rewritten whole


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_pickled_code_in_training_state_is_refused(done, tmp_path):
    """Code pickled into state.pt is never run: the checkpoint is refused, in one line, and resume falls
    back to the previous one; with every checkpoint refused, resume is one error."""
    from depthpack.train import train

    _Evil.marker = tmp_path / "pwned"
    tmp_path = copy_run(done, tmp_path / "run")
    payload = pickle.dumps({"step": 6, "x": _Evil()})
    buf = io.BytesIO()
    torch.save({"step": 6, "x": _Evil()}, buf)
    for blob in (buf.getvalue(), payload):
        for d in ck.list_checkpoints(tmp_path)[::-1]:
            (d / ck.STATE).write_bytes(blob)
            meta = json.loads((d / ck.META).read_text())  # an attacker can fix the hashes too
            meta["files"][ck.STATE] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
            (d / ck.META).write_text(json.dumps(meta))
            with pytest.raises(ck.CheckpointError, match="refused or unreadable") as e:
                ck.load_state_bytes(ck.verify_checkpoint(d)[ck.STATE], d / ck.STATE)
            assert "\n" not in str(e.value) and "weights_only" not in str(e.value)
        with pytest.raises(ck.CheckpointError, match="no usable checkpoint.*refused or unreadable"):
            train(tiny_cfg(tmp_path, "steps=8", "resume=true"))
    assert not _Evil.marker.exists()
    copy = copy_run(done, tmp_path.parent / "newest")  # only the newest refused: resume from the one before
    shutil.copy(tmp_path / "checkpoints" / "step_00000006" / ck.STATE, ck.step_dir(copy, 6) / ck.STATE)
    shutil.copy(ck.step_dir(tmp_path, 6) / ck.META, ck.step_dir(copy, 6) / ck.META)
    with pytest.warns(UserWarning, match=r"step_00000006/state.pt: refused or unreadable.*; using the previous checkpoint"):
        assert train(tiny_cfg(copy, "steps=8", "resume=true"))["resumed_from"] == 3
    assert not _Evil.marker.exists()


def test_a_resume_with_another_seed_or_data_stream_is_refused_by_name(done, tmp_path):
    """resume=true replays the stream the run started with: another seed or data path is one error naming the
    key, its stored and its new value, before anything is written; the same values resume."""
    from depthpack.train import train

    run = copy_run(done, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    for over, said in ((["seed=1"], "seed=1 (the run trained with seed=0)"),
                       (["data.fresh=true"], "data.fresh=true (the run trained with data.fresh=false)"),
                       (["seed=2", "data.seed=3"], "seed=2 (the run trained with seed=0), data.seed=3 (the run trained "
                                                   "with data.seed=0)")):
        with pytest.raises(ValueError, match=re.escape(f"resume: {said}: a resumed run continues the data stream of")):
            train(tiny_cfg(run, "resume=true", "steps=8", *over))
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert train(tiny_cfg(run, "resume=true", "steps=7"))["resumed_from"] == 6


def test_load_model_errors_name_the_problem(tmp_path):
    with pytest.raises(ck.CheckpointError, match="does not exist"):
        ck.load_model(tmp_path / "nothing")
    with pytest.raises(ck.CheckpointError, match="holds no checkpoint"):
        ck.load_model(tmp_path)


# ---- torchrun, gloo, 2 processes ----------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_two(out, *overrides: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
           str(ROOT / "train" / "train.py"), "--config", str(TINY), f"out_dir={out}", "steps=4", "ckpt_every=2",
           "eval_images=2", *overrides]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_torchrun_gloo_two_processes(tmp_path):
    out = tmp_path / "ddp"
    summary = _torchrun_two(out, "device=cpu")
    assert (summary["world_size"], summary["step"], summary["backend"]) == (2, 4, "gloo")
    assert summary["ranks_in_sync"]  # the all-reduced gradients left both ranks with the same weights
    assert json.loads((out / "latest.json").read_text())["step"] == 4
    rows = (out / "log.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 4  # rank 0 alone writes the log
    ck.load_model(out)  # a checkpoint that verifies and loads strictly


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_torchrun_nccl_two_gpus(tmp_path):
    out = tmp_path / "ddp"
    summary = _torchrun_two(out)  # device auto: cuda:LOCAL_RANK, nccl
    assert (summary["world_size"], summary["step"], summary["backend"]) == (2, 4, "nccl")
    assert summary["device"] == "cuda:0" and summary["ranks_in_sync"]
    assert json.loads((out / "latest.json").read_text())["step"] == 4
    assert len((out / "log.csv").read_text().strip().splitlines()) == 1 + 4
    ck.load_model(out)


def test_extra_points_lie_in_their_query_patch_and_cost_no_token():
    """Extra supervision points: inside the patch of their parent query, and decoded from the tokens
    the queries selected: the loss equals the packed forward over queries + extras together."""
    from depthpack.data import make_dataset
    from depthpack.train.losses import PackedObjective, SiLogLoss
    from depthpack.train.loop import build_model

    cfg = load_train_config(TINY)
    mc = cfg.model_config()
    p = mc.patch_size
    ds = make_dataset(cfg.data, split="train", img_size=mc.img_size, min_depth=mc.min_depth, max_depth=mc.max_depth)
    b, batch, wq = host_batch(ds, 4, 3, extra_points=2, patch_size=p)
    xp, parent, xt, xv = b.extra
    assert xp.shape == (3, 8, 2) and parent.shape == (3, 8)
    parents = torch.gather(b.points, 1, parent[..., None].expand(-1, -1, 2))
    assert torch.equal(torch.div(xp, p, rounding_mode="floor"), torch.div(parents, p, rounding_mode="floor"))
    assert torch.equal(wq[(1, 1, 1, 4)]["extra_points"], xp[1])  # seeded like the points
    xy = xp.long()
    assert torch.equal(xt, batch["depth"][torch.arange(3)[:, None], xy[..., 1], xy[..., 0]])  # the truth at them
    model = randomize_(build_model(cfg, torch.device("cpu"))).eval()
    obj = PackedObjective(model, 0.5)
    with torch.no_grad():
        loss, _ = obj(b.images, b.points, b.target, b.valid, 16, b.extra)
        both = torch.cat([b.points, xp], 1)
        want = SiLogLoss(0.5)(model.packed_core(b.images, both, 16), torch.cat([b.target, xt], 1),
                              torch.cat([b.valid, xv], 1))
    assert abs(float(loss) - float(want)) < 1e-5


def test_hflip_mirrors_image_and_maps_before_the_points_are_drawn():
    from depthpack.data import make_dataset
    from depthpack.train.batches import WithQueries, hflip_sample

    cfg = load_train_config(TINY)
    mc = cfg.model_config()
    ds = make_dataset(cfg.data, split="train", img_size=mc.img_size, min_depth=mc.min_depth, max_depth=mc.max_depth)
    s = ds[0]
    f = hflip_sample(s)
    assert torch.equal(f["image"], s["image"].flip(-1)) and torch.equal(f["depth"][:, 0], s["depth"][:, -1])
    assert all(torch.equal(hflip_sample(f)[k], s[k]) for k in ("image", "depth", "valid", "eval_mask"))
    wq = WithQueries(ds, seed=0, rank=0, queries=QueryConfig(edge_frac=0.5), hflip=True)
    flipped = [torch.equal(wq[(0, 1, j, 8)]["image"], f["image"]) for j in range(16)]
    assert 2 <= sum(flipped) <= 14  # about half, decided per (step, slot)
    for j in range(16):
        smp = wq[(0, 1, j, 8)]
        xy = smp["points"].long()
        assert smp["valid"][xy[:, 1], xy[:, 0]].all()  # drawn on the mirrored valid mask
