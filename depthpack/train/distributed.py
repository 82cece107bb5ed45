"""Distributed setup: under torchrun (WORLD_SIZE, RANK, LOCAL_RANK set) every process joins one group,
nccl on CUDA and gloo on CPU; rank 0 alone writes. One process needs none of it (world 1).

    d = setup_distributed(cfg.device)      # Dist(rank, world, device)
    ...
    d.close()                              # leaves the group if setup_distributed joined it
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    initialized_here: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        return dist.get_backend() if self.world > 1 else "none"

    def barrier(self) -> None:
        """Every rank waits here for the others (nothing to wait for in one process)."""
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.initialized_here:
            dist.destroy_process_group()


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


def all_ranks_any(flag: bool, d: Dist) -> bool:
    """True on every rank if it is True on any (so all ranks stop at the same step)."""
    if d.world == 1:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def ranks_in_sync(model: nn.Module) -> bool:
    """Whether every rank ends with the same weights (DDP's all-reduce at work): exact float64 sums."""
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    sig = torch.stack([flat.sum(), flat.abs().sum(), (flat * flat).sum()])
    every = [torch.empty_like(sig) for _ in range(dist.get_world_size())]
    dist.all_gather(every, sig)
    return all(torch.equal(every[0], other) for other in every[1:])
