"""TrainConfig: one training run, from a YAML file (only what differs from the defaults) plus
`key=value` overrides (dotted for model.*, data.* and queries.*); unknown keys and nonsense values are errors."""
from __future__ import annotations

import json
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


EDGE_SOURCES = ("image", "depth")


@dataclass
class QueryConfig:
    """The query points of every training step: how many (Q), where in the image, and the bucket that
    packs them. In a YAML file `queries: {edge_frac: 0.3, extra_points: 8}`; as overrides
    `queries.edge_frac=0.3`."""
    counts: list[int] | None = None  # the Q values a step draws from; None: every Q in [min, max]
    min: int = 1  # the fewest queries a step draws (when counts is None)
    max: int | None = None  # the most (when counts is None); None: the largest bucket
    edge_frac: float = 0.5  # share of the points drawn at edges (depthpack.data.sample_queries)
    edge_source: str = "image"  # where those are drawn: "image" (Sobel magnitude of the image) or "depth" (inside
    #                             the depth-edge band, one patch around the ground truth's discontinuities)
    extra_points: int = 0  # per query, supervision points drawn inside its patch: more signal for the same tokens
    random_budgets: bool = False  # each step's bucket drawn among those that hold its Q (not always the smallest)

    def __post_init__(self) -> None:
        coerce_fields(self)  # every field its declared type, or a ValueError naming it
        problems = []
        if not 0.0 <= self.edge_frac <= 1.0 or self.extra_points < 0:
            problems.append(f"need 0 <= edge_frac <= 1 and extra_points >= 0, got {self.edge_frac}, {self.extra_points}")
        if self.edge_source not in EDGE_SOURCES:
            problems.append(f"edge_source must be image or depth, got {self.edge_source!r}")
        _refuse(QueryConfig, problems)

    def bounds(self, largest: int) -> tuple[int, int]:
        """The fewest and the most queries a step may draw, with largest the largest bucket."""
        if self.counts is not None:
            return min(self.counts, default=0), max(self.counts, default=0)
        return max(1, self.min), largest if self.max is None else self.max


# The query settings' old top-level keys, before they were one mapping (queries), and their new names.
MOVED_QUERY_KEYS = {"q_min": "min", "q_max": "max", "edge_frac": "edge_frac", "edge_source": "edge_source",
                    "extra_points": "extra_points", "random_budgets": "random_budgets"}


@dataclass
class TrainConfig:
    """One training run. Sizes are per process: under torchrun the global batch is batch_size * world_size.

    The model is `preset` plus the `model` overrides (a dict of ModelConfig fields, or a whole
    ModelConfig); `data` is a depthpack.data.DataConfig, `queries` a QueryConfig.
    """
    preset: str = "vits"  # ModelConfig preset name (see depthpack.core.config.PRESETS)
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides on top of the preset
    data: DataConfig = field(default_factory=DataConfig)
    queries: QueryConfig = field(default_factory=QueryConfig)
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
    train_path: str = "packed"  # the path the loss runs: packed (as deployed) or dense (every patch: the
    #                             equal-tokens baseline, a dense model at a smaller image size)
    glance_loss: float = 1.0  # weight of the glance depth map's SILog (models with glance_depth), every step
    dense_first_steps: int = 0  # schedule: the first steps train the dense path at dense_first_size, then packed
    dense_first_size: list[int] | None = None  # (H, W) of those steps, multiples of the patch (None: the model's)
    data_size: list[int] | None = None  # (H, W) the training scenes or images are made at, area-resized to the model's
    #                                     size in every step: a smaller model sees what downscale-and-run-dense gives
    #                                     it (None: made at the model's size)
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
        self.model = _model_overrides(self.model)
        self.data = _nested(self.data, DataConfig, "data")
        self.queries = _nested(self.queries, QueryConfig, "queries")
        coerce_fields(self)  # every field its declared type, or a ValueError naming it
        _refuse(TrainConfig, self._name_problems())  # first: the preset names the model
        largest = self.model_config().buckets[-1]  # unknown or invalid model keys fail here, naming them
        _refuse(TrainConfig, [*self._run_problems(), *self._optimizer_problems(), *self._path_problems(),
                              *self._query_problems(largest)])

    def _name_problems(self) -> list[str]:
        problems = [f"{name} must be a non-empty string, got {getattr(self, name)!r}"
                    for name in ("preset", "out_dir", "device") if not getattr(self, name).strip()]
        if self.device.strip() and not DEVICE_NAME.fullmatch(self.device):
            problems.append(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        return problems

    def _run_problems(self) -> list[str]:
        """Length, checkpoints, logs, evaluation, processes."""
        problems = []
        if self.steps < 0 or self.batch_size < 1:
            problems.append(f"need steps >= 0 and batch_size >= 1, got {self.steps}, {self.batch_size}")
        if self.ckpt_every < 1 or self.log_every < 1 or self.keep_checkpoints < 1:
            problems.append("ckpt_every, log_every and keep_checkpoints must be >= 1")
        if self.num_workers < 0 or self.threads < 0 or self.max_time_s < 0:
            problems.append("need num_workers >= 0, threads >= 0 and max_time_s >= 0")
        if not 0 <= self.seed < 2**32:  # the per-step seeds are built from it and must stay in 64 bits
            problems.append(f"seed must lie in [0, 2**32), got {self.seed}")
        return problems + _below(self, ("eval_every", 0), ("eval_images", 1), ("eval_queries", 1))

    def _optimizer_problems(self) -> list[str]:
        """AdamW, its schedule and the loss."""
        problems = [] if self.lr > 0 and self.warmup_steps >= 0 else ["need lr > 0 and warmup_steps >= 0"]
        for name in ("min_lr_ratio", "silog_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        return problems + _below(self, ("weight_decay", 0), ("backbone_lr_ratio", 0), ("grad_clip", 0))

    def _path_problems(self) -> list[str]:
        """The path each step trains: packed or dense, the glance's loss, the dense schedules."""
        problems = []
        if self.train_path not in ("packed", "dense"):
            problems.append(f"train_path must be packed or dense, got {self.train_path!r}")
        if self.glance_loss < 0 or self.dense_first_steps < 0:
            problems.append(f"glance_loss and dense_first_steps must be >= 0, got {self.glance_loss}, "
                            f"{self.dense_first_steps}")
        if self.data_size is not None:
            if len(self.data_size) != 2 or min(self.data_size) < 1:
                problems.append(f"data_size must be (H, W), two positive pixel counts, got {self.data_size}")
            elif self.data_path == "fresh":
                problems.append("data_size needs stored scenes (not data.fresh: its scenes are rendered at the model's "
                                "size)")
        if self.dense_first_size is not None:
            mc, size = self.model_config(), self.dense_first_size
            if len(size) != 2 or any(v < mc.patch_size or v % mc.patch_size for v in size):
                problems.append(f"dense_first_size must be (H, W), multiples of the patch size {mc.patch_size}, got {size}")
        return problems

    def _query_problems(self, largest: int) -> list[str]:
        """The query counts against the buckets (QueryConfig checks the rest itself)."""
        lo, hi = self.queries.bounds(largest)
        if 1 <= lo <= hi <= largest:
            return []
        given = "queries.counts" if self.queries.counts is not None else "queries.min/queries.max"
        return [f"{given}: query counts must lie in [1, {largest}] (the largest of model.buckets), got {lo}..{hi}"]

    def model_config(self) -> ModelConfig:
        if isinstance(self.model, ModelConfig):
            return self.model
        return model_config(self.preset, **self.model)

    @property
    def data_path(self) -> str:
        """Where the batches come from: "fresh" (data.fresh: scenes rendered new every step, on the device),
        "device" (data.device_cache: the scene store in one tensor on the device) or "host" (a DataLoader)."""
        return "fresh" if self.data.fresh else "device" if self.data.device_cache else "host"

    @property
    def scene_size(self) -> tuple[int, int]:
        """(H, W) the training scenes are made and stored at: data_size, else the model's img_size."""
        return tuple(self.data_size or self.model_config().img_size)

    def query_choices(self) -> Sequence[int]:
        """The Q values a step may draw: queries.counts, or every Q in [queries.min, queries.max] as a range
        (never a list: the bounds may be large). draw_q picks a bucket uniformly, then Q inside its range, so
        small buckets are trained as often as large ones."""
        if self.queries.counts is not None:
            return list(self.queries.counts)
        lo, hi = self.queries.bounds(self.model_config().buckets[-1])
        return range(lo, hi + 1)


def _model_overrides(model) -> dict[str, Any] | ModelConfig:
    """TrainConfig.model: a mapping of ModelConfig fields (their values coerced) or a ModelConfig."""
    if model is None:  # `model:` with nothing under it in a YAML file
        return {}
    if isinstance(model, dict):
        return coerce_dict(ModelConfig, model)
    if not isinstance(model, ModelConfig):
        raise ValueError(f"invalid TrainConfig: model must be a mapping of ModelConfig fields, got {model!r}")
    return model


def _nested(value, cls, name: str):
    """A nested config of TrainConfig (data, queries), given as a mapping of cls's fields, nothing (a YAML
    key with nothing under it) or a cls: a cls, or one ValueError. from_dict leaves these to TrainConfig
    (core.config cannot import them), so the values are coerced here first, then from_dict checks the keys."""
    if value is None:
        value = {}
    if isinstance(value, dict):
        value = from_dict(cls, coerce_dict(cls, value))
    if not isinstance(value, cls):
        raise ValueError(f"invalid TrainConfig: {name} must be a mapping of {cls.__name__} fields, got {value!r}")
    return value


def _below(cfg, *limits: tuple[str, float]) -> list[str]:
    return [f"{name} must be >= {lo}, got {getattr(cfg, name)}" for name, lo in limits if getattr(cfg, name) < lo]


def _refuse(cls, problems: list[str]) -> None:
    if problems:
        raise ValueError(f"invalid {cls.__name__}: " + "; ".join(problems))


def refuse_moved_query_keys(values: dict[str, Any], where: str) -> None:
    """One error naming the new keys when values (a YAML file's or the overrides) holds query settings
    under their old top-level names (q_min, edge_frac, ..., or queries as a list of counts)."""
    moved = {new: values[old] for old, new in MOVED_QUERY_KEYS.items() if old in values}
    old = [old for old in MOVED_QUERY_KEYS if old in values]
    if isinstance(values.get("queries"), list):
        moved, old = {"counts": values["queries"], **moved}, ["queries as a list", *old]
    if not moved:
        return
    flow = {k: json.dumps(v, default=str, separators=(",", ":")) for k, v in moved.items()}  # YAML without spaces
    raise ValueError(f"{where}: {', '.join(old)}: the query settings are one mapping now, queries: write "
                     f"{' '.join(f'queries.{k}={v}' for k, v in flow.items())} "
                     f"(in a YAML file: queries: {{{', '.join(f'{k}: {v}' for k, v in flow.items())}}})")


DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")  # what a device option or key may say


def draw_bucket(cfg: TrainConfig, buckets: tuple[int, ...], q: int, step: int) -> int:
    """The step's bucket for q queries: the smallest that holds them, or with queries.random_budgets one
    drawn uniformly among those that do (the same on every rank), so every budget is trained at every Q."""
    fits = [b for b in buckets if b >= q] or [bucket_for(q, buckets)]
    if not cfg.queries.random_budgets:
        return fits[0]
    return random.Random(cfg.seed * 1_000_033 + step).choice(fits)


def draw_q(cfg: TrainConfig, buckets: tuple[int, ...], step: int) -> int:
    """Q for a step, the same on every rank: a bucket uniformly, then Q uniformly inside its range
    (previous bucket, bucket] clipped to [queries.min, queries.max]; or uniformly from queries.counts when given."""
    rng = random.Random(cfg.seed * 1_000_003 + step)
    if cfg.queries.counts is not None:
        return rng.choice(cfg.queries.counts)
    choices = cfg.query_choices()
    lo, hi = choices[0], choices[-1]  # a range: [queries.min, queries.max]
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
    dense_first_steps steps, then train_path at the model's size (None: the data's, when they are made at it)."""
    size = tuple(cfg.model_config().img_size) if cfg.data_size is not None else None
    if step <= cfg.dense_first_steps:
        return "dense", tuple(cfg.dense_first_size) if cfg.dense_first_size else size
    return cfg.train_path, size


def load_train_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> TrainConfig:
    """YAML (only what differs from the defaults) + `key=value` overrides -> TrainConfig.
    Unknown keys anywhere (train, model, data) are a ValueError naming them."""
    base = load_yaml(path) if path else {}
    over = overrides if isinstance(overrides, dict) else parse_overrides(list(overrides or []))
    refuse_moved_query_keys(base, f"config {path}")  # each apart: a merge would hide a list under queries
    refuse_moved_query_keys(over, "overrides")
    return from_dict(TrainConfig, deep_merge(base, over))


def dump_yaml(cfg, path: str | Path) -> None:
    """Write a (nested) dataclass config as YAML, atomically (a run's config.yaml)."""
    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
