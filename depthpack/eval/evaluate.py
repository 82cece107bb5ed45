"""Accuracy of the packed, masked and dense paths of one checkpoint, at the queried points.

    python -m depthpack.eval --checkpoint runs/demo                       # its own val split
    python -m depthpack.eval --checkpoint runs/demo --data configs/demo.yaml data.num_val=128
    python -m depthpack.eval --checkpoint ck/ data.kind=kitti data.root=/data/kitti \\
        data.split_file=/data/kitti/val.txt data.eval_crop=garg --queries 64 256 1024

For every image, every query count Q draws Q points among the pixels that are valid AND inside the
data set's evaluation crop (sample_queries with a generator seeded by (seed, image index, Q), so
repeated runs give the same numbers); every path and anchor setting is run on the same points. The
standard metrics (depthpack.eval.metrics, the one implementation: MetricAccumulator per="image") are computed per image and
averaged over images, optionally with per-image median scaling.

The "constant" row is the best constant-depth predictor of those points: the single depth c that
minimizes the reported AbsRel, mean over images of mean_j |c - g_ij| / g_ij. That objective is a
weighted sum of |c - g_ij| with weights 1 / (n_i g_ij), so its exact minimizer is the weighted
median of all g_ij under those weights (computed here, not approximated by the median of GT).

Outputs in --out: eval.md (the table), eval.json (everything, machine-readable), eval.png (image,
ground truth, dense prediction, and the queried points of the packed path colored by AbsRel).

Options for the packed-versus-dense question (off by default; the default outputs are unchanged):
--dense-map adds the dense map's metrics: every valid pixel in the crop, not only the queried points;
--curve adds the share of patches the packed path runs at each Q (its buffer: min(bucket, N) patch
tokens per chunk, out of the N of the dense path; and the share the queried points fall in) and
curve.png: AbsRel against that share, packed (anchors on and off) and dense on the same points;
--image-size WxH evaluates on images of another size than the model's (each resized to the model's size,
antialiased, its points scaled): a dense model at a reduced resolution, read at the same points as the
full-size models. Where the dense path's queries look and the gap over training: scripts/diagnostics.py.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..core import cli
from ..core.checkpoint import checkpoint_files, load_model, stored_config
from ..core.config import deep_merge, from_dict, load_yaml, parse_overrides, to_dict
from ..core.model import scaled_depth
from ..core.packing import bucket_for, pad_points, patch_of_points, run_chunked
from ..core.preprocess import parse_frame_size, to_model_size
from ..core.validation import check_focal, check_inputs
from ..core.files import atomic_write_json, atomic_write_text, check_writable_dir
from ..data.datasets import make_dataset
from ..data.queries import (EDGE_THRESHOLD, THIN_MAX_PX, check_band, check_thin_width, edge_band, sample_queries,
                            thin_band)
from ..data.config import DataConfig
from .metrics import MetricAccumulator, si_boundary_f1
from .viz import depth_figure

METRICS = ("abs_rel", "sq_rel", "rmse", "rmse_log", "log10", "silog", "d1", "d2", "d3")  # table column order
PATHS = ("packed", "masked", "dense", "glance")  # glance: the glance depth at the points, from the packed buffer
POINT_SETS = {"uniform": ("uniform",), "edge": ("edge",), "thin": ("thin",), "both": ("uniform", "edge"),
              "all": ("uniform", "edge", "thin")}  # --points


@dataclass
class EvalSettings:
    queries: tuple[int, ...] = (16, 64, 256)  # query counts per image
    anchors: tuple[bool, ...] = (True, False)  # with and without the anchors (same weights)
    paths: tuple[str, ...] = PATHS[:3]
    median_scaling: bool = False  # per-image median scaling (for relative-depth models)
    edge_frac: float = 0.0  # share of query points drawn at image edges; 0 = uniform over valid pixels
    #                         (the standard protocol: every valid pixel counts the same)
    max_images: int | None = None  # None: the whole split
    batch_size: int = 8
    seed: int = 0
    figure_images: int = 4  # rows of the PNG; 0 = no figure
    progress: bool = True
    dense_map: bool = False  # also the dense map's metrics over every valid pixel in the crop
    shares: bool = False  # the share of patches the packed path runs at each Q (for the curve)
    context: tuple[int, ...] = ()  # packed path again on these larger buffers (K patch slots > Q's bucket):
    #                                rows "packed@K", what more context tokens for the same queries buy
    points: str = "uniform"  # "uniform" | "edge" | "thin" | "both" | "all": query points uniform over the valid pixels,
    #                          inside the depth-edge band (depthpack.data.queries.edge_band), on thin structures and
    #                          small objects (the thin band: synthetic scenes), uniform and edge, or all three
    band_radius: int | None = None  # the edge band's radius in pixels; None: one patch of the model (band_radius())
    band_threshold: float = EDGE_THRESHOLD  # a neighbour depth ratio above this is a discontinuity
    thin_max_px: int = THIN_MAX_PX  # the thin band: parts of thin structures and small objects this many pixels across
    focal: str = "data"  # "data": each image's focal length where the data set has it (0 = unknown);
    #                      "default": none given (the model's focal_default); models without a focal input ignore it

    def __post_init__(self) -> None:
        if self.points not in POINT_SETS:
            raise ValueError(f"points must be one of {', '.join(POINT_SETS)}, got {self.points!r}")
        check_band(0 if self.band_radius is None else self.band_radius, self.band_threshold)
        check_thin_width(self.thin_max_px)


# ---- points -------------------------------------------------------------------------------------
def eval_points(sample: dict, q: int, seed: int, index: int, edge_frac: float = 0.0,
                mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """Q points [Q,2] among the pixels of mask (default: the valid pixels inside the evaluation crop);
    None if there are none."""
    mask = sample["valid"] & sample["eval_mask"] if mask is None else mask
    if not bool(mask.any()):
        return None
    g = torch.Generator().manual_seed((seed * 1_000_003 + index) * 65_537 + q)
    return sample_queries(mask, sample["image"], q, g, edge_frac=edge_frac).float()


def _at(points: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    # points [Q,2] (x, y), m [H,W] -> [Q]
    return m[points[:, 1].long(), points[:, 0].long()]


def run_path(model, path: str, images: torch.Tensor, points: torch.Tensor, focal: torch.Tensor | None = None,
             anchors: bool = True) -> torch.Tensor:
    """images [B,3,H,W], points [B,Q,2], focal [B] or None -> depth [B,Q] through the named path (checked
    forwards), with or without the anchors; images of another size than the model's are resized first."""
    images, points, focal = to_model_size(model, images, points, focal)
    with torch.inference_mode():
        if path == "packed":
            return model(images, points, focal, anchors).float()
        if path == "masked":
            return model.forward_masked(images, points, focal, anchors).float()
        if path == "dense":
            return model.forward_dense(images, points, focal, anchors).float()
        if path == "glance":
            return glance_at_points(model, images, points, focal)
    raise ValueError(f"unknown path {path!r}; choose from {PATHS}")


def glance_at_points(model, images: torch.Tensor, points: torch.Tensor, focal: torch.Tensor | None) -> torch.Tensor:
    """The packed call's coarse answer: the glance depth at the points, from the packed buffer of their Q."""
    if model.glance_head is None:
        raise ValueError("path glance: the model has no glance depth (model.glance_depth)")
    images, points = check_inputs(images, points, model.cfg.patch_size)
    focal = check_focal(focal, images.shape[0], images.device)
    hw = tuple(images.shape[-2:])

    def core(im, pts, k, f):
        _, glance = model.encode(im, model.select(im, pts, k)[0])
        logd = model.glance_head.log_depth(model.glance_head.token_features(glance), pts, hw)
        return scaled_depth(logd, model.focal_scale(im, f), model.cfg.min_depth, model.cfg.max_depth, clamp=True)
    return run_chunked(core, images, points, model.cfg.buckets, focal).float()


def sample_focal(samples: list[dict], mode: str, device) -> torch.Tensor | None:
    """focal [B] of the samples (0 where unknown) for mode "data"; None for mode "default"."""
    if mode == "default":
        return None
    if mode != "data":
        raise ValueError(f"focal mode {mode!r} is not one of ('data', 'default')")
    return torch.stack([torch.as_tensor(smp.get("focal", 0.0), dtype=torch.float32) for smp in samples]).to(device)


def focal_report(focals: list[float], s: "EvalSettings", model) -> dict[str, Any]:
    """What focal lengths the evaluation gave the model: how many images had one, their range."""
    mc = model.cfg
    out: dict[str, Any] = {"mode": s.focal, "model_canonical_focal": mc.canonical_focal,
                           "model_focal_default": (mc.focal_default or mc.canonical_focal) if mc.uses_focal else None}
    known = [f for f in focals if f > 0] if s.focal == "data" else []
    out.update(images_with_focal=len(known), focal_min=min(known) if known else None,
               focal_max=max(known) if known else None)
    return out


def run_packed_on(model, k: int, images: torch.Tensor, points: torch.Tensor, focal: torch.Tensor | None,
                  anchors: bool = True) -> torch.Tensor:
    """The packed path with a K-slot buffer for Q <= K queries (the points padded as every runner pads
    them): the same queries with more context tokens. -> depth [B,Q]."""
    q = points.shape[1]
    images, points, focal = to_model_size(model, images, points, focal)
    with torch.inference_mode():
        images, points = check_inputs(images, points, model.cfg.patch_size)
        focal = check_focal(focal, images.shape[0], images.device)
        return model.packed_core(images, pad_points(points, k), k, focal, anchors)[:, :q].float()


# ---- the evaluation -----------------------------------------------------------------------------
def best_constant(targets: list[torch.Tensor]) -> float:
    """argmin_c mean_i mean_j |c - g_ij| / g_ij: the weighted median of g with weights 1/(n_i g_ij)."""
    g = torch.cat([t.double() for t in targets])
    w = torch.cat([1.0 / (t.double() * t.numel()) for t in targets])
    order = torch.argsort(g)
    g, w = g[order], w[order]
    cum = torch.cumsum(w, 0)
    k = int(torch.searchsorted(cum, cum[-1] / 2))  # first index with cum >= half the total weight
    return float(g[min(k, g.numel() - 1)])


def band_radius(model, image_hw: tuple[int, int], s: EvalSettings) -> int:
    """The edge band's radius in pixels of the evaluated images: s.band_radius, or one patch of the model
    (its patch size, scaled when the images are resized to the model's size)."""
    if s.band_radius is not None:
        return s.band_radius
    return max(1, round(model.cfg.patch_size * image_hw[1] / model.cfg.img_size[1]))


def anchor_settings(model, s: EvalSettings) -> tuple[bool, ...]:
    """The anchor settings to run: s.anchors; one for a model without anchors (off) or one whose
    answer needs them (on: a residual head corrects the glance depth)."""
    if not model.cfg.num_anchors:
        return (False,)
    return (True,) if model.cfg.query_head == "residual" else s.anchors


def evaluate(model, dataset, s: EvalSettings) -> dict[str, Any]:
    """Per point set (uniform, edge band) and (path, anchors, Q): metrics averaged over images; plus the
    best-constant row per Q. The first point set's rows are also the result's top-level rows."""
    from tqdm import tqdm

    n = len(dataset) if s.max_images is None else min(len(dataset), s.max_images)
    device = next(model.parameters()).device
    bands = POINT_SETS[s.points]
    per: dict[tuple, MetricAccumulator] = {}
    targets: dict[tuple, list[torch.Tensor]] = {(b, q): [] for b in bands for q in s.queries}
    skipped = {b: 0 for b in bands}
    focals: list[float] = []
    queried: dict[int, list[float]] = {q: [] for q in s.queries}  # share of patches under the points, per image
    maps: dict[bool, dict[str, Any]] = {}
    radius = None
    bar = tqdm(total=n, desc="evaluate", disable=not s.progress, dynamic_ncols=True)
    try:
        for start in range(0, n, s.batch_size):
            samples = [(i, dataset[i]) for i in range(start, min(n, start + s.batch_size))]
            focals += [float(smp.get("focal", 0.0)) for _, smp in samples]
            if radius is None:
                radius = band_radius(model, tuple(samples[0][1]["depth"].shape[-2:]), s)
            for band in bands:
                regions = [region(smp, band, radius, s.band_threshold, s.thin_max_px) for _, smp in samples]
                for q in s.queries:
                    pts = [(i, smp, eval_points(smp, q, s.seed, i, s.edge_frac, reg)) for (i, smp), reg in zip(samples, regions)]
                    kept = [(i, smp, p) for i, smp, p in pts if p is not None]
                    if q == s.queries[0]:
                        skipped[band] += len(pts) - len(kept)
                    if kept:
                        _evaluate_points(model, kept, band, q, s, device, per, targets, queried if band == bands[0] else None)
            if s.dense_map:
                dense_map_update(model, samples, s, maps, device)
            bar.update(len(samples))
    finally:
        bar.close()
    out_bands = {}
    for band in bands:
        rows = [{"path": path, "anchors": a, "queries": q, "images": acc.images, **acc.compute()}
                for (b, path, a, q), acc in per.items() if b == band]
        const = constant_rows(band, s, targets)
        out_bands[band] = {"rows": rows, "constant": const, "images": n - skipped[band], "skipped_images": skipped[band],
                           "summary": summarize(rows, const)}
    first = out_bands[bands[0]]
    out = {**first, "bands": out_bands, "settings": asdict(s), "focal": focal_report(focals, s, model),
           "band": {"radius": radius, "threshold": s.band_threshold, "images_without_band": skipped.get("edge"),
                    **({"images_without_thin": skipped["thin"], "thin_max_px": s.thin_max_px} if "thin" in skipped else {})}}
    if s.dense_map:
        out["dense_map"] = [{"path": "dense map", "anchors": a, "images": m["acc"].images, **m["acc"].compute(),
                             "boundary_f1": sum(m["f1"]) / len(m["f1"])} for a, m in maps.items() if m["acc"].images]
    if s.shares:
        out["shares"] = selection_shares(model, s.queries, queried)
    return out


def region(sample: dict, band: str, radius: int, threshold: float, thin_max_px: int = THIN_MAX_PX) -> torch.Tensor:
    """Where a point set draws its points in a sample: its valid pixels inside the evaluation crop, and
    for "edge" inside the depth-edge band, for "thin" on the thin band (the parts of the sample's "thin" mask
    at most thin_max_px pixels across) too."""
    mask = sample["valid"] & sample["eval_mask"]
    if band == "edge":
        mask = mask & edge_band(sample["depth"], sample["valid"], radius, threshold)
    elif band == "thin":
        if "thin" not in sample:
            raise ValueError(f"--points thin: sample {sample.get('name', '?')} has no thin-structure mask (only "
                             f"synthetic scenes carry one: data.kind synthetic)")
        mask = mask & thin_band(sample["thin"], thin_max_px)
    return mask


def _evaluate_points(model, kept: list, band: str, q: int, s: EvalSettings, device, per: dict, targets: dict,
                     queried: dict | None) -> None:
    """Every path and anchor setting at the Q points of each kept (index, sample, points), into per."""
    images = torch.stack([smp["image"] for _, smp, _ in kept]).to(device)
    points = torch.stack([p for _, _, p in kept]).to(device)  # [B,Q,2]
    focal = sample_focal([smp for _, smp, _ in kept], s.focal, device)
    gt = torch.stack([_at(p, smp["depth"]) for _, smp, p in kept])  # [B,Q]
    targets[(band, q)].extend(gt.unbind(0))
    if s.shares and queried is not None:
        mimages, mpoints, _ = to_model_size(model, images, points)
        grid = model.grid_of(mimages)
        pidx = patch_of_points(mpoints.cpu(), model.cfg.patch_size, grid)
        queried[q] += [len(set(r.tolist())) / (grid[0] * grid[1]) for r in pidx]
    for a in anchor_settings(model, s):
        for path in s.paths:
            if path == "glance" and not a:
                continue
            pred = run_path(model, path, images, points, focal, a).cpu()
            per.setdefault((band, path, a, q), MetricAccumulator("image", s.median_scaling)).update(pred, gt, batched=True)
        for k in s.context:
            if k > bucket_for(min(q, model.cfg.buckets[-1]), model.cfg.buckets) and q <= k:
                pred = run_packed_on(model, k, images, points, focal, a).cpu()
                acc = per.setdefault((band, f"packed@{k}", a, q), MetricAccumulator("image", s.median_scaling))
                acc.update(pred, gt, batched=True)


def constant_rows(band: str, s: EvalSettings, targets: dict) -> list[dict[str, Any]]:
    """The best constant's row per Q of one point set."""
    const = []
    for q in s.queries:
        if targets[(band, q)]:
            c = best_constant(targets[(band, q)])
            acc = MetricAccumulator("image", s.median_scaling)
            for t in targets[(band, q)]:
                acc.update(torch.full_like(t, c), t)
            const.append({"path": "constant", "anchors": None, "queries": q, "images": acc.images, "constant_m": c,
                          **acc.compute()})
    return const


def dense_map_update(model, samples: list, s: EvalSettings, maps: dict, device, chunk: int = 4) -> None:
    """The dense map (every pixel) against every valid pixel in the crop, per image, per anchor setting;
    and its scale-invariant boundary F1 against the ground truth (Depth Pro's)."""
    for a in anchor_settings(model, s):
        m = maps.setdefault(a, {"acc": MetricAccumulator("image", s.median_scaling), "f1": []})
        for c in range(0, len(samples), chunk):  # a map decodes H*W points: a few images at a time
            part = [smp for _, smp in samples[c:c + chunk]]
            images = torch.stack([smp["image"] for smp in part]).to(device)
            dmap = dense_map(model, images, sample_focal(part, s.focal, device), a)
            for smp, pred in zip(part, dmap):
                mask = smp["valid"] & smp["eval_mask"]
                if bool(mask.any()):
                    m["acc"].update(pred[mask], smp["depth"][mask])
                    m["f1"].append(si_boundary_f1(pred, smp["depth"], mask))


def dense_map(model, images: torch.Tensor, focal: torch.Tensor | None, anchors: bool = True) -> torch.Tensor:
    """The dense path's map [B,h,w] at the images' own size (a model of another size: resized back)."""
    mimages, _, mfocal = to_model_size(model, images, None, focal)
    with torch.inference_mode():
        dmap = model.forward_dense(mimages, None, mfocal, anchors).float()
    if dmap.shape[-2:] != images.shape[-2:]:
        dmap = torch.nn.functional.interpolate(dmap[:, None], size=images.shape[-2:], mode="bilinear",
                                               align_corners=False)[:, 0]
    return dmap.cpu()


def selection_shares(model, queries, queried: dict[int, list[float]]) -> list[dict[str, Any]]:
    """Per Q: patch tokens the packed path runs (every chunk's min(bucket, N)) as a share of the N the
    dense path runs, and the share of patches the queried points fall in (mean over images)."""
    from ..core.packing import chunk_plan

    n = model.cfg.num_patches
    out = []
    for q in queries:
        slots = sum(min(k, n) for _, _, k in chunk_plan(q, model.cfg.buckets))
        qs = queried.get(q) or []
        out.append({"queries": q, "bucket_slots": slots, "patches": n, "buffer_share": slots / n,
                    "queried_share": sum(qs) / len(qs) if qs else None,
                    "tokens_packed": model.cfg.num_prefix + slots, "tokens_dense": model.cfg.num_prefix + n})
    return out


def summarize(rows: list[dict], const: list[dict]) -> dict[str, Any]:
    """The figures the targets are stated in: packed vs constant, packed vs dense, anchors on vs off."""
    def get(path, a, q):
        return next((r["abs_rel"] for r in rows if r["path"] == path and r["anchors"] == a and r["queries"] == q), None)

    out: dict[str, Any] = {}
    for c in const:
        q = c["queries"]
        on, off, dense = get("packed", True, q), get("packed", False, q), get("dense", True, q)
        entry: dict[str, Any] = {"constant_abs_rel": c["abs_rel"], "packed_abs_rel": on, "packed_abs_rel_no_anchors": off,
                                 "dense_abs_rel": dense}
        if on:
            entry["constant_over_packed"] = c["abs_rel"] / on
        if on and dense:
            entry["packed_vs_dense_rel"] = (on - dense) / dense
        out[f"q{q}"] = entry
    return out


def quick_eval(model, dataset, q: int, max_images: int, seed: int = 0) -> dict[str, float]:
    """Packed-path metrics + the best constant's AbsRel; for training logs."""
    s = EvalSettings(queries=(q,), anchors=(True,), paths=("packed",), max_images=max_images,
                     seed=seed, figure_images=0, progress=False)
    r = evaluate(model, dataset, s)
    out = {k: r["rows"][0][k] for k in METRICS} if r["rows"] else {}
    if r["constant"]:
        out["constant_abs_rel"] = r["constant"][0]["abs_rel"]
    return out


# ---- reports ------------------------------------------------------------------------------------
def to_markdown(result: dict[str, Any], title: str = "") -> str:
    """eval.md: a table per point set (uniform, edge band, thin band), then each set's summary lines."""
    lines = [f"# {title}" if title else ""]
    for band, r in result["bands"].items():
        lines += ["", f"## {_band_words(band, result)}", ""] if len(result["bands"]) > 1 else [""]
        lines += _band_markdown(r, result["settings"])
    return "\n".join(lines).lstrip("\n") + "\n"


def _band_words(band: str, result: dict[str, Any]) -> str:
    if band == "uniform":
        return "Uniform points"
    b = result["band"]
    if band == "thin":
        return (f"Thin band: points on thin structures and small objects where at most {b.get('thin_max_px', '?')} px "
                f"across (synthetic scenes)")
    return (f"Depth-edge band: points within {b['radius']} px of a depth discontinuity (neighbour ratio > "
            f"{b['threshold']:g})")


def _band_markdown(result: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    head = "| path | anchors | Q | " + " | ".join(METRICS) + " |"
    lines = [head, "|" + " --- |" * (3 + len(METRICS))]
    order = {p: i for i, p in enumerate(PATHS)}
    rows = sorted(result["rows"], key=lambda r: (r["queries"], not r["anchors"], order.get(r["path"], 9),
                                                 int(r["path"].split("@")[1]) if "@" in r["path"] else 0))
    for q in sorted({r["queries"] for r in rows}):
        for r in [r for r in rows if r["queries"] == q] + [c for c in result["constant"] if c["queries"] == q]:
            a = "-" if r["anchors"] is None else ("on" if r["anchors"] else "off")
            name = r["path"] if r["path"] != "constant" else f"constant {r['constant_m']:.3g} m"
            lines.append(f"| {name} | {a} | {q} | " + " | ".join(f"{r[k]:.4f}" for k in METRICS) + " |")
    lines += ["", f"{result['images']} images ({result['skipped_images']} without a pixel to draw from skipped); "
              f"metrics per image, averaged; median scaling {'on' if settings['median_scaling'] else 'off'}; "
              f"query points {_points_words(settings.get('edge_frac', 0.0))}.", ""]
    for key, e in result["summary"].items():
        parts = [f"- {key}: best constant AbsRel {e['constant_abs_rel']:.4f}"]
        if e.get("packed_abs_rel") is not None:
            parts.append(f"packed {e['packed_abs_rel']:.4f}")
        if e.get("constant_over_packed"):
            parts.append(f"constant / packed = {e['constant_over_packed']:.2f}x")
        if e.get("packed_vs_dense_rel") is not None:
            parts.append(f"packed vs dense {100 * e['packed_vs_dense_rel']:+.1f}%")
        if e.get("packed_abs_rel_no_anchors") is not None:
            parts.append(f"packed without anchors {e['packed_abs_rel_no_anchors']:.4f}")
        lines.append(", ".join(parts))
    return lines


def extra_markdown(result: dict[str, Any]) -> str:
    """The dense-map rows and the share table, when they were asked for ('' otherwise)."""
    lines = []
    if result.get("dense_map"):
        lines += ["", "Dense map: every valid pixel in the crop (not only the queried points); boundary F1: Depth Pro's "
                  "scale-invariant one against the ground truth.", "",
                  "| path | anchors | " + " | ".join(METRICS) + " | boundary F1 |", "|" + " --- |" * (3 + len(METRICS))]
        for r in result["dense_map"]:
            lines.append(f"| dense map | {'on' if r['anchors'] else 'off'} | " + " | ".join(f"{r[k]:.4f}" for k in METRICS)
                         + f" | {r['boundary_f1']:.4f} |")
    if result.get("shares"):
        def get(path, a, q):
            return next((r["abs_rel"] for r in result["rows"] if r["path"] == path and r["anchors"] == a
                         and r["queries"] == q), None)

        lines += ["", "Share of the patches the packed path runs (its buffer, out of the dense path's N) and the share "
                  "the queried points fall in; AbsRel on the same points.", "",
                  "| Q | buffer share | queried share | tokens packed / dense | packed | packed, anchors off | dense | "
                  "packed vs dense |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in result["shares"]:
            q = e["queries"]
            p, off, d = get("packed", True, q), get("packed", False, q), get("dense", True, q)
            qs = "-" if e["queried_share"] is None else f"{100 * e['queried_share']:.1f}%"
            f = (lambda v: "-" if v is None else f"{v:.4f}")
            rel = f"{100 * (p - d) / d:+.2f}%" if p is not None and d else "-"
            lines.append(f"| {q} | {100 * e['buffer_share']:.1f}% | {qs} | {e['tokens_packed']} / {e['tokens_dense']} | "
                         f"{f(p)} | {f(off)} | {f(d)} | {rel} |")
    return "\n".join(lines) + ("\n" if lines else "")


def curve_figure(result: dict[str, Any], path: str | Path) -> Path:
    """AbsRel against the share of patches selected: packed (anchors on, off) and dense on the same points."""
    from .viz import _plt, save_figure

    plt = _plt()
    shares = {e["queries"]: e["buffer_share"] for e in result["shares"]}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = [("packed", True, "o-", "packed"), ("packed", False, "s--", "packed, anchors off"),
              ("dense", True, "^:", "dense (every patch) on the same points")]
    for name, a, style, label in styles:
        pts = sorted((shares[r["queries"]], r["abs_rel"], r["queries"]) for r in result["rows"]
                     if r["path"] == name and r["anchors"] == a and r["queries"] in shares)
        if not pts:
            continue
        xs, ys, qs = zip(*pts)
        ax.plot([100 * x for x in xs], ys, style, label=label)
        if name == "packed" and a:
            for x, y, q in pts:
                ax.annotate(f"Q={q}", (100 * x, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
    n = result["shares"][0]["patches"] if result["shares"] else 1
    ctx = sorted((min(int(r["path"].split("@")[1]), n) / n, r["abs_rel"], r["queries"]) for r in result["rows"]
                 if r["path"].startswith("packed@") and r["anchors"])
    if ctx:
        ax.plot([100 * x for x, _, _ in ctx], [y for _, y, _ in ctx], "D", mfc="none", label="packed, larger buffer (same Q)")
        for x, y, q in ctx:
            ax.annotate(f"Q={q}", (100 * x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    for r in result.get("dense_map") or []:
        if r["anchors"]:
            ax.axhline(r["abs_rel"], color="gray", lw=0.8, label="dense map, every valid pixel")
    ax.set_xlabel("patches in the packed buffer (% of the dense path's)")
    ax.set_ylabel("AbsRel (lower is better)")
    ax.set_xscale("log")
    xs_all = [100 * v for v in shares.values()] + [100 * x for x, _, _ in ctx]
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200) if min(xs_all) / 1.5 <= t <= max(xs_all) * 1.5]
    ax.set_xticks(ticks, [f"{t:g}%" for t in ticks])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:  # no point set with rows (say, no image has a depth-edge band): no legend
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no rows to plot", transform=ax.transAxes, ha="center", va="center", color="gray")
    ax.set_title(f"packed vs dense: {result['images']} held-out images", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def _points_words(edge_frac: float) -> str:
    if edge_frac == 0:
        return "uniform over the valid pixels"
    return f"{100 * edge_frac:.0f}% at image edges (Sobel-weighted), the rest uniform"


def figure(model, dataset, s: EvalSettings, out: str | Path) -> list[Path]:
    """eval.png (then eval_1.png, ...): image | ground truth | dense prediction | the packed path's
    points at the largest Q colored by relative error (depthpack.eval.viz.depth_figure), one per image."""
    q = max(s.queries)
    device = next(model.parameters()).device
    paths = []
    for i in range(min(s.figure_images, len(dataset))):
        smp = dataset[i]
        pts = eval_points(smp, q, s.seed, i, s.edge_frac)
        if pts is None:
            continue
        img = smp["image"].unsqueeze(0).to(device)
        focal = sample_focal([smp], s.focal, device)
        dense = dense_map(model, img, focal)[0]  # [H,W]
        pred = run_path(model, "packed", img, pts.unsqueeze(0).to(device), focal)[0].cpu()
        gt = torch.where(smp["valid"], smp["depth"], torch.zeros_like(smp["depth"]))
        name = "eval.png" if not paths else f"eval_{i}.png"
        paths.append(depth_figure(Path(out) / name, smp["image"], gt, dense, pts, pred, _at(pts, smp["depth"]),
                                  title=f"{smp.get('name', i)}: packed Q={q}"))
    return paths


# ---- CLI ----------------------------------------------------------------------------------------
def resolve_device(name: str, what: str = "--device") -> str:
    """auto | cpu | cuda | cuda:N -> a device this machine has, or one ValueError saying why not (naming the
    option or key `what`)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        if not isinstance(name, str):
            raise RuntimeError
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{what} {name!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{what} {name}: CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{what} {name!r}: use auto, cpu, cuda or cuda:N")
    return name


def data_config(checkpoint: str | Path, data_yaml: str | None, overrides: list[str]):
    """DataConfig for evaluation: the checkpoint's training data config (if stored), replaced by
    --data YAML (a TrainConfig-style file with a `data:` mapping, or a bare DataConfig mapping), then
    `data.key=value` overrides."""
    base: dict[str, Any] = {}
    try:
        base = dict(stored_config(checkpoint).get("train", {}).get("data", {}) or {})
    except Exception:  # a bare weights file without a training config: defaults
        base = {}
    if data_yaml:
        y = load_yaml(data_yaml)
        base = deep_merge(base, y["data"] if isinstance(y.get("data"), dict) else y)
    over = parse_overrides(overrides)
    extra = sorted(set(over) - {"data"})
    if extra:
        raise ValueError(f"overrides must be data.KEY=VALUE, got key(s) {extra}")
    return from_dict(DataConfig, deep_merge(base, over.get("data", {})))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = cli.Parser(
        prog="python -m depthpack.eval", description=__doc__, name="eval",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Data: by default the data config stored with the checkpoint (its training data), split "
               "--split. --data FILE replaces it with a YAML file: either a training config (its `data:` "
               "mapping is used, e.g. configs/demo.yaml) or a bare DataConfig mapping. Positional "
               "data.KEY=VALUE overrides apply last (e.g. data.kind=kitti data.root=/data/kitti "
               "data.eval_crop=garg).")
    ap.add_argument("--checkpoint", required=True, help="run folder, checkpoint folder, or a weights file (that file, config.json beside it)")
    ap.add_argument("--data", default=None, help="YAML with the DataConfig (a `data:` mapping or a bare one)")
    ap.add_argument("overrides", nargs="*", help="data.KEY=VALUE overrides of the DataConfig")
    ap.add_argument("--split", default="val", choices=("train", "val"))
    ap.add_argument("--queries", type=int, nargs="+", default=[16, 64, 256], help="query counts per image")
    ap.add_argument("--anchors", choices=("both", "on", "off"), default="both")
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS[:3]),
                    help="packed, masked, dense; glance: the glance depth of a model with one (model.glance_depth)")
    ap.add_argument("--median-scaling", action="store_true", help="per-image median scaling (relative depth)")
    ap.add_argument("--edge-frac", type=float, default=0.0,
                    help="share of query points drawn at image edges (0: uniform, the standard protocol; "
                         "0.5: as in training, harder: depth edges)")
    ap.add_argument("--points", choices=tuple(POINT_SETS), default="both",
                    help="where the query points are drawn: uniform over the valid pixels, inside the depth-edge band "
                         "(pixels near a depth discontinuity, where resolution decides), on the thin band (thin "
                         "structures and small objects: synthetic scenes), both uniform and edge, or all three (a table "
                         "each)")
    ap.add_argument("--band-radius", type=int, default=None, metavar="PX",
                    help="the edge band's radius in pixels of the evaluated images (default: one patch of the model)")
    ap.add_argument("--band-threshold", type=float, default=EDGE_THRESHOLD, metavar="RATIO",
                    help=f"a neighbour depth ratio above this is a discontinuity (default {EDGE_THRESHOLD})")
    ap.add_argument("--thin-max-px", type=int, default=THIN_MAX_PX, metavar="PX",
                    help=f"the thin band: the parts of thin structures and small objects at most this many pixels "
                         f"across in the evaluated images (default {THIN_MAX_PX}; a pole near the camera is not thin)")
    ap.add_argument("--focal", choices=("data", "default"), default="data",
                    help="data: give the model each image's focal length where the data set has it; default: "
                         "give none (the model's focal_default). Models without canonical_focal ignore it")
    ap.add_argument("--dense-map", action="store_true",
                    help="also the dense map's metrics over every valid pixel in the crop (not only the queried points)")
    ap.add_argument("--curve", action="store_true",
                    help="the share of patches the packed path runs at each Q, and curve.png: AbsRel against it, "
                         "packed and dense")
    ap.add_argument("--context", type=int, nargs="*", default=[],
                    help="also run the packed path on these larger buffers (patch slots) for the same queries: rows "
                         "packed@K, what more context tokens buy (e.g. --context 512 1024)")
    ap.add_argument("--image-size", type=parse_frame_size, default=None, metavar="WxH",
                    help="evaluate on images of this size (default: the model's): each is resized to the model's "
                         "size and its points scaled, e.g. a reduced-resolution dense model against full-size ones")
    ap.add_argument("--max-images", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--figure-images", type=int, default=4, help="PNGs: eval.png, eval_1.png, ... (0 = none)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--out", default=None, help="output folder (default: the --checkpoint folder (or the file's folder) /eval)")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    # nonsense that would fail deep inside, or evaluate nothing and say nothing: refused here
    for flag, value, ok, need in (("--queries", a.queries, min(a.queries) >= 1, "each >= 1"),
                                  ("--batch-size", a.batch_size, a.batch_size >= 1, ">= 1"),
                                  ("--max-images", a.max_images, a.max_images is None or a.max_images >= 1, ">= 1"),
                                  ("--figure-images", a.figure_images, a.figure_images >= 0, ">= 0"),
                                  ("--edge-frac", a.edge_frac, 0.0 <= a.edge_frac <= 1.0, "in [0, 1]"),
                                  ("--band-radius", a.band_radius, a.band_radius is None or 0 <= a.band_radius <= 4096,
                                   "a whole number of pixels in [0, 4096]"),
                                  ("--band-threshold", a.band_threshold, 1.0 < a.band_threshold <= 100.0, "a ratio in (1, 100]"),
                                  ("--thin-max-px", a.thin_max_px, 1 <= a.thin_max_px <= 4096,
                                   "a whole number of pixels in [1, 4096]")):
        if not ok:
            ap.error(f"{flag} {value}: must be {need}")
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    torch.manual_seed(a.seed)
    device = resolve_device(a.device)
    given = Path(a.checkpoint)
    out = check_writable_dir(Path(a.out) if a.out else (given if given.is_dir() else given.parent) / "eval", "--out")
    dcfg = data_config(a.checkpoint, a.data, a.overrides)

    def dataset_for(model):
        mc = model.cfg
        return make_dataset(dcfg, split=a.split, img_size=a.image_size or mc.img_size, min_depth=mc.min_depth,
                            max_depth=mc.max_depth)
    model = load_model(a.checkpoint, device=device)
    mc = model.cfg
    ds = dataset_for(model)
    anchors = {"both": (True, False), "on": (True,), "off": (False,)}[a.anchors]
    s = EvalSettings(queries=tuple(a.queries), anchors=anchors, paths=tuple(a.paths), median_scaling=a.median_scaling,
                     edge_frac=a.edge_frac, points=a.points, band_radius=a.band_radius, band_threshold=a.band_threshold,
                     thin_max_px=a.thin_max_px, max_images=a.max_images, batch_size=a.batch_size, seed=a.seed, figure_images=a.figure_images,
                     progress=not a.no_progress, focal=a.focal, dense_map=a.dense_map, shares=a.curve,
                     context=tuple(a.context))
    result = evaluate(model, ds, s)
    cdir, weights = checkpoint_files(a.checkpoint)
    result.update(checkpoint=str(cdir), weights=str(weights), data=to_dict(dcfg), split=a.split, model=to_dict(mc),
                  image_size=list(a.image_size or mc.img_size))
    atomic_write_json(out / "eval.json", result, sort_keys=False)
    md = to_markdown(result, f"depthpack accuracy: {weights}, {dcfg.kind} {a.split}") + extra_markdown(result)
    atomic_write_text(out / "eval.md", md)
    pngs = figure(model, ds, s, out) if s.figure_images else []
    if a.curve:
        pngs.append(curve_figure(result, out / "curve.png"))
    print(md)
    print(f"wrote {out / 'eval.md'}, {out / 'eval.json'}" + "".join(f", {p}" for p in pngs))
    return result

