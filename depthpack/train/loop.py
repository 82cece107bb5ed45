"""The training loop: train(cfg) runs a whole run, and this file reads as it runs, top to bottom.

    from depthpack.train import load_train_config, train
    summary = train(load_train_config("configs/demo.yaml", ["steps=200"]))

A run joins its processes (depthpack.train.distributed: DDP under torchrun, nccl on CUDA, gloo on
CPU; rank 0 alone writes), makes its folder ready and restores from it (depthpack.train.run_folder),
opens the batches of its data path, then steps: a Batch on the device (depthpack.train.batches), the
packed path's loss at its points (PackedObjective, depthpack.train.losses), backward, clipping and
AdamW with warmup then cosine (depthpack.train.optim; TrainStep, depthpack.train.step: eager, compiled
or a CUDA graph), a log row, an evaluation and a checkpoint when due. All that is random is a function
of (seed, step, rank): a run resumed from step S replays S+1.. as the uninterrupted run would (bit for
bit on CPU). The command line is depthpack.train.cli.
"""
from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..core.files import atomic_write_json
from ..core.model import DepthPack
from ..core.provenance import commit, device_name
from ..data.datasets import make_dataset
from ..eval.evaluate import quick_eval
from .batches import Batch, host_batches
from .config import TrainConfig, dump_yaml, step_path
from .device_data import DeviceScenes, FreshScenes
from .distributed import Dist, all_ranks_any, ranks_in_sync, setup_distributed
from .log import Meter, RunLog, sync
from .optim import make_optimizer, make_schedule
from .run_folder import prepare_out_dir, restore, save, saved
from .step import check_graph_config, make_step


def train(cfg: TrainConfig, hook: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train per cfg; returns a summary dict (also written to out_dir/summary.json on rank 0).

    hook(step, info), if given, runs after every step (after that step's checkpoint, if any):
    tests use it to stop a run at an arbitrary point, as a kill would.
    """
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    d = setup_distributed(cfg.device)
    try:
        with ExitStack() as held:  # rank 0's hold on the run folder (its lock), until the run ends
            return _train(cfg, d, hook, held)
    finally:
        d.close()


def _train(cfg: TrainConfig, d: Dist, hook, held: ExitStack) -> dict[str, Any]:
    out, model, opt, sched, start_step = start(cfg, d, held)
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
                if cfg.max_time_s and all_ranks_any(meter.elapsed() > cfg.max_time_s, d):
                    stopped = {"reason": f"max_time_s={cfg.max_time_s:g} reached", "at_step": step}
            log.step_done()
            end = step == cfg.steps or stopped is not None
            if d.main and (end or cfg.eval_every and step % cfg.eval_every == 0):
                last_eval = _validate(model, cfg, step, log)  # logged before the checkpoint that marks the step done
            if d.main and (end or step % cfg.ckpt_every == 0):
                save(out, step, model, opt, sched, cfg, d.world)
            if hook is not None:
                hook(step, {"loss": loss.detach(), "model": model})
            if stopped is not None:
                break
            meter.next_step()
    finally:
        log.close()  # the progress bar ends here, also when a kill or Ctrl-C ends the loop
    if d.main and step == cfg.steps and not saved(out, step):  # e.g. steps=0
        save(out, step, model, opt, sched, cfg, d.world)
    last_loss = meter.last.get("loss", float("nan"))
    if d.main and start_step == cfg.steps:  # resumed at its end (killed after the last checkpoint), or steps=0
        last_eval = log.logged(step, eval_row=True) or _validate(model, cfg, step, log)
        last_loss = (log.logged(step) or {}).get("loss", last_loss)
    sync(d.device)
    wall = meter.elapsed()
    throughput = meter.summary(step - start_step, wall, data_path=cfg.data_path, data_setup_s=data_setup_s,
                               compile=cfg.compile, graph=cfg.graph, graph_capture_s=train_step.capture_s,
                               scenes=scenes, batch_size=cfg.batch_size)
    summary = _summary(cfg, d, model, step, start_step, last_loss, wall, stopped, throughput)
    if d.main:
        summary["val"] = last_eval
        atomic_write_json(out / "summary.json", summary)
    d.barrier()
    return summary


def start(cfg: TrainConfig, d: Dist, held: ExitStack) -> tuple[Path, DepthPack, torch.optim.Optimizer, Any, int]:
    """The run folder ready (held: its lock, on rank 0; config.yaml written), the model, its optimizer and
    schedule, and the step they start from (restore); every refusal comes before anything is written."""
    out = Path(cfg.out_dir)
    check_graph_config(cfg, device=d.device, world=d.world)
    if d.main:
        held.enter_context(prepare_out_dir(out))
    d.barrier()  # every rank reads the folder rank 0 prepared
    model = build_model(cfg, d.device)
    opt = make_optimizer(model, cfg)
    sched = make_schedule(opt, cfg)
    start_step = restore(cfg, out, model, opt, sched, d)
    if d.main:
        dump_yaml(cfg, out / "config.yaml")
    return out, model, opt, sched, start_step


def build_model(cfg: TrainConfig, device: torch.device) -> DepthPack:
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DepthPack(cfg.model_config()).to(device)
    for p in model.parameters():
        if p.numel() == 0:  # e.g. anchor_pos with anchor_grid=0: nothing to train, and DDP needs no grad for it
            p.requires_grad_(False)
    return model


def open_batches(cfg: TrainConfig, d: Dist, start_step: int) -> tuple[Iterator[Batch], int | str]:
    """The batches of steps start_step+1 .. cfg.steps on the device, from the one data path the run
    names (cfg.data_path), and the number of training samples ("fresh": new scenes every step)."""
    mcfg = cfg.model_config()
    if cfg.data_path == "fresh":  # every step's scenes rendered new, on the device
        return FreshScenes(cfg, mcfg, d.device, d.world, d.rank).batches(start_step), "fresh"
    train_set = _training_set(cfg, d, start_step)
    if cfg.data_path == "device":  # every scene in one tensor on the device; each batch made there
        scenes = DeviceScenes(train_set.store, d.device, cfg, mcfg, d.rank, d.world)
        return scenes.batches(start_step), len(train_set)
    # "host": a DataLoader over the data set, each batch copied to the device
    return host_batches(train_set, cfg, d.rank, d.world, start_step, d.device), len(train_set)


def _training_set(cfg: TrainConfig, d: Dist, start_step: int):
    """The train split at the model's size (or cfg.data_size); with data.cache its synthetic scenes rendered now, by
    every core (DataLoader workers forked later share them, copy-on-write, instead of each rendering its own copy)."""
    mcfg = cfg.model_config()
    train_set = make_dataset(cfg.data, split="train", img_size=cfg.scene_size,
                             min_depth=mcfg.min_depth, max_depth=mcfg.max_depth)
    if cfg.data.cache and hasattr(train_set, "prefill") and start_step < cfg.steps:
        train_set.prefill(processes=os.cpu_count() or 1, progress=d.main and cfg.progress)
    return train_set


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


def _summary(cfg: TrainConfig, d: Dist, model: DepthPack, step: int, start_step: int, last_loss: float, wall: float,
             stopped: dict | None, throughput: dict[str, Any]) -> dict[str, Any]:
    """summary.json but for its val: where the run ended, on what, how fast, and (DDP) whether the ranks
    hold the same weights."""
    summary: dict[str, Any] = {"step": step, "steps": cfg.steps, "resumed_from": start_step, "last_loss": last_loss,
                               "wall_s": round(wall, 2), "world_size": d.world, "device": str(d.device),
                               "device_name": device_name(d.device), "torch": torch.__version__, "commit": commit()}
    if stopped is not None:
        summary["stopped_early"] = stopped
    summary["throughput"] = throughput
    if d.world > 1:
        summary["backend"] = d.backend
        summary["ranks_in_sync"] = ranks_in_sync(model)
    return summary
