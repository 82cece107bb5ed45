"""Jetson Orin latency of depthpack's forwards, predicted by a per-kernel cost model calibrated on the H200.

    python scripts/orin.py                          # docs/results/orin.json, docs/figures/orin_latency.png
    python scripts/orin.py --profile prof.json      # calibrate on a measured profile instead
    python scripts/docs_tables.py                   # then docs/orin.md's tables from docs/results/orin.json

PREDICTIONS, NOT MEASUREMENTS: nothing here ran on a Jetson, and every output says so. Each kernel of
a forward (the inventory: FLOPs and minimum bytes per kernel) costs a launch/floor term plus the
larger of its compute time (with an efficiency curve for small GEMMs) and its memory time; the terms
are fitted to the H200's measured profile and latencies, then moved to the Orins' published clocks,
SMs, tensor rates and bandwidths, with the Orin-side efficiency fitted to published TensorRT
latencies of Depth Anything Small. The H200 measurements are docs/results/h200_calibration.json and
docs/results/h200_profile.json; the method and the tables are in docs/orin.md. --profile takes what
scripts/gpu_profile.py writes as profile.json. The inventory is the thumbnail layout's (context
"thumbnail", the direct head), the layout every committed H200 row ran; the glance's depth head is not in it.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python scripts/orin.py` without an installed depthpack
    sys.path.insert(0, str(ROOT))
from depthpack.core.config import PRESETS, ModelConfig, model_config  # noqa: E402
LAYOUT = dict(context="thumbnail")  # the layout the calibration rows ran (see the docstring)

RESULTS = ROOT / "docs" / "results"
CALIBRATION = RESULTS / "h200_calibration.json"
PROFILE = RESULTS / "h200_profile.json"

__all__ = ["Device", "DEVICES", "Kernel", "Params", "packed_inventory", "dense_inventory",
           "depth_anything_inventory", "forward_us", "calibrate_h200", "calibrate_orin", "predict", "main"]

H200_CLOCK_GHZ = 1.98
BYTES = 2  # fp16 / bf16 activations and weights


# ---- devices ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    key: str
    name: str
    sms: int
    clock_ghz: float      # GPU boost / max clock
    peak_tflops: float    # dense FP16/BF16 tensor-core rate
    mem_gbs: float        # DRAM bandwidth, datasheet
    l2_mb: float          # L2 cache
    arch: str
    derivation: str
    sources: tuple[str, ...]

    @property
    def clock_scale(self) -> float:
        return H200_CLOCK_GHZ / self.clock_ghz


def _orin_peak(sms: int, ghz: float) -> float:
    # sm_87: 4 tensor cores per SM x 256 dense FP16 FMA per clock (A100-class; Orin's 64 TCs at 1.3 GHz give
    # the datasheet's 170 sparse INT8 TOPS = 85 dense INT8 = 42.5 dense FP16 TFLOP/s)
    return sms * 4 * 256 * 2 * ghz / 1e3


DEVICES: dict[str, Device] = {d.key: d for d in [
    Device("h200", "NVIDIA H200 SXM", 132, 1.98, 989.0, 4800.0, 50.0, "sm_90",
           "datasheet dense BF16 989 TFLOP/s (1979 with sparsity), HBM3e 4.8 TB/s, 50 MB L2 (the GH100 die of the "
           "H100 SXM; only the Orins' L2 enters the predictions); on an H200 an 8192^3 bf16 GEMM reaches "
           "about 790 TFLOP/s and a copy about 4.3 TB/s (not in a committed result file); 132 SMs and 1980 MHz max SM clock from docs/results/h200_calibration.json",
           ("https://www.nvidia.com/en-us/data-center/h200/", "docs/results/h200_calibration.json (info)")),
    Device("agx_orin_64", "Jetson AGX Orin 64GB", 16, 1.30, _orin_peak(16, 1.30), 204.8, 4.0, "sm_87",
           "2048 CUDA cores = 16 SMs x 128, 64 tensor cores, 4 MB L2, GPU max 1.3 GHz, 204.8 GB/s LPDDR5; GPU 170 sparse "
           "INT8 TOPS (of 275 with the DLAs) -> 85 dense INT8 -> 42.5 dense FP16 TFLOP/s",
           ("NVIDIA Jetson AGX Orin Series Technical Brief v1.2 (summary: http://mzph.cn/web/30785.shtml)",
            "https://www.nvidia.com/en-us/autonomous-machines/embedded-systems/jetson-orin/")),
    Device("orin_nx_16", "Jetson Orin NX 16GB", 8, 0.918, _orin_peak(8, 0.918), 102.4, 2.0, "sm_87",
           "1024 CUDA cores = 8 SMs, 32 tensor cores, 2 MB L2 (deviceQuery), GPU max 918 MHz "
           "(MAXN, JetPack 5/6; JetPack 6.2's "
           "MAXN_SUPER raises it to 1173 MHz), 102.4 GB/s; 100 TOPS with the DLAs (GPU ~60 sparse INT8)",
           ("https://github.com/icub-tech-iit/cad-libraries/files/13056089/JETSON-ORIN-NX-DATASHEET.pdf",
            "deviceQuery of an Orin NX 16GB: https://gist.github.com/atinfinity/8cede915acda05d0ff427c09604735dd")),
    Device("orin_nano_super", "Jetson Orin Nano Super 8GB", 8, 1.02, _orin_peak(8, 1.02), 102.0, 2.0, "sm_87",
           "1024 CUDA cores = 8 SMs, 32 tensor cores, L2 assumed 2 MB as the NX, GPU 1020 MHz "
           "(MAXN_SUPER, JetPack 6.1+), 102 GB/s; "
           "67 sparse INT8 TOPS -> 16.7 dense FP16 TFLOP/s",
           ("NVIDIA Jetson Orin Nano Super Developer Kit datasheet (Dec 2024), as quoted at "
            "https://www.brojogopalsapui.com/ai-foundations/sub_contents/AI_hardware/jetson_orin_nano_light.html",)),
    Device("orin_nano_8", "Jetson Orin Nano 8GB (before Super, JetPack 5)", 8, 0.625, _orin_peak(8, 0.625), 68.0,
           2.0, "sm_87", "1024 CUDA cores, 32 tensor cores, GPU max 625 MHz, 68 GB/s; 40 sparse INT8 TOPS, 10 FP16 "
           "TFLOP/s (calibration only: the device of the Depth Anything V1 figures)",
           ("https://ericxliu.me/posts/benchmarking-llms-on-jetson-orin-nano",
            "opencv_zoo benchmark note 'max freq 625MHz': "
            "https://huggingface.co/opencv/opencv_zoo/commit/51d25f918c5e36757bb5aed1bfd97a1f636de63f")),
]}
TARGETS = ("agx_orin_64", "orin_nx_16", "orin_nano_super")


# ---- kernel inventory --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernel:
    name: str
    category: str          # gemm | attention | conv | norm | pointwise | select | topk
    flops: float = 0.0     # per launch
    bytes: float = 0.0     # per launch, minimum (each operand read once, each result written once)
    count: int = 1         # identical launches per forward
    m: int = 0             # GEMM / implicit-GEMM output rows (attention: batch*heads*queries)
    n: int = 0             # GEMM output columns
    k: int = 0             # reduction length (alignment matters: k % 8 != 0 takes the slow 4-byte-load path)
    scores_bytes: float = 0.0  # attention only: extra traffic when the S x S scores are materialized
    wbytes: float = 0.0        # the part of `bytes` that is weights (always from DRAM: 42 MB per vits forward)


def _gemm(name, m, n, k, count=1, extra_bytes=0.0, bias=True):
    # y[m,n] = x[m,k] @ w[k,n] (+ bias): 2mnk FLOPs; read x and w (and bias), write y
    return Kernel(name, "gemm", 2.0 * m * n * k, BYTES * (m * k + k * n + m * n + (n if bias else 0)) + extra_bytes,
                  count, m, n, k, wbytes=BYTES * (k * n + (n if bias else 0)))


def _pw(name, nbytes, count=1, category="pointwise"):
    return Kernel(name, category, 0.0, float(nbytes), count)


def _attention(name, b, heads, s, d, count=1, fused=True):
    # softmax(q k^T) v for S queries over S keys: 4 S^2 d FLOPs per image (QK^T and PV), as the bench counts
    flops = 4.0 * b * s * s * d
    io = BYTES * 4 * b * s * d  # q, k, v, o
    scores = 0.0 if fused else BYTES * 4 * b * heads * s * s  # write QK, read+write softmax, read for PV
    return Kernel(name, "attention", flops, io, count, m=b * heads * s, n=s, k=d // heads, scores_bytes=scores)


def vit_blocks(cfg: ModelConfig, b: int, s: int, form: str, qkv_split: bool = False,
               attn_fused: bool = True) -> list[Kernel]:
    """Kernels of cfg.depth timm/DINOv2 blocks over [b, s, D] tokens. form: compiled | eager | trt."""
    d, hid, L = cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio), cfg.depth
    m = b * s
    act = BYTES * m * d
    ks: list[Kernel] = []
    if qkv_split:  # HF Dinov2: three Linear layers
        ks.append(_gemm("q/k/v", m, d, d, count=3 * L))
    else:
        ks.append(_gemm("qkv", m, 3 * d, d, count=L))
    ks.append(_attention("attention", b, cfg.num_heads, s, d, count=L, fused=attn_fused))
    if not attn_fused:  # unfused: QK^T GEMM, softmax, PV GEMM are three launches
        ks.append(_pw("attention (extra launches of the unfused form)", 0.0, count=2 * L, category="pointwise"))
    if form == "eager":
        ks += [_gemm("proj", m, d, d, count=L), _gemm("fc1", m, hid, d, count=L), _gemm("fc2", m, d, hid, count=L),
               _pw("layernorm", 2 * act, count=2 * L, category="norm"),
               _pw("layerscale mul", 2 * act, count=2 * L), _pw("residual add", 3 * act, count=2 * L),
               _pw("gelu", 2 * BYTES * m * hid, count=L)]
    elif form == "compiled":  # Inductor: residual + LayerScale + next LayerNorm fused into one Triton kernel
        ks += [_gemm("proj", m, d, d, count=L), _gemm("fc1", m, hid, d, count=L), _gemm("fc2", m, d, hid, count=L),
               _pw("fused residual+layerscale+layernorm", 4 * act, count=2 * L, category="norm"),
               _pw("gelu", 2 * BYTES * m * hid, count=L)]
    elif form == "trt":  # TensorRT: bias/GELU/LayerScale/residual in GEMM epilogues, LayerNorm one kernel
        ks += [_gemm("proj+residual", m, d, d, count=L, extra_bytes=act),
               _gemm("fc1+gelu", m, hid, d, count=L), _gemm("fc2+residual", m, d, hid, count=L, extra_bytes=act),
               _pw("layernorm", 2 * act, count=2 * L, category="norm")]
    else:
        raise ValueError(f"unknown launch form {form!r}")
    return ks


# Kernels outside the blocks whose count the profile fixes but whose work is negligible (normalize the image,
# gather the picked patches, thumbnail, position gathers, Fourier encoding, sigmoid/exp, copies, fills).
# compiled: 121 = 54 GEMM + 12 attention + 26 norm + 12 block GELU + 3 head pointwise + 4 select
#                + 1 image normalize/gather + 9 misc.
# eager:    206 = 54 GEMM + 12 attention + 26 norm + 60 block pointwise + 3 head + 4 select + 1 + 46 misc.
_MISC = {"compiled": 9, "eager": 46}
_DENSE_FEWER = {"compiled": 2, "eager": 8}  # the dense path skips the selection and the slot map as well


def _prologue_epilogue(cfg: ModelConfig, b: int, kp: int, q: int, form: str, packed: bool,
                       head_tokens: int) -> list[Kernel]:
    d, p = cfg.embed_dim, cfg.patch_size
    H, W = cfg.img_size
    n = cfg.num_patches
    a = cfg.num_anchors
    pix = 3 * p * p + (-3 * p * p) % 8  # the folded embedding's K, padded to a multiple of 8 (fold_input)
    hd = cfg.head_dim
    fe = 2 + 4 * cfg.head_freqs
    ks = [
        _gemm("patch embed (selected)", b * kp, d, pix),
        _gemm("patch embed (anchors)", b * a, d, pix),
        _gemm("head tok", b * head_tokens, hd, d),
        _gemm("head offset", b * q, hd, fe, bias=False),
        _gemm("head mlp", b * q, hd, hd),
        _gemm("head out", b * q, 1, hd),
        _pw("head norm", 2 * BYTES * b * head_tokens * d, category="norm"),
        _pw("first layernorm (cat, pos)", BYTES * b * (1 + a + kp) * d * 3, category="norm"),
        _pw("head gelu/add/sigmoid", BYTES * b * q * hd * 3, count=3),
        _pw("image pool + patch gather (normalization folded)", 4 * 3 * H * W * b + BYTES * b * kp * pix),
    ]
    misc = _MISC[form] - (0 if packed else _DENSE_FEWER[form])
    ks.append(_pw("misc small kernels", 4096.0, count=misc))
    if packed:
        ks += [Kernel("topk over the patch scores", "topk", 0.0, 4.0 * b * n * 2, 1),
               _pw("select: scatter / max-pool / slot map", 4.0 * b * n * 3, count=3, category="select")]
    return ks


def packed_inventory(cfg: ModelConfig, batch: int, bucket: int, queries: int | None = None,
                     form: str = "compiled") -> list[Kernel]:
    """One packed forward: 1 + A + Kp tokens, Kp = min(bucket, N)."""
    kp = min(bucket, cfg.num_patches)
    q = bucket if queries is None else queries  # the head runs over the padded query count of the bucket
    s = 1 + cfg.num_anchors + kp
    return vit_blocks(cfg, batch, s, form) + _prologue_epilogue(cfg, batch, kp, q, form, True, kp)


def dense_inventory(cfg: ModelConfig, batch: int, queries: int, form: str = "compiled") -> list[Kernel]:
    """The dense forward: every token, no mask (1 + A + N), head over all N tokens."""
    n = cfg.num_patches
    s = 1 + cfg.num_anchors + n
    return vit_blocks(cfg, batch, s, form) + _prologue_epilogue(cfg, batch, n, queries, form, False, n)


def _conv(name, b, hout, wout, cin, cout, kh, kw, hin=None, win=None, count=1, bias=True):
    hin = hout if hin is None else hin
    win = wout if win is None else win
    m, n, k = b * hout * wout, cout, cin * kh * kw
    nbytes = BYTES * (b * hin * win * cin + b * hout * wout * cout + cin * cout * kh * kw + (cout if bias else 0))
    return Kernel(name, "conv", 2.0 * m * n * k, nbytes, count, m, n, k,
                  wbytes=BYTES * (cin * cout * kh * kw + (cout if bias else 0)))


def dpt_head(b: int, ph: int, pw: int, dim_in: int = 384, features: int = 64,
             out_channels=(48, 96, 192, 384), head_hidden: int = 32, patch: int = 14, form: str = "trt",
             dual: bool = False, out_dim: int = 1) -> list[Kernel]:
    """Depth Anything's DPT head (reassemble at x4, x2, x1, /2 of the patch grid, RefineNet fusion at
    `features` channels, output convs) as convolutions + resizes. dual: DA3's DualDPT, which adds a second,
    independent fusion chain whose 5-conv pre-head runs at every pyramid level."""
    F = features
    c48, c96, c192, c384 = out_channels
    h4, w4 = 4 * ph, 4 * pw
    h2, w2 = 2 * ph, 2 * pw
    hh, wh = (ph + 1) // 2, (pw + 1) // 2
    h8, w8 = 8 * ph, 8 * pw
    ho, wo = patch * ph, patch * pw
    ks: list[Kernel] = []
    for oc in out_channels:
        ks.append(_conv(f"project 1x1 {dim_in}->{oc}", b, ph, pw, dim_in, oc, 1, 1))
    # ConvTranspose k=s: each input pixel writes an s x s block: an implicit GEMM of m = input pixels
    ks.append(Kernel("resize convT x4", "conv", 2.0 * b * ph * pw * c48 * c48 * 16,
                     BYTES * (b * ph * pw * c48 + b * h4 * w4 * c48 + 16 * c48 * c48), 1, b * ph * pw, 16 * c48, c48,
                     wbytes=BYTES * 16 * c48 * c48))
    ks.append(Kernel("resize convT x2", "conv", 2.0 * b * ph * pw * c96 * c96 * 4,
                     BYTES * (b * ph * pw * c96 + b * h2 * w2 * c96 + 4 * c96 * c96), 1, b * ph * pw, 4 * c96, c96,
                     wbytes=BYTES * 4 * c96 * c96))
    ks.append(_conv("resize conv s2", b, hh, wh, c384, c384, 3, 3, hin=ph, win=pw))
    levels = [(h4, w4, c48), (h2, w2, c96), (ph, pw, c192), (hh, wh, c384)]

    def chain(tag):
        out = []
        for (h, w, c) in levels:
            out.append(_conv(f"{tag}layer_rn 3x3 {c}->{F}", b, h, w, c, F, 3, 3, bias=False))
        # refinenet4: one residual conv unit at /2, upsample to x1, 1x1 out conv
        out += [_conv(f"{tag}rcu 3x3", b, hh, wh, F, F, 3, 3, count=2),
                _conv(f"{tag}out 1x1", b, ph, pw, F, F, 1, 1)]
        for (h, w, nh, nw) in [(ph, pw, h2, w2), (h2, w2, h4, w4), (h4, w4, h8, w8)]:
            out += [_conv(f"{tag}rcu 3x3", b, h, w, F, F, 3, 3, count=4),
                    _conv(f"{tag}out 1x1", b, nh, nw, F, F, 1, 1)]
        return out

    def chain_pointwise(tag):
        # upsample of each refinenet's output, its residual add and the ReLUs of the conv units
        # (TensorRT / Inductor fuse the ReLUs and adds into conv epilogues; the resizes stay)
        out = []
        for (h, w, nh, nw) in [(hh, wh, ph, pw), (ph, pw, h2, w2), (h2, w2, h4, w4), (h4, w4, h8, w8)]:
            out.append(_pw(f"{tag}upsample", BYTES * b * F * (h * w + nh * nw)))
            if form == "eager":
                out.append(_pw(f"{tag}relu/add", 3 * BYTES * b * F * h * w, count=6))
        return out

    ks += chain("") + chain_pointwise("")
    ks.append(_conv("output_conv1 3x3", b, h8, w8, F, F // 2, 3, 3))
    ks.append(_pw("upsample to the image", BYTES * b * (F // 2) * (h8 * w8 + ho * wo)))
    ks.append(_conv("output_conv2 3x3", b, ho, wo, F // 2, head_hidden, 3, 3))
    ks.append(_conv("output 1x1", b, ho, wo, head_hidden, out_dim, 1, 1))
    ks.append(_pw("tokens -> NCHW", BYTES * b * ph * pw * dim_in * 2, count=4))
    if dual:
        ks += chain("aux ") + chain_pointwise("aux ")
        for (h, w) in [(ph, pw), (h2, w2), (h4, w4), (h8, w8)]:  # 5-conv pre-head at each level
            ks.append(_conv("aux pre-head 3x3", b, h, w, F, F // 2, 3, 3, count=3))
            ks.append(_conv("aux pre-head 3x3", b, h, w, F // 2, F, 3, 3, count=2))
        ks.append(_conv("aux output 3x3", b, h8, w8, F // 2, head_hidden, 3, 3))
        ks.append(_conv("aux output 1x1", b, h8, w8, head_hidden, 7, 1, 1))
    if form == "eager":  # cuDNN's NCHW tensor-core convs transform layouts around the conv
        convs = [k for k in ks if k.category == "conv"]
        ks += [_pw("conv layout transform", k.bytes, count=k.count) for k in convs]
    return ks


def depth_anything_inventory(size: int = 518, variant: str = "v2", form: str = "trt", batch: int = 1,
                             attn_fused: bool = True, da3_aux: bool = True) -> list[Kernel]:
    """Depth Anything Small at size x size: DINOv2 ViT-S/14 (1 + N tokens, no anchors) + DPT head.
    variant: v1 / v2 (same shapes) | da3 (DualDPT head on the concatenated cls+patch features, 768 channels).
    HF's implementation (the bench's dav2 rows) splits q/k/v into three GEMMs: form 'eager'/'compiled' use it."""
    cfg = model_config("vits", img_size=(size, size), anchor_grid=0, **LAYOUT)
    ph = pw = size // cfg.patch_size
    n = ph * pw
    s = 1 + n
    qkv_split = form in ("eager", "compiled")
    ks = vit_blocks(cfg, batch, s, form, qkv_split=qkv_split, attn_fused=attn_fused)
    ks.append(Kernel("patch embed conv", "conv", 2.0 * batch * n * cfg.embed_dim * 3 * 14 * 14,
                     BYTES * (batch * 3 * size * size + batch * n * cfg.embed_dim), 1, batch * n, cfg.embed_dim, 588))
    ks.append(_pw("4 stage layernorms", 2 * BYTES * batch * s * cfg.embed_dim, count=4, category="norm"))
    ks.append(_pw("image normalize / pos add", 4 * 3 * size * size * batch + 3 * BYTES * batch * s * cfg.embed_dim,
                  count=2))
    if variant in ("v1", "v2"):
        ks += dpt_head(batch, ph, pw, form=form)
    elif variant == "da3":
        ks += dpt_head(batch, ph, pw, dim_in=2 * cfg.embed_dim, form=form, dual=da3_aux, out_dim=2)
    else:
        raise ValueError(f"unknown Depth Anything variant {variant!r}")
    if form in ("eager", "compiled"):  # pad to the profiled kernel counts of the bench's dav2 rows
        have = sum(k.count for k in ks)
        want = dav2_kernels()[form]
        if want > have:
            ks.append(_pw("misc small kernels", 4096.0, count=want - have))
    return ks


def dav2_kernels() -> dict[str, int]:
    """Kernels per forward of the benchmark's Depth Anything V2 rows (dav2-graph, dav2-compile+graph)."""
    rows = {r["row"]: r["kernels"] for r in h200_results()["bench"] if r["queries"] == 256 and r["batch"] == 1}
    return {"eager": rows["dav2-graph"], "compiled": rows["dav2-compile+graph"]}


def total_flops(ks: list[Kernel], categories=None) -> float:
    return sum(k.flops * k.count for k in ks if categories is None or k.category in categories)


def kernel_count(ks: list[Kernel]) -> int:
    return sum(k.count for k in ks)


# ---- cost model --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    """Cost-model parameters, in H200 units (microseconds at 1.98 GHz, efficiencies relative to the datasheet
    peaks). The defaults are starting points; calibrate_h200() fits them."""
    launch_us: float = 0.73      # CUDA-graph node gap between dependent kernels
    floor_gemm_us: float = 3.7   # fixed body time of a GEMM / implicit-GEMM conv
    floor_attn_us: float = 2.9
    floor_norm_us: float = 1.66  # a LayerNorm-containing kernel
    floor_pw_us: float = 1.8     # any other small kernel
    topk_us: float = 18.9        # the single-block radix top-k over one image's patch scores
    gemm_eff: float = 0.44       # saturated tensor-core efficiency of GEMMs
    tile_area: float = 300.0     # output elements per tile (the library's adaptive tiling, one number)
    sharp: float = 16.0          # q of the saturation curve
    attn_eff: float = 0.35
    conv_eff: float = 0.10
    mem_eff: float = 0.41        # DRAM efficiency
    l2_reuse: float = 0.02       # activation traffic of a kernel whose activations fit in half the L2 costs
    #                              this fraction of its DRAM time (reuse between kernels: the output of one
    #                              kernel is still in the L2 when the next reads it)
    unaligned: float = 0.25      # efficiency factor when the reduction length is not a multiple of 8

    # device transfer (unused on the H200)
    target_eff: float = 0.6      # saturated GEMM / conv efficiency on the target; attention gets
    #                              target_eff * attn_eff / gemm_eff (the H200's ratio)
    floor_scale: float = 1.0     # multiplies the clock-scaled fixed costs on the target
    target_mem_eff: float = 0.75  # DRAM efficiency on the target
    l2_factor: float = 0.5       # l2_reuse on the target (an assumption: no Orin L2 bandwidth was found)


FIT_NAMES = ("launch_us", "floor_gemm_us", "floor_attn_us", "floor_norm_us", "floor_pw_us", "topk_us", "gemm_eff",
             "tile_area", "sharp", "attn_eff", "conv_eff", "mem_eff", "l2_reuse")
# a start far from the committed defaults (round numbers), for the check that the data pin the fit
GENERIC_START = Params(launch_us=1.0, floor_gemm_us=2.0, floor_attn_us=3.0, floor_norm_us=1.0, floor_pw_us=1.0,
                       topk_us=10.0, gemm_eff=0.7, tile_area=4096.0, sharp=2.0, attn_eff=0.3, conv_eff=0.3, mem_eff=0.7,
                       l2_reuse=0.5)
BOUNDS = {"gemm_eff": (0.05, 1.0), "attn_eff": (0.01, 1.0), "conv_eff": (0.01, 1.0), "mem_eff": (0.2, 1.0),
          "sharp": (0.5, 20.0), "tile_area": (256.0, 65536.0), "launch_us": (0.05, 5.0), "floor_gemm_us": (0.1, 20.0),
          "floor_attn_us": (0.1, 30.0), "floor_norm_us": (0.1, 10.0), "floor_pw_us": (0.1, 10.0), "topk_us": (0.5, 50.0),
          "l2_reuse": (0.01, 1.0)}


def _saturation(u: float, q: float) -> float:
    return u / (1.0 + u ** q) ** (1.0 / q)


def kernel_us(k: Kernel, dev: Device, p: Params, busy: bool = False) -> float:
    """Time of one launch of k in microseconds. busy=True leaves out the graph node gap (what a profiler's
    kernel duration shows)."""
    return float(kernel_times_us([k], dev, p, busy)[0])


_CATS = ("gemm", "conv", "attention", "norm", "topk", "pointwise", "select")


class _Packed:
    """An inventory as numpy arrays, so that a fit can evaluate it thousands of times quickly."""

    def __init__(self, ks: list[Kernel]):
        self.cat = np.array([_CATS.index(k.category) for k in ks])
        self.count = np.array([k.count for k in ks], float)
        self.flops = np.array([k.flops for k in ks], float)
        self.bytes = np.array([k.bytes + k.scores_bytes for k in ks], float)
        self.wbytes = np.array([k.wbytes for k in ks], float)
        self.mn = np.array([k.m * k.n for k in ks], float)
        self.m = np.array([k.m for k in ks], float)
        self.unaligned = np.array([bool(k.k % 8) and k.category in ("gemm", "conv") for k in ks])


_PACKED: dict[int, tuple[list, _Packed]] = {}


def _packed(ks: list[Kernel]) -> _Packed:
    hit = _PACKED.get(id(ks))
    if hit is None or hit[0] is not ks:
        hit = (ks, _Packed(ks))
        _PACKED[id(ks)] = hit
    return hit[1]


def kernel_times_us(ks: list[Kernel], dev: Device, p: Params, busy: bool = False) -> np.ndarray:
    """Per-launch time of every kernel of the inventory (vectorized kernel_us)."""
    a = _packed(ks)
    on_target = dev.key != "h200"
    cs = dev.clock_scale * (p.floor_scale if on_target else 1.0)
    mem_eff = p.target_mem_eff if on_target else p.mem_eff
    if on_target:
        effs = (p.target_eff, p.target_eff, p.target_eff * p.attn_eff / p.gemm_eff)
    else:
        effs = (p.gemm_eff, p.conv_eff, p.attn_eff)
    floors = np.array([p.floor_gemm_us, p.floor_gemm_us, p.floor_attn_us, p.floor_norm_us, p.topk_us,
                       p.floor_pw_us, p.floor_pw_us])
    t = cs * (floors[a.cat] + (0.0 if busy else p.launch_us))
    peak = dev.peak_tflops * 1e6
    l2f = p.l2_factor if on_target else p.l2_reuse
    act = a.bytes - a.wbytes
    dram = a.wbytes + np.where(act <= dev.l2_mb * 2 ** 19, act * l2f, act)
    t_mem = dram / (dev.mem_gbs * 1e3 * mem_eff)
    eff = np.array([*effs, 1.0, 1.0, 1.0, 1.0])[a.cat]  # by _CATS index: gemm, conv, attention, the rest
    eff = np.where(a.unaligned, eff * p.unaligned, eff)
    u = np.where(a.cat == 2, a.m / 128.0, a.mn / p.tile_area) / dev.sms
    u = np.maximum(u, 1e-12)
    sat = u / (1.0 + u ** p.sharp) ** (1.0 / p.sharp)
    t_c = np.where(a.cat <= 2, a.flops / (peak * eff * sat), 0.0)
    return t + np.maximum(t_c, t_mem)


def forward_us(ks: list[Kernel], dev: Device, p: Params, busy: bool = False) -> float:
    """Predicted time of one forward in microseconds: the sum over its launches (CUDA graph: no host gaps)."""
    return float(np.dot(_packed(ks).count, kernel_times_us(ks, dev, p, busy)))


def breakdown_us(ks: list[Kernel], dev: Device, p: Params, busy: bool = True) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in ks:
        out[k.category] = out.get(k.category, 0.0) + k.count * kernel_us(k, dev, p, busy)
    return out


# profiler category (scripts/gpu_profile.py) -> inventory categories
PROFILE_CATEGORIES = {"gemm": ("gemm",), "attention": ("attention",), "select/topk": ("topk", "select"),
                      "triton fused": ("norm", "pointwise"), "layernorm/elementwise": ("norm", "pointwise"),
                      "conv (anchors)": ("conv",)}


# ---- calibration data ----------------------------------------------------------------------------------
# The H200 points of the fit: (row, batch, queries, run) of docs/results/h200_calibration.json, vits 518 bf16,
# torch 2.11.0+cu130, medians in ms; duplicate configurations (Q16 and Q64 share bucket 64; the two runs share
# B1 Q256 and B8 Q512) are kept as separate points.
H200_BENCH = [
    ("packed-compile+graph", 1, 16, "bench"), ("packed-compile+graph", 1, 64, "bench"),
    ("packed-compile+graph", 1, 256, "bench"), ("packed-compile+graph", 1, 256, "targets"),
    ("packed-compile+graph", 1, 512, "bench"), ("packed-compile+graph", 1, 1024, "bench"),
    ("packed-compile+graph", 8, 512, "bench"), ("packed-compile+graph", 8, 512, "targets"),
    ("packed-graph", 1, 16, "bench"), ("packed-graph", 1, 64, "bench"),
    ("packed-graph", 1, 256, "bench"), ("packed-graph", 1, 256, "targets"),
    ("packed-graph", 1, 512, "bench"), ("packed-graph", 1, 1024, "bench"),
    ("packed-graph", 8, 512, "bench"), ("packed-graph", 8, 512, "targets"),
    ("dense-graph", 1, 256, "bench"), ("dense-graph", 1, 256, "targets"),
    ("dense-graph", 8, 512, "targets"),
    ("dav2-graph", 1, 256, "bench"), ("dav2-compile+graph", 1, 256, "bench"),
]


def h200_results() -> dict[str, list[dict]]:
    """The committed H200 runs of docs/results/h200_calibration.json: {run: [result rows]}."""
    runs = json.loads(CALIBRATION.read_text())["runs"]
    return {k: v["results"] for k, v in runs.items()}


def h200_profiles() -> list[dict]:
    """The committed H200 profiles (busy us per category, kernel lines, graph replay) of docs/results/h200_profile.json."""
    return json.loads(PROFILE.read_text())["profiles"]


def h200_bench() -> list[tuple]:
    """H200_BENCH with each point's median: (row, batch, queries, median ms, run)."""
    res = h200_results()
    out = []
    for row, b, q, run in H200_BENCH:
        hit = [r["median_ms"] for r in res[run] if (r["row"], r["batch"], r["queries"]) == (row, b, q)]
        if len(hit) != 1:
            raise ValueError(f"{CALIBRATION}: run {run!r} has {len(hit)} rows {row} B{b} Q{q}, expected 1")
        out.append((row, b, q, hit[0], run))
    return out


def _form(row_or_backend: str) -> str:
    return "compiled" if "compile" in row_or_backend else "eager"


@dataclass
class Point:
    id: str
    measured: float           # microseconds
    inventory: list
    busy: bool = False
    categories: tuple | None = None   # only kernels of these categories (a profiler's busy time per category)
    names: tuple | None = None        # only kernels with these names (a profiler's per-kernel line)
    source: str = ""

    def includes(self, k: Kernel) -> bool:
        return (self.categories is None or k.category in self.categories) and (self.names is None or k.name in self.names)


def h200_points(cfg: ModelConfig | None = None, profiles=None) -> list[Point]:
    """The H200 calibration points. The committed measurements are of vits (cfg defaults to it); a profile
    file may name another preset."""
    cfg = cfg or model_config("vits", **LAYOUT)
    pts = []
    for row, b, q, ms, src in h200_bench():
        k = _bucket(cfg, q)
        if row.startswith("packed"):
            inv = packed_inventory(cfg, b, k, k, _form(row))
        elif row.startswith("dense"):
            inv = dense_inventory(cfg, b, q, _form(row))
        else:
            inv = depth_anything_inventory(cfg.img_size[0], "v2", _form(row), b)
        pts.append(Point(f"{row} B{b} Q{q} ({src})", ms * 1e3, inv, source=f"docs/results/h200_calibration.json ({src})"))
    for prof in (profiles if profiles is not None else h200_profiles()):
        form = _form(prof.get("backend", "compile+graph"))
        b, k = prof.get("batch", 1), prof.get("bucket", 256)
        pcfg = model_config(prof["preset"], **LAYOUT) if prof.get("preset") else cfg
        inv = packed_inventory(pcfg, b, k, k, form)
        src = prof.get("source", "docs/results/h200_profile.json")
        have = kernel_count(inv)
        if abs(prof["kernels_per_call"] - have) > 0.1 * have:
            print(f"warning: profile has {prof['kernels_per_call']:.0f} kernels per call, the {form} inventory "
                  f"{have}", file=sys.stderr)
        cats = prof["categories_us"]
        groups = {"gemm": ("gemm",), "attention": ("attention",), "select/topk": ("topk", "select"),
                  "norm+pointwise": ("norm", "pointwise")}
        # Triton kernels (compiled) or aten norms/elementwise (eager), and the odd other kernel: the
        # inventory's norm + pointwise kernels
        merged = {"gemm": cats.get("gemm", 0), "attention": cats.get("attention", 0),
                  "select/topk": cats.get("select/topk", 0),
                  "norm+pointwise": cats.get("triton fused", 0) + cats.get("layernorm/elementwise", 0)
                  + cats.get("other", 0)}
        tag = f"profile {prof.get('backend')} K{k} B{b}"
        for name, us in merged.items():
            if us > 0:
                pts.append(Point(f"{tag}: {name} busy", us, inv, busy=True, categories=groups[name], source=src))
        for role, us in prof.get("roles_us", {}).items():
            names = (role,) if role in {k.name for k in inv} else tuple(role.split("+"))
            pts.append(Point(f"{tag}: {role} busy", us, inv, busy=True, names=names,
                             source=src + " (kernel lines, assigned to inventory kernels)"))
        pts.append(Point(f"{tag}: graph replay", prof["graph_replay_ms"] * 1e3, inv, source=src))
    return pts


def predict_point(pt: Point, dev: Device, p: Params) -> float:
    if pt.categories is None and pt.names is None:
        return forward_us(pt.inventory, dev, p, pt.busy)
    w = np.array([k.count if pt.includes(k) else 0 for k in pt.inventory], float)
    return float(np.dot(w, kernel_times_us(pt.inventory, dev, p, pt.busy)))


class _Batch:
    """All calibration points as one weight matrix over one concatenated inventory: a fit evaluates every
    kernel once per step."""

    def __init__(self, points: list[Point]):
        self.points = points
        self.kernels: list[Kernel] = []
        offsets: dict[int, int] = {}
        for pt in points:
            if id(pt.inventory) not in offsets:
                offsets[id(pt.inventory)] = len(self.kernels)
                self.kernels.extend(pt.inventory)
        self.w = np.zeros((len(points), len(self.kernels)))
        for i, pt in enumerate(points):
            off = offsets[id(pt.inventory)]
            for j, k in enumerate(pt.inventory):
                if pt.includes(k):
                    self.w[i, off + j] = k.count
        self.busy = np.array([pt.busy for pt in points], float)
        self.launches = self.w.sum(axis=1)
        self.measured = np.array([pt.measured for pt in points])

    def predict(self, dev: Device, p: Params) -> np.ndarray:
        t = kernel_times_us(self.kernels, dev, p, busy=False)
        cs = dev.clock_scale * (p.floor_scale if dev.key != "h200" else 1.0)
        return self.w @ t - self.busy * cs * p.launch_us * self.launches


# ---- fitting -------------------------------------------------------------------------------------------
def _to_x(p: Params, names) -> np.ndarray:
    x = []
    for n in names:
        lo, hi = BOUNDS[n]
        v = min(max(getattr(p, n), lo * 1.0001), hi * 0.9999)
        t = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))  # (0, 1) in log space
        x.append(math.log(t / (1 - t)))
    return np.array(x)


def _from_x(x, p: Params, names) -> Params:
    vals = {}
    for xi, n in zip(x, names):
        lo, hi = BOUNDS[n]
        t = 1.0 / (1.0 + math.exp(-min(max(float(xi), -30.0), 30.0)))
        vals[n] = lo * (hi / lo) ** t
    return replace(p, **vals)


def nelder_mead(f, x0: np.ndarray, step: float = 0.5, iters: int = 3000, tol: float = 1e-12):
    n = len(x0)
    simplex = [x0.copy()] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        c = np.mean(simplex[:-1], axis=0)
        xr = c + (c - simplex[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2.0 * (c - simplex[-1])
            fe = f(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (simplex[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex]
                vals = [f(s) for s in simplex]
    i = int(np.argmin(vals))
    return simplex[i], vals[i]


def fit(points: list[Point], dev: Device, p0: Params, names, restarts: int = 3) -> Params:
    batch = _Batch(points)
    logm = np.log(batch.measured)

    def loss(x):
        pred = batch.predict(dev, _from_x(x, p0, names))
        return float(np.sum((np.log(pred) - logm) ** 2))

    x = _to_x(p0, names)
    best = loss(x)
    for r in range(restarts):  # restarted from the best point with a smaller simplex until it stops improving
        x, val = nelder_mead(loss, x, step=0.6 / (r + 1), iters=2500, tol=1e-9)
        if best - val < 1e-6 and r:
            break
        best = val
    return _from_x(x, p0, names)


def _pct(pred: float, measured: float) -> float:
    return round(100.0 * (pred / measured - 1.0), 1) + 0.0  # + 0.0: no "-0.0" in the outputs


def errors(points: list[Point], dev: Device, p: Params) -> list[dict]:
    out = []
    for pt in points:
        pred = predict_point(pt, dev, p)
        out.append(dict(id=pt.id, measured_us=round(pt.measured, 2), predicted_us=round(pred, 2),
                        error_pct=_pct(pred, pt.measured), source=pt.source))
    return out


def calibrate_h200(cfg: ModelConfig | None = None, profiles=None) -> tuple[Params, list[dict]]:
    """Fit the cost model to the H200 measurements (vits unless cfg says otherwise; the committed data are
    vits). Returns the parameters and each point's error."""
    pts = h200_points(cfg, profiles)
    p = fit(pts, DEVICES["h200"], Params(), FIT_NAMES)
    return p, errors(pts, DEVICES["h200"], p)


# ---- published Orin measurements (TensorRT, FP16) ------------------------------------------------------
PUBLISHED = [
    # Depth Anything V1 Small, TensorRT 8.5.2 FP16 (ONNX opset 11), JetPack 5.1.3, "Jetson Orin Developer Kit
    # (8GB)" = the Orin Nano 8GB devkit (the only 8 GB Orin devkit), 625 MHz before Super; timed with time.time()
    # around H2D copy + execute_async_v2 + D2H copy + synchronize.
    *[dict(id=f"DA-V1-S {s}px, Orin Nano 8GB, TRT 8.5", model="v1", size=s, device="orin_nano_8", stack="trt8.5",
           ms=ms, source="https://github.com/IRCVLab/Depth-Anything-for-Jetson-Orin (README, depth.py, export.py)")
      for s, ms in [(308, 23.5), (364, 39.2), (406, 47.7), (518, 98.0)]],
    # Depth Anything 3 Small, TensorRT 10.3 FP16, Orin NX 16GB, JetPack 6 (L4T r36.4): "40 FPS @ 518x518",
    # "93 FPS @ 308x308" (reported FPS; what the timing includes is not stated)
    *[dict(id=f"DA3-S {s}px, Orin NX 16GB, TRT 10.3", model="da3", size=s, device="orin_nx_16", stack="trt10.3",
           ms=round(1000.0 / fps, 3), source="https://github.com/GerdsenAI/GerdsenAI-Depth-Anything-3-ROS2-Wrapper/pull/24")
      for s, fps in [(518, 40.0), (308, 93.0)]],
]
# a third-party cross-check, not fitted: DA3-Small FP16 TensorRT at 308x308 on an Orin Nano 8GB (JetPack 6.x;
# Super mode assumed): 4.6 ms
CROSS_CHECK = dict(id="DA3-S 308px, Orin Nano 8GB (Super assumed), TRT FP16", model="da3", size=308,
                   device="orin_nano_super", stack="trt10.3", ms=4.6,
                   source="https://nishant-zfyii.github.io/ml_inference/deployment")


def _published_inventory(pub: dict, da3_aux: bool, trt85_fused_attention: bool = False) -> list[Kernel]:
    # TensorRT 8.5 with ONNX opset 11 is taken to materialize the attention scores (no fused MHA for this
    # pattern assumed); trt85_fused_attention=True tests that assumption
    fused = pub["stack"] != "trt8.5" or trt85_fused_attention
    return depth_anything_inventory(pub["size"], pub["model"], "trt", 1, attn_fused=fused, da3_aux=da3_aux)


# Assumptions of the transfer to the Orin that no data here fixes; the band spans them.
#   floor_scale: the Orin's fixed per-kernel cost relative to the H200's scaled by the clock ratio (a kernel's
#     prologue/epilogue and the graph node gap are cycle-bound; LPDDR5 latency and a smaller front end may
#     cost more, hence up to 2x)
#   target_mem_eff: achievable fraction of the LPDDR5 datasheet bandwidth (Little's law: 204.8 GB/s x ~0.5 us
#     is ~100 KB in flight, which a few SMs sustain, so mid-size kernels get closer to peak than on the H200)
#   l2_factor: cost of activation traffic that stays in the L2 between kernels (4 MB on the AGX, 2 MB on
#     NX/Nano) relative to DRAM; 1 = no reuse. No published Orin L2 bandwidth was found.
CORNERS = {"optimistic": dict(floor_scale=0.75, target_mem_eff=0.85, l2_factor=0.3),
           "central": dict(floor_scale=1.0, target_mem_eff=0.75, l2_factor=0.5),
           "pessimistic": dict(floor_scale=2.0, target_mem_eff=0.60, l2_factor=1.0)}


def _target(h200: Params, eff: float, transfer: dict | None = None) -> Params:
    return replace(h200, target_eff=eff, **(CORNERS["central"] if transfer is None else transfer))


EFF_MAX = 0.95  # no tensor-core kernel reaches its datasheet peak


def _solve_eff(inv: list[Kernel], dev: Device, h200: Params, ms: float, transfer: dict | None = None) -> float:
    """The target_eff at which the inventory's predicted time equals ms (bisection; time falls as eff rises).
    Clipped to [0.01, EFF_MAX]."""
    lo, hi = 0.01, EFF_MAX
    if forward_us(inv, dev, _target(h200, hi, transfer)) / 1e3 >= ms:
        return hi
    if forward_us(inv, dev, _target(h200, lo, transfer)) / 1e3 <= ms:
        return lo
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if forward_us(inv, dev, _target(h200, mid, transfer)) / 1e3 > ms:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def calibrate_orin(h200: Params, da3_aux: bool = True, transfer: dict | None = None,
                   trt85_fused_attention: bool = False) -> dict:
    """Fit, per software stack, the Orin's saturated tensor-core efficiency (target_eff) and a fixed host
    overhead per source (ms, >= 0) to the PUBLISHED points; report each point's error, and a cross-check on a
    source that was not fitted."""
    transfer = CORNERS["central"] if transfer is None else transfer
    out = {"assumptions": dict(da3_aux=da3_aux, **transfer), "stacks": {}, "points": []}
    for stack in ("trt10.3", "trt8.5"):
        pubs = [q for q in PUBLISHED if q["stack"] == stack]
        invs = [_published_inventory(q, da3_aux, trt85_fused_attention) for q in pubs]

        def unpack(x):
            return EFF_MAX / (1.0 + math.exp(-float(x[0]))), math.exp(float(x[1]))

        def pred_ms(eff, host, q, inv):
            return forward_us(inv, DEVICES[q["device"]], _target(h200, eff, transfer)) / 1e3 + host

        def loss(x):
            eff, host = unpack(x)
            return sum(math.log(pred_ms(eff, host, q, inv) / q["ms"]) ** 2 for q, inv in zip(pubs, invs))

        best = None
        for h0 in (0.01, 0.5, 3.0):  # a few starts: the host term can sit at its floor
            x, v = nelder_mead(loss, np.array([0.0, math.log(h0)]), step=0.7, iters=400, tol=1e-10)
            if best is None or v < best[1]:
                best = (x, v)
        eff, host = unpack(best[0])
        out["stacks"][stack] = dict(target_eff=round(eff, 4), host_ms=round(host, 3), points=len(pubs),
                                    free_parameters=2)
        for q, inv in zip(pubs, invs):
            pm = pred_ms(eff, host, q, inv)
            out["points"].append(dict(id=q["id"], stack=stack, measured_ms=q["ms"], predicted_ms=round(pm, 2),
                                      error_pct=_pct(pm, q["ms"]),
                                      gflop=round(total_flops(inv) / 1e9, 1), source=q["source"]))
    # cross-check (not fitted): the TRT 10.3 efficiency with no host overhead on another source and device;
    # that export may or may not carry DA3's auxiliary (ray) head, so both are reported
    q = CROSS_CHECK
    dev = DEVICES[q["device"]]
    eff = out["stacks"]["trt10.3"]["target_eff"]
    cc = dict(id=q["id"], measured_ms=q["ms"], source=q["source"], variants=[])
    for aux in (True, False):
        inv = _published_inventory(q, aux)
        pm = forward_us(inv, dev, _target(h200, eff, transfer)) / 1e3
        cc["variants"].append(dict(da3_aux=aux, gflop=round(total_flops(inv) / 1e9, 1), predicted_ms=round(pm, 2),
                                   error_pct=_pct(pm, q["ms"]),
                                   eff_that_fits=round(_solve_eff(inv, dev, h200, q["ms"], transfer), 4)))
    out["cross_check"] = cc
    return out


# ---- predictions -----------------------------------------------------------------------------------------
QUERIES = (16, 64, 256, 1024)
GOAL_MS = 2.0


def _bucket(cfg: ModelConfig, q: int) -> int:
    for b in cfg.buckets:
        if b >= q:
            return b
    raise ValueError(f"{q} queries exceed the largest bucket {cfg.buckets[-1]}")


def predict(cfg: ModelConfig, dev: Device, p: Params, path: str, queries: int, batch: int = 1,
            form: str = "compiled") -> float:
    """Predicted CUDA-graph latency in ms of one forward (packed: the smallest bucket holding `queries`)."""
    if path == "packed":
        k = _bucket(cfg, queries)
        return forward_us(packed_inventory(cfg, batch, k, k, form), dev, p) / 1e3
    if path == "dense":
        return forward_us(dense_inventory(cfg, batch, queries, form), dev, p) / 1e3
    raise ValueError(f"unknown path {path!r}")


def run(cfg: ModelConfig, profiles=None, batch: int = 1) -> dict:
    """Calibrate (on the H200's vits measurements, whatever cfg is), then predict cfg on the Orin targets."""
    h200, h200_err = calibrate_h200(None, profiles)
    rms = _rms_log_error(h200_err)
    fits, effs, eff_used = _orin_efficiencies(h200)
    corners = {c: _target(h200, eff_used[c], CORNERS[c]) for c in CORNERS}
    central = fits["central"]["with_da3_aux"]
    central["trt8.5_with_fused_attention"] = _trt85_fused_attention(h200)
    band = functools.partial(_band, corners=corners, rms=rms)
    rows = _prediction_rows(cfg, batch, band)
    return dict(
        **_setting(cfg),
        h200_params={n: round(getattr(h200, n), 4) for n in FIT_NAMES},
        h200_fit_from_generic_start=_generic_start_fit(cfg, profiles, batch),
        h200_calibration=h200_err, h200_rms_log_error=round(rms, 4),
        h200_at_bound=[n for n in FIT_NAMES if min(abs(math.log(getattr(h200, n) / b_)) for b_ in BOUNDS[n]) < 0.02],
        orin_calibration=central, orin_calibration_corners=fits,
        orin_transfer=_transfer_report(h200, effs, eff_used),
        predictions=rows, batch8=_batch8_rows(cfg, h200, band), dense_family=_family_rows(band),
        goal=_goal(cfg, batch, rows, corners["central"], eff_used["central"]),
    )


def _rms_log_error(errs: list[dict]) -> float:
    return math.sqrt(float(np.mean([math.log(1 + e["error_pct"] / 100) ** 2 for e in errs])))


def _generic_start_fit(cfg: ModelConfig, profiles, batch: int) -> dict:
    """The H200 fit again from a generic start: how well the data pin the parameters, and what that moves
    on the goal."""
    points = h200_points(None, profiles)
    other = fit(points, DEVICES["h200"], GENERIC_START, FIT_NAMES)
    other_err = errors(points, DEVICES["h200"], other)
    other_eff = calibrate_orin(other)["stacks"]["trt10.3"]["target_eff"]
    other_goal = predict(cfg, DEVICES["agx_orin_64"], _target(other, other_eff), "packed", 256, batch)
    return dict(params={n: round(getattr(other, n), 4) for n in FIT_NAMES},
                rms_log_error=round(_rms_log_error(other_err), 4),
                goal_ms=round(other_goal, 3), start={n: getattr(GENERIC_START, n) for n in FIT_NAMES})


def _orin_efficiencies(h200: Params) -> tuple[dict, dict, dict]:
    """Per corner of the transfer assumptions: the Orin efficiency fitted with and without DA3's auxiliary
    head, and the one that makes the unfitted cross-check exact. -> (the fits, those three efficiencies per
    corner, the efficiency each corner uses)."""
    fits, effs = {}, {}
    for c, tr in CORNERS.items():
        fa = calibrate_orin(h200, True, tr)
        fn = calibrate_orin(h200, False, tr)
        cross = min(fa["cross_check"]["variants"], key=lambda v: abs(v["error_pct"]))
        fits[c] = dict(with_da3_aux=fa, without_da3_aux=fn)
        effs[c] = (fa["stacks"]["trt10.3"]["target_eff"], fn["stacks"]["trt10.3"]["target_eff"], cross["eff_that_fits"])
    # every parameter of the optimistic corner is at least as favourable as the central one (and the reverse
    # for the pessimistic corner), so low <= central <= high holds for every prediction; an efficiency at the
    # cap means that no efficiency fits that point, and is left out
    fitted = [e for v in effs.values() for e in v if e < EFF_MAX]
    eff_used = {"optimistic": max(fitted), "central": effs["central"][0], "pessimistic": min(fitted)}
    return fits, effs, eff_used


def _trt85_fused_attention(h200: Params) -> dict:
    """The central corner's TensorRT 8.5 fit with a fused attention kernel."""
    cal = calibrate_orin(h200, True, CORNERS["central"], trt85_fused_attention=True)
    stack = cal["stacks"]["trt8.5"]
    return dict(target_eff=stack["target_eff"], host_ms=stack["host_ms"],
                error_pct=[pt["error_pct"] for pt in cal["points"] if pt["stack"] == "trt8.5"])


def _transfer_report(h200: Params, effs: dict, eff_used: dict) -> dict:
    return dict(corners={c: dict(CORNERS[c], target_eff=round(eff_used[c], 4),
                                 attention_eff=round(eff_used[c] * h200.attn_eff / h200.gemm_eff, 4))
                         for c in CORNERS},
                effs_per_corner={c: dict(zip(("with_da3_aux", "without_da3_aux", "cross_check"), v))
                                 for c, v in effs.items()},
                clock_scale={k: round(DEVICES[k].clock_scale, 3) for k in TARGETS})


def _band(inv: list[Kernel], dev: Device, corners: dict[str, Params], rms: float) -> tuple[float, float, float]:
    """(central, low, high) ms of one forward: the corners' predictions, the band widened by the H200 fit's
    rms log error."""
    v = {c: forward_us(inv, dev, pc) / 1e3 for c, pc in corners.items()}
    return v["central"], v["optimistic"] * math.exp(-rms), v["pessimistic"] * math.exp(rms)


def _prediction_rows(cfg: ModelConfig, batch: int, band) -> list[dict]:
    """Every target, packed and dense, at every count of QUERIES."""
    rows = []
    for key in TARGETS:
        dev = DEVICES[key]
        for path in ("packed", "dense"):
            for q in QUERIES:
                if path == "packed":
                    k = _bucket(cfg, q)
                    inv = packed_inventory(cfg, batch, k, k)
                else:
                    k = cfg.num_patches
                    inv = dense_inventory(cfg, batch, q)
                ms, lo, hi = band(inv, dev)
                rows.append(dict(device=key, device_name=dev.name, path=path, queries=q, batch=batch,
                                 tokens=1 + cfg.num_anchors + k, kernels=kernel_count(inv),
                                 gflop=round(total_flops(inv) / 1e9, 2), ms=round(ms, 3), ms_low=round(lo, 3),
                                 ms_high=round(hi, 3)))
    return rows


def _family_rows(band) -> list[dict]:
    """Dense models of the same family, TensorRT-style fused, fp16, GPU time only (no host)."""
    family = []
    for key in TARGETS:
        dev = DEVICES[key]
        for name, inv in [("Depth Anything V2 Small 518 (ViT-S + DPT)", depth_anything_inventory(518, "v2", "trt")),
                          ("Depth Anything 3 Small 518 (ViT-S + DualDPT)", depth_anything_inventory(518, "da3", "trt"))]:
            ms, lo, hi = band(inv, dev)
            family.append(dict(device=key, device_name=dev.name, model=name, kernels=kernel_count(inv),
                               gflop=round(total_flops(inv) / 1e9, 1), ms=round(ms, 2), ms_low=round(lo, 2),
                               ms_high=round(hi, 2)))
    return family


def _batch8_rows(cfg: ModelConfig, h200: Params, band) -> list[dict]:
    """Batch 8, Q512 (eight cameras): the regime where kernels, not launches, are the time; the model's own H200
    figure beside the measured one (docs/results/h200_bench.json, back-to-back) says how far it carries there."""
    batch8 = []
    for key in ("h200",) + tuple(TARGETS):
        dev = DEVICES[key]
        for path8, inv8 in (("packed", packed_inventory(cfg, 8, 512, 512)), ("dense", dense_inventory(cfg, 8, 512))):
            if key == "h200":
                ms, lo, hi = forward_us(inv8, dev, h200) / 1e3, None, None
            else:
                ms, lo, hi = band(inv8, dev)
            batch8.append(dict(device=key, device_name=dev.name, path=path8, queries=512, batch=8,
                               kernels=kernel_count(inv8), gflop=round(total_flops(inv8) / 1e9, 1), ms=round(ms, 3),
                               ms_low=None if lo is None else round(lo, 3), ms_high=None if hi is None else round(hi, 3)))
    return batch8


def _goal(cfg: ModelConfig, batch: int, rows: list[dict], central: Params, central_eff: float) -> dict:
    """The goal point (AGX Orin 64GB, Q256 packed) under the central corner: its band, where its time goes and
    where each assumption alone would take it past GOAL_MS."""
    goal = next(r for r in rows if r["device"] == "agx_orin_64" and r["path"] == "packed" and r["queries"] == 256)
    agx = DEVICES["agx_orin_64"]
    inv = packed_inventory(cfg, batch, 256, 256)
    by_cat = breakdown_us(inv, agx, central, busy=False)
    t = kernel_times_us(inv, agx, central)
    cs = agx.clock_scale
    floors = sum(k.count * cs * (p_f + central.launch_us) for k, p_f in zip(inv, _floors_of(inv, central)))
    # one assumption at a time, the others central: where would the goal point reach the limit?
    breaks_at = dict(floor_scale=_crossing(inv, agx, central, "floor_scale", 0.5, 5.0),
                     target_eff=_crossing(inv, agx, central, "target_eff", 0.05, EFF_MAX),
                     target_mem_eff=_crossing(inv, agx, central, "target_mem_eff", 0.05, 1.0))
    return dict(what="vits 518, B1, Q256 (bucket 256), packed, compiled + CUDA graph, AGX Orin 64GB", limit_ms=GOAL_MS,
                ms=goal["ms"], ms_low=goal["ms_low"], ms_high=goal["ms_high"],
                met_central=goal["ms"] <= GOAL_MS, met_whole_band=goal["ms_high"] <= GOAL_MS,
                breakdown_us={c: round(v, 1) for c, v in by_cat.items()},
                fixed_costs_us=round(floors, 1), total_us=round(float(np.dot(_packed(inv).count, t)), 1),
                kernels=kernel_count(inv), limit_reached_when=breaks_at, central_eff=central_eff)


def _crossing(inv: list[Kernel], dev: Device, p: Params, field_: str, lo: float, hi: float) -> float | None:
    """The value of one parameter of p, in [lo, hi], at which inv's predicted time on dev reaches GOAL_MS
    (bisection); None when it does not cross inside the range."""
    f = lambda v: forward_us(inv, dev, replace(p, **{field_: v})) / 1e3 - GOAL_MS  # noqa: E731
    if f(lo) * f(hi) > 0:
        return None
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(lo) * f(mid) > 0 else (lo, mid)
    return round(0.5 * (lo + hi), 3)


def _setting(cfg: ModelConfig) -> dict:
    """What the predictions are of: the model's shapes, the dtypes, the backend and the devices."""
    return dict(
        note="PREDICTIONS from a cost model calibrated on H200 measurements and published Orin TensorRT figures; "
             "nothing was measured on a Jetson.",
        preset_shapes=dict(img_size=list(cfg.img_size), patch=cfg.patch_size, width=cfg.embed_dim, depth=cfg.depth,
                           heads=cfg.num_heads, anchors=cfg.num_anchors, buckets=list(cfg.buckets)),
        dtype="float16 on the Orin (sm_87 runs bf16 at the same tensor rate; deploy_cpp's Jetson export uses "
              "float16); bfloat16 on the H200 (calibration)",
        backend="compiled (Inductor / AOTInductor .pt2) in a CUDA graph, batch 1",
        devices={k: asdict(DEVICES[k]) | {"peak_tflops": round(DEVICES[k].peak_tflops, 2)} for k in DEVICES},
    )


def _floors_of(ks: list[Kernel], p: Params) -> list[float]:
    f = {"gemm": p.floor_gemm_us, "conv": p.floor_gemm_us, "attention": p.floor_attn_us, "norm": p.floor_norm_us,
         "topk": p.topk_us}
    return [f.get(k.category, p.floor_pw_us) for k in ks]


# ---- outputs ---------------------------------------------------------------------------------------------
def plot(rep: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.4, 4.2), dpi=90)
    colors = {"agx_orin_64": "tab:blue", "orin_nx_16": "tab:orange", "orin_nano_super": "tab:green"}
    for key in TARGETS:
        for path_, ls in (("packed", "-"), ("dense", "--")):
            rs = [r for r in rep["predictions"] if r["device"] == key and r["path"] == path_]
            q = [r["queries"] for r in rs]
            ax.plot(q, [r["ms"] for r in rs], ls, marker="o", ms=3, color=colors[key],
                    label=f"{DEVICES[key].name.replace('Jetson ', '')}, {path_}")
            ax.fill_between(q, [r["ms_low"] for r in rs], [r["ms_high"] for r in rs], color=colors[key],
                            alpha=0.08 if path_ == "packed" else 0.04, lw=0)
    ax.axhline(GOAL_MS, color="k", lw=0.8, ls=":")
    ax.text(17, GOAL_MS * 1.06, "2 ms goal (AGX Orin, Q256, packed)", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(QUERIES), [str(q) for q in QUERIES])
    ax.set_xlabel("queries (batch 1)")
    ax.set_ylabel("predicted latency, ms (log)")
    ax.set_title("vits 518 fp16, compiled + CUDA graph: PREDICTED, not measured", fontsize=9)
    ax.grid(alpha=0.3, which="both", lw=0.4)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="line: central\nshade: band",
              title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def load_profiles(files: list[str]) -> list[dict]:
    """Measured profile JSON files (format in the module docstring) -> the calibration's profile records."""
    out = []
    for f in files:
        data = json.loads(Path(f).read_text())
        for prof in data if isinstance(data, list) else [data]:
            missing = [k for k in ("kernels", "kernels_per_call", "graph_replay_ms") if k not in prof]
            if missing:
                raise ValueError(f"{f}: profile lacks {', '.join(missing)} (format: python scripts/orin.py --help)")
            cats: dict[str, float] = {}
            for k in prof["kernels"]:
                cat = k.get("category", "other")
                if cat not in PROFILE_CATEGORIES and cat != "other":
                    raise ValueError(f"{f}: unknown category {cat!r}; use one of {sorted(PROFILE_CATEGORIES)} or 'other'")
                cats[cat] = cats.get(cat, 0.0) + float(k["us"])
            out.append(dict(backend=prof.get("backend", "compile+graph"), bucket=int(prof.get("bucket", 256)),
                            preset=prof.get("preset", "vits"),
                            batch=int(prof.get("batch", 1)), kernels_per_call=float(prof["kernels_per_call"]),
                            graph_replay_ms=float(prof["graph_replay_ms"]), categories_us=cats, source=str(f)))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description="Predict depthpack's latency on Jetson Orin devices from a per-kernel "
                                 "cost model calibrated on H200 measurements (predictions, not measurements)",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--json", default=str(RESULTS / "orin.json"), help="the predictions and the fit (docs/orin.md's tables)")
    ap.add_argument("--figure", default=str(ROOT / "docs" / "figures" / "orin_latency.png"), help="latency against queries")
    ap.add_argument("--preset", default="vits", choices=sorted(PRESETS))
    ap.add_argument("--profile", action="append", default=[], metavar="FILE",
                    help="measured profile JSON (repeatable); replaces the committed H200 profile numbers")
    args = ap.parse_args(argv)
    cfg = model_config(args.preset, **LAYOUT)
    profiles = load_profiles(args.profile) if args.profile else None
    rep = run(cfg, profiles)
    cal = json.loads(CALIBRATION.read_text())
    rep["inputs"] = dict(h200=cal["info"], runs={k: dict(commit=v["commit"], source=v["source"]) for k, v in cal["runs"].items()},
                         profile=args.profile or json.loads(PROFILE.read_text())["info"]["commit"])
    for path in (Path(args.json), Path(args.figure)):
        path.parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")
    plot(rep, Path(args.figure))
    g = rep["goal"]
    print(json.dumps(dict(goal_ms=g["ms"], band_ms=[g["ms_low"], g["ms_high"]], met_central=g["met_central"],
                          met_whole_band=g["met_whole_band"], h200_rms_log_error=rep["h200_rms_log_error"],
                          json=args.json, figure=args.figure, predicted_not_measured=True)))
    return rep


if __name__ == "__main__":
    main()
