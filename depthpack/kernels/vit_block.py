"""A ViT block (timm's pre-norm Block) as four Triton kernels: fused_blocks.

Reference (timm's Block, attention without a mask):
    x = x + ls1 * proj(attention(qkv(LN1(x))))
    x = x + ls2 * fc2(GELU(fc1(LN2(x))))
After Inductor, a block is 8-10 kernels (LayerNorm, QKV GEMM, attention, projection GEMM, residual +
LayerNorm, fc1 GEMM, GELU, fc2 GEMM, residual), some of them cuBLAS split-K pairs. At batch 1 and a few
hundred tokens every GEMM is small and a kernel inside a CUDA graph still costs about 1.3 us to launch,
so the count is the latency (docs/bench/h200/profile.md). Here a block is four launches:
    1. ln_qkv     LN1 in the GEMM's prologue (row statistics first, then each K tile normalized as it is
                  loaded) + the QKV GEMM + bias -> qkv [M,3D]; the first column tile of each row block
                  also starts the residual r = x + ls1 * proj.bias (float32)
    2. attn_proj  per (query tile, head, image): attention over every key with an online softmax (flash
                  attention's form), then that head's slice of the output projection, scaled by ls1 and
                  atomically added into r (the heads' sum without a reduction pass)
    3. ln_fc1     LN2 of r in the prologue + fc1 + bias + GELU (exact, erf) -> h [M,hidden]
    4. fc2_res    fc2 + bias, scaled by ls2, + r -> the block's output (float32); at batch 1 split over K
                  so the grid covers the SMs, the parts added atomically into an output ln_fc1 started
                  as r + ls2 * fc2.bias
The residual stream between blocks is float32. The float32 atomics make sums order-dependent at float32
rounding, far below the model dtype's (bf16) rounding. GEMMs take the model dtype's inputs with
float32 accumulation (float32 models: full IEEE products, as torch without TF32).

Inference only (no backward). ``torch.ops.depthpack.vit_block`` is a ``torch.library.triton_op``:
torch.compile and torch.export trace through it, AOTInductor compiles its kernels into the package
(plain Triton: sm_80/sm_87 as well as Hopper), and it is capturable in a CUDA graph. CPU tensors or a
missing Triton take the reference (``vit_block_reference``, the same arithmetic in torch). With
TRITON_INTERPRET=1 set before Triton is imported, ``run_interpreted`` runs the kernels on CPU tensors.
Switch: ``DepthPack.fused_blocks`` (default off): True for the four kernels, "hybrid" for hybrid_block,
which keeps kernels 2 and 4 (``depthpack::attn_proj_res``, ``depthpack::fc2_res``) and leaves the
LayerNorms, QKV and fc1 to Inductor and cuBLAS, where they measured faster than kernels 1 and 3;
"persistent" for ``depthpack::vit_block_persistent``: the four kernels' tiles as four phases of one
launch (_block_kernel), one program per SM, a grid barrier between phases, so a block is one launch
and its phases choose tiles for a full grid (persistent_tiles). The barrier needs every program
resident at once (one per SM is) and is plain Triton atomics (sm_80/sm_87 as well as Hopper).
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
    INTERPRET = bool(triton.knobs.runtime.interpret)
except ImportError:  # CPU-only installs: the reference is the only path
    HAVE_TRITON = INTERPRET = False

LOG2E = 1.4426950408889634


# ---- the reference: the kernels' arithmetic in torch ------------------------------------------------
def attn_proj_res_reference(qkv, x, proj_w, proj_b, ls1, num_heads: int) -> torch.Tensor:
    """r = x + ls1 * (attention(qkv) @ proj_w^T + proj_b) [B,S,D] float32; qkv [B*S,3D] in the weights'
    dtype, attention in float32, its output rounded to that dtype before the projection."""
    B, S, D = x.shape
    q, k, v = qkv.view(B, S, 3, num_heads, D // num_heads).permute(2, 0, 3, 1, 4).float()
    o = F.scaled_dot_product_attention(q, k, v).to(qkv.dtype).transpose(1, 2).reshape(B, S, D)
    o = F.linear(o, proj_w, proj_b).float()
    return x.float() + (o * ls1.float() if ls1 is not None else o)


def fc2_res_reference(h, fc2_w, fc2_b, ls2, r) -> torch.Tensor:
    """out = r + ls2 * (h @ fc2_w^T + fc2_b) [B,S,D] float32; h [B*S,hidden]."""
    y = F.linear(h, fc2_w, fc2_b).float().view(r.shape)
    return r + (y * ls2.float() if ls2 is not None else y)


def hybrid_block(x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b,
                 ls2, num_heads: int, eps1: float, eps2: float, attn_proj=attn_proj_res_reference,
                 fc2=fc2_res_reference, gelu_epilogue: bool = False) -> torch.Tensor:
    """One block, x [B,S,D] (any float dtype) -> [B,S,D] float32: the residual stream in float32, the
    GEMMs' inputs in the weights' dtype. LayerNorms, QKV and fc1 as torch ops (fc1's bias and GELU in
    cuBLASLt's epilogue when gelu_epilogue: its tanh GELU, as the mlp_epilogue switch); attention +
    projection + residual by attn_proj(qkv, x, proj_w, proj_b, ls1, num_heads), fc2 + residual by
    fc2(h, fc2_w, fc2_b, ls2, r). With the torch references for those two it is the reference every
    form is held to (vit_block_reference); fused_blocks="hybrid" passes the kernels' ops."""
    B, S, D = x.shape
    dt = qkv_w.dtype
    x = x.float()
    h = F.layer_norm(x, (D,), ln1_w.float(), ln1_b.float(), eps1).to(dt).view(B * S, D)
    r = attn_proj(F.linear(h, qkv_w, qkv_b), x, proj_w, proj_b, ls1, num_heads)
    h = F.layer_norm(r, (D,), ln2_w.float(), ln2_b.float(), eps2).to(dt).view(B * S, D)
    if gelu_epilogue:
        h = torch._addmm_activation(fc1_b, h, fc1_w.t(), use_gelu=True)
    else:
        h = F.gelu(F.linear(h, fc1_w, fc1_b).float()).to(dt)
    return fc2(h, fc2_w, fc2_b, ls2, r)


def vit_block_reference(x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b,
                        fc2_w, fc2_b, ls2, num_heads: int, eps1: float, eps2: float) -> torch.Tensor:
    """x [B,S,D] (any float dtype) -> the block's output [B,S,D] float32, as the kernels round.
    Weights as timm's Block holds them; ls1/ls2 None (no LayerScale) or [D]; qkv_b may be None."""
    return hybrid_block(x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w,
                        fc2_b, ls2, num_heads, eps1, eps2)


def block_weights(blk: nn.Module) -> tuple:
    """The tensors of a timm Block in vit_block's order, after checking the block is the form the kernels
    compute (pre-norm, plain attention, GELU MLP); anything else is a ValueError naming the part."""
    attn, mlp = blk.attn, blk.mlp
    plain = [("norm1", blk.norm1, nn.LayerNorm), ("norm2", blk.norm2, nn.LayerNorm),
             ("attn.q_norm", getattr(attn, "q_norm", nn.Identity()), nn.Identity),
             ("attn.k_norm", getattr(attn, "k_norm", nn.Identity()), nn.Identity),
             ("attn.norm", getattr(attn, "norm", nn.Identity()), nn.Identity),
             ("mlp.norm", getattr(mlp, "norm", nn.Identity()), nn.Identity),
             ("mlp.act", mlp.act, nn.GELU)]
    for name, mod, kind in plain:
        if not isinstance(mod, kind):
            raise ValueError(f"fused_blocks: block part {name} is {type(mod).__name__}, the kernels need {kind.__name__}")
    if getattr(mlp.act, "approximate", "none") != "none":
        raise ValueError("fused_blocks: the kernels compute the exact (erf) GELU, not the tanh approximation")
    if getattr(attn, "gate", None) is not None or mlp.fc1.bias is None or mlp.fc2.bias is None or attn.proj.bias is None:
        raise ValueError("fused_blocks: gated attention or a linear without bias is not what the kernels compute")
    if blk.norm1.weight is None or blk.norm2.weight is None or blk.norm1.bias is None or blk.norm2.bias is None:
        raise ValueError("fused_blocks: the kernels need LayerNorms with weight and bias (elementwise_affine)")
    hd = attn.head_dim if hasattr(attn, "head_dim") else blk.norm1.normalized_shape[0] // attn.num_heads
    if hd < 16 or hd & (hd - 1):
        raise ValueError(f"fused_blocks: head dim {hd} must be a power of two >= 16")
    ls = lambda mod: getattr(mod, "gamma", None)  # noqa: E731  (timm's LayerScale; Identity: None)
    return (blk.norm1.weight, blk.norm1.bias, attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias,
            ls(blk.ls1), blk.norm2.weight, blk.norm2.bias, mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight,
            mlp.fc2.bias, ls(blk.ls2), attn.num_heads, float(blk.norm1.eps), float(blk.norm2.eps))


# ---- the kernels ----------------------------------------------------------------------------------
if HAVE_TRITON:

    @triton.jit
    def _mm(a, b, acc, IEEE: tl.constexpr):
        if IEEE:  # float32 inputs: full fp32 products, as torch's default (no TF32)
            return tl.dot(a, b, acc=acc, input_precision="ieee")
        return tl.dot(a, b, acc=acc)

    @triton.jit
    def _tile(pid_m, pid_n, M, N, BM: tl.constexpr, BN: tl.constexpr):
        # output tile (pid_m, pid_n)'s rows and columns and which are inside [M,N]
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        return rm, rm < M, rn, rn < N

    @triton.jit
    def _row_stats(x_ptr, rm, m_ok, D: tl.constexpr, eps, BM: tl.constexpr, BK: tl.constexpr, CM: tl.constexpr):
        # mean and 1/std of rows rm of x [M,D], one pass over K tiles, unrolled (D is the model's width):
        # the tiles' loads go out together, not one L2 round trip after another
        s1 = tl.zeros((BM,), dtype=tl.float32)
        s2 = tl.zeros((BM,), dtype=tl.float32)
        for k0 in tl.static_range(0, D, BK):
            rk = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + rm[:, None] * D + rk[None, :], mask=m_ok[:, None] & (rk < D)[None, :],
                        other=0.0, cache_modifier=CM).to(tl.float32)
            s1 += tl.sum(x, axis=1)
            s2 += tl.sum(x * x, axis=1)
        mean = s1 / D
        # (.to: Inductor passes Python floats as fp64, which would carry into everything after)
        var = tl.maximum(s2 / D - mean * mean, 0.0)
        return mean, 1.0 / tl.sqrt((var + eps).to(tl.float32))

    @triton.jit
    def _ln_gemm(x_ptr, rm, m_ok, D, mean, rstd, lnw_ptr, lnb_ptr, w_ptr, rn, n_ok, acc, IEEE: tl.constexpr,
                 BK: tl.constexpr, CM: tl.constexpr):
        # acc + LayerNorm(x[rm]) @ W[rn]^T, W [N,D]: each K tile of x normalized as it is loaded
        for k0 in range(0, D, BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < D
            x = tl.load(x_ptr + rm[:, None] * D + rk[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0, cache_modifier=CM).to(tl.float32)
            g = tl.load(lnw_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
            b = tl.load(lnb_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
            xn = (x - mean[:, None]) * rstd[:, None] * g[None, :] + b[None, :]  # 0 beyond column D
            w = tl.load(w_ptr + rn[None, :] * D + rk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc = _mm(xn.to(w.dtype), w, acc, IEEE)
        return acc

    @triton.jit
    def _store_rows_plus(src_ptr, dst_ptr, rm, m_ok, D: tl.constexpr, v_ptr, s_ptr, HAS_S: tl.constexpr,
                         BK: tl.constexpr, CM: tl.constexpr):
        # dst[rm] = src[rm] + v * s (float32), the start of a residual sum (unrolled, as _row_stats)
        for k0 in tl.static_range(0, D, BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < D
            mask = m_ok[:, None] & k_ok[None, :]
            x = tl.load(src_ptr + rm[:, None] * D + rk[None, :], mask=mask, other=0.0, cache_modifier=CM).to(tl.float32)
            v = tl.load(v_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
            if HAS_S:
                v = v * tl.load(s_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
            tl.store(dst_ptr + rm[:, None] * D + rk[None, :], x + v[None, :], mask=mask)

    @triton.jit
    def _ln_linear_tile(pid_m, pid_n, x_ptr, lnw_ptr, lnb_ptr, w_ptr, bias_ptr, y_ptr, init_ptr, initv_ptr, inits_ptr,
                        M, D: tl.constexpr, N, eps, HAS_BIAS: tl.constexpr, GELU: tl.constexpr, INIT: tl.constexpr,
                        HAS_S: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr, CM: tl.constexpr):
        # tile (pid_m, pid_n) of y [M,N] = LayerNorm(x) @ W^T (+ bias) (GELU); INIT: the first column tile of
        # each row block also starts a residual sum, init = x + initv * inits (ln_qkv: r = x + ls1 *
        # proj.bias, which attn_proj adds to; ln_fc1 before a K-split fc2: out = r + ls2 * fc2.bias)
        rm, m_ok, rn, n_ok = _tile(pid_m, pid_n, M, N, BM, BN)
        mean, rstd = _row_stats(x_ptr, rm, m_ok, D, eps, BM, BK, CM)
        acc = _ln_gemm(x_ptr, rm, m_ok, D, mean, rstd, lnw_ptr, lnb_ptr, w_ptr, rn, n_ok,
                       tl.zeros((BM, BN), dtype=tl.float32), IEEE, BK, CM)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if GELU:  # exact (erf), as nn.GELU()
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
        if INIT:
            if pid_n == 0:
                _store_rows_plus(x_ptr, init_ptr, rm, m_ok, D, initv_ptr, inits_ptr, HAS_S, BK, CM)

    @triton.jit
    def _ln_linear_kernel(x_ptr, lnw_ptr, lnb_ptr, w_ptr, bias_ptr, y_ptr, init_ptr, initv_ptr, inits_ptr, M,
                          D: tl.constexpr, N, eps, HAS_BIAS: tl.constexpr, GELU: tl.constexpr, INIT: tl.constexpr, HAS_S: tl.constexpr,
                          IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        _ln_linear_tile(tl.program_id(0), tl.program_id(1), x_ptr, lnw_ptr, lnb_ptr, w_ptr, bias_ptr, y_ptr, init_ptr,
                        initv_ptr, inits_ptr, M, D, N, eps, HAS_BIAS, GELU, INIT, HAS_S, IEEE, BM, BN, BK, "")

    @triton.jit
    def _attention(qkv_ptr, q, row0, h, S, D, qk_scale, IEEE: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, CM: tl.constexpr):
        # softmax(q k^T) v of queries q [BM,HD] over the S keys of head h from row row0 of qkv [M,3D]:
        # every key tile holds at least one real key, so m_i is finite after the first (online softmax)
        N3 = 3 * D
        dd = tl.arange(0, HD)
        m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BM,), dtype=tl.float32)
        acc = tl.zeros((BM, HD), dtype=tl.float32)
        for k0 in range(0, S, BN):
            rk = k0 + tl.arange(0, BN)
            k_ok = rk < S
            kv = (row0 + rk)[:, None] * N3 + h * HD + dd[None, :]
            k = tl.load(qkv_ptr + kv + D, mask=k_ok[:, None], other=0.0, cache_modifier=CM)
            s = (_mm(q, tl.trans(k), tl.zeros((BM, BN), dtype=tl.float32), IEEE) * qk_scale).to(tl.float32)
            s = tl.where(k_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(qkv_ptr + kv + 2 * D, mask=k_ok[:, None], other=0.0, cache_modifier=CM)
            acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
            m_i = m_new
        return (acc / l_i[:, None]).to(q.dtype)

    @triton.jit
    def _proj_add(o, row, q_ok, h, projw_ptr, ls1_ptr, r_ptr, D, HAS_LS: tl.constexpr, IEEE: tl.constexpr,
                  HD: tl.constexpr, BM: tl.constexpr, BO: tl.constexpr, ATOMIC: tl.constexpr):
        # head h's share of the output projection of o [BM,HD] (rows row of r [M,D]), times ls1, added
        # into r atomically (ATOMIC False: stored, for timing probes only: the heads' sum is lost)
        dd = tl.arange(0, HD)
        ro = tl.arange(0, BO)
        for c0 in range(0, D, BO):
            rc = c0 + ro
            c_ok = rc < D
            w = tl.load(projw_ptr + rc[None, :] * D + h * HD + dd[:, None], mask=c_ok[None, :], other=0.0)
            part = _mm(o, w, tl.zeros((BM, BO), dtype=tl.float32), IEEE)
            if HAS_LS:
                part = part * tl.load(ls1_ptr + rc, mask=c_ok, other=0.0).to(tl.float32)[None, :]
            mask = q_ok[:, None] & c_ok[None, :]
            if ATOMIC:
                tl.atomic_add(r_ptr + row[:, None] * D + rc[None, :], part, mask=mask, sem="relaxed")
            else:
                tl.store(r_ptr + row[:, None] * D + rc[None, :], part, mask=mask)

    @triton.jit
    def _attn_proj_tile(pid_m, h, b, qkv_ptr, projw_ptr, ls1_ptr, r_ptr, S, D, qk_scale, HAS_LS: tl.constexpr,
                        IEEE: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BO: tl.constexpr,
                        CM: tl.constexpr):
        # query tile pid_m of head h, image b: attention over every key with an online softmax, then the
        # head's share of the output projection, times ls1, added atomically into r
        rq = pid_m * BM + tl.arange(0, BM)
        q_ok = rq < S
        row = b * S + rq
        q = tl.load(qkv_ptr + row[:, None] * (3 * D) + h * HD + tl.arange(0, HD)[None, :], mask=q_ok[:, None],
                    other=0.0, cache_modifier=CM)
        o = _attention(qkv_ptr, q, b * S, h, S, D, qk_scale, IEEE, HD, BM, BN, CM)
        _proj_add(o, row, q_ok, h, projw_ptr, ls1_ptr, r_ptr, D, HAS_LS, IEEE, HD, BM, BO, True)

    @triton.jit
    def _attn_proj_kernel(qkv_ptr, projw_ptr, ls1_ptr, r_ptr, S, D, qk_scale, HAS_LS: tl.constexpr,
                          IEEE: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BO: tl.constexpr):
        _attn_proj_tile(tl.program_id(0), tl.program_id(1), tl.program_id(2), qkv_ptr, projw_ptr, ls1_ptr, r_ptr,
                        S, D, qk_scale, HAS_LS, IEEE, HD, BM, BN, BO, "")

    @triton.jit
    def _fc2_res_tile(pid_m, pid_n, pid_k, h_ptr, w2_ptr, b2_ptr, ls2_ptr, r_ptr, out_ptr, M, D, HID, KCHUNK,
                      ATOMIC: tl.constexpr, HAS_LS: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, BK: tl.constexpr, CM: tl.constexpr):
        # tile (pid_m, pid_n) of out = r + ls2 * (h @ fc2_w^T + fc2_b) over K part pid_k
        rm, m_ok, rn, n_ok = _tile(pid_m, pid_n, M, D, BM, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(pid_k * KCHUNK, tl.minimum(pid_k * KCHUNK + KCHUNK, HID), BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < HID
            a = tl.load(h_ptr + rm[:, None] * HID + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0,
                        cache_modifier=CM)
            w = tl.load(w2_ptr + rn[None, :] * HID + rk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc = _mm(a, w, acc, IEEE)
        mask = m_ok[:, None] & n_ok[None, :]
        offs = rm[:, None] * D + rn[None, :]
        if ATOMIC:  # a K part: out already holds r + ls2 * fc2.bias
            if HAS_LS:
                acc = acc * tl.load(ls2_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.atomic_add(out_ptr + offs, acc, mask=mask, sem="relaxed")
        else:
            acc += tl.load(b2_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if HAS_LS:
                acc = acc * tl.load(ls2_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + offs, acc + tl.load(r_ptr + offs, mask=mask, other=0.0, cache_modifier=CM), mask=mask)

    @triton.jit
    def _fc2_res_kernel(h_ptr, w2_ptr, b2_ptr, ls2_ptr, r_ptr, out_ptr, M, D, HID, KCHUNK,
                        ATOMIC: tl.constexpr, HAS_LS: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr):
        _fc2_res_tile(tl.program_id(0), tl.program_id(1), tl.program_id(2), h_ptr, w2_ptr, b2_ptr, ls2_ptr, r_ptr,
                      out_ptr, M, D, HID, KCHUNK, ATOMIC, HAS_LS, IEEE, BM, BN, BK, "")

    # ---- the persistent block: the four steps in one launch, one program per SM ----------------------
    @triton.jit
    def _grid_sync(bar_ptr, gen):
        # Every program of the grid waits here until all have arrived. bar_ptr[0] counts arrivals, bar_ptr[1]
        # is the generation: the last to arrive resets the count and bumps the generation the others wait
        # on, so the barrier leaves the count at 0 for the next launch (no reset kernel). gen: the
        # generation this barrier ends (the launch's first generation + this barrier's number). Scalar
        # atomics run on one thread of the program; the CTA barriers around them order the other threads.
        tl.debug_barrier()
        if tl.atomic_add(bar_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
            tl.atomic_xchg(bar_ptr, 0, sem="relaxed")
            tl.atomic_add(bar_ptr + 1, 1, sem="release")
        else:
            while tl.atomic_add(bar_ptr + 1, 0, sem="acquire") != gen:
                pass
        tl.debug_barrier()

    @triton.jit
    def _block_kernel(x_ptr, ln1w_ptr, ln1b_ptr, qkvw_ptr, qkvb_ptr, projw_ptr, projb_ptr, ls1_ptr, ln2w_ptr,
                      ln2b_ptr, fc1w_ptr, fc1b_ptr, fc2w_ptr, fc2b_ptr, ls2_ptr, qkv_ptr, r_ptr, h_ptr, out_ptr,
                      bar_ptr, B, S, D: tl.constexpr, HID, KCHUNK, eps1, eps2, qk_scale, PHASES: tl.constexpr,
                      SYNC: tl.constexpr, HAS_QKVB: tl.constexpr, HAS_LS1: tl.constexpr, HAS_LS2: tl.constexpr,
                      FC2_ATOMIC: tl.constexpr, IEEE: tl.constexpr, HD: tl.constexpr, Q_BM: tl.constexpr,
                      Q_BN: tl.constexpr, A_BM: tl.constexpr, A_BN: tl.constexpr, A_BO: tl.constexpr,
                      F_BM: tl.constexpr, F_BN: tl.constexpr, O_BM: tl.constexpr, O_BN: tl.constexpr,
                      BK: tl.constexpr, CM: tl.constexpr):
        # One ViT block, the four kernels' tiles (ln_qkv, attn_proj, ln_fc1, fc2_res) as four phases of
        # one launch, each program looping over a phase's tiles with a stride of the grid, a grid barrier
        # between phases (SYNC). Needs every program resident at once: the grid is at most one per SM.
        # Buffers written in this launch are read with CM = .cg (L2; an SM's L1 is not coherent with the
        # others' writes). PHASES (bits 1, 2, 4, 8) picks phases: the interpreter runs them one launch
        # each, without the barrier (its programs run one after another).
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        M = B * S
        gen = 0
        if SYNC:
            gen = tl.atomic_add(bar_ptr + 1, 0, sem="relaxed")
        if PHASES & 1:  # qkv = LN1(x) @ qkv_w^T + qkv_b; r = x + ls1 * proj.bias
            n_n = tl.cdiv(3 * D, Q_BN)
            for t in range(pid, tl.cdiv(M, Q_BM) * n_n, nprog):
                _ln_linear_tile(t // n_n, t % n_n, x_ptr, ln1w_ptr, ln1b_ptr, qkvw_ptr, qkvb_ptr, qkv_ptr, r_ptr,
                                projb_ptr, ls1_ptr, M, D, 3 * D, eps1, HAS_QKVB, False, True, HAS_LS1, IEEE, Q_BM,
                                Q_BN, BK, CM)
        if SYNC:
            _grid_sync(bar_ptr, gen + 1)
        if PHASES & 2:  # r += ls1 * attention(qkv) @ proj_w^T, per (query tile, head, image)
            n_q = tl.cdiv(S, A_BM)
            n_h = D // HD
            for t in range(pid, n_q * n_h * B, nprog):
                _attn_proj_tile(t % n_q, (t // n_q) % n_h, t // (n_q * n_h), qkv_ptr, projw_ptr, ls1_ptr, r_ptr, S,
                                D, qk_scale, HAS_LS1, IEEE, HD, A_BM, A_BN, A_BO, CM)
        if SYNC:
            _grid_sync(bar_ptr, gen + 2)
        if PHASES & 4:  # h = GELU(LN2(r) @ fc1_w^T + fc1_b); out = r + ls2 * fc2.bias before a K split
            n_n = tl.cdiv(HID, F_BN)
            for t in range(pid, tl.cdiv(M, F_BM) * n_n, nprog):
                _ln_linear_tile(t // n_n, t % n_n, r_ptr, ln2w_ptr, ln2b_ptr, fc1w_ptr, fc1b_ptr, h_ptr, out_ptr,
                                fc2b_ptr, ls2_ptr, M, D, HID, eps2, True, True, FC2_ATOMIC, HAS_LS2, IEEE, F_BM,
                                F_BN, BK, CM)
        if SYNC:
            _grid_sync(bar_ptr, gen + 3)
        if PHASES & 8:  # out (+)= ls2 * (h @ fc2_w^T (+ fc2_b)) (+ r), per (row tile, column tile, K part)
            n_m = tl.cdiv(M, O_BM)
            n_n = tl.cdiv(D, O_BN)
            for t in range(pid, n_m * n_n * tl.cdiv(HID, KCHUNK), nprog):
                _fc2_res_tile(t % n_m, (t // n_m) % n_n, t // (n_m * n_n), h_ptr, fc2w_ptr, fc2b_ptr, ls2_ptr, r_ptr,
                              out_ptr, M, D, HID, KCHUNK, FC2_ATOMIC, HAS_LS2, IEEE, O_BM, O_BN, BK, CM)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter: tile choices as on an H100/H200


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _kchunk(K: int, split: int, bk: int) -> int:
    """The K range of one part of a K split into `split` parts, rounded up to whole K tiles of bk."""
    return _cdiv(_cdiv(K, split), bk) * bk


def attn_tiles(M: int, S: int, sms: int, heads: int) -> dict:
    """attn_proj: the query tile the largest of 64/32/16 whose grid still covers the SMs. At 16 rows (batch 1:
    a grid of one program per SM, each a chain of dependent steps on an otherwise idle SM) key and
    projection tiles of 128, half the steps: 6.8 us against 8.5 with 64 at 321 tokens on the H200
    (scripts/attn_probe.py, docs/bench/h200/2026-12-03/attn/attn_probe/)."""
    bm = next((bm for bm in (64, 32) if _cdiv(S, bm) * heads * (M // S) >= sms), 16)
    bn = 128 if bm == 16 else 64
    return dict(BM=bm, BN=bn, BO=bn, num_warps=4, num_stages=3)


def fc2_tiles(M: int, D: int, hidden: int, sms: int) -> dict:
    """fc2_res: 64x64 tiles, split over K while its grid would leave SMs idle."""
    split = max(1, min(hidden // 128, round(sms / (_cdiv(M, 64) * _cdiv(D, 64)))))
    return dict(BM=64, BN=64, BK=64, num_warps=4, num_stages=3, split=split)


def tiles(M: int, S: int, D: int, hidden: int, sms: int, heads: int = 6) -> dict:
    """Per kernel, its tiles, warps and pipeline stages for M = B*S rows, as measured best on the H200
    (scripts/block_kernel_sweep.py, docs/bench/h200/2026-12-02/sixth/): 64-row GEMM tiles 128 wide;
    attention's and fc2's from attn_tiles and fc2_tiles."""
    warps = 8 if M <= 1024 else 4
    return dict(ln_qkv=dict(BM=64, BN=128, BK=64, num_warps=warps, num_stages=3),
                attn_proj=attn_tiles(M, S, sms, heads),
                ln_fc1=dict(BM=64, BN=128, BK=64, num_warps=8, num_stages=3),
                fc2_res=fc2_tiles(M, D, hidden, sms))


def launch_ln_qkv(k, c, x, ln1_w, ln1_b, qkv_w, qkv_b, proj_b, ls1, eps1, qkv, r) -> None:
    B, S, D = x.shape
    k[(_cdiv(B * S, c["BM"]), _cdiv(3 * D, c["BN"]))](
        x, ln1_w, ln1_b, qkv_w, _opt(qkv_b, proj_b), qkv, r, proj_b, _opt(ls1, proj_b), B * S, D, 3 * D, eps1,
        HAS_BIAS=qkv_b is not None, GELU=False, INIT=True, HAS_S=ls1 is not None,
        IEEE=qkv_w.dtype == torch.float32, **c)


def launch_attn_proj(k, c, qkv, proj_w, ls1, r, num_heads) -> None:
    B, S, D = r.shape
    hd = D // num_heads
    k[(_cdiv(S, c["BM"]), num_heads, B)](
        qkv, proj_w, _opt(ls1, proj_w), r, S, D, LOG2E / math.sqrt(hd), HAS_LS=ls1 is not None,
        IEEE=proj_w.dtype == torch.float32, HD=hd, **c)


def launch_ln_fc1(k, c, r, ln2_w, ln2_b, fc1_w, fc1_b, fc2_b, ls2, eps2, h, out, init_out: bool) -> None:
    B, S, D = r.shape
    hidden = fc1_w.shape[0]
    k[(_cdiv(B * S, c["BM"]), _cdiv(hidden, c["BN"]))](
        r, ln2_w, ln2_b, fc1_w, fc1_b, h, out, fc2_b, _opt(ls2, fc2_b), B * S, D, hidden, eps2,
        HAS_BIAS=True, GELU=True, INIT=init_out, HAS_S=ls2 is not None, IEEE=fc1_w.dtype == torch.float32, **c)


def launch_fc2_res(k, c, h, fc2_w, fc2_b, ls2, r, out) -> None:
    B, S, D = r.shape
    M, hidden = B * S, fc2_w.shape[1]
    c = dict(c)
    split = c.pop("split")
    kchunk = _kchunk(hidden, split, c["BK"])
    k[(_cdiv(M, c["BM"]), _cdiv(D, c["BN"]), _cdiv(hidden, kchunk))](
        h, fc2_w, fc2_b, _opt(ls2, fc2_b), r, out, M, D, hidden, kchunk,
        ATOMIC=split > 1, HAS_LS=ls2 is not None, IEEE=fc2_w.dtype == torch.float32, **c)


def persistent_tiles(M: int, S: int, D: int, hidden: int, sms: int, heads: int) -> dict:
    """_block_kernel's tiles for M = B*S rows on a grid of `sms` programs: per GEMM phase, the tile (and
    for fc2 the K split) with the least work on the slowest program, tiles per program x (products +
    64 x loads) per K step, where a LayerNorm phase's rows count 4 (float32, read twice) and fc2's 1,
    beside the weights' columns; ties go to fewer tiles (less LayerNorm recomputed, fewer atomics).
    Attention's from attn_tiles. Eight warps: faster than four at B1 and B8 in the H200 sweep
    (docs/bench/h200/2026-12-03/)."""
    def pick(N, K, split_k, row_cost):
        best = None
        for bm, bn in ((32, 64), (64, 64), (32, 128), (64, 128)):
            for split in range(1, max(1, min(K // 128, sms)) + 1) if split_k else (1,):
                kchunk = _kchunk(K, split, 64)
                n = _cdiv(M, bm) * _cdiv(N, bn) * _cdiv(K, kchunk)
                if kchunk < K and n > sms:  # split over K (atomics) only to fill an otherwise idle grid
                    continue
                key = (_cdiv(n, sms) * (bm * bn + 64 * (row_cost * bm + bn)) * kchunk, n)
                if best is None or key < best[0]:
                    best = (key, dict(BM=bm, BN=bn, KCHUNK=kchunk))
        return best[1]
    q, f, o = pick(3 * D, D, False, 4), pick(hidden, D, False, 4), pick(D, hidden, True, 1)
    a = attn_tiles(M, S, sms, heads)
    return dict(Q_BM=q["BM"], Q_BN=q["BN"], A_BM=a["BM"], A_BN=a["BN"], A_BO=a["BO"], F_BM=f["BM"], F_BN=f["BN"],
                O_BM=o["BM"], O_BN=o["BN"], KCHUNK=o["KCHUNK"], BK=64, CM=".cg", num_warps=8, num_stages=3)


def launch_persistent(k, x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w,
                      fc2_b, ls2, num_heads, eps1, eps2, out, r, qkv, h, bar, sms: int, phases: int = 15,
                      sync: bool | None = None, config: dict | None = None) -> None:
    """_block_kernel on a grid of `sms` programs: all four phases with grid barriers (phases 15), or one
    phase without them (1, 2, 4 or 8: the interpreter, whose programs run one after another). sync
    (default: phases == 15) and config (replacing persistent_tiles' entries) are for the tile sweep."""
    B, S, D = x.shape
    hidden = fc1_w.shape[0]
    c = {**persistent_tiles(B * S, S, D, hidden, sms, num_heads), **(config or {})}
    kchunk = c.pop("KCHUNK")
    k[(sms,)](x, ln1_w, ln1_b, qkv_w, _opt(qkv_b, proj_b), proj_w, proj_b, _opt(ls1, proj_b), ln2_w, ln2_b, fc1_w,
              fc1_b, fc2_w, fc2_b, _opt(ls2, fc2_b), qkv, r, h, out, bar, B, S, D, hidden, kchunk, eps1, eps2,
              LOG2E / math.sqrt(D // num_heads), PHASES=phases, SYNC=phases == 15 if sync is None else sync, HAS_QKVB=qkv_b is not None,
              HAS_LS1=ls1 is not None, HAS_LS2=ls2 is not None, FC2_ATOMIC=kchunk < hidden,
              IEEE=qkv_w.dtype == torch.float32, HD=D // num_heads, **c)


def new_barrier(device: torch.device) -> torch.Tensor:
    """The persistent block's grid barrier (arrivals, generation), zeroed: one per forward, shared by every
    block in turn (each launch leaves the count at 0)."""
    return torch.zeros(2, dtype=torch.int32, device=device)


def _opt(t: torch.Tensor | None, other: torch.Tensor) -> torch.Tensor:
    return t if t is not None else other  # an absent tensor's pointer (never read: its flag is off)


def _launch(kernels, x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w,
            fc2_b, ls2, num_heads, eps1, eps2, out, r, qkv, h, sms: int | None = None) -> None:
    k1, k2, k3, k4 = kernels
    B, S, D = x.shape
    t = tiles(B * S, S, D, fc1_w.shape[0], sms or _sm_count(x.device), num_heads)
    launch_ln_qkv(k1, t["ln_qkv"], x, ln1_w, ln1_b, qkv_w, qkv_b, proj_b, ls1, eps1, qkv, r)
    launch_attn_proj(k2, t["attn_proj"], qkv, proj_w, ls1, r, num_heads)
    launch_ln_fc1(k3, t["ln_fc1"], r, ln2_w, ln2_b, fc1_w, fc1_b, fc2_b, ls2, eps2, h, out, t["fc2_res"]["split"] > 1)
    launch_fc2_res(k4, t["fc2_res"], h, fc2_w, fc2_b, ls2, r, out)


def _buffers(x: torch.Tensor, qkv_w: torch.Tensor, hidden: int, fill: float | None = None):
    """out and r [B,S,D] float32, qkv [M,3D] and h [M,hidden] in the weights' dtype."""
    B, S, D = x.shape
    def new(*shape, dtype):
        if fill is None:
            return torch.empty(*shape, device=x.device, dtype=dtype)
        return torch.full(shape, fill, device=x.device, dtype=dtype)
    return (new(B, S, D, dtype=torch.float32), new(B, S, D, dtype=torch.float32),
            new(B * S, 3 * D, dtype=qkv_w.dtype), new(B * S, hidden, dtype=qkv_w.dtype))


# ---- the hybrid: LayerNorm, QKV and fc1 left to torch ops (Inductor, cuBLAS); the two kernels that win --------
# The tile sweep (docs/bench/h200/2026-12-02/sixth/) found the LayerNorm-in-prologue GEMMs 1.3-2x slower
# than Inductor's LayerNorm plus cuBLAS, and attn_proj and fc2_res about 2x faster than torch's kernels
# for the same steps. fused_blocks="hybrid" takes each from where it is fastest.
def attn_proj_res(k, qkv: torch.Tensor, x: torch.Tensor, proj_w: torch.Tensor, proj_b: torch.Tensor,
                  ls1: torch.Tensor | None, num_heads: int, sms: int | None = None) -> torch.Tensor:
    """r = x + ls1 * (attention(qkv) @ proj_w^T + proj_b), float32 [B,S,D], qkv [B*S,3D]. The residual
    starts in torch (under torch.compile a pointwise op that Inductor fuses with a neighbour); the kernel k
    (_attn_proj_kernel or its wrap_triton) adds each head's projection into it atomically."""
    B, S, D = x.shape
    r = x.float() + (proj_b.float() * ls1.float() if ls1 is not None else proj_b.float())
    launch_attn_proj(k, attn_tiles(B * S, S, sms or _sm_count(x.device), num_heads), qkv, proj_w, ls1, r, num_heads)
    return r


def fc2_res(k, h: torch.Tensor, fc2_w: torch.Tensor, fc2_b: torch.Tensor, ls2: torch.Tensor | None,
            r: torch.Tensor, sms: int | None = None) -> torch.Tensor:
    """out = r + ls2 * (h @ fc2_w^T + fc2_b), float32 [B,S,D], h [B*S,hidden]. Split over K (batch 1): out
    starts as r + ls2 * fc2_b in torch and the kernel k adds its K parts atomically."""
    B, S, D = r.shape
    c = fc2_tiles(B * S, D, fc2_w.shape[1], sms or _sm_count(r.device))
    if c["split"] > 1:
        out = r + (fc2_b.float() * ls2.float() if ls2 is not None else fc2_b.float())
    else:
        out = torch.empty_like(r)
    launch_fc2_res(k, c, h, fc2_w, fc2_b, ls2, r, out)
    return out


if HAVE_TRITON and not INTERPRET:

    @torch.library.triton_op("depthpack::vit_block", mutates_args=())
    def _vit_block_op(x: torch.Tensor, ln1_w: torch.Tensor, ln1_b: torch.Tensor, qkv_w: torch.Tensor,
                      qkv_b: Optional[torch.Tensor], proj_w: torch.Tensor, proj_b: torch.Tensor,
                      ls1: Optional[torch.Tensor], ln2_w: torch.Tensor, ln2_b: torch.Tensor, fc1_w: torch.Tensor,
                      fc1_b: torch.Tensor, fc2_w: torch.Tensor, fc2_b: torch.Tensor, ls2: Optional[torch.Tensor],
                      num_heads: int, eps1: float, eps2: float) -> torch.Tensor:
        out, r, qkv, h = _buffers(x, qkv_w, fc1_w.shape[0])
        wrap = torch.library.wrap_triton
        _launch((wrap(_ln_linear_kernel), wrap(_attn_proj_kernel), wrap(_ln_linear_kernel), wrap(_fc2_res_kernel)),
                x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b, ls2,
                num_heads, eps1, eps2, out, r, qkv, h)
        return out

    @_vit_block_op.register_kernel("cpu")
    def _vit_block_cpu(*args):
        return vit_block_reference(*args)

    @torch.library.triton_op("depthpack::vit_block_persistent", mutates_args={"bar"})
    def _vit_block_persistent_op(x: torch.Tensor, bar: torch.Tensor, ln1_w: torch.Tensor, ln1_b: torch.Tensor,
                                 qkv_w: torch.Tensor, qkv_b: Optional[torch.Tensor], proj_w: torch.Tensor,
                                 proj_b: torch.Tensor, ls1: Optional[torch.Tensor], ln2_w: torch.Tensor,
                                 ln2_b: torch.Tensor, fc1_w: torch.Tensor, fc1_b: torch.Tensor, fc2_w: torch.Tensor,
                                 fc2_b: torch.Tensor, ls2: Optional[torch.Tensor], num_heads: int, eps1: float,
                                 eps2: float) -> torch.Tensor:
        out, r, qkv, h = _buffers(x, qkv_w, fc1_w.shape[0])
        launch_persistent(torch.library.wrap_triton(_block_kernel), x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b,
                          ls1, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b, ls2, num_heads, eps1, eps2, out, r, qkv, h,
                          bar, _sm_count(x.device))
        return out

    @_vit_block_persistent_op.register_kernel("cpu")
    def _vit_block_persistent_cpu(x, bar, *weights):
        return vit_block_reference(x, *weights)

    @torch.library.triton_op("depthpack::attn_proj_res", mutates_args=())
    def _attn_proj_res_op(qkv: torch.Tensor, x: torch.Tensor, proj_w: torch.Tensor, proj_b: torch.Tensor,
                          ls1: Optional[torch.Tensor], num_heads: int) -> torch.Tensor:
        return attn_proj_res(torch.library.wrap_triton(_attn_proj_kernel), qkv, x, proj_w, proj_b, ls1, num_heads)

    _attn_proj_res_op.register_kernel("cpu")(attn_proj_res_reference)

    @torch.library.triton_op("depthpack::fc2_res", mutates_args=())
    def _fc2_res_op(h: torch.Tensor, fc2_w: torch.Tensor, fc2_b: torch.Tensor, ls2: Optional[torch.Tensor],
                    r: torch.Tensor) -> torch.Tensor:
        return fc2_res(torch.library.wrap_triton(_fc2_res_kernel), h, fc2_w, fc2_b, ls2, r)

    _fc2_res_op.register_kernel("cpu")(fc2_res_reference)


def _check(x: torch.Tensor, weights: tuple) -> None:
    qkv_w, fc1_w = weights[2], weights[9]
    D = x.shape[-1]
    if x.ndim != 3 or qkv_w.shape != (3 * D, D) or fc1_w.shape[1] != D:
        raise ValueError(f"vit_block: shapes do not agree: tokens {tuple(x.shape)}, qkv {tuple(qkv_w.shape)}, "
                         f"fc1 {tuple(fc1_w.shape)}")


def fused_blocks(blocks, tokens: torch.Tensor, mode: bool | str = True, gelu_epilogue: bool = False) -> torch.Tensor:
    """tokens [B,S,D] through timm Blocks (no attention mask) -> [B,S,D] in the tokens' dtype. On CUDA, mode
    True: four kernels a block (vit_block); "hybrid": hybrid_block (gelu_epilogue: fc1's GELU in cuBLASLt's
    epilogue); "persistent": one launch a block (vit_block_persistent, gelu_epilogue unused: its GELU is
    exact). CPU tensors or no Triton: the blocks themselves (the reference path)."""
    if mode not in (True, "hybrid", "persistent"):
        raise ValueError(f"fused_blocks: mode {mode!r} is not True, 'hybrid' or 'persistent'")
    if not (HAVE_TRITON and not INTERPRET and tokens.is_cuda):
        for blk in blocks:
            tokens = blk(tokens)
        return tokens
    if torch.is_grad_enabled() and tokens.requires_grad:
        raise ValueError("fused_blocks is inference only: run under torch.no_grad() or switch it off to train")
    x = tokens.contiguous()
    ops = torch.ops.depthpack
    bar = new_barrier(x.device) if mode == "persistent" else None
    for blk in blocks:
        weights = block_weights(blk)
        _check(x, weights)
        if mode == "hybrid":
            x = hybrid_block(x, *weights, attn_proj=ops.attn_proj_res, fc2=ops.fc2_res, gelu_epilogue=gelu_epilogue)
        elif mode == "persistent":
            x = ops.vit_block_persistent(x, bar, *weights)
        else:
            x = ops.vit_block(x, *weights)
    return x.to(tokens.dtype)


def run_interpreted(x: torch.Tensor, *weights, sms: int = 132, hybrid: bool = False,
                    persistent: bool = False) -> torch.Tensor:
    """The block's kernels on CPU tensors through Triton's interpreter (tests without a GPU), tiled as for a
    GPU of `sms` SMs (1: fc2 without the K split): the four kernels, hybrid_block with its two, or the
    persistent kernel on a grid of `sms` programs, one launch per phase (the interpreter runs programs one
    after another, so the grid barrier would wait forever). Needs TRITON_INTERPRET=1 in the environment
    before triton was first imported."""
    if not INTERPRET:
        raise RuntimeError("run_interpreted needs TRITON_INTERPRET=1 set before triton is imported")
    _check(x, weights)
    x = x.contiguous()
    if hybrid:
        return hybrid_block(x, *weights, attn_proj=functools.partial(attn_proj_res, _attn_proj_kernel, sms=sms),
                            fc2=functools.partial(fc2_res, _fc2_res_kernel, sms=sms))
    bufs = _buffers(x, weights[2], weights[9].shape[0], fill=float("nan"))  # poisoned: unwritten shows
    if persistent:
        bar = new_barrier(x.device)
        for phase in (1, 2, 4, 8):
            launch_persistent(_block_kernel, x, *weights, *bufs, bar, sms=sms, phases=phase)
        return bufs[0]
    _launch((_ln_linear_kernel, _attn_proj_kernel, _ln_linear_kernel, _fc2_res_kernel), x, *weights, *bufs, sms=sms)
    return bufs[0]
