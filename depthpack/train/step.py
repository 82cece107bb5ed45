"""One training step (forward, backward, gradient clipping, AdamW), eager or replayed from a CUDA graph.

    step = make_step(model, opt, cfg, d)          # the objective (under DDP, compiled) in a TrainStep
    loss, terms, grad_norm = step(batch)          # batch: a depthpack.train.batches.Batch

Why a graph (cfg.graph): a small model's step is launch-bound; from a CUDA graph its kernels go out in
one call. Each bucket gets one graph: its first WARMUP steps run eagerly on a side stream (they
train), the next is captured, and every later step of that bucket copies its batch into the graph's
input buffers and replays. Capture needs, and this arranges:
- fixed shapes per bucket: the device data paths (data.device_cache, data.fresh) pad every batch to its bucket;
- AdamW fused and capturable, its learning rates device tensors that the scheduler fills between
  replays (a Python float would be frozen into the graph at capture);
- the gradients allocated inside the graph (set to None before the capture; each replay overwrites them);
- autocast without its weight-cast cache (a cached cast would outlive the capture).
Checkpoints hold the learning rates as floats either way (depthpack.train.run_folder.plain_lr_state),
so a run may resume with the graph on or off.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace

import torch
import torch.nn as nn

from .batches import Batch
from .config import TrainConfig
from .distributed import Dist
from .losses import PackedObjective

WARMUP = 3  # eager steps per bucket before its capture (lazy initialisation stays out of the graph)

StepOut = tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]  # loss, its terms (the objective's), grad norm


def check_graph_config(cfg: TrainConfig, *, device: torch.device, world: int) -> None:
    """One clear error for a graph (cfg.graph) asked where it cannot run: on device, in a run of world processes."""
    if not cfg.graph:
        return
    if cfg.compile:  # not measured or tested together: Inductor's code inside a hand-captured graph
        raise ValueError("graph=true and compile=true together are not supported: choose one (graph=true alone "
                         "takes the launches out of a small model's step)")
    if device.type != "cuda":
        raise ValueError(f"graph=true captures the training step in a CUDA graph: it needs a CUDA device, not {device}")
    if cfg.data_path == "host":
        raise ValueError("graph=true needs data.device_cache=true or data.fresh=true: the device data paths pad every "
                         "batch to its bucket, so each bucket has one shape to capture (the host path's shapes follow Q)")
    if world > 1:
        raise ValueError(f"graph=true runs one process; this run has {world} (under torchrun set graph=false)")


def make_step(model: nn.Module, opt: torch.optim.Optimizer, cfg: TrainConfig, d: Dist) -> TrainStep:
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
    return TrainStep(runner, model, opt, cfg.grad_clip, cfg.amp, d.device, graph=cfg.graph)


def make_capturable(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """AdamW as a CUDA graph can replay it: capturable, each group's lr a device tensor."""
    for group in opt.param_groups:
        group["capturable"] = True
        lr = group["lr"]
        if not (isinstance(lr, torch.Tensor) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)


def _flatten(b: Batch) -> list[torch.Tensor | None]:
    return [b.images, b.points, b.target, b.valid, *(b.extra if b.extra is not None else (None,) * 4), b.focal,
            *(b.glance if b.glance is not None else (None,) * 2)]


def _unflatten(flat: list, b: Batch) -> Batch:
    images, points, target, valid, x0, x1, x2, x3, focal, g0, g1 = flat
    extra = None if x0 is None else (x0, x1, x2, x3)
    glance = None if g0 is None else (g0, g1)
    return replace(b, images=images, points=points, target=target, valid=valid, extra=extra, focal=focal, glance=glance)


def _layout(flat: list) -> tuple:
    return tuple(None if t is None else (tuple(t.shape), t.dtype) for t in flat)


class TrainStep:
    """The training step of cfg; with graph=True one CUDA graph per bucket (see the module doc)."""

    def __init__(self, runner: nn.Module, model: nn.Module, opt: torch.optim.Optimizer, grad_clip: float, amp: bool,
                 device: torch.device, graph: bool = False):
        self.runner, self.model, self.opt, self.device, self.graph = runner, model, opt, device, graph
        self.clip = grad_clip if grad_clip > 0 else float("inf")
        self.amp = amp and device.type == "cuda"
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, list, tuple, StepOut]] = {}
        self.seen: dict[int, int] = {}
        self.capture_s: dict[int, float] = {}  # bucket -> seconds its capture took
        if graph:
            make_capturable(opt, device)
            self.side = torch.cuda.Stream(device)

    def eager(self, b: Batch) -> StepOut:
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not self.graph) if self.amp
                    else contextlib.nullcontext())
        with autocast:
            loss, terms = self.runner(b.images, b.points, b.target, b.valid, b.bucket, b.extra, b.focal, b.glance,
                                      b.path == "dense", b.size)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        return loss, terms, gnorm

    def __call__(self, b: Batch) -> StepOut:
        if not self.graph:
            return self.eager(b)
        flat = _flatten(b)
        key = (b.bucket, b.path, b.size)
        captured = self.graphs.get(key)
        if captured is None:
            n = self.seen.get(key, 0)
            self.seen[key] = n + 1
            if n < WARMUP:
                return self._on_side_stream(b)
            captured = self._capture(b, flat)
        graph, static, layout, out = captured
        if _layout(flat) != layout:
            raise ValueError(f"bucket {b.bucket}: the batch's tensors {_layout(flat)} differ from those its graph was "
                             f"captured with {layout}")
        for s, t in zip(static, flat):
            if s is not None:
                s.copy_(t, non_blocking=True)
        graph.replay()
        return out

    def _on_side_stream(self, b: Batch) -> StepOut:
        cur = torch.cuda.current_stream(self.device)
        self.side.wait_stream(cur)
        with torch.cuda.stream(self.side):
            out = self.eager(b)
        cur.wait_stream(self.side)
        return out

    def _capture(self, b: Batch, flat: list) -> tuple:
        t0 = time.perf_counter()
        static = [None if t is None else t.clone() for t in flat]
        self.opt.zero_grad(set_to_none=True)  # the graph allocates the gradients it writes
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.eager(_unflatten(static, b))
        self.graphs[(b.bucket, b.path, b.size)] = captured = (graph, static, _layout(flat), out)
        self.capture_s[b.bucket if (b.path, b.size) == ("packed", None) else f"{b.bucket} {b.path} {b.size}"] = \
            round(time.perf_counter() - t0, 3)
        return captured
