"""Configuration: ModelConfig / TrainConfig dataclasses, named presets, YAML + key=value merging.

YAML files hold only what differs from the dataclass defaults; unknown keys are an error.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


@dataclass
class ModelConfig:
    img_size: tuple[int, int] = (518, 518)  # (H, W) the position embeddings are made for
    patch_size: int = 14
    embed_dim: int = 384
    depth: int = 12
    num_heads: int = 6
    mlp_ratio: float = 4.0
    init_values: float | None = 1e-5  # LayerScale, as DINOv2
    anchor_grid: int = 8  # A = anchor_grid**2 anchor tokens from a thumbnail of the image
    buckets: tuple[int, ...] = (64, 128, 256, 512, 1024)  # capacity ladder (patch slots)
    head_dim: int = 128  # hidden width of the query head
    head_freqs: int = 4  # Fourier frequencies of the in-patch offset encoding
    head_abs_pos: bool = False  # the head also reads the point's position in the image (Fourier, same freqs)
    min_depth: float = 0.1  # meters
    max_depth: float = 80.0
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)  # ImageNet, as DINOv2
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    backbone_weights: str | None = None  # local timm/DINOv2 state dict; nothing is downloaded

    def __post_init__(self) -> None:
        if isinstance(self.img_size, int):
            self.img_size = (self.img_size, self.img_size)
        self.img_size = tuple(int(s) for s in self.img_size)
        self.buckets = tuple(sorted(int(b) for b in self.buckets))
        self.mean = tuple(float(m) for m in self.mean)
        self.std = tuple(float(s) for s in self.std)
        H, W = self.img_size
        p = self.patch_size
        problems = []
        if len(self.img_size) != 2 or H % p or W % p:
            problems.append(f"img_size {self.img_size} must be two multiples of patch_size {p}")
        if self.embed_dim % self.num_heads:
            problems.append(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if not self.buckets or min(self.buckets) < 1:
            problems.append(f"buckets {self.buckets} must be positive capacities")
        if self.anchor_grid < 0:
            problems.append(f"anchor_grid {self.anchor_grid} must be >= 0")
        if not 0 < self.min_depth < self.max_depth:
            problems.append(f"need 0 < min_depth < max_depth, got {self.min_depth}, {self.max_depth}")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    @property
    def grid(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid
        return gh * gw

    @property
    def num_anchors(self) -> int:
        return self.anchor_grid**2


# Named presets: only what differs from the defaults (which are the vits / DINOv2-small shape).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(img_size=(64, 64), patch_size=8, embed_dim=64, depth=2, num_heads=2, anchor_grid=2,
                 buckets=(8, 16, 32, 64), head_dim=32, max_depth=20.0),
    "small": dict(img_size=(128, 128), patch_size=8, embed_dim=128, depth=4, num_heads=4, anchor_grid=4,
                  buckets=(16, 32, 64, 128, 256), head_dim=64, max_depth=20.0),
    "vits": dict(),
    "vitb": dict(embed_dim=768, depth=12, num_heads=12),
    "vitl": dict(embed_dim=1024, depth=24, num_heads=16),
}


def model_config(preset: str = "vits", **overrides: Any) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    return from_dict(ModelConfig, {**PRESETS[preset], **overrides})


def from_dict(cls, values: dict[str, Any]):
    """Build a (possibly nested) dataclass from a dict; unknown keys are an error naming them."""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} key(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    kwargs = {}
    for name, value in values.items():
        sub = _NESTED.get(known[name].type)
        if sub is not None and isinstance(value, dict):
            value = from_dict(sub, value)
        kwargs[name] = value
    return cls(**kwargs)


def to_dict(cfg) -> dict[str, Any]:
    """Plain JSON/YAML-ready dict (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`key=value` strings (dotted keys for nesting) -> nested dict; values parsed as YAML."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        merged[k] = deep_merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def load_yaml(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config file must hold a mapping, got {type(data).__name__}")
    return data


_NESTED: dict[str, type] = {"ModelConfig": ModelConfig}


# ---- training ----------------------------------------------------------------------------------
def _default_data():
    from .data.config import DataConfig  # lazy, and torch-free: parsing a config loads no data code
    return DataConfig()


@dataclass
class TrainConfig:
    """One training run. YAML files and `key=value` overrides (dotted for nesting) fill it.

    The model is `preset` plus the `model` overrides (a dict of ModelConfig fields, or a whole
    ModelConfig); `data` is a depthpack.data.DataConfig. Sizes are per process: under torchrun the
    global batch is batch_size * world_size.
    """
    preset: str = "vits"  # ModelConfig preset name (see PRESETS)
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides on top of the preset
    data: DataConfig = field(default_factory=_default_data)
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
    distill_weight: float = 0.0  # weight of |log packed - log dense| (dense path of the same model, detached); 0 = off
    queries: list[int] | None = None  # Q values to draw from each step; None: every bucket in [q_min, q_max]
    q_min: int = 1
    q_max: int | None = None  # None: the largest bucket
    edge_frac: float = 0.5  # share of edge-weighted query samples (sample_queries)
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
    progress: bool = True  # tqdm bar on rank 0

    def __post_init__(self) -> None:
        from .data.config import DataConfig
        # data arrives here as a dict (DataConfig is deliberately not in _NESTED): its numbers are
        # coerced first, then from_dict checks its keys
        if isinstance(self.data, dict):
            self.data = from_dict(DataConfig, _coerce_dict(DataConfig, self.data))
        if self.model is None:
            self.model = {}
        if isinstance(self.model, dict):
            self.model = _coerce_dict(ModelConfig, self.model)
        _coerce_numbers(self)
        if self.queries is not None:
            self.queries = [int(q) for q in self.queries]
        self.model_config()  # unknown or invalid model keys fail here, naming them
        problems = []
        if self.steps < 0 or self.batch_size < 1:
            problems.append(f"need steps >= 0 and batch_size >= 1, got {self.steps}, {self.batch_size}")
        if self.ckpt_every < 1 or self.log_every < 1 or self.keep_checkpoints < 1:
            problems.append("ckpt_every, log_every and keep_checkpoints must be >= 1")
        kmax = self.model_config().buckets[-1]
        qs = self.query_choices()
        if not qs or min(qs) < 1 or max(qs) > kmax:
            problems.append(f"query counts must lie in [1, {kmax}] (the largest bucket), got {qs[:3]}...{qs[-3:]}")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))

    def model_config(self) -> ModelConfig:
        if isinstance(self.model, ModelConfig):
            return self.model
        return model_config(self.preset, **self.model)

    def query_choices(self) -> list[int]:
        """The Q values a step may draw: cfg.queries, or every Q in [q_min, q_max] (draw_q picks a bucket
        uniformly, then Q inside its range, so small buckets are trained as often as large ones)."""
        if self.queries is not None:
            return list(self.queries)
        buckets = self.model_config().buckets
        hi = buckets[-1] if self.q_max is None else self.q_max
        return list(range(max(1, self.q_min), hi + 1))


def _number(cls, name: str, kind: str, v):
    # YAML 1.1 reads `1e-3` (no dot) as a string: give the field the number it declares
    kind = kind.replace(" | None", "")
    if isinstance(v, str) and kind in ("float", "int"):
        try:
            return float(v) if kind == "float" else int(v)
        except ValueError:
            raise ValueError(f"{cls.__name__}.{name} must be a number, got {v!r}") from None
    if isinstance(v, int) and not isinstance(v, bool) and kind == "float":
        return float(v)
    return v


def _coerce_numbers(cfg) -> None:
    """Numeric fields given as strings (`lr=1e-3`) become numbers, or a ValueError names the field."""
    for f in fields(cfg):
        setattr(cfg, f.name, _number(type(cfg), f.name, f.type, getattr(cfg, f.name)))


def _coerce_dict(cls, values: dict[str, Any]) -> dict[str, Any]:
    """The same for a dict of cls's fields, before cls validates them (unknown keys pass through)."""
    types = {f.name: f.type for f in fields(cls)}
    return {k: _number(cls, k, types[k], v) if k in types else v for k, v in values.items()}


def load_train_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> TrainConfig:
    """YAML (only what differs from the defaults) + `key=value` overrides -> TrainConfig.
    Unknown keys anywhere (train, model, data) are a ValueError naming them."""
    base = load_yaml(path) if path else {}
    over = overrides if isinstance(overrides, dict) else parse_overrides(list(overrides or []))
    return from_dict(TrainConfig, deep_merge(base, over))


def dump_yaml(cfg, path: str | Path) -> None:
    """Write a (nested) dataclass as YAML."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
