"""The training loop, and the train command (python -m depthpack.train, train/train.py).

    from depthpack.train import load_train_config, train
    summary = train(load_train_config("configs/demo.yaml", ["steps=200"]))

A step: a Batch on the device (depthpack.train.batches, from either data path), the packed path's
loss at its points (PackedObjective, depthpack.train.losses), backward, clipping and AdamW with
warmup then cosine (TrainStep, depthpack.train.step: eager, compiled or a CUDA graph). All that is
random is a function of (seed, step, rank): a run resumed from step S replays S+1.. as the
uninterrupted run would (bit for bit on CPU). Under torchrun it runs DistributedDataParallel (nccl
on CUDA, gloo on CPU); rank 0 alone writes. Run folder: config.yaml, log.csv, eval.csv,
summary.json, latest.json + checkpoints/ (depthpack.core.checkpoint), tb/ (with tensorboard).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

from ..core import checkpoint as ckpt, cli
from ..core.config import ModelConfig, from_dict, to_dict
from ..core.files import atomic_write_json, check_writable_dir, remove_stale_temporaries
from ..core.model import DepthPack
from ..core.provenance import commit, device_name
from ..data.datasets import make_dataset
from ..eval.evaluate import quick_eval
from .batches import Batch, host_batches
from .config import TrainConfig, draw_bucket, dump_yaml, load_train_config, step_path
from .device_data import DeviceScenes, FreshScenes, device_stream
from .log import Meter, RunLog, sync
from .losses import PackedObjective
from .step import TrainStep, check_graph_config, plain_lr_state


# ---- distributed setup --------------------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
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
    return Dist(rank, world, dev, here)


def _all_ranks_any(flag: bool, d: Dist) -> bool:
    """True on every rank if it is True on any (so all ranks stop at the same step)."""
    if d.world == 1:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def _ranks_in_sync(model: nn.Module) -> bool:
    """Whether every rank ends with the same weights (DDP's all-reduce at work): exact float64 sums."""
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    sig = torch.stack([flat.sum(), flat.abs().sum(), (flat * flat).sum()])
    every = [torch.empty_like(sig) for _ in range(dist.get_world_size())]
    dist.all_gather(every, sig)
    return all(torch.equal(every[0], other) for other in every[1:])


# ---- model, optimizer, schedule, step -----------------------------------------------------------
def build_model(cfg: TrainConfig, device: torch.device) -> DepthPack:
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DepthPack(cfg.model_config()).to(device)
    for p in model.parameters():
        if p.numel() == 0:  # e.g. anchor_pos with anchor_grid=0: nothing to train, and DDP needs no grad for it
            p.requires_grad_(False)
    return model


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


def make_step(model: DepthPack, opt: torch.optim.Optimizer, cfg: TrainConfig, d: Dist) -> TrainStep:
    """The objective, under DDP with several processes, compiled with cfg.compile, in a TrainStep."""
    objective = PackedObjective(model, cfg.silog_lambda, cfg.glance_loss).to(d.device)
    runner: nn.Module = objective
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        runner = DDP(runner, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    if cfg.compile:  # forward + backward compiled (AOTAutograd); one graph per shape, so per bucket on the device path
        import torch._dynamo as dynamo
        dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 4 * len(cfg.model_config().buckets))
        runner = torch.compile(runner, dynamic=False)
    step = TrainStep(runner, model, opt, cfg.grad_clip, cfg.amp, d.device, graph=cfg.graph)
    return step


# ---- the run folder: start, resume, save --------------------------------------------------------
def prepare_out_dir(out: Path) -> None:
    """Rank 0, before anything reads it: out takes files, and what killed writers left there is gone
    (temporaries of dead processes, checkpoints that never completed: each said in a warning)."""
    check_writable_dir(out, "out_dir")
    for folder in (out, *ckpt.list_checkpoints(out)):
        remove_stale_temporaries(folder)
    for d in ckpt.remove_incomplete(out):
        warnings.warn(f"checkpoint {d} never completed (no {ckpt.META}: its write was cut short); removed it")


def restore(cfg: TrainConfig, out: Path, model: DepthPack, opt, sched, d: Dist) -> int:
    """The step this run starts from. A new run (resume=false) refuses a folder that holds checkpoints.
    resume=true loads the newest checkpoint that fits this run (model, optimizer, scheduler, RNG); each
    newer one that does not is one warning line; 0 when there is none; a checkpoint past cfg.steps is refused."""
    if not cfg.resume:
        existing = ckpt.list_checkpoints(out)
        if existing:
            raise ValueError(f"{out} already holds checkpoints ({existing[-1].name}); pass resume=true to continue "
                             f"it, or choose another out_dir")
        return 0
    mcfg = cfg.model_config()
    found = ckpt.latest_checkpoint(out, use=lambda cdir, blobs: _load(cdir, blobs, mcfg, model, opt, sched))
    if found is None:
        if d.main:
            print(f"resume: {out} holds no checkpoint yet; starting from step 0")
        return 0
    cdir, (step, world) = found
    if step > cfg.steps:  # it would only rewrite summary.json, with nothing trained
        raise ValueError(f"resume: {cdir} is at step {step}, past steps={cfg.steps}: resume with steps >= {step}, or "
                         f"choose another out_dir")
    if d.main:
        if world not in (None, d.world):
            print(f"resume: world size {world} -> {d.world}; the data order after step {step} changes")
        print(f"resumed from {cdir} at step {step}")
    return step


def _load(cdir: Path, blobs: dict[str, bytes], mcfg: ModelConfig, model: DepthPack, opt, sched) -> tuple[int, Any]:
    """Checkpoint cdir into this run: (its step, its world size); a CheckpointError if it is not of this run."""
    want = to_dict(mcfg)
    have = to_dict(from_dict(ModelConfig, json.loads(blobs[ckpt.CONFIG])["model"]))  # fields added since: defaults
    diff = [f"{k} {have.get(k)!r} (the config: {want.get(k)!r})" for k in sorted(set(want) | set(have))
            if k != "backbone_weights" and want.get(k) != have.get(k)]
    if diff:
        raise ckpt.CheckpointError(f"checkpoint {cdir} holds another model: {', '.join(diff)}")
    ckpt.load_weights(model, ckpt.load_weights_bytes(blobs[ckpt.WEIGHTS], cdir / ckpt.WEIGHTS), cdir / ckpt.WEIGHTS)
    state = ckpt.load_state_bytes(blobs[ckpt.STATE], cdir / ckpt.STATE)
    try:  # a state.pt that verifies but is not ours (another program, another version)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        return int(state["step"]), state.get("world_size")
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as e:
        raise ckpt.CheckpointError(f"{cdir / ckpt.STATE}: not the training state of this run "
                                   f"({type(e).__name__}: {e})") from None


def _save(out: Path, step: int, model: DepthPack, opt, sched, cfg: TrainConfig, world: int) -> None:
    opt_state, sched_state = plain_lr_state(opt.state_dict(), sched.state_dict())
    state = {"step": step, "optimizer": opt_state, "scheduler": sched_state, "rng": ckpt.rng_state(),
             "world_size": world, "data": {"seed": cfg.seed, "position": step, "batch_size": cfg.batch_size}}
    stored = {"model": to_dict(cfg.model_config()), "train": to_dict(cfg)}
    ckpt.save_checkpoint(out, step, model, state, stored, keep=cfg.keep_checkpoints)


def _validate(model: DepthPack, cfg: TrainConfig, step: int, log: RunLog) -> dict[str, float]:
    """Packed-path metrics on the first eval_images validation images (fixed points), logged to eval.csv."""
    mcfg = cfg.model_config()
    val = make_dataset(cfg.data, split="val", img_size=mcfg.img_size, min_depth=mcfg.min_depth, max_depth=mcfg.max_depth)
    was = model.training
    model.eval()
    metrics = quick_eval(model, val, q=min(cfg.eval_queries, mcfg.buckets[-1]), max_images=cfg.eval_images, seed=cfg.seed)
    model.train(was)
    log.log({"step": step, **{k: round(v, 6) for k, v in metrics.items()}}, eval_row=True)
    return metrics


# ---- data ---------------------------------------------------------------------------------------
def open_batches(cfg: TrainConfig, d: Dist, start_step: int) -> tuple[Iterator[Batch], int | str]:
    """The batches of steps start_step+1 .. cfg.steps on the device, from the data path cfg names (chosen
    here, once), and the number of training samples ("fresh": a new batch of scenes every step)."""
    mcfg = cfg.model_config()
    if cfg.data.fresh:
        return FreshScenes(cfg, mcfg, d.device, d.world, d.rank).batches(start_step), "fresh"
    train_set = make_dataset(cfg.data, split="train", img_size=mcfg.img_size, min_depth=mcfg.min_depth,
                             max_depth=mcfg.max_depth)
    if cfg.data.cache and hasattr(train_set, "prefill") and start_step < cfg.steps:
        # every core renders the cached scenes before the first step; DataLoader workers forked later
        # share them (copy-on-write) instead of each rendering its own copy every epoch
        train_set.prefill(processes=os.cpu_count() or 1, progress=d.main and cfg.progress)
    if not cfg.data.device_cache:
        return host_batches(train_set, cfg, d.rank, d.world, start_step, d.device), len(train_set)
    scenes = DeviceScenes(train_set.store, d.device, cfg, mcfg, d.rank)  # every scene in one tensor on the device
    return (scenes.batch(idx, q, draw_bucket(cfg, mcfg.buckets, q, step), step) for step, q, idx in
            device_stream(scenes.n, cfg, d.world, d.rank, start_step, mcfg.buckets, d.device)), len(train_set)


# ---- the loop -----------------------------------------------------------------------------------
def train(cfg: TrainConfig, hook: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train per cfg; returns a summary dict (also written to out_dir/summary.json on rank 0).

    hook(step, info), if given, runs after every step (after that step's checkpoint, if any):
    tests use it to stop a run at an arbitrary point, as a kill would.
    """
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    d = setup_distributed(cfg.device)
    try:
        return _train(cfg, d, hook)
    finally:
        if d.initialized_here:
            dist.destroy_process_group()


def start(cfg: TrainConfig, d: Dist) -> tuple[Path, DepthPack, torch.optim.Optimizer, Any, int]:
    """The run folder ready (config.yaml written), the model, its optimizer and schedule, and the step
    they start from (restore); every refusal comes before anything is written."""
    out = Path(cfg.out_dir)
    check_graph_config(cfg.graph, d.device, cfg.data.device_cache or cfg.data.fresh, d.world, cfg.compile)
    if d.main:
        prepare_out_dir(out)
    if d.world > 1:
        dist.barrier()  # every rank reads the folder rank 0 prepared
    model = build_model(cfg, d.device)
    opt = make_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    start_step = restore(cfg, out, model, opt, sched, d)
    if d.main:
        dump_yaml(cfg, out / "config.yaml")
    return out, model, opt, sched, start_step


def _train(cfg: TrainConfig, d: Dist, hook) -> dict[str, Any]:
    out, model, opt, sched, start_step = start(cfg, d)
    t_data = time.perf_counter()
    batches, scenes = open_batches(cfg, d, start_step)
    data_setup_s = round(time.perf_counter() - t_data, 2)
    train_step = make_step(model, opt, cfg, d)
    log = RunLog(out, start_step, d.main, cfg.steps, cfg.progress)
    model.train()
    skip = start_step + min(10, max(0, (cfg.steps - start_step) // 10))  # warm-up steps left out of the timing
    meter = Meter(d.device, cfg.batch_size * d.world, skip)
    step, last_eval, stopped = start_step, {}, None
    try:
        for b in batches:
            step = b.step
            b = replace(b, **dict(zip(("path", "size"), step_path(cfg, step))))
            meter.data_ready(b)
            loss, terms, gnorm = train_step(b)
            sched.step()
            meter.step_done(b, loss, terms)
            if step % cfg.log_every == 0 or step == cfg.steps:
                log.log(meter.row(b, sched.get_last_lr()[0], gnorm))
                if cfg.max_time_s and _all_ranks_any(meter.elapsed() > cfg.max_time_s, d):
                    stopped = {"reason": f"max_time_s={cfg.max_time_s:g} reached", "at_step": step}
            log.step_done()
            end = step == cfg.steps or stopped is not None
            if d.main and (end or cfg.eval_every and step % cfg.eval_every == 0):
                last_eval = _validate(model, cfg, step, log)  # logged before the checkpoint that marks the step done
            if d.main and (end or step % cfg.ckpt_every == 0):
                _save(out, step, model, opt, sched, cfg, d.world)
            if hook is not None:
                hook(step, {"loss": loss.detach(), "model": model})
            if stopped is not None:
                break
            meter.next_step()
    finally:
        log.close()  # the progress bar ends here, also when a kill or Ctrl-C ends the loop
    if d.main and step == cfg.steps and not ckpt.step_dir(out, step).is_dir():  # e.g. steps=0
        _save(out, step, model, opt, sched, cfg, d.world)
    last_loss = meter.last.get("loss", float("nan"))
    if d.main and start_step == cfg.steps:  # resumed at its end (killed after the last checkpoint), or steps=0
        last_eval = log.logged(step, eval_row=True) or _validate(model, cfg, step, log)
        last_loss = (log.logged(step) or {}).get("loss", last_loss)
    sync(d.device)
    wall = meter.elapsed()
    summary: dict[str, Any] = {"step": step, "steps": cfg.steps, "resumed_from": start_step, "last_loss": last_loss,
                               "wall_s": round(wall, 2), "world_size": d.world, "device": str(d.device),
                               "device_name": device_name(d.device), "torch": torch.__version__, "commit": commit()}
    if stopped is not None:
        summary["stopped_early"] = stopped
    path = "fresh" if cfg.data.fresh else "device" if cfg.data.device_cache else "host"
    summary["throughput"] = meter.summary(step - start_step, wall, data_path=path, data_setup_s=data_setup_s,
                                          compile=cfg.compile, graph=cfg.graph, graph_capture_s=train_step.capture_s,
                                          scenes=scenes, batch_size=cfg.batch_size)
    if d.world > 1:
        summary["backend"] = dist.get_backend()
        summary["ranks_in_sync"] = _ranks_in_sync(model)
    if d.main:
        summary["val"] = last_eval
        atomic_write_json(out / "summary.json", summary)
    if d.world > 1:
        dist.barrier()
    return summary


# ---- the command --------------------------------------------------------------------------------
EXAMPLES = """\
    python -m depthpack.train --config configs/tiny.yaml steps=5 out_dir=runs/t model.depth=1
    python -m depthpack.train --config configs/demo.yaml resume=true        # continue a stopped run
    torchrun --nproc_per_node=2 -m depthpack.train --config configs/vits_nyu.yaml data.root=/data/nyu

The YAML holds what differs from TrainConfig's defaults; key=value overrides (model.*, data.*) go on
top; the merged config is written to OUT_DIR/config.yaml. A refusal is one line on stderr and exit
code 1; Ctrl-C is one line and exit code 130, the last complete checkpoint and the log kept.
"""


def _main(argv: list[str] | None = None) -> dict[str, Any] | int:
    ap = cli.Parser(prog="python -m depthpack.train", description="Train depthpack (train/train.py is the same).",
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter, name="train")
    ap.add_argument("--config", default=None, help="YAML with the fields that differ from the defaults")
    ap.add_argument("overrides", nargs="*", help="key=value (dotted keys for model.* and data.*)")
    a = ap.parse_args(argv)
    cfg = load_train_config(a.config, a.overrides)
    try:
        summary = train(cfg)
    except KeyboardInterrupt:  # as a kill: the last complete checkpoint and the log stay; one line, no traceback
        print(f"train: interrupted; {_resume_point(Path(cfg.out_dir))}", file=sys.stderr, flush=True)
        return 130
    if "val" in summary:  # rank 0 only
        print(json.dumps(summary))
    return summary


def _resume_point(out: Path) -> str:
    try:
        step = json.loads((out / ckpt.LATEST).read_bytes())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{out} holds no complete checkpoint yet (resume=true starts from step 0)"
    return f"{out} keeps its checkpoints up to step {step} (resume=true continues from it)"


def main(argv: list[str] | None = None) -> int:
    """The train command (python -m depthpack.train, train/train.py): 0, 1 on a refusal, 130 on Ctrl-C."""
    return cli.run("train", _main, argv)
