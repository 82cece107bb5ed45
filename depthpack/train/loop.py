"""The training loop: SILog at queried points through the packed path, as the model runs at inference.

    from depthpack.train import load_train_config, train
    summary = train(load_train_config("configs/demo.yaml", ["steps=200"]))

One step: a batch of images (a DistributedSampler over the data set, one shuffled permutation per
epoch), one query count Q drawn on the host for the whole batch (each bucket is drawn equally often,
so every bucket is trained), Q points per image from depthpack.data.sample_queries (after an
optional left-right mirror, cfg.hflip), the packed forward on the smallest bucket >= Q,
plus cfg.extra_points * Q points inside the queried patches decoded from the same tokens (the head's
cost only), SiLogLoss against the ground truth at all those pixels,
optionally + distill_weight * mean |log packed - log dense| toward the dense path of the same model
(computed without gradient). AdamW, linear warmup then cosine, gradient clipping, bf16 autocast on
CUDA, float32 on CPU.

Everything random in a step (batch order, Q, points) is a function of (seed, step, rank), so a run
resumed from the checkpoint of step S replays steps S+1.. exactly as the uninterrupted run would
(bit for bit on CPU in float32). Under `torchrun --nproc_per_node=N` the same code runs
DistributedDataParallel (nccl on CUDA, gloo on CPU); only rank 0 writes logs and checkpoints.

Run folder (out_dir): config.yaml (the merged config), log.csv (one row per log_every steps),
eval.csv (validation), summary.json (the end), latest.json + checkpoints/ (depthpack.core.checkpoint),
tb/ (TensorBoard, only where the tensorboard package is installed).
"""
from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler

from ..core import checkpoint as ckpt
from ..core.config import ModelConfig, from_dict, to_dict
from ..core.files import atomic_write_json, atomic_write_text, check_writable_dir, remove_stale_temporaries
from ..core.model import DepthPack
from ..core.packing import bucket_for
from ..data.datasets import make_dataset
from ..data.queries import sample_queries
from ..eval.evaluate import quick_eval
from .config import TrainConfig, draw_q, dump_yaml  # noqa: F401  (draw_q: the host stream's Q, re-exported)
from .device_data import DeviceScenes, device_stream
from .losses import SiLogLoss
from .step import TrainStep, check_graph_config, plain_lr_state

LOG_FIELDS = ["step", "loss", "silog", "distill", "lr", "q", "bucket", "grad_norm", "imgs_per_s", "elapsed_s",
              "data_ms", "compute_ms"]


# ---- distributed setup --------------------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized_here: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str = "auto") -> Dist:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK: then join the group (nccl on CUDA, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device}: only {torch.cuda.device_count()} GPU(s) visible")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    here = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        here = True
    return Dist(rank, world, local_rank, dev, here)


# ---- the objective (one module, so DDP sees every parameter used in its forward) --------------
class PackedObjective(nn.Module):
    """Loss of the packed path at the queried points (+ optional distillation toward dense)."""

    def __init__(self, model: DepthPack, silog_lambda: float, distill_weight: float):
        super().__init__()
        self.model = model
        self.silog = SiLogLoss(lambd=silog_lambda)
        self.distill_weight = distill_weight

    def forward(self, images: torch.Tensor, points: torch.Tensor, target: torch.Tensor, valid: torch.Tensor,
                bucket: int, extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                focal: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # images [B,3,H,W], points [B,Q,2], target [B,Q] meters, valid [B,Q] bool, focal [B] pixels (0 unknown).
        # extra: (points [B,E,2], parent [B,E] (the query whose patch holds each), target, valid [B,E]):
        # decoded from the tokens the queries already selected, so they cost the head only
        m = self.model
        index, slot = m.select(images, points, bucket)  # forward_packed, in its parts
        feats = m.forward_features(images, index)
        if extra is not None:
            xp, parent, xt, xv = extra
            slot = torch.cat([slot, torch.gather(slot, 1, parent)], dim=1)
            points, target, valid = torch.cat([points, xp], 1), torch.cat([target, xt], 1), torch.cat([valid, xv], 1)
        pred = m.forward_head(feats, slot, points, m.focal_scale(images, focal))  # [B,Q(+E)] float32
        silog = self.silog(pred, target, valid)
        distill = pred.new_zeros(())
        if self.distill_weight > 0:
            with torch.no_grad():
                teacher = m.forward_dense_core(images, points, None, focal)
            w = valid.float()
            distill = ((pred.log() - teacher.float().log()).abs() * w).sum() / w.sum().clamp_min(1.0)
        # without distillation the loss IS silog: `silog + 0.0 * zeros` came out of Inductor without a
        # grad_fn (torch 2.14 CPU), so the compiled step could not backpropagate
        loss = silog + self.distill_weight * distill if self.distill_weight > 0 else silog
        return loss, silog.detach(), distill.detach()


# ---- data stream --------------------------------------------------------------------------------
class _Batches(torch.utils.data.Sampler):
    def __init__(self, batches: list[list]):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class WithQueries(torch.utils.data.Dataset):
    """ds[(index, step, slot, q)] -> the sample plus points [q,2] drawn among its valid pixels.

    The query sampling runs where the sample is made (in the DataLoader workers when there are any),
    with a generator seeded by (seed, step, rank, slot in the batch): the same points whatever the
    number of workers, and again on a resumed run.
    """

    def __init__(self, base, seed: int, rank: int, edge_frac: float, hflip: bool = False, extra_points: int = 0,
                 patch_size: int = 1):
        self.base, self.seed, self.rank, self.edge_frac, self.hflip = base, seed, rank, edge_frac, hflip
        self.extra_points, self.patch_size = extra_points, patch_size

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: tuple[int, int, int, int]) -> dict:
        index, step, slot, q = key
        sample = dict(self.base[index])
        g = torch.Generator().manual_seed(((self.seed * 7919 + step) * 131 + self.rank) * 1031 + slot)
        if self.hflip and bool(torch.rand((), generator=g) < 0.5):
            sample = hflip_sample(sample)
        sample["points"] = sample_queries(sample["valid"], sample["image"], q, g, edge_frac=self.edge_frac).float()
        if self.extra_points:  # pixels inside the patches of the queries (any pixel: invalid ones are masked)
            n, p = q * self.extra_points, self.patch_size
            parent = torch.randint(q, (n,), generator=g)
            corner = torch.div(sample["points"][parent], p, rounding_mode="floor") * p
            sample["extra_points"] = corner + torch.randint(p, (n, 2), generator=g).float()
            sample["extra_parent"] = parent
        return sample


def hflip_sample(sample: dict) -> dict:
    """The sample mirrored left-right: image [3,H,W] and the [H,W] maps (depth, valid, eval_mask)."""
    return {k: v.flip(-1) if k in ("image", "depth", "valid", "eval_mask") else v for k, v in sample.items()}


def batch_stream(dataset, cfg: TrainConfig, d: Dist, start_step: int, buckets: tuple[int, ...]) -> Iterator[tuple[int, int, dict]]:
    """Yield (step, q, batch) for steps start_step+1 .. cfg.steps. The images of a step depend only on
    (seed, step, rank, world) and its Q and points only on (seed, step, rank): that is what makes
    resuming exact (the data position is the step)."""
    sampler = DistributedSampler(dataset, num_replicas=d.world, rank=d.rank, shuffle=True, seed=cfg.seed, drop_last=True)
    per_epoch = len(sampler) // cfg.batch_size
    if per_epoch == 0:
        raise ValueError(f"the data set has {len(dataset)} samples: fewer than one batch of {cfg.batch_size} "
                         f"per process ({d.world} processes)")
    wrapped = WithQueries(dataset, cfg.seed, d.rank, cfg.edge_frac, cfg.hflip, cfg.extra_points,
                          cfg.model_config().patch_size)
    step = start_step
    while step < cfg.steps:
        epoch, offset = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        idx = list(sampler)
        n = min(per_epoch - offset, cfg.steps - step)
        steps = range(step + 1, step + n + 1)
        qs = [draw_q(cfg, buckets, s) for s in steps]
        batches = [[(idx[(offset + b) * cfg.batch_size + j], s, j, q) for j in range(cfg.batch_size)]
                   for b, (s, q) in enumerate(zip(steps, qs))]
        loader = DataLoader(wrapped, batch_sampler=_Batches(batches), num_workers=cfg.num_workers,
                            persistent_workers=False, pin_memory=d.device.type == "cuda")
        for q, batch in zip(qs, loader):
            step += 1
            yield step, q, batch


def targets_for_batch(batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """points [B,Q,2] of the batch, with the ground-truth depth and validity at them [B,Q]."""
    points = batch["points"]
    return (points,) + gather_at(points, batch["depth"], batch["valid"])


def gather_at(points: torch.Tensor, *maps: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Values of [B,H,W] maps at the pixels (floor(x), floor(y)) of points [B,Q,2] -> [B,Q] each."""
    W = maps[0].shape[-1]
    flat = points[..., 1].long() * W + points[..., 0].long()  # [B,Q]
    return tuple(torch.gather(m.flatten(1), 1, flat) for m in maps)


# ---- optimizer + schedule -----------------------------------------------------------------------
def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases, norms, LayerScale, cls token and position embeddings;
    the backbone's learning rate scaled by backbone_lr_ratio."""
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim < 2 or "pos" in name or "cls_token" in name
        groups.setdefault((name.startswith("backbone."), no_decay), []).append(p)
    cuda = all(p.is_cuda for ps in groups.values() for p in ps)
    return torch.optim.AdamW(
        [{"params": ps, "lr": cfg.lr * (cfg.backbone_lr_ratio if bb else 1.0), "weight_decay": 0.0 if nd else cfg.weight_decay}
         for (bb, nd), ps in sorted(groups.items())], lr=cfg.lr, betas=(0.9, 0.999),
        **({"fused": True} if cuda else {}))  # one kernel per group on CUDA instead of a dozen per tensor list


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup over warmup_steps, then cosine from 1 down to min_lr_ratio at cfg.steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    span = max(1, cfg.steps - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


# ---- logging ------------------------------------------------------------------------------------
class RunLog:
    """CSV rows on rank 0 (+ TensorBoard where installed).

    Rows are appended (a kill can cut at most the last row short), and every row of a step, the last
    evaluation's included, is written before that step's checkpoint: a kill never leaves a checkpoint
    whose rows are missing. On resume, log.csv and eval.csv keep their rows up to the resumed step and
    are rewritten atomically; rows that do not parse (a cut-short last row, garbage) are dropped with
    a warning naming the file and line.
    """

    def __init__(self, out_dir: Path, start_step: int, enabled: bool):
        self.enabled = enabled
        self.path = out_dir / "log.csv"
        self.eval_path = out_dir / "eval.csv"
        self.tb = None
        if not enabled:
            return
        for path in (self.path, self.eval_path):
            if path.is_file():
                self._truncate(path, start_step)
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(out_dir / "tb"))
        except Exception:  # tensorboard is optional
            self.tb = None

    @staticmethod
    def _truncate(path: Path, start_step: int) -> None:
        import io
        import warnings

        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = reader.fieldnames, []
            for line, r in enumerate(reader, 2):
                try:
                    step = int(r["step"])
                    if None in r or any(v is None for v in r.values()):
                        raise ValueError("wrong number of columns")
                except (TypeError, ValueError, KeyError) as e:
                    warnings.warn(f"{path}:{line}: dropping a row that does not parse ({e})")
                    continue
                if step <= start_step:
                    rows.append(r)
        buf = io.StringIO()
        if rows and fields:
            w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        atomic_write_text(path, buf.getvalue())

    def logged(self, step: int, eval_row: bool = False) -> dict[str, float] | None:
        """The row of `step` in log.csv (eval.csv) as numbers; None where there is none."""
        path = self.eval_path if eval_row else self.path
        if not self.enabled or not path.is_file():
            return None
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r.get("step") == str(step):
                    try:
                        return {k: float(v) for k, v in r.items() if k != "step"}
                    except (TypeError, ValueError):
                        return None
        return None

    def _append(self, path: Path, row: dict[str, Any]) -> None:
        new = not path.is_file() or path.stat().st_size == 0
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row), lineterminator="\n")
            if new:
                w.writeheader()
            w.writerow(row)

    def log(self, row: dict[str, Any], eval_row: bool = False) -> None:
        if not self.enabled:
            return
        self._append(self.eval_path if eval_row else self.path, row)
        if self.tb is not None:
            prefix = "val/" if eval_row else "train/"
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(prefix + k, v, row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


# ---- the loop -----------------------------------------------------------------------------------
def build_model(cfg: TrainConfig, device: torch.device) -> DepthPack:
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DepthPack(cfg.model_config()).to(device)
    for p in model.parameters():
        if p.numel() == 0:  # e.g. anchor_pos with anchor_grid=0: nothing to train, and DDP needs no grad for it
            p.requires_grad_(False)
    return model


def _check_resume_config(stored: dict[str, Any], mcfg: ModelConfig, d: Path) -> None:
    want = to_dict(mcfg)
    have = to_dict(from_dict(ModelConfig, dict(stored.get("model", {}))))  # fields added since: their defaults
    want.pop("backbone_weights", None), have.pop("backbone_weights", None)
    if have != want:
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        raise ValueError(f"resume: the model of checkpoint {d} differs from the config in {', '.join(diff)}")


def train(cfg: TrainConfig, hook: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train per cfg; returns a summary dict (also written to out_dir/summary.json on rank 0).

    hook(step, info), if given, runs after every step (after that step's checkpoint, if any):
    tests use it to stop a run at an arbitrary point, as a kill would.
    """
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    d = setup_distributed(cfg.device)
    out = Path(cfg.out_dir)
    try:
        return _train(cfg, d, out, hook)
    finally:
        if d.initialized_here:
            dist.destroy_process_group()


def _train(cfg: TrainConfig, d: Dist, out: Path, hook) -> dict[str, Any]:
    mcfg = cfg.model_config()
    if d.main:  # fail now, not at the first checkpoint, if the run folder cannot take files
        check_writable_dir(out, "out_dir")
        for folder in (out, *ckpt.list_checkpoints(out)):
            remove_stale_temporaries(folder)
    model = build_model(cfg, d.device)
    opt = make_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    stored_cfg = {"model": to_dict(mcfg), "train": to_dict(cfg)}

    start_step = 0
    existing = ckpt.list_checkpoints(out)
    if cfg.resume:
        found = ckpt.latest_checkpoint(out)
        if found is not None:
            cdir, blobs = found
            _check_resume_config(json.loads(blobs[ckpt.CONFIG]), mcfg, cdir)
            model.load_state_dict(ckpt.load_weights_bytes(blobs[ckpt.WEIGHTS], cdir / ckpt.WEIGHTS))
            state = ckpt.load_state_bytes(blobs[ckpt.STATE], cdir / ckpt.STATE)
            try:  # a state.pt that verifies but is not ours (another program, another version)
                opt.load_state_dict(state["optimizer"])
                sched.load_state_dict(state["scheduler"])
                ckpt.set_rng_state(state["rng"])
                start_step = int(state["step"])
            except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
                raise ckpt.CheckpointError(f"{cdir / ckpt.STATE}: not the training state of this run "
                                           f"({type(e).__name__}: {e})") from None
            if state.get("world_size", d.world) != d.world and d.main:
                print(f"resume: world size {state['world_size']} -> {d.world}; the data order after step {start_step} changes")
            if d.main:
                print(f"resumed from {cdir} at step {start_step}")
        elif d.main:
            print(f"resume: {out} holds no checkpoint yet; starting from step 0")
    elif existing:
        raise ValueError(f"{out} already holds checkpoints ({existing[-1].name}); pass resume=true to continue "
                         f"it, or choose another out_dir")
    if d.main:
        dump_yaml(cfg, out / "config.yaml")

    t_data = time.perf_counter()
    train_set = make_dataset(cfg.data, split="train", img_size=mcfg.img_size, min_depth=mcfg.min_depth, max_depth=mcfg.max_depth)
    if cfg.data.cache and hasattr(train_set, "prefill") and start_step < cfg.steps:
        # every core renders the cached scenes before the first step; DataLoader workers forked later
        # share them (copy-on-write) instead of each rendering its own copy every epoch
        train_set.prefill(processes=os.cpu_count() or 1, progress=d.main and cfg.progress)
    scenes = None
    if cfg.data.device_cache:  # every scene in one tensor on the device; batches made there
        scenes = DeviceScenes(train_set.store, d.device, cfg, mcfg, d.rank)
        stream = device_stream(scenes.n, cfg, d.world, d.rank, start_step, mcfg.buckets, d.device)
    else:
        stream = batch_stream(train_set, cfg, d, start_step, mcfg.buckets)
    data_setup_s = time.perf_counter() - t_data
    objective = PackedObjective(model, cfg.silog_lambda, cfg.distill_weight).to(d.device)
    runner: nn.Module = objective
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        runner = DDP(objective, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    step_fn = runner
    if cfg.compile:  # forward + backward compiled (AOTAutograd); one graph per shape, so per bucket on the device path
        import torch._dynamo as dynamo
        dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 4 * len(mcfg.buckets))
        step_fn = torch.compile(runner, dynamic=False)
    check_graph_config(cfg.graph, d.device, scenes is not None, d.world, cfg.compile)
    train_step = TrainStep(step_fn, model, opt, cfg.grad_clip, cfg.amp, d.device, graph=cfg.graph)
    log = RunLog(out, start_step, d.main)
    bar = None
    if d.main and cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.steps, initial=start_step, desc="train", dynamic_ncols=True)

    model.train()
    t0 = t_last = time.perf_counter()
    last_loss = float("nan")
    last_eval: dict[str, float] = {}
    step = start_step
    imgs_since, sums, n_sum = 0, torch.zeros(3, device=d.device), 0
    timer = StepTimer(d.device)
    first_step_s: dict[int, float] = {}  # bucket -> seconds of its first step (the compile, with cfg.compile)
    skip = start_step + min(10, max(0, (cfg.steps - start_step) // 10))  # warm-up steps left out of the timing
    stopped = None
    for step, q, item in stream:
        bucket = bucket_for(q, mcfg.buckets)
        if scenes is not None:  # made on the device
            b = scenes.batch(item, q, bucket, step)
            images, points, target, valid, extra, focal = b.images, b.points, b.target, b.valid, b.extra, b.focal
        else:
            batch = item
            points, target, valid = targets_for_batch(batch)
            images = batch["image"].to(d.device, non_blocking=True)
            points, target, valid = points.to(d.device), target.to(d.device), valid.to(d.device)
            extra = None
            if "extra_points" in batch:
                xp = batch["extra_points"]
                xt, xv = gather_at(xp, batch["depth"], batch["valid"])
                extra = tuple(t.to(d.device) for t in (xp, batch["extra_parent"], xt, xv))
            focal = batch["focal"].to(d.device) if "focal" in batch else None
        timer.data_ready()
        first = bucket not in first_step_s
        if first:
            _sync(d.device)
            t_first = time.perf_counter()
        loss, silog, distill, gnorm = train_step(images, points, target, valid, bucket, extra, focal)
        sched.step()
        timer.step_done(timed=not first and step > skip)
        if first:
            _sync(d.device)
            first_step_s[bucket] = round(time.perf_counter() - t_first, 3)
        imgs_since += images.shape[0] * d.world
        sums = sums + torch.stack([loss.detach(), silog, distill]).float()  # no host sync until the log row
        n_sum += 1

        if step % cfg.log_every == 0 or step == cfg.steps:
            mean = (sums / n_sum).tolist()  # the window's mean, not one noisy step
            last_loss = mean[0]
            data_ms, compute_ms = timer.window()
            now = time.perf_counter()
            row = dict(step=step, loss=round(last_loss, 6), silog=round(mean[1], 6), distill=round(mean[2], 6),
                       lr=float(sched.get_last_lr()[0]), q=q, bucket=bucket, grad_norm=round(float(gnorm), 4),
                       imgs_per_s=round(imgs_since / max(now - t_last, 1e-9), 2), elapsed_s=round(now - t0, 2),
                       data_ms=round(data_ms, 3), compute_ms=round(compute_ms, 3))
            log.log(row)
            if bar is not None:
                bar.set_postfix(loss=f"{last_loss:.4f}", img_s=f"{row['imgs_per_s']:.1f}", q=q)
            t_last, imgs_since, sums, n_sum = now, 0, torch.zeros(3, device=d.device), 0
            if cfg.max_time_s and _all_ranks_any(now - t0 > cfg.max_time_s, d):
                stopped = {"reason": f"max_time_s={cfg.max_time_s:g} reached", "at_step": step}
        if bar is not None:
            bar.update(1)
        if d.main and (step == cfg.steps or stopped is not None or cfg.eval_every and step % cfg.eval_every == 0):
            # the evaluation's row is logged before the checkpoint that marks the step done
            last_eval = _validate(model, cfg, mcfg, step, log)
        if d.main and (step % cfg.ckpt_every == 0 or step == cfg.steps or stopped is not None):
            _save(out, step, model, opt, sched, cfg, d, stored_cfg)
        if hook is not None:
            hook(step, {"loss": loss.detach(), "model": model})
        if stopped is not None:
            break
        timer.next_step()
    if bar is not None:
        bar.close()
    if d.main and step == cfg.steps and not ckpt.step_dir(out, step).is_dir():  # e.g. steps=0
        _save(out, step, model, opt, sched, cfg, d, stored_cfg)
    if d.main and start_step == cfg.steps:  # resumed at its end (killed after the last checkpoint), or steps=0
        last_eval = log.logged(step, eval_row=True) or _validate(model, cfg, mcfg, step, log)
        last_loss = (log.logged(step) or {}).get("loss", last_loss)
    _sync(d.device)
    wall = time.perf_counter() - t0
    timer.window()  # the last steps into the totals
    summary: dict[str, Any] = {"step": step, "steps": cfg.steps, "resumed_from": start_step, "last_loss": last_loss,
                               "wall_s": round(wall, 2), "world_size": d.world, "device": str(d.device)}
    if stopped is not None:
        summary["stopped_early"] = stopped
    summary["throughput"] = timer.summary(cfg.batch_size * d.world, step - start_step, wall, first_step_s,
                                          data_path="device" if scenes is not None else "host",
                                          data_setup_s=round(data_setup_s, 2), compile=cfg.compile, graph=cfg.graph,
                                          graph_capture_s=train_step.capture_s,
                                          scenes=len(train_set), batch_size=cfg.batch_size)
    if d.world > 1:
        summary["backend"] = dist.get_backend()
        summary["ranks_in_sync"] = _ranks_in_sync(model)
    if d.main:
        summary["val"] = last_eval
        atomic_write_json(out / "summary.json", summary)
    log.close()
    if d.world > 1:
        dist.barrier()
    return summary


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _all_ranks_any(flag: bool, d: Dist) -> bool:
    """True on every rank if it is True on any (so all ranks stop at the same step)."""
    if d.world == 1:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


class StepTimer:
    """Where a step's time goes: data (the batch made and on the device) and compute (forward,
    backward, optimizer). On CUDA it reads events on the device's clock, only at log rows (no sync per
    step); elsewhere the host's clock. Logging, validation and checkpoints fall between steps and
    count in neither."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple] = []
        self.start = self._mark()
        self._data = None
        self.total = [0.0, 0.0, 0]  # data s, compute s, steps (timed ones)

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def data_ready(self) -> None:
        self._data = self._mark()

    def step_done(self, timed: bool) -> None:
        self.marks.append((self.start, self._data, self._mark(), timed))

    def next_step(self) -> None:
        self.start = self._mark()

    def window(self) -> tuple[float, float]:
        """Mean data and compute ms per step since the last call (and the timed ones into the totals)."""
        if not self.marks:
            return float("nan"), float("nan")
        if self.cuda:
            self.marks[-1][2].synchronize()
        sd = sc = 0.0
        for a, b, c, timed in self.marks:
            ds, cs = self._seconds(a, b), self._seconds(b, c)
            sd, sc = sd + ds, sc + cs
            if timed:
                self.total[0] += ds
                self.total[1] += cs
                self.total[2] += 1
        n = len(self.marks)
        self.marks.clear()
        return 1e3 * sd / n, 1e3 * sc / n

    def summary(self, images_per_step: int, steps: int, wall: float, first_step_s: dict, **extra) -> dict[str, Any]:
        d, c, n = self.total
        out: dict[str, Any] = {"timed_steps": n, "clock": "cuda events" if self.cuda else "host"}
        if n:
            per = (d + c) / n
            out.update(imgs_per_s=round(images_per_step / per, 1), step_ms=round(1e3 * per, 3),
                       data_ms=round(1e3 * d / n, 3), compute_ms=round(1e3 * c / n, 3), data_share=round(d / (d + c), 4))
        out.update(wall_imgs_per_s=round(images_per_step * steps / max(wall, 1e-9), 1), first_step_s=first_step_s, **extra)
        return out


def _ranks_in_sync(model: nn.Module) -> bool:
    """Whether every rank ends with the same weights (DDP's all-reduce at work): exact float64 sums."""
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    sig = torch.stack([flat.sum(), flat.abs().sum(), (flat * flat).sum()])
    every = [torch.empty_like(sig) for _ in range(dist.get_world_size())]
    dist.all_gather(every, sig)
    return all(torch.equal(every[0], other) for other in every[1:])


def _save(out: Path, step: int, model: DepthPack, opt, sched, cfg: TrainConfig, d: Dist, stored_cfg: dict) -> None:
    opt_state, sched_state = plain_lr_state(opt.state_dict(), sched.state_dict())
    state = {"step": step, "optimizer": opt_state, "scheduler": sched_state, "rng": ckpt.rng_state(),
             "world_size": d.world, "data": {"seed": cfg.seed, "position": step, "batch_size": cfg.batch_size}}
    ckpt.save_checkpoint(out, step, model, state, stored_cfg, keep=cfg.keep_checkpoints)


def _validate(model: DepthPack, cfg: TrainConfig, mcfg: ModelConfig, step: int, log: RunLog) -> dict[str, float]:
    """Packed-path metrics on the first eval_images validation images (fixed points), logged to eval.csv."""
    val = make_dataset(cfg.data, split="val", img_size=mcfg.img_size, min_depth=mcfg.min_depth, max_depth=mcfg.max_depth)
    was = model.training
    model.eval()
    metrics = quick_eval(model, val, q=min(cfg.eval_queries, mcfg.buckets[-1]), max_images=cfg.eval_images, seed=cfg.seed)
    model.train(was)
    log.log({"step": step, **{k: round(v, 6) for k, v in metrics.items()}}, eval_row=True)
    return metrics
