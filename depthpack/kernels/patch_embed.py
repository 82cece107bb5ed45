"""Fused embedding of the selected patches: gather + patch-embed GEMM + bias + position, one kernel.

Reference (pure torch, the computation of DepthPack.embed_patches):
    patches[b, n]  = x[b, :, rows of patch n, cols of patch n] flattened in (c, i, j) order  # [B,N,C*p*p]
    out[b, k]      = patches[b, index[b, k]] @ weight.T + bias + pos[index[b, k]]          # [B,K,D]
In torch (and after Inductor) this is a permute+gather kernel that writes the picked pixels [B,K,C*p*p],
a GEMM, and an epilogue that gathers and adds the position embedding. The kernel reads each selected
patch's pixels straight from the image by address arithmetic, accumulates in float32 and adds bias and
position in the epilogue: one launch, and only [B,K,D] is written.

It is registered as ``torch.ops.depthpack.patch_embed`` through ``torch.library.triton_op`` so that
torch.compile and torch.export trace through it (Inductor sees the Triton kernel), and it is capturable
in a CUDA graph. Inference only (no backward). CPU tensors, or a missing Triton, fall back to the
reference. With TRITON_INTERPRET=1 set before Triton is imported, ``run_interpreted`` runs the kernel
itself on CPU tensors through Triton's interpreter (how the CPU test checks it against the reference).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
    INTERPRET = bool(triton.knobs.runtime.interpret)  # TRITON_INTERPRET=1 at import: kernels run on the CPU
except ImportError:  # CPU-only installs: the reference is the only path
    HAVE_TRITON = INTERPRET = False

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64


def patch_embed_reference(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                          pos: torch.Tensor, patch: int) -> torch.Tensor:
    """x [B,C,H,W] normalized, index [B,K] patch ids, weight [D,C*p*p], bias [D], pos [N,D] -> [B,K,D]."""
    B, C, H, W = x.shape
    p = patch
    gh, gw = H // p, W // p
    patches = x.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * p * p)
    picked = torch.gather(patches, 1, index.unsqueeze(-1).expand(-1, -1, C * p * p))  # [B,K,Cpp]
    tok = F.linear(picked, weight, bias)  # [B,K,D]
    posb = pos.unsqueeze(0).expand(B, -1, -1)
    return tok + torch.gather(posb, 1, index.unsqueeze(-1).expand(-1, -1, pos.shape[-1]))


def _patch_embed_kernel_src(x_ptr, idx_ptr, w_ptr, b_ptr, pos_ptr, out_ptr,
                            M, Kp, D, KD, gw, sxb, sxc, sxh, sxw,
                            P: tl.constexpr, IEEE: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # rows m = b * Kp + k of the output [B*Kp, D]; columns n of the embedding
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < D
    b = rm // Kp
    tok = tl.load(idx_ptr + rm, mask=m_ok, other=0)  # patch id of each row
    py = tok // gw
    px = tok % gw
    row_base = b * sxb + (py * P) * sxh + (px * P) * sxw  # top-left pixel of the patch
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KD, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)  # (c, i, j) flattened, the Conv2d weight's order
        k_ok = rk < KD
        c = rk // (P * P)
        i = (rk // P) % P
        j = rk % P
        col = c * sxc + i * sxh + j * sxw
        a = tl.load(x_ptr + row_base[:, None] + col[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + rn[None, :] * KD + rk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:  # float32 inputs: full fp32 products, as torch's default (no TF32)
            acc = tl.dot(a, w, acc=acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc=acc)
    bias = tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + tok[:, None] * D + rn[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0.0)
    acc = acc + bias[None, :] + pos.to(tl.float32)
    tl.store(out_ptr + rm[:, None] * D + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def _launch(kernel, x, index, weight, bias, pos, patch: int, out: torch.Tensor) -> None:
    B, C, H, W = x.shape
    Kp = index.shape[1]
    D, KD = weight.shape
    M = B * Kp
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(D, BLOCK_N))
    kernel[grid](x, index, weight, bias, pos, out, M, Kp, D, KD, W // patch, *x.stride(),
                 P=patch, IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)


def _check(x, index, weight, bias, pos, patch) -> None:
    B, C, H, W = x.shape
    if H % patch or W % patch or weight.shape[1] != C * patch * patch or pos.shape != (H // patch * (W // patch), weight.shape[0]):
        raise ValueError(f"patch_embed: shapes do not agree: x {tuple(x.shape)}, patch {patch}, "
                         f"weight {tuple(weight.shape)}, pos {tuple(pos.shape)}")
    if not (x.dtype == weight.dtype == bias.dtype == pos.dtype):
        raise ValueError(f"patch_embed: dtypes differ: x {x.dtype}, weight {weight.dtype}, bias {bias.dtype}, pos {pos.dtype}")


if HAVE_TRITON:
    _patch_embed_kernel = triton.jit(_patch_embed_kernel_src)

if HAVE_TRITON and not INTERPRET:

    @torch.library.triton_op("depthpack::patch_embed", mutates_args=())
    def _patch_embed_op(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        pos: torch.Tensor, patch: int) -> torch.Tensor:
        out = torch.empty(x.shape[0], index.shape[1], weight.shape[0], device=x.device, dtype=x.dtype)
        _launch(torch.library.wrap_triton(_patch_embed_kernel), x, index, weight, bias, pos, patch, out)
        return out

    @_patch_embed_op.register_kernel("cpu")
    def _patch_embed_cpu(x, index, weight, bias, pos, patch):
        return patch_embed_reference(x, index, weight, bias, pos, patch)


def fused_patch_embed(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      pos: torch.Tensor, patch: int) -> torch.Tensor:
    """The Triton kernel on CUDA tensors when Triton is present, else the reference. Same signature."""
    _check(x, index, weight, bias, pos, patch)
    if not (HAVE_TRITON and not INTERPRET and x.is_cuda):
        return patch_embed_reference(x, index, weight, bias, pos, patch)
    return torch.ops.depthpack.patch_embed(x, index.contiguous(), weight.contiguous(), bias.contiguous(),
                                           pos.contiguous(), patch)


def run_interpreted(x, index, weight, bias, pos, patch: int) -> torch.Tensor:
    """Run the kernel itself on CPU tensors through Triton's interpreter (tests without a GPU).
    Needs TRITON_INTERPRET=1 in the environment before triton was first imported."""
    if not INTERPRET:
        raise RuntimeError("run_interpreted needs TRITON_INTERPRET=1 set before triton is imported")
    _check(x, index, weight, bias, pos, patch)
    out = torch.full((x.shape[0], index.shape[1], weight.shape[0]), float("nan"), dtype=x.dtype)  # poisoned
    _launch(_patch_embed_kernel, x, index.contiguous(), weight.contiguous(),
            bias.contiguous(), pos.contiguous(), patch, out)
    return out
