"""ModelConfig and its named presets; the YAML + `key=value` merging every config of depthpack uses.

YAML files hold only what differs from the dataclass defaults; unknown keys are an error; numbers
given as text (YAML 1.1 reads `1e-3` as a string) become the number the field declares.
"""
from __future__ import annotations

import dataclasses
import json
import math
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
    # metric depth that follows the lens (Metric3D's canonical camera): None = off (no focal input,
    # today's behaviour and weights). Else the head predicts depth as seen by a camera of this focal
    # length (pixels at img_size) and the output is scaled by f / canonical_focal, f the image's
    # focal length (pixels of the image the model sees; 0 = unknown: focal_default).
    canonical_focal: float | None = None
    focal_default: float | None = None  # the focal assumed when none is given; None = canonical_focal
    focal_ratio_range: tuple[float, float] = (0.5, 2.0)  # f / canonical_focal over which every depth
    #   in [min_depth, max_depth] stays reachable: the head's canonical range is widened by it
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
        self.focal_ratio_range = tuple(float(r) for r in self.focal_ratio_range)
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
        for name in ("canonical_focal", "focal_default"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                problems.append(f"{name} must be a positive number of pixels or null, got {v!r}")
        if self.focal_default is not None and self.canonical_focal is None:
            problems.append("focal_default needs canonical_focal (the focal input is off without it)")
        lo_hi = self.focal_ratio_range
        if len(lo_hi) != 2 or not 0 < lo_hi[0] <= 1 <= lo_hi[1]:
            problems.append(f"focal_ratio_range must be (lo, hi) with 0 < lo <= 1 <= hi, got {lo_hi}")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    @property
    def uses_focal(self) -> bool:
        return self.canonical_focal is not None

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
    """A YAML mapping from a file; one ValueError naming the file if it is missing or not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"config {path}: a config file must hold a mapping, got {type(data).__name__}")
    return data


def dump_yaml(cfg, path: str | Path) -> None:
    """Write a (nested) dataclass as YAML, atomically."""
    from .files import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


_NESTED: dict[str, type] = {"ModelConfig": ModelConfig}


def _number(cls, name: str, kind: str, v):
    """v as the number field `name` of cls declares (int or float), or a ValueError naming the field.
    Numbers given as text (`lr=1e-3`, which YAML 1.1 reads as a string) are parsed; booleans are not
    numbers; an int field takes only integral values (`1e9` yes, `1.5` no)."""
    optional = "None" in kind
    kind = kind.replace(" | None", "")
    if kind not in ("float", "int"):
        return v
    if v is None and optional:
        return v
    where = f"{cls.__name__}.{name}"
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"{where} must be a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where} must be a number, got {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"{where} must be a finite number, got {v!r}")
    if kind == "int":
        if float(v) != int(v):
            raise ValueError(f"{where} must be an integer, got {v!r}")
        return int(v)
    return float(v)


def coerce_numbers(cfg) -> None:
    """Numeric fields of a dataclass instance given as text become numbers, or a ValueError names the field."""
    for f in fields(cfg):
        setattr(cfg, f.name, _number(type(cfg), f.name, f.type, getattr(cfg, f.name)))


def coerce_dict(cls, values: dict[str, Any]) -> dict[str, Any]:
    """The same for a dict of cls's fields, before cls validates them (unknown keys pass through)."""
    types = {f.name: f.type for f in fields(cls)}
    return {k: _number(cls, k, types[k], v) if k in types else v for k, v in values.items()}


