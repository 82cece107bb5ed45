"""TrainConfig: one training run, from a YAML file (only what differs from the defaults) plus
`key=value` overrides (dotted for model.* and data.*); unknown keys and nonsense values are errors."""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from ..core.config import (ModelConfig, coerce_dict, coerce_fields, deep_merge, from_dict, load_yaml, model_config,
                           parse_overrides, to_dict)
from ..core.files import atomic_write_text
from ..core.packing import bucket_for
from ..data.config import DataConfig


@dataclass
class TrainConfig:
    """One training run. Sizes are per process: under torchrun the global batch is batch_size * world_size.

    The model is `preset` plus the `model` overrides (a dict of ModelConfig fields, or a whole
    ModelConfig); `data` is a depthpack.data.DataConfig.
    """
    preset: str = "vits"  # ModelConfig preset name (see depthpack.core.config.PRESETS)
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides on top of the preset
    data: DataConfig = field(default_factory=DataConfig)
    out_dir: str = "runs/default"  # run folder: config.yaml, log.csv, latest.json, checkpoints/
    steps: int = 1000  # total optimizer steps (a resumed run stops at the same count)
    batch_size: int = 16  # images per step and process
    lr: float = 3e-4  # peak AdamW learning rate
    backbone_lr_ratio: float = 1.0  # backbone lr = lr * this (e.g. 0.1 over pretrained DINOv2 weights)
    min_lr_ratio: float = 0.05  # the cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.05
    warmup_steps: int = 50  # linear warmup from 0
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    silog_lambda: float = 0.5  # SiLogLoss(lambd)
    random_budgets: bool = False  # each step's bucket drawn among those that hold its Q (not always the smallest)
    train_path: str = "packed"  # the path the loss runs: packed (as deployed) or dense (every patch: the
    #                             equal-tokens baseline, a dense model at a smaller image size)
    glance_loss: float = 1.0  # weight of the glance depth map's SILog (models with glance_depth), every step
    dense_first_steps: int = 0  # schedule: the first steps train the dense path at dense_first_size, then packed
    dense_first_size: list[int] | None = None  # (H, W) of those steps, multiples of the patch (None: the model's)
    dense_every: int = 0  # joint training: every dense_every-th step trains the dense path at the model's size
    queries: list[int] | None = None  # Q values to draw from each step; None: every bucket in [q_min, q_max]
    q_min: int = 1
    q_max: int | None = None  # None: the largest bucket
    edge_frac: float = 0.5  # share of query points drawn at edges (sample_queries)
    edge_source: str = "image"  # where those are drawn: "image" (Sobel magnitude of the image) or "depth" (inside
    #                             the depth-edge band, one patch around the ground truth's discontinuities)
    extra_points: int = 0  # per query, supervision points drawn inside its patch: more signal for the same tokens
    hflip: bool = False  # mirror a training sample left-right with probability 1/2 (seeded like its points)
    ckpt_every: int = 200  # steps between checkpoints (and one at the end)
    keep_checkpoints: int = 2  # checkpoints kept on disk (the previous one is the fallback)
    eval_every: int = 0  # steps between validation evaluations (packed AbsRel); 0 = only at the end
    eval_images: int = 32  # validation images per evaluation
    eval_queries: int = 64  # queries per validation image
    log_every: int = 10  # steps between CSV rows
    resume: bool = False  # continue from out_dir's last checkpoint that verifies
    seed: int = 0
    num_workers: int = 0  # DataLoader workers per process (they render/load samples and draw the query points)
    threads: int = 0  # CPU intra-op threads of each process; 0 = torch's default. On a shared CPU 1 thread
    #                   + 1 worker beats 2 threads by far (OpenMP threads wait on each other when preempted)
    device: str = "auto"  # auto = cuda:LOCAL_RANK when CUDA is present, else cpu
    amp: bool = True  # bf16 autocast on CUDA (CPU always trains in float32)
    compile: bool = False  # torch.compile the forward + backward (one graph per bucket with data.device_cache)
    graph: bool = False  # replay each bucket's step (forward, backward, clip, AdamW) from a CUDA graph: a small
    #                      model's step is launch-bound. Needs CUDA, data.device_cache, one process, no compile
    max_time_s: float = 0.0  # stop after this many seconds of steps (checked at log rows), with a checkpoint
    #                          and a summary as at the end; the schedule is then unfinished. 0 = off
    progress: bool = True  # tqdm bar on rank 0

    def __post_init__(self) -> None:
        # data arrives here as a dict (DataConfig is deliberately not nested by from_dict): its
        # values are coerced first, then from_dict checks its keys
        if self.data is None:  # `data:` with nothing under it in a YAML file
            self.data = {}
        if isinstance(self.data, dict):
            self.data = from_dict(DataConfig, coerce_dict(DataConfig, self.data))
        if self.model is None:
            self.model = {}
        if isinstance(self.model, dict):
            self.model = coerce_dict(ModelConfig, self.model)
        elif not isinstance(self.model, ModelConfig):
            raise ValueError(f"invalid TrainConfig: model must be a mapping of ModelConfig fields, got {self.model!r}")
        if not isinstance(self.data, DataConfig):
            raise ValueError(f"invalid TrainConfig: data must be a mapping of DataConfig fields, got {self.data!r}")
        coerce_fields(self)  # every field its declared type, or a ValueError naming it
        problems = [f"{name} must be a non-empty string, got {getattr(self, name)!r}"
                    for name in ("preset", "out_dir", "device") if not getattr(self, name).strip()]
        if self.device.strip() and not _DEVICE.fullmatch(self.device):
            problems.append(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))
        self.model_config()  # unknown or invalid model keys fail here, naming them
        if self.steps < 0 or self.batch_size < 1:
            problems.append(f"need steps >= 0 and batch_size >= 1, got {self.steps}, {self.batch_size}")
        if self.ckpt_every < 1 or self.log_every < 1 or self.keep_checkpoints < 1:
            problems.append("ckpt_every, log_every and keep_checkpoints must be >= 1")
        if self.lr <= 0 or self.warmup_steps < 0 or self.num_workers < 0 or self.threads < 0 or self.max_time_s < 0:
            problems.append("need lr > 0, warmup_steps >= 0, num_workers >= 0, threads >= 0 and max_time_s >= 0")
        if not 0.0 <= self.edge_frac <= 1.0 or self.extra_points < 0:
            problems.append(f"need 0 <= edge_frac <= 1 and extra_points >= 0, got {self.edge_frac}, {self.extra_points}")
        if not 0 <= self.seed < 2**32:  # the per-step seeds are built from it and must stay in 64 bits
            problems.append(f"seed must lie in [0, 2**32), got {self.seed}")
        for name, lo in (("eval_every", 0), ("eval_images", 1), ("eval_queries", 1), ("weight_decay", 0),
                         ("backbone_lr_ratio", 0), ("grad_clip", 0)):
            if getattr(self, name) < lo:
                problems.append(f"{name} must be >= {lo}, got {getattr(self, name)}")
        if self.glance_loss < 0 or self.dense_first_steps < 0 or self.dense_every < 0:
            problems.append(f"glance_loss, dense_first_steps and dense_every must be >= 0, got {self.glance_loss}, "
                            f"{self.dense_first_steps}, {self.dense_every}")
        if self.dense_first_size is not None:
            mc, size = self.model_config(), self.dense_first_size
            if len(size) != 2 or any(v < mc.patch_size or v % mc.patch_size for v in size):
                problems.append(f"dense_first_size must be (H, W), multiples of the patch size {mc.patch_size}, got {size}")
        if self.edge_source not in ("image", "depth"):
            problems.append(f"edge_source must be image or depth, got {self.edge_source!r}")
        if self.train_path not in ("packed", "dense"):
            problems.append(f"train_path must be packed or dense, got {self.train_path!r}")
        for name in ("min_lr_ratio", "silog_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        kmax = self.model_config().buckets[-1]
        if self.queries is not None:  # bounds first: query_choices lists every count
            lo, hi, given = min(self.queries, default=0), max(self.queries, default=0), "queries"
        else:
            lo, hi, given = max(1, self.q_min), kmax if self.q_max is None else self.q_max, "q_min/q_max"
        if lo < 1 or hi > kmax or lo > hi:
            problems.append(f"{given}: query counts must lie in [1, {kmax}] (the largest of model.buckets), "
                            f"got {lo}..{hi}")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))

    def model_config(self) -> ModelConfig:
        if isinstance(self.model, ModelConfig):
            return self.model
        return model_config(self.preset, **self.model)

    @property
    def data_path(self) -> str:
        """Where the batches come from: "fresh" (data.fresh: scenes rendered new every step, on the device),
        "device" (data.device_cache: the scene store in one tensor on the device) or "host" (a DataLoader)."""
        return "fresh" if self.data.fresh else "device" if self.data.device_cache else "host"

    def query_choices(self) -> Sequence[int]:
        """The Q values a step may draw: cfg.queries, or every Q in [q_min, q_max] as a range (never a
        list: the bounds may be large). draw_q picks a bucket uniformly, then Q inside its range, so
        small buckets are trained as often as large ones."""
        if self.queries is not None:
            return list(self.queries)
        buckets = self.model_config().buckets
        hi = buckets[-1] if self.q_max is None else self.q_max
        return range(max(1, self.q_min), hi + 1)


_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def draw_bucket(cfg: TrainConfig, buckets: tuple[int, ...], q: int, step: int) -> int:
    """The step's bucket for q queries: the smallest that holds them, or with random_budgets one drawn
    uniformly among those that do (the same on every rank), so every budget is trained at every Q."""
    fits = [b for b in buckets if b >= q] or [bucket_for(q, buckets)]
    if not cfg.random_budgets:
        return fits[0]
    return random.Random(cfg.seed * 1_000_033 + step).choice(fits)


def draw_q(cfg: TrainConfig, buckets: tuple[int, ...], step: int) -> int:
    """Q for a step, the same on every rank: a bucket uniformly, then Q uniformly inside its range
    (previous bucket, bucket] clipped to [q_min, q_max]; or uniformly from cfg.queries when given."""
    rng = random.Random(cfg.seed * 1_000_003 + step)
    if cfg.queries is not None:
        return rng.choice(cfg.queries)
    choices = cfg.query_choices()
    lo, hi = choices[0], choices[-1]  # a range: [q_min, q_max]
    ranges, prev = [], 0
    for b in buckets:  # ranges, not lists: O(buckets) per step, and the same draws as choosing from lists
        r = range(max(prev + 1, lo), min(b, hi) + 1)
        if r:
            ranges.append(r)
        prev = b
    return rng.choice(rng.choice(ranges))


def glance_size(cfg: TrainConfig) -> tuple[int, int] | None:
    """The glance depth map's size (its loss's targets) when the model has one and the run trains it."""
    mc = cfg.model_config()
    return mc.glance_map_size if mc.glance_depth and cfg.glance_loss > 0 else None


def step_path(cfg: TrainConfig, step: int) -> tuple[str, tuple[int, int] | None]:
    """The path step trains and the image size it runs at: dense at dense_first_size for the first
    dense_first_steps steps, dense at the model's size every dense_every-th step, else packed."""
    if step <= cfg.dense_first_steps:
        return "dense", tuple(cfg.dense_first_size) if cfg.dense_first_size else None
    if cfg.train_path == "dense" or (cfg.dense_every and step % cfg.dense_every == 0):
        return "dense", None
    return "packed", None


def load_train_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> TrainConfig:
    """YAML (only what differs from the defaults) + `key=value` overrides -> TrainConfig.
    Unknown keys anywhere (train, model, data) are a ValueError naming them."""
    base = load_yaml(path) if path else {}
    over = overrides if isinstance(overrides, dict) else parse_overrides(list(overrides or []))
    return from_dict(TrainConfig, deep_merge(base, over))


def dump_yaml(cfg, path: str | Path) -> None:
    """Write a (nested) dataclass config as YAML, atomically (a run's config.yaml)."""
    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
