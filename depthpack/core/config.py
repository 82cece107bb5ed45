"""ModelConfig and its named presets; the YAML + `key=value` merging every config of depthpack uses.

YAML files hold only what differs from the dataclass defaults; unknown keys are an error; numbers
given as text (YAML 1.1 reads `1e-3` as a string) become the number the field declares; every other
value must have the type its field declares (`coerce_fields`), or one ValueError names the field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml


CONTEXTS = ("thumbnail", "glance")
QUERY_HEADS = ("direct", "residual")
GLANCE_STREAMS = ("oneway", "shared")


@dataclass
class ModelConfig:
    img_size: tuple[int, int] = (518, 518)  # (H, W) the position embeddings are made for
    patch_size: int = 14
    embed_dim: int = 384
    depth: int = 12
    num_heads: int = 6
    mlp_ratio: float = 4.0
    init_values: float | None = 1e-5  # LayerScale, as DINOv2
    # anchors: A fixed context tokens that see the whole image, beside cls in every buffer
    context: str = "glance"  # how they are made: "glance" (glance_grid tokens: the image box-downsampled, each
    #   region one patch, at its centre's position plus a learned scale embedding) or "thumbnail" (anchor_grid**2
    #   tokens, a square thumbnail); the frontier chose glance (docs/accuracy.md)
    anchor_grid: int = 8  # context "thumbnail": A = anchor_grid**2
    glance_grid: tuple[int, int] | None = None  # context "glance": (rows, columns) of regions, A = rows*cols;
    #   None: regions of about 2.5 patches a side that divide img_size (12x16 at 420x560, patch 14)
    registers: int = 0  # learned tokens always in the buffer (DINOv2 with registers): [cls | registers | anchors | patches]
    glance_stream: str | None = None  # "oneway": the prefix (cls, registers, glance) reads only itself and the
    #   patches read every token, so the glance stream is a low-resolution dense model whatever the queries (and
    #   its map one map per image); "shared": every token reads every token. None: oneway with the glance
    #   context, else shared. Checkpoints and packages stored without the field ran shared (stored_model_config)
    buckets: tuple[int, ...] = (64, 128, 256, 512, 1024)  # capacity ladder (patch slots)
    head_dim: int = 128  # hidden width of the query head
    head_freqs: int = 4  # Fourier frequencies of the in-patch offset encoding
    head_abs_pos: bool = False  # the head also reads the point's position in the image (Fourier, same freqs)
    glance_depth: bool | None = None  # the glance tokens decode depth anywhere in the image (GlanceHead, a
    #   low-resolution dense depth model in every buffer), trained by a dense loss over the glance image's pixels;
    #   None: on with the glance context
    query_head: str | None = None  # "residual" (needs glance_depth): the glance depth at the point times exp(a
    #   residual from its patch token) (ResidualHead); "direct": a query's depth from its patch token (QueryHead);
    #   None: residual with glance_depth, else direct
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
        coerce_fields(self)  # types: img_size 64 -> (64, 64), "1e-5" -> 1e-5; anything else names the field
        self.buckets = tuple(sorted(self.buckets))
        problems = [f"{name} {getattr(self, name)} must be >= {lo}" for name, lo in (
            ("patch_size", 1), ("embed_dim", 1), ("depth", 1), ("num_heads", 1), ("head_dim", 1), ("head_freqs", 0),
            ("anchor_grid", 0)) if getattr(self, name) < lo]
        H, W = self.img_size
        p = self.patch_size
        size_ok = p >= 1 and H >= p and W >= p and not H % p and not W % p
        if p >= 1 and not size_ok:
            problems.append(f"img_size {self.img_size} must be two positive multiples of patch_size {p}")
        if self.context not in CONTEXTS:
            problems.append(f"context {self.context!r} must be one of {', '.join(CONTEXTS)}")
        elif self.context != "thumbnail":
            if self.glance_grid is None and size_ok:  # derived once the size is valid
                self.glance_grid = (default_glance(H, p), default_glance(W, p))
            gh, gw = self.glance_grid or (1, 1)  # none: the size's own problem is the one said
            if gh < 1 or gw < 1 or H % gh or W % gw:
                problems.append(f"glance_grid {self.glance_grid} must be two positive divisors of img_size {self.img_size} "
                                f"(each region one box of whole pixels)")
        if self.glance_depth is None:
            self.glance_depth = self.context == "glance"
        if self.glance_stream is None:
            self.glance_stream = "oneway" if self.context == "glance" else "shared"
        if self.glance_stream not in GLANCE_STREAMS:
            problems.append(f"glance_stream {self.glance_stream!r} must be one of {', '.join(GLANCE_STREAMS)}")
        elif self.glance_stream == "oneway" and self.context != "glance":
            problems.append(f"glance_stream 'oneway' needs context 'glance' (the glance is the stream that reads only "
                            f"itself), got {self.context!r}")
        if self.query_head is None:
            self.query_head = "residual" if self.glance_depth else "direct"
        if self.glance_depth and self.context != "glance":
            problems.append(f"glance_depth needs context 'glance' (the glance tokens decode the depth), got {self.context!r}")
        if self.query_head not in QUERY_HEADS:
            problems.append(f"query_head {self.query_head!r} must be one of {', '.join(QUERY_HEADS)}")
        elif self.query_head == "residual" and not self.glance_depth:
            problems.append("query_head 'residual' needs glance_depth (the residual corrects the glance depth)")
        if self.head_abs_pos and self.query_head != "direct":
            problems.append(f"head_abs_pos needs query_head 'direct' (the {self.query_head} head has no position term)")
        if not 0 <= self.registers <= min(self.buckets or (0,)):
            problems.append(f"registers {self.registers} must lie in [0, {min(self.buckets or (0,))}] (no more than the "
                            f"smallest bucket's patch slots)")
        if self.num_heads >= 1 and self.embed_dim % self.num_heads:
            problems.append(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if not self.mlp_ratio > 0:
            problems.append(f"mlp_ratio {self.mlp_ratio} must be > 0")
        if not self.buckets or min(self.buckets) < 1:
            problems.append(f"buckets {self.buckets} must be positive capacities")
        if not 0 < self.min_depth < self.max_depth:
            problems.append(f"need 0 < min_depth < max_depth, got {self.min_depth}, {self.max_depth}")
        if min(self.std) <= 0:
            problems.append(f"std {self.std} must be > 0")
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
    def glance_map_size(self) -> tuple[int, int]:
        """(rows, cols) of the glance's depth map: the glance image, each glance token a patch of it."""
        return self.glance_grid[0] * self.patch_size, self.glance_grid[1] * self.patch_size

    @property
    def grid(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid
        return gh * gw

    @property
    def num_anchors(self) -> int:
        if self.context == "thumbnail":
            return self.anchor_grid**2
        return self.glance_grid[0] * self.glance_grid[1]

    @property
    def num_prefix(self) -> int:
        """Tokens before the patches in every buffer: cls, registers, anchors."""
        return 1 + self.registers + self.num_anchors

    @property
    def oneway(self) -> bool:
        return self.glance_stream == "oneway"


def default_glance(pixels: int, patch: int) -> int:
    """The divisor of `pixels` nearest pixels / (2.5 patch): glance regions about 2.5 patches a side (the
    larger of two equally near)."""
    target = pixels / (2.5 * patch)
    small = [d for d in range(1, math.isqrt(pixels) + 1) if pixels % d == 0]  # the divisors in O(sqrt(pixels))
    return min(small + [pixels // d for d in small], key=lambda d: (abs(d - target), -d))


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


def stored_model_config(values: dict[str, Any]) -> ModelConfig:
    """The ModelConfig of a stored model (a checkpoint's or a package's config): a field added since takes the
    value the models stored before it ran (glance_stream: shared), any other absent field its default."""
    if not isinstance(values, dict):
        raise ValueError(f"ModelConfig must be a mapping of its fields, got {values!r}")
    return from_dict(ModelConfig, {"glance_stream": "shared", **values})


def model_config(preset: str = "vits", **overrides: Any) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    return from_dict(ModelConfig, {**PRESETS[preset], **overrides})


def from_dict(cls, values: dict[str, Any]):
    """Build a (possibly nested) dataclass from a dict; unknown keys are an error naming them."""
    if not isinstance(values, dict):
        raise ValueError(f"{cls.__name__} must be a mapping of its fields, got {values!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(str(k) or "''" for k in set(values) - set(known))
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


def dotted(d: dict[str, Any], whole: tuple[str, ...] = ()) -> dict[str, Any]:
    """A nested mapping's leaves by dotted key ({"data": {"seed": 1}} -> {"data.seed": 1}); a mapping under a key
    named in `whole` stays one value."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        inner = dotted(v, whole) if isinstance(v, dict) and k not in whole else None
        out.update({f"{k}.{sub}": x for sub, x in inner.items()} if inner is not None else {k: v})
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`key=value` strings (dotted keys for nesting) -> nested dict; values parsed as YAML."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        if not all(_NAME.fullmatch(part) for part in parts):
            raise ValueError(f"override {item!r}: {key!r} is not a key (a name, dotted for nesting: model.depth)")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ValueError(f"override {key}: {raw!r} is not a YAML value ({str(e).splitlines()[0]})") from None
        node = out
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {key}: {'.'.join(parts[:i + 1])} was given a value, it has no sub-keys")
        node[parts[-1]] = value
    return out


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        merged[k] = deep_merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def load_yaml(path: str | Path, what: str = "config") -> dict[str, Any]:
    """A YAML mapping from a file; one ValueError naming the file (as `what`: config, plan) if it is missing,
    a folder or not a mapping."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a folder, not a file")
    if not path.is_file():
        raise ValueError(f"{what} {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{what} {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path}: a {what} file must hold a mapping, got {type(data).__name__}")
    return data


_NESTED: dict[str, type] = {"ModelConfig": ModelConfig}


_SEQUENCE = re.compile(r"(tuple|list)\[(int|float)((?:, \2)*)(, \.\.\.)?\]")


def _coerce(cls, name: str, kind: str, v):
    """v as the type field `name` of cls declares (its annotation, a string), or a ValueError naming the
    field. Numbers: see _number; bool: true or false only; str: text only; tuple[int, int] and the like:
    that many numbers (one number stands for all of them), tuple[int, ...]: any number of them."""
    optional = kind.endswith(" | None")
    base = kind.removesuffix(" | None")
    where = f"{cls.__name__}.{name}"
    if v is None and optional:
        return v
    if base in ("int", "float"):
        return _number(cls, name, kind, v)
    if base == "bool":
        if not isinstance(v, bool):
            raise ValueError(f"{where} must be true or false, got {v!r}")
        return v
    if base == "str":
        if not isinstance(v, str):
            hint = f" (quote text that YAML reads as a number: {name}='{v}')" if isinstance(v, (int, float)) else ""
            raise ValueError(f"{where} must be text, got {v!r}{hint}")
        return v
    m = _SEQUENCE.fullmatch(base)
    if m is None:
        return v  # nested configs and mappings are checked by their own class
    container, elem, more, variadic = m[1], m[2], m[3], m[4]
    n = None if variadic or container == "list" else 1 + more.count(",")  # list[int]: any length
    if isinstance(v, (int, float, str)) and not isinstance(v, bool):
        v = [v] * (n or 1)
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{where} must be a list of numbers, got {v!r}")
    if n is not None and len(v) != n:
        raise ValueError(f"{where} must hold {n} numbers, got {list(v)!r}")
    items = [_number(cls, f"{name}[{i}]", elem, x) for i, x in enumerate(v)]
    return tuple(items) if container == "tuple" else items


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
        text = v
        try:  # an integer literal exactly (float would round 20 digits), else a float literal
            v = int(text)
        except ValueError:
            try:
                v = float(text)
            except ValueError:
                raise ValueError(f"{where} must be a number, got {text!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where} must be a number, got {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{where} must be a finite number, got {v!r}")
    if kind == "int":
        if isinstance(v, float) and not v.is_integer():
            raise ValueError(f"{where} must be an integer, got {v!r}")
        if not -2**63 <= v < 2**63:  # what torch, numpy and the file formats can hold
            raise ValueError(f"{where} must fit in 64 bits, got {v!r}")
        return int(v)
    try:
        return float(v)
    except OverflowError:  # an int beyond float's range
        raise ValueError(f"{where} must be a finite number, got {v!r}") from None


def coerce_fields(cfg) -> None:
    """Every plain field of a dataclass instance (numbers, bool, text, lists of numbers) to the type it
    declares: numbers given as text become numbers; a value of the wrong type is a ValueError naming the field."""
    for f in fields(cfg):
        setattr(cfg, f.name, _coerce(type(cfg), f.name, f.type, getattr(cfg, f.name)))


def coerce_dict(cls, values: dict[str, Any]) -> dict[str, Any]:
    """The same for a dict of cls's fields, before cls validates them (unknown keys pass through)."""
    if not isinstance(values, dict):
        raise ValueError(f"{cls.__name__} must be a mapping of its fields, got {values!r}")
    types = {f.name: f.type for f in fields(cls)}
    return {k: _coerce(cls, k, types[k], v) if k in types else v for k, v in values.items()}


