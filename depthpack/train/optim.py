"""The optimizer and its schedule: AdamW, linear warmup then cosine.

    opt = make_optimizer(model, cfg)
    sched = make_schedule(opt, cfg)       # sched.step() after every optimizer step
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import TrainConfig


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


def make_schedule(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Each group's learning rate times lr_factor of the step."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
