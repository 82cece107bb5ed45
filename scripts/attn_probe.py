"""Where attn_proj's time goes at batch 1 (321 tokens) on a CUDA GPU: the library's attention and
projection steps (vit_block._attention, vit_block._proj_add) composed with switches, then a tile sweep.

    python scripts/attn_probe.py --out DIR         # DIR/attn_probe.json, DIR/attn_probe.md
    bash scripts/attn_probe_ncu.sh                 # Nsight Compute on the library kernel at its tiles

ATTN 0 skips the attention (o = q); PROJ 0 stores o (no projection), 1 adds the projection atomically (as
the library), 2 stores it (wrong sums: what the atomics cost). Times: one launch replayed from a CUDA
graph (triton.testing.do_bench_cudagraph), microseconds.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from depthpack.kernels import vit_block as vb  # noqa: E402
from depthpack.kernels.vit_block import _attention, _proj_add  # noqa: E402


@triton.jit
def _probe(qkv_ptr, projw_ptr, ls1_ptr, r_ptr, o_ptr, S, D, qk_scale, HD: tl.constexpr, BM: tl.constexpr,
           BN: tl.constexpr, BO: tl.constexpr, ATTN: tl.constexpr, PROJ: tl.constexpr):
    pid_m, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rq = pid_m * BM + tl.arange(0, BM)
    q_ok = rq < S
    row = b * S + rq
    dd = tl.arange(0, HD)
    q = tl.load(qkv_ptr + row[:, None] * (3 * D) + h * HD + dd[None, :], mask=q_ok[:, None], other=0.0)
    if ATTN:
        o = _attention(qkv_ptr, q, b * S, h, S, D, qk_scale, False, HD, BM, BN, "")
    else:
        o = q
    if PROJ == 0:
        tl.store(o_ptr + row[:, None] * D + h * HD + dd[None, :], o, mask=q_ok[:, None])
    else:
        _proj_add(o, row, q_ok, h, projw_ptr, ls1_ptr, r_ptr, D, True, False, HD, BM, BO, PROJ == 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe_out")
    ap.add_argument("--cases", default="1x321")
    args = ap.parse_args()
    rows = []
    for case in args.cases.split(","):
        B, S = (int(v) for v in case.split("x"))
        D, heads, hd = 384, 6, 64
        g = torch.Generator().manual_seed(0)
        qkv = torch.randn(B * S, 3 * D, generator=g).cuda().bfloat16()
        proj_w = (torch.randn(D, D, generator=g) * D ** -0.5).cuda().bfloat16()
        ls1 = torch.rand(D, generator=g).cuda().bfloat16()
        r = torch.zeros(B, S, D, device="cuda")
        o = torch.empty(B * S, D, device="cuda", dtype=torch.bfloat16)

        def bench(fn) -> float:
            fn()
            torch.cuda.synchronize()
            return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30)

        def run(cfg):
            c = dict(cfg)
            grid = (triton.cdiv(S, c["BM"]), heads, B)
            return lambda: _probe[grid](qkv, proj_w, ls1, r, o, S, D, vb.LOG2E / math.sqrt(hd), HD=hd, **c)

        # the library kernel at its tiles, and at key and projection tiles of 64 (its tiles before this probe)
        lib = vb.attn_tiles(B * S, S, torch.cuda.get_device_properties(0).multi_processor_count, heads)
        for what, c in (("library attn_proj", lib), ("library attn_proj, 64-wide tiles", dict(lib, BN=64, BO=64))):
            us = bench(lambda: vb.launch_attn_proj(vb._attn_proj_kernel, c, qkv, proj_w, ls1, r, heads))
            rows.append(dict(B=B, S=S, what=what, cfg=c, us=round(us, 2)))
            print(rows[-1], flush=True)
        # the share of each part, at the library's tiles
        for attn, proj in ((1, 1), (1, 0), (0, 1), (1, 2), (0, 0)):
            cfg = dict(lib, ATTN=attn, PROJ=proj)
            rows.append(dict(B=B, S=S, what="parts", cfg=cfg, us=round(bench(run(cfg)), 2)))
            print(rows[-1], flush=True)
        # tiles: query rows, key tile, projection columns, warps, pipeline stages
        for bm, bn, bo, nw, ns in itertools.product((16, 32), (64, 128, 256), (64, 128), (2, 4, 8), (2, 3)):
            cfg = dict(BM=bm, BN=bn, BO=bo, num_warps=nw, num_stages=ns, ATTN=1, PROJ=1)
            try:
                us = bench(run(cfg))
            except Exception as e:  # out of shared memory or registers: say so, go on
                rows.append(dict(B=B, S=S, what="tiles", cfg=cfg, us=None, error=str(e).splitlines()[0][:120]))
            else:
                rows.append(dict(B=B, S=S, what="tiles", cfg=cfg, us=round(us, 2)))
            print(rows[-1], flush=True)
        # correctness of the best tiles against the library kernel
        good = [x for x in rows if x["what"] == "tiles" and x["us"] is not None and x["B"] == B]
        best = min(good, key=lambda x: x["us"])
        r.zero_()
        run(best["cfg"])()
        got = r.clone()
        r.zero_()
        vb.launch_attn_proj(vb._attn_proj_kernel, lib, qkv, proj_w, ls1, r, heads)
        rows.append(dict(B=B, S=S, what="best", cfg=best["cfg"], us=best["us"],
                         max_abs_diff_vs_library=float((got - r).abs().max())))
        print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attn_probe.json").write_text(json.dumps(rows, indent=1))
    lines = [f"# attn_proj probe ({torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__})",
             "", "One launch replayed from a CUDA graph, us. parts: ATTN 0 skips attention, PROJ 0 no projection, "
             "1 atomic (library), 2 plain stores.", "", "| B | tokens | what | config | us |", "|---|---|---|---|---|"]
    for x in sorted(rows, key=lambda x: (x["what"] == "tiles", x["us"] is None, x["us"] or 0)):
        cfg = ", ".join(f"{k}={v}" for k, v in x["cfg"].items())
        extra = f" (max abs diff vs library {x['max_abs_diff_vs_library']:.1e})" if "max_abs_diff_vs_library" in x else ""
        lines.append(f"| {x['B']} | {x['S']} | {x['what']} | {cfg}{extra} | {x['us'] if x['us'] is not None else x['error']} |")
    (out / "attn_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:20]))


if __name__ == "__main__":
    main()
