"""The ViT blocks: timm's pre-norm Block with a one-way prefix (PrefixBlock, the model's own), and the hybrid
block, the same with two of its steps as Triton kernels, inference only.

One-way attention (PrefixBlock, every block of the model): the first `prefix` tokens of the buffer (cls,
registers, the glance) read only each other; every other token reads every key. So the prefix stream is a
model of its own whatever else is in the buffer. prefix = 0 is timm's attention (every token reads every key).
Two SDPA calls, the prefix rows over the prefix keys and the other rows over all of them, in place of one:
the buffer stays dense, with no mask.

Reference (timm's Block, attention without a mask):
    x = x + ls1 * proj(attention(qkv(LN1(x))))
    x = x + ls2 * fc2(GELU(fc1(LN2(x))))
hybrid_block keeps LN1, the QKV GEMM, LN2 and fc1 (+ GELU) as torch ops (Inductor and cuBLAS are fastest
at them) and runs the other two steps as kernels:
    attn_proj_res  per (query tile, head, image): attention over every key (a prefix row: over the prefix
                   keys) with an online softmax (flash attention's form), then that head's slice of the output projection, scaled by ls1 and
                   atomically added into the residual r = x + ls1 * proj.bias (the heads' sum without a
                   reduction pass)
    fc2_res        fc2 + bias, scaled by ls2, + r -> the block's output; split over K while its grid would
                   leave SMs idle (batch 1), the parts added atomically into r + ls2 * fc2.bias
The residual stream is float32; GEMM inputs are in the weights' dtype with float32 accumulation
(float32 weights: full IEEE products, as torch without TF32). The float32 atomics make sums
order-dependent at float32 rounding, far below bf16's.

Each kernel is a ``torch.library.triton_op`` (``depthpack::attn_proj_res``, ``depthpack::fc2_res``):
torch.compile and torch.export trace through it, AOTInductor compiles it into the package (plain Triton:
sm_80/sm_87 as well as Hopper), and it is capturable in a CUDA graph. CPU tensors or a missing Triton take
the references (the same arithmetic in torch). With TRITON_INTERPRET=1 set before Triton is imported,
``run_interpreted`` runs the kernels on CPU tensors. The fast recipe (core.fast) picks these blocks at
batch 1; DepthPack.deployed swaps them in for timm's (swap_blocks), EpilogueBlock for the GELU epilogue alone.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.vision_transformer import Block

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
    INTERPRET = bool(triton.knobs.runtime.interpret)
except ImportError:  # CPU-only installs: the reference is the only path
    HAVE_TRITON = INTERPRET = False

LOG2E = 1.4426950408889634


# ---- the reference: the kernels' arithmetic in torch ------------------------------------------------
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int = 0,
              attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) v, q k v [B,H,S,hd] -> [B,S,H,hd] (token-major, as the projection reads it), with
    the one-way rule: rows below `prefix` read only the keys below it, the others read every key (prefix 0 or
    >= S: every row every key). attn_mask: a key mask [B,1,1,S] (additive or boolean) that never removes a prefix
    key; it applies to the other rows."""
    S = q.shape[2]
    if not 0 < prefix < S:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask).transpose(1, 2)
    if attn_mask is not None and attn_mask.shape[-2] != 1:
        raise ValueError(f"one-way attention takes a key mask [B,1,1,S], got {tuple(attn_mask.shape)}")
    head = F.scaled_dot_product_attention(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix])
    tail = F.scaled_dot_product_attention(q[:, :, prefix:], k, v, attn_mask=attn_mask)
    return torch.cat([head.transpose(1, 2), tail.transpose(1, 2)], 1)  # one copy, token-major


def self_attention(attn: nn.Module, x: torch.Tensor, prefix: int = 0, attn_mask: torch.Tensor | None = None,
                   prefix_kv: tuple | None = None) -> tuple[torch.Tensor, tuple]:
    """timm's Attention module `attn` over x [B,S,D] with the one-way rule (attention()) -> (output [B,S,D],
    (k, v) [B,H,S,hd]). prefix_kv: (k, v) [B,H,P,hd] of a prefix run apart (PrefixBlock.forward_kv): x then
    holds no prefix, and every row reads those keys before its own."""
    B, S, _ = x.shape
    H, width = attn.num_heads, attn.qkv.out_features // 3
    q, k, v = attn.qkv(x).reshape(B, S, 3, H, width // H).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if prefix_kv is not None:
        o = F.scaled_dot_product_attention(q, torch.cat([prefix_kv[0], k], 2), torch.cat([prefix_kv[1], v], 2),
                                           attn_mask=attn_mask).transpose(1, 2)
    else:
        o = attention(q, k, v, prefix, attn_mask)
    o = o.reshape(B, S, width)
    o = getattr(attn, "norm", nn.Identity())(o)
    return attn.proj_drop(attn.proj(o)), (k, v)


def attn_proj_res_reference(qkv, x, proj_w, proj_b, ls1, num_heads: int, prefix: int = 0) -> torch.Tensor:
    """r = x + ls1 * (attention(qkv, prefix) @ proj_w^T + proj_b) [B,S,D] float32; qkv [B*S,3D] in the
    weights' dtype, attention in float32 (one-way below prefix), its output rounded to that dtype before the
    projection."""
    B, S, D = x.shape
    q, k, v = qkv.view(B, S, 3, num_heads, D // num_heads).permute(2, 0, 3, 1, 4).float()
    o = attention(q, k, v, prefix).to(qkv.dtype).reshape(B, S, D)
    o = F.linear(o, proj_w, proj_b).float()
    return x.float() + (o * ls1.float() if ls1 is not None else o)


def fc2_res_reference(h, fc2_w, fc2_b, ls2, r) -> torch.Tensor:
    """out = r + ls2 * (h @ fc2_w^T + fc2_b) [B,S,D] float32; h [B*S,hidden]."""
    y = F.linear(h, fc2_w, fc2_b).float().view(r.shape)
    return r + (y * ls2.float() if ls2 is not None else y)


def hybrid_block(x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b,
                 ls2, num_heads: int, eps1: float, eps2: float, attn_proj=attn_proj_res_reference,
                 fc2=fc2_res_reference, gelu_epilogue: bool = False, prefix: int = 0) -> torch.Tensor:
    """One block, x [B,S,D] (any float dtype) -> [B,S,D] float32: the residual stream in float32, the
    GEMMs' inputs in the weights' dtype. LayerNorms, QKV and fc1 as torch ops (fc1's bias and GELU in
    cuBLASLt's epilogue when gelu_epilogue: its tanh GELU); attention (one-way below prefix) + projection +
    residual by attn_proj(qkv, x, proj_w, proj_b, ls1, num_heads, prefix), fc2 + residual by
    fc2(h, fc2_w, fc2_b, ls2, r).
    With the torch references for those two it is the reference the kernels are held to
    (vit_block_reference); HybridBlock passes the kernels' ops."""
    B, S, D = x.shape
    dt = qkv_w.dtype
    x = x.float()
    h = F.layer_norm(x, (D,), ln1_w.float(), ln1_b.float(), eps1).to(dt).view(B * S, D)
    r = attn_proj(F.linear(h, qkv_w, qkv_b), x, proj_w, proj_b, ls1, num_heads, prefix)
    h = F.layer_norm(r, (D,), ln2_w.float(), ln2_b.float(), eps2).to(dt).view(B * S, D)
    if gelu_epilogue:
        h = torch._addmm_activation(fc1_b, h, fc1_w.t(), use_gelu=True)
    else:
        h = F.gelu(F.linear(h, fc1_w, fc1_b).float()).to(dt)
    return fc2(h, fc2_w, fc2_b, ls2, r)


def vit_block_reference(x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b,
                        fc2_w, fc2_b, ls2, num_heads: int, eps1: float, eps2: float, prefix: int = 0) -> torch.Tensor:
    """x [B,S,D] (any float dtype) -> the block's output [B,S,D] float32, as the kernels round (one-way below
    prefix). Weights as timm's Block holds them; ls1/ls2 None (no LayerScale) or [D]; qkv_b may be None."""
    return hybrid_block(x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ls1, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w,
                        fc2_b, ls2, num_heads, eps1, eps2, prefix=prefix)


def block_weights(blk: nn.Module) -> tuple:
    """The tensors of a timm Block in hybrid_block's order, after checking the block is the form the kernels
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
            raise ValueError(f"hybrid blocks: block part {name} is {type(mod).__name__}, the kernels need {kind.__name__}")
    if getattr(mlp.act, "approximate", "none") != "none":
        raise ValueError("hybrid blocks: the kernels compute the exact (erf) GELU, not the tanh approximation")
    if getattr(attn, "gate", None) is not None or mlp.fc1.bias is None or mlp.fc2.bias is None or attn.proj.bias is None:
        raise ValueError("hybrid blocks: gated attention or a linear without bias is not what the kernels compute")
    if blk.norm1.weight is None or blk.norm2.weight is None or blk.norm1.bias is None or blk.norm2.bias is None:
        raise ValueError("hybrid blocks: the kernels need LayerNorms with weight and bias (elementwise_affine)")
    hd = attn.head_dim if hasattr(attn, "head_dim") else blk.norm1.normalized_shape[0] // attn.num_heads
    if hd < 16 or hd & (hd - 1):
        raise ValueError(f"hybrid blocks: head dim {hd} must be a power of two >= 16")
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
    def _attention(qkv_ptr, q, rq, row0, h, S, D, P, qk_scale, IEEE: tl.constexpr, HD: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr):
        # softmax(q k^T) v of queries q [BM,HD] (rows rq of the image) over the keys of head h from row row0
        # of qkv [M,3D]: a row below P (the one-way prefix) reads the keys below P, any other all S keys
        # (P = 0: every row all S). Key 0 is in every row's first tile, so m_i is finite after it (online
        # softmax); a tile wholly past a row's limit then adds nothing. A tile of prefix rows stops at P.
        N3 = 3 * D
        dd = tl.arange(0, HD)
        limit = tl.where(rq < P, P, S)  # [BM] keys each row reads
        end = tl.where(tl.max(rq, axis=0) < P, P, S)
        m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BM,), dtype=tl.float32)
        acc = tl.zeros((BM, HD), dtype=tl.float32)
        for k0 in range(0, end, BN):
            rk = k0 + tl.arange(0, BN)
            k_ok = rk < S
            kv = (row0 + rk)[:, None] * N3 + h * HD + dd[None, :]
            k = tl.load(qkv_ptr + kv + D, mask=k_ok[:, None], other=0.0)
            s = (_mm(q, tl.trans(k), tl.zeros((BM, BN), dtype=tl.float32), IEEE) * qk_scale).to(tl.float32)
            s = tl.where(rk[None, :] < limit[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(qkv_ptr + kv + 2 * D, mask=k_ok[:, None], other=0.0)
            acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
            m_i = m_new
        return (acc / l_i[:, None]).to(q.dtype)

    @triton.jit
    def _attn_proj_kernel(qkv_ptr, projw_ptr, ls1_ptr, r_ptr, S, D, P, qk_scale, HAS_LS: tl.constexpr,
                          IEEE: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BO: tl.constexpr):
        # query tile pid_m of head h, image b: attention over every key (one-way below P), then the head's share of the
        # output projection, times ls1, added atomically into r
        pid_m, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rq = pid_m * BM + tl.arange(0, BM)
        q_ok = rq < S
        row = b * S + rq
        dd = tl.arange(0, HD)
        q = tl.load(qkv_ptr + row[:, None] * (3 * D) + h * HD + dd[None, :], mask=q_ok[:, None], other=0.0)
        o = _attention(qkv_ptr, q, rq, b * S, h, S, D, P, qk_scale, IEEE, HD, BM, BN)
        ro = tl.arange(0, BO)
        for c0 in range(0, D, BO):
            rc = c0 + ro
            c_ok = rc < D
            w = tl.load(projw_ptr + rc[None, :] * D + h * HD + dd[:, None], mask=c_ok[None, :], other=0.0)
            part = _mm(o, w, tl.zeros((BM, BO), dtype=tl.float32), IEEE)
            if HAS_LS:
                part = part * tl.load(ls1_ptr + rc, mask=c_ok, other=0.0).to(tl.float32)[None, :]
            tl.atomic_add(r_ptr + row[:, None] * D + rc[None, :], part, mask=q_ok[:, None] & c_ok[None, :],
                          sem="relaxed")

    @triton.jit
    def _fc2_res_kernel(h_ptr, w2_ptr, b2_ptr, ls2_ptr, r_ptr, out_ptr, M, D, HID, KCHUNK,
                        ATOMIC: tl.constexpr, HAS_LS: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr):
        # tile (pid_m, pid_n) of out = r + ls2 * (h @ fc2_w^T + fc2_b) over K part pid_k
        pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        m_ok, n_ok = rm < M, rn < D
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(pid_k * KCHUNK, tl.minimum(pid_k * KCHUNK + KCHUNK, HID), BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < HID
            a = tl.load(h_ptr + rm[:, None] * HID + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
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
            tl.store(out_ptr + offs, acc + tl.load(r_ptr + offs, mask=mask, other=0.0), mask=mask)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter: tile choices as on an H100/H200


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def attn_tiles(M: int, S: int, sms: int, heads: int) -> dict:
    """attn_proj: the query tile the largest of 64/32/16 whose grid still covers the SMs; at 16 rows (batch 1:
    one program per SM, each a chain of dependent steps) key and projection tiles of 128, half the steps."""
    bm = next((bm for bm in (64, 32) if _cdiv(S, bm) * heads * (M // S) >= sms), 16)
    bn = 128 if bm == 16 else 64
    return dict(BM=bm, BN=bn, BO=bn, num_warps=4, num_stages=3)


def fc2_tiles(M: int, D: int, hidden: int, sms: int) -> dict:
    """fc2_res: 64x64 tiles, split over K while its grid would leave SMs idle."""
    split = max(1, min(hidden // 128, round(sms / (_cdiv(M, 64) * _cdiv(D, 64)))))
    return dict(BM=64, BN=64, BK=64, num_warps=4, num_stages=3, split=split)


def _opt(t: torch.Tensor | None, other: torch.Tensor) -> torch.Tensor:
    return t if t is not None else other  # an absent tensor's pointer (never read: its flag is off)


def attn_proj_res(k, qkv: torch.Tensor, x: torch.Tensor, proj_w: torch.Tensor, proj_b: torch.Tensor,
                  ls1: torch.Tensor | None, num_heads: int, prefix: int = 0, sms: int | None = None) -> torch.Tensor:
    """r = x + ls1 * (attention(qkv, prefix) @ proj_w^T + proj_b), float32 [B,S,D], qkv [B*S,3D]. The residual
    starts in torch (under torch.compile a pointwise op that Inductor fuses with a neighbour); the kernel k
    (_attn_proj_kernel or its wrap_triton) adds each head's projection into it atomically."""
    B, S, D = x.shape
    r = x.float() + (proj_b.float() * ls1.float() if ls1 is not None else proj_b.float())
    c = attn_tiles(B * S, S, sms or _sm_count(x.device), num_heads)
    hd = D // num_heads
    k[(_cdiv(S, c["BM"]), num_heads, B)](
        qkv, proj_w, _opt(ls1, proj_w), r, S, D, prefix if 0 < prefix < S else 0, LOG2E / math.sqrt(hd),
        HAS_LS=ls1 is not None,
        IEEE=proj_w.dtype == torch.float32, HD=hd, **c)
    return r


def fc2_res(k, h: torch.Tensor, fc2_w: torch.Tensor, fc2_b: torch.Tensor, ls2: torch.Tensor | None,
            r: torch.Tensor, sms: int | None = None) -> torch.Tensor:
    """out = r + ls2 * (h @ fc2_w^T + fc2_b), float32 [B,S,D], h [B*S,hidden]. Split over K (batch 1): out
    starts as r + ls2 * fc2_b in torch and the kernel k adds its K parts atomically."""
    B, S, D = r.shape
    M, hidden = B * S, fc2_w.shape[1]
    c = fc2_tiles(M, D, hidden, sms or _sm_count(r.device))
    split = c.pop("split")
    if split > 1:
        out = r + (fc2_b.float() * ls2.float() if ls2 is not None else fc2_b.float())
    else:
        out = torch.empty_like(r)
    kchunk = _cdiv(_cdiv(hidden, split), c["BK"]) * c["BK"]  # whole K tiles per part
    k[(_cdiv(M, c["BM"]), _cdiv(D, c["BN"]), _cdiv(hidden, kchunk))](
        h, fc2_w, fc2_b, _opt(ls2, fc2_b), r, out, M, D, hidden, kchunk,
        ATOMIC=split > 1, HAS_LS=ls2 is not None, IEEE=fc2_w.dtype == torch.float32, **c)
    return out


if HAVE_TRITON and not INTERPRET:

    @torch.library.triton_op("depthpack::attn_proj_res", mutates_args=())
    def _attn_proj_res_op(qkv: torch.Tensor, x: torch.Tensor, proj_w: torch.Tensor, proj_b: torch.Tensor,
                          ls1: Optional[torch.Tensor], num_heads: int, prefix: int = 0) -> torch.Tensor:
        return attn_proj_res(torch.library.wrap_triton(_attn_proj_kernel), qkv, x, proj_w, proj_b, ls1, num_heads,
                             prefix)

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
        raise ValueError(f"hybrid blocks: shapes do not agree: tokens {tuple(x.shape)}, qkv {tuple(qkv_w.shape)}, "
                         f"fc1 {tuple(fc1_w.shape)}")


class PrefixBlock(Block):
    """timm's Block (the same parameters under the same names) with the one-way rule: forward(x, attn_mask,
    prefix, prefix_kv), see self_attention(). The model builds its blocks as these."""

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, prefix: int = 0,
                prefix_kv: tuple | None = None) -> torch.Tensor:
        return self._run(x, attn_mask, prefix, prefix_kv)[0]

    def forward_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """x [B,P,D], a one-way prefix alone -> (the block's output, its keys and values (k, v) [B,H,P,hd]):
        what the buffers of other tokens read (forward(..., prefix_kv=(k, v)))."""
        return self._run(x)

    def _run(self, x, attn_mask=None, prefix=0, prefix_kv=None):
        o, kv = self_attention(self.attn, self.norm1(x), prefix, attn_mask, prefix_kv)
        x = x + self.drop_path1(self.ls1(o))
        return x + self.drop_path2(self.ls2(self.mlp_out(self.norm2(x)))), kv

    def mlp_out(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(h)


class EpilogueBlock(PrefixBlock):
    """PrefixBlock with fc1 + bias + GELU as one GEMM with cuBLASLt's epilogue (torch._addmm_activation:
    its tanh GELU, within bf16 rounding of timm's exact one). Swapped in at deploy time (swap_blocks)."""

    def mlp_out(self, h: torch.Tensor) -> torch.Tensor:
        mlp = self.mlp
        y = torch._addmm_activation(mlp.fc1.bias, h.reshape(-1, h.shape[-1]), mlp.fc1.weight.t(), use_gelu=True)
        return mlp.drop2(mlp.fc2(mlp.norm(mlp.drop1(y))).reshape(h.shape))


class HybridBlock(PrefixBlock):
    """hybrid_block with the two kernels, inference only: the residual stream comes out float32 (the model
    casts it back after the last block). With a key mask, a prefix run apart, CPU tensors or no Triton: the
    block it replaced (PrefixBlock's, or EpilogueBlock's with gelu_epilogue)."""
    gelu_epilogue = False

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, prefix: int = 0,
                prefix_kv: tuple | None = None) -> torch.Tensor:
        if attn_mask is not None or prefix_kv is not None or not (HAVE_TRITON and not INTERPRET and x.is_cuda):
            return PrefixBlock.forward(self, x, attn_mask, prefix, prefix_kv)
        if torch.is_grad_enabled() and x.requires_grad:
            raise ValueError("hybrid blocks are inference only: run under torch.no_grad() or use the timm blocks to train")
        weights = block_weights(self)
        _check(x, weights)
        ops = torch.ops.depthpack
        return hybrid_block(x.contiguous(), *weights, attn_proj=ops.attn_proj_res, fc2=ops.fc2_res,
                            gelu_epilogue=self.gelu_epilogue, prefix=prefix)

    def mlp_out(self, h: torch.Tensor) -> torch.Tensor:
        return EpilogueBlock.mlp_out(self, h) if self.gelu_epilogue else self.mlp(h)


def swap_blocks(blocks: nn.Sequential, kind: str, gelu_epilogue: bool) -> None:
    """Replace the model's PrefixBlocks in place by the recipe's: "hybrid" (HybridBlock), or with gelu_epilogue
    EpilogueBlock; the same parameters under the same names. A block the kernels cannot compute is a
    ValueError naming the part (block_weights)."""
    for i, blk in enumerate(blocks):
        if kind == "hybrid":
            block_weights(blk)
            cls = HybridBlock
        elif gelu_epilogue:
            cls = EpilogueBlock
        else:
            continue
        new = cls.__new__(cls)
        new.__dict__.update(blk.__dict__)  # the same submodules and parameters
        if kind == "hybrid":
            new.gelu_epilogue = gelu_epilogue
        blocks[i] = new


def run_interpreted(x: torch.Tensor, *weights, sms: int = 132, prefix: int = 0) -> torch.Tensor:
    """hybrid_block with its two kernels on CPU tensors through Triton's interpreter (tests without a GPU),
    tiled as for a GPU of `sms` SMs (1: fc2 without the K split). Needs TRITON_INTERPRET=1 in the
    environment before triton was first imported."""
    if not INTERPRET:
        raise RuntimeError("run_interpreted needs TRITON_INTERPRET=1 set before triton is imported")
    _check(x, weights)
    return hybrid_block(x.contiguous(), *weights, attn_proj=functools.partial(attn_proj_res, _attn_proj_kernel, sms=sms),
                        fc2=functools.partial(fc2_res, _fc2_res_kernel, sms=sms), prefix=prefix)
