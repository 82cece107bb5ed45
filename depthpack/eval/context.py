"""Why the packed answer differs from the dense one: where the dense path's queries look.

    python -m depthpack.eval --checkpoint runs/scale --context-diagnostic --queries 256

context_diagnostic: on held-out images, the dense path (every patch) is run with its attention read out
at each block, for the tokens of the queried patches: the share of their attention mass on the prefix
(cls, registers, anchors), on the patches the packed buffer holds, and on the patches it leaves out; and
at the late blocks, where the highest-norm tokens sit (prefix, in the buffer, left out). Mass on the
left-out patches says the gap is long-range context; high-norm tokens outside the buffer say the model
keeps a scratchpad among the patches that packing drops.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..core.packing import bucket_for, patch_of_points
from ..core.preprocess import scale_focal, scale_points


def to_model_size(model, images: torch.Tensor, points: torch.Tensor | None = None, focal: torch.Tensor | None = None):
    """Images of another size than the model's resized to it (bilinear, antialiased: a user's downsampling),
    their points and focal scaled alike; at the model's size everything is returned as it is."""
    size, have = tuple(model.cfg.img_size), tuple(images.shape[-2:])
    if have == size:
        return images, points, focal
    images = torch.nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=True)
    images = images.clamp(0.0, 1.0)  # the filter's weights are >= 0: anything past [0, 1] is their rounding
    if points is not None:  # pixel (x, y) stays inside the image: x * W / w < W
        points = scale_points(points, have, size).clamp(min=0).minimum(
            torch.tensor([size[1] - 1e-3, size[0] - 1e-3], device=points.device))
    return images, points, scale_focal(focal, have, size) if focal is not None else None


def _attention_rows(blk, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Softmax attention of timm Block blk at tokens x [B,S,D] for the query rows [B,R] -> [B,R,S], heads averaged."""
    attn = blk.attn
    B, S, D = x.shape
    h = blk.norm1(x)
    qkv = attn.qkv(h).reshape(B, S, 3, attn.num_heads, D // attn.num_heads).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])  # [B,H,S,hd]
    q = torch.gather(q, 2, rows[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[-1]))
    return torch.softmax((q * attn.scale) @ k.transpose(-2, -1), dim=-1).mean(1).float()


def context_diagnostic(model, dataset, q: int, points_for, max_images: int = 32, top: int = 8) -> dict[str, Any]:
    """Per block: attention mass of the queried patches' tokens (dense path) on the prefix, on the packed
    buffer's patches and on the patches it leaves out, and where the `top` highest-norm tokens sit.
    points_for(sample, index) -> the Q points [Q,2] of that image (None: none valid)."""
    device = next(model.parameters()).device
    cfg = model.cfg
    k = bucket_for(min(q, cfg.buckets[-1]), cfg.buckets)
    nb = len(model.backbone.blocks)
    mass = torch.zeros(nb, 3, dtype=torch.float64)  # prefix, in the buffer, left out
    norms = torch.zeros(nb, 3, dtype=torch.float64)
    n = 0
    for i in range(min(max_images, len(dataset))):
        smp = dataset[i]
        pts = points_for(smp, i)
        if pts is None:
            continue
        images, points, _ = to_model_size(model, smp["image"][None].to(device), pts[None].to(device))
        with torch.inference_mode():
            index, _ = model.select(images, points, k)
            grid = model.grid_of(images)
            x = model.embedding_input(images)
            pre = model.prefix(x)
            P = pre.shape[1]
            tokens = model.backbone.norm_pre(torch.cat([pre, model.embed_patches(x, None)], dim=1))
            kind = torch.full((tokens.shape[1],), 2, device=device)  # 2: left out
            kind[:P] = 0
            kind[P + index[0]] = 1
            rows = (P + patch_of_points(points, cfg.patch_size, grid)).unique()[None]
            for b, blk in enumerate(model.backbone.blocks):
                a = _attention_rows(blk, tokens, rows)[0]  # [R,S]
                for c in range(3):
                    mass[b, c] += a[:, kind == c].sum(1).mean().double().cpu()
                tokens = blk(tokens)
                hi = tokens[0].norm(dim=-1).topk(min(top, tokens.shape[1])).indices
                for c in range(3):
                    norms[b, c] += (kind[hi] == c).float().mean().double().cpu()
        n += 1
    if n == 0:
        raise ValueError("context diagnostic: no image with a valid pixel to query")
    names = ("prefix", "in_buffer", "left_out")
    return {"queries": q, "bucket": k, "images": n, "patches": cfg.num_patches, "prefix_tokens": cfg.num_prefix,
            "blocks": [{"block": b, "attention": {c: float(mass[b, j] / n) for j, c in enumerate(names)},
                        "top_norm_tokens": {c: float(norms[b, j] / n) for j, c in enumerate(names)}}
                       for b in range(nb)]}


def diagnostic_markdown(d: dict[str, Any]) -> str:
    lines = ["", f"Where the dense path's query tokens look (Q={d['queries']}, the packed buffer of {d['bucket']} patch "
             f"slots out of {d['patches']}, {d['prefix_tokens']} prefix tokens, {d['images']} images): attention mass, "
             "and the share of the highest-norm tokens.", "",
             "| block | attention: prefix | in the buffer | left out | top-norm tokens: prefix | in the buffer | left out |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["blocks"]:
        a, t = r["attention"], r["top_norm_tokens"]
        lines.append(f"| {r['block']} | {a['prefix']:.3f} | {a['in_buffer']:.3f} | {a['left_out']:.3f} | "
                     f"{t['prefix']:.2f} | {t['in_buffer']:.2f} | {t['left_out']:.2f} |")
    return "\n".join(lines) + "\n"
