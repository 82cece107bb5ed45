"""Diagnostics of the packing gap, on a trained run: where the dense path's queries look, and the gap over
training.

    python scripts/diagnostics.py context --checkpoint runs/scale --queries 256 --out runs/scale/diag
    python scripts/diagnostics.py gap --checkpoint runs/scale --queries 16 256 --out runs/scale/gap

context: on held-out images, the dense path (every patch) is run with its attention read out at each
block, for the tokens of the queried patches: the share of their attention mass on the prefix (cls,
registers, anchors), on the patches the packed buffer holds, and on the patches it leaves out; and at
the late blocks, where the highest-norm tokens sit (prefix, in the buffer, left out). Mass on the
left-out patches says the gap is long-range context; high-norm tokens outside the buffer say the model
keeps a scratchpad among the patches that packing drops.
gap: packed and dense AbsRel at each Q for every checkpoint of the run folder, against the step.
Both read the run's held-out data (its stored data config, as python -m depthpack.eval does).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from depthpack.core.checkpoint import list_checkpoints, load_model
from depthpack.core.files import atomic_write_json, atomic_write_text, check_writable_dir
from depthpack.core.packing import bucket_for, patch_of_points
from depthpack.core.preprocess import to_model_size
from depthpack.data.datasets import make_dataset
from depthpack.eval.evaluate import EvalSettings, data_config, eval_points, evaluate
from depthpack.eval.viz import _plt
from depthpack.runtime.engines import resolve_device


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


def gap_curve(run_dir: str | Path, dataset_for, queries: tuple[int, ...], max_images: int, device: str,
              seed: int = 0) -> list[dict[str, Any]]:
    """Packed and dense AbsRel (anchors on) at each Q for every complete checkpoint of the run, oldest first.
    dataset_for(model) gives the held-out data at that model's size."""
    from tqdm import tqdm

    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise ValueError(f"gap: {run_dir} holds no checkpoint")
    out, ds = [], None
    for c in tqdm(ckpts, desc="checkpoints"):
        model = load_model(c, device=device)
        ds = ds or dataset_for(model)
        s = EvalSettings(queries=queries, anchors=(True,), paths=("packed", "dense"), max_images=max_images, seed=seed,
                         figure_images=0, progress=False)
        summary = evaluate(model, ds, s)["summary"]
        step = int(c.name.split("_")[-1]) if c.name.split("_")[-1].isdigit() else len(out)
        out.append({"checkpoint": c.name, "step": step, **{key: {"packed": e["packed_abs_rel"], "dense": e["dense_abs_rel"],
                                                                  "gap": e.get("packed_vs_dense_rel")}
                                                            for key, e in summary.items()}})
    return out




def gap_main(a, out: Path, dataset_for, device: str) -> dict[str, Any]:
    """Packed vs dense at every checkpoint of the run; gap.json, gap.md and gap.png in out."""
    curve = gap_curve(a.checkpoint, dataset_for, tuple(a.queries), a.max_images or 128, device, a.seed)
    atomic_write_json(out / "gap.json", {"run": str(a.checkpoint), "curve": curve}, sort_keys=False)
    keys = [k for k in curve[0] if k.startswith("q")]
    lines = ["| step | " + " | ".join(f"{k}: packed / dense / gap" for k in keys) + " |", "|---" * (1 + len(keys)) + "|"]
    fmt = lambda e: f"{e['packed']:.4f} / {e['dense']:.4f} / {100 * e['gap']:+.1f}%"  # noqa: E731
    lines += [f"| {r['step']} | " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in curve]
    atomic_write_text(out / "gap.md", "\n".join(lines) + "\n")
    gap_figure(curve, out / "gap.png")
    print("\n".join(lines))
    return {"curve": curve}




def gap_figure(curve: list[dict[str, Any]], path: str | Path) -> Path:
    """Packed vs dense (relative AbsRel gap, %) against the training step, one line per Q."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key in [k for k in curve[0] if k.startswith("q")]:
        pts = [(r["step"], 100 * r[key]["gap"]) for r in curve if r[key]["gap"] is not None]
        if pts:
            ax.plot(*zip(*pts), "o-", label=f"Q={key[1:]}")
    ax.axhline(0, color="gray", lw=0.8)
    ax.set(xlabel="training step", ylabel="packed vs dense AbsRel (%)", title="the packing gap over training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("context", "gap"))
    ap.add_argument("--checkpoint", required=True, help="context: a checkpoint or run folder; gap: a run folder")
    ap.add_argument("--queries", type=int, nargs="+", default=[256])
    ap.add_argument("--max-images", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    a.device = str(resolve_device(a.device))
    out = check_writable_dir(Path(a.out), "--out")
    dcfg = data_config(a.checkpoint, None, [])

    def dataset_for(model):
        mc = model.cfg
        return make_dataset(dcfg, split="val", img_size=mc.img_size, min_depth=mc.min_depth, max_depth=mc.max_depth)
    if a.what == "gap":
        return gap_main(a, out, dataset_for, a.device)
    model = load_model(a.checkpoint, device=a.device)
    q = a.queries[0]
    d = context_diagnostic(model, dataset_for(model), q, lambda smp, i: eval_points(smp, q, a.seed, i), a.max_images or 32)
    atomic_write_json(out / "context.json", d, sort_keys=False)
    atomic_write_text(out / "context.md", diagnostic_markdown(d))
    print(diagnostic_markdown(d))
    return d


if __name__ == "__main__":
    main()
