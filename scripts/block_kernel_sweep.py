"""Tile sweep of the fused ViT block's four kernels (depthpack.kernels.vit_block) on a CUDA GPU.

    python scripts/block_kernel_sweep.py --out DIR        # vits bf16 at B1 Q256 (321 tokens) and B8 Q512 (577)
    python scripts/block_kernel_sweep.py --persistent --out DIR   # the persistent block: variants, phases alone

For each kernel and each candidate (tiles, warps, pipeline stages; fc2's K split), the time of one launch
replayed from a CUDA graph (triton.testing.do_bench_cudagraph), beside what the same step costs in torch
(eager ops captured the same way: cuBLAS GEMMs, cuDNN/flash attention, LayerNorm). The default tiles
(vit_block.tiles) are marked. Writes DIR/sweep.md and DIR/sweep.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from depthpack.kernels import vit_block as vb  # noqa: E402

QKV_FC1 = [(64, 64, 64, 4, 3), (64, 64, 64, 4, 1), (64, 64, 32, 4, 3), (64, 128, 64, 4, 3), (64, 128, 64, 8, 3),
           (32, 64, 64, 4, 3), (128, 64, 64, 8, 3), (64, 64, 128, 4, 2), (64, 32, 64, 4, 3)]
ATTN = [(32, 64, 64, 4, 3), (64, 64, 64, 4, 3), (16, 64, 64, 4, 3), (32, 32, 64, 4, 2), (32, 64, 128, 4, 3),
        (64, 64, 64, 8, 3), (32, 128, 64, 4, 3), (32, 64, 64, 2, 2)]
FC2 = [(64, 64, 64, 4, 3, 1), (64, 64, 64, 4, 3, 2), (64, 64, 64, 4, 3, 4), (64, 64, 64, 4, 3, 8),
       (64, 128, 64, 4, 3, 4), (32, 64, 64, 4, 3, 4), (64, 64, 128, 4, 3, 4), (128, 64, 64, 8, 3, 1)]


def bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30)  # us


def case(B: int, S: int, D: int = 384, heads: int = 6, hidden: int = 1536, dtype=torch.bfloat16):
    """Tokens, the block's weights (a dict in vit_block's argument order) and its buffers."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s, sc=1.0: (torch.randn(*s, generator=g) * sc).to("cuda", dtype)  # noqa: E731
    w = dict(ln1_w=1 + 0.1 * r(D), ln1_b=0.1 * r(D), qkv_w=r(3 * D, D, sc=D ** -0.5), qkv_b=0.1 * r(3 * D),
             proj_w=r(D, D, sc=D ** -0.5), proj_b=0.1 * r(D), ls1=r(D).abs(), ln2_w=1 + 0.1 * r(D), ln2_b=0.1 * r(D),
             fc1_w=r(hidden, D, sc=D ** -0.5), fc1_b=0.1 * r(hidden), fc2_w=r(D, hidden, sc=hidden ** -0.5),
             fc2_b=0.1 * r(D), ls2=r(D).abs())
    x = torch.randn(B, S, D, generator=g).cuda()
    out, res, qkv, h = vb._buffers(x, w["qkv_w"], hidden)
    return x, w, dict(out=out, r=res, qkv=qkv, h=h)


def sweep(B: int, S: int) -> list[dict]:
    x, w, buf = case(B, S)
    D, hidden, heads = x.shape[-1], w["fc1_w"].shape[0], 6
    default = vb.tiles(B * S, S, D, hidden, torch.cuda.get_device_properties(0).multi_processor_count, heads)
    rows = []

    def row(kernel, cfg, us):
        is_default = kernel in default and all(default[kernel].get(k) == v for k, v in cfg.items())
        rows.append(dict(B=B, S=S, kernel=kernel, config=cfg, us=round(us, 2), default=is_default))
        print(f"B{B} S{S} {kernel:10s} {json.dumps(cfg):80s} {us:8.2f} us{'  (default)' if is_default else ''}", flush=True)

    xb, rb = x.to(torch.bfloat16), buf["r"]
    qkv4 = buf["qkv"].view(B, S, 3, heads, D // heads).permute(2, 0, 3, 1, 4)
    with torch.inference_mode():  # torch's own kernels for the same steps
        row("torch", {"step": "layer_norm + qkv linear"},
            bench(lambda: F.linear(F.layer_norm(xb, (D,), w["ln1_w"], w["ln1_b"], 1e-6), w["qkv_w"], w["qkv_b"])))
        row("torch", {"step": "sdpa + proj linear + ls1 + residual"},
            bench(lambda: xb + w["ls1"] * F.linear(F.scaled_dot_product_attention(qkv4[0], qkv4[1], qkv4[2])
                                                    .transpose(1, 2).reshape(B, S, D), w["proj_w"], w["proj_b"])))
        row("torch", {"step": "layer_norm + fc1 linear + gelu"},
            bench(lambda: F.gelu(F.linear(F.layer_norm(xb, (D,), w["ln2_w"], w["ln2_b"], 1e-5), w["fc1_w"], w["fc1_b"]))))
        hb = buf["h"].view(B, S, hidden)
        row("torch", {"step": "fc2 linear + ls2 + residual"},
            bench(lambda: xb + w["ls2"] * F.linear(hb, w["fc2_w"], w["fc2_b"])))
    for bm, bn, bk, nw, ns in QKV_FC1:
        c = dict(BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=ns)
        row("ln_qkv", c, bench(lambda: vb.launch_ln_qkv(vb._ln_linear_kernel, c, x, w["ln1_w"], w["ln1_b"], w["qkv_w"],
                                                         w["qkv_b"], w["proj_b"], w["ls1"], 1e-6, buf["qkv"], rb)))
        row("ln_fc1", c, bench(lambda: vb.launch_ln_fc1(vb._ln_linear_kernel, c, rb, w["ln2_w"], w["ln2_b"], w["fc1_w"],
                                                         w["fc1_b"], w["fc2_b"], w["ls2"], 1e-5, buf["h"], buf["out"],
                                                         True)))
    rb.copy_(x)
    for bm, bn, bo, nw, ns in ATTN:
        c = dict(BM=bm, BN=bn, BO=bo, num_warps=nw, num_stages=ns)
        row("attn_proj", c, bench(lambda: vb.launch_attn_proj(vb._attn_proj_kernel, c, buf["qkv"], w["proj_w"],
                                                               w["ls1"], rb, heads)))
    for bm, bn, bk, nw, ns, split in FC2:
        c = dict(BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=ns, split=split)
        row("fc2_res", c, bench(lambda: vb.launch_fc2_res(vb._fc2_res_kernel, c, buf["h"], w["fc2_w"], w["fc2_b"],
                                                           w["ls2"], rb, buf["out"])))
    return rows


# the persistent block (fused_blocks="persistent"): whole-kernel variants over persistent_tiles' choice
PERSISTENT = [{}, {"num_warps": 8}, {"CM": ""}, {"A_BN": 128}, {"A_BO": 128}, {"Q_BM": 32, "Q_BN": 128},
              {"Q_BM": 64, "Q_BN": 64}, {"F_BM": 64, "F_BN": 64}, {"F_BM": 32, "F_BN": 128}, {"O_BM": 64, "O_BN": 64, "KCHUNK": 512},
              {"Q_BM": 64, "Q_BN": 128, "F_BM": 64, "F_BN": 128, "num_warps": 8}]


def sweep_persistent(B: int, S: int) -> list[dict]:
    """The persistent block at its tiles and at PERSISTENT's variants; at its tiles each phase alone (one
    launch, no barrier) and the three barriers alone (no phase), so the time splits into phases and
    barriers; beside it the four-kernel block and the hybrid block (its torch ops and two kernels)."""
    x, w, buf = case(B, S)
    D, hidden, heads = x.shape[-1], w["fc1_w"].shape[0], 6
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    weights = [*w.values(), heads, 1e-6, 1e-5]  # case() builds w in vit_block's argument order
    bufs = [buf[k] for k in ("out", "r", "qkv", "h")]
    bar = vb.new_barrier(x.device)
    rows = []

    def row(kernel, cfg, fn):
        us = bench(fn)
        rows.append(dict(B=B, S=S, kernel=kernel, config=cfg, us=round(us, 2), default=not cfg))
        print(f"B{B} S{S} {kernel:16s} {json.dumps(cfg):80s} {us:8.2f} us", flush=True)

    def launch(phases=15, sync=None, config=None):
        return lambda: vb.launch_persistent(vb._block_kernel, x, *weights, *bufs, bar, sms=sms, phases=phases,
                                            sync=sync, config=config)
    print(f"B{B} S{S} persistent_tiles {vb.persistent_tiles(B * S, S, D, hidden, sms, heads)}", flush=True)
    for cfg in PERSISTENT:
        row("persistent", cfg, launch(config=cfg))
    for phase, name in ((1, "ln_qkv"), (2, "attn_proj"), (4, "ln_fc1"), (8, "fc2_res")):
        row("persistent", {"phase alone": name}, launch(phases=phase, sync=False))
    row("persistent", {"phase alone": "three barriers"}, launch(phases=0, sync=True))
    with torch.inference_mode():
        row("four kernels", {"tiles": "vit_block.tiles"}, lambda: vb._launch(
            (vb._ln_linear_kernel, vb._attn_proj_kernel, vb._ln_linear_kernel, vb._fc2_res_kernel), x, *weights, *bufs))
        ops = torch.ops.depthpack
        row("hybrid block", {"ops": "torch + attn_proj_res + fc2_res"},
            lambda: vb.hybrid_block(x, *weights, attn_proj=ops.attn_proj_res, fc2=ops.fc2_res))
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [f"# Tile sweep of the fused block's kernels ({torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"triton {triton.__version__}, vits bf16)", "",
             "One launch replayed from a CUDA graph (triton.testing.do_bench_cudagraph), microseconds. torch rows: "
             "the same step with torch's kernels, captured the same way. `*`: the default tiles.", "",
             "| B | tokens | kernel | config | us |", "|---|---|---|---|---|"]
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        lines.append(f"| {r['B']} | {r['S']} | {r['kernel']} | {cfg}{' *' if r['default'] else ''} | {r['us']:.2f} |")
    best = {}
    for r in rows:
        key = (r["B"], r["kernel"])
        if r["kernel"] != "torch" and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    lines += ["", "Best per kernel:", ""] + [f"- B{b} {k}: {r['us']:.2f} us with {r['config']}" for (b, k), r in best.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="sweep_out")
    ap.add_argument("--cases", default="1x321,8x577", help="BxS token counts")
    ap.add_argument("--persistent", action="store_true", help="the persistent block instead of the four kernels")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("block_kernel_sweep needs a CUDA GPU")
    rows = []
    for c in args.cases.split(","):
        B, S = (int(v) for v in c.split("x"))
        rows += sweep_persistent(B, S) if args.persistent else sweep(B, S)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(rows, indent=1))
    (out / "sweep.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
