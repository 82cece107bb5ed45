"""The hybrid ViT block's two Triton kernels against their torch reference on fresh random inputs: on the
CPU through Triton's interpreter (a child process with TRITON_INTERPRET=1), on a GPU directly, under
torch.compile and inside a CUDA graph; the reference is timm's Block; and the model with the hybrid blocks
(the fast recipe at batch 1) stays within bf16 rounding of the plain model."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from depthpack import create_model
from depthpack.core.fast import Recipe
from depthpack.kernels.vit_block import EpilogueBlock, HybridBlock, PrefixBlock

HAVE_TRITON = importlib.util.find_spec("triton") is not None
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _interpreted(code: str) -> float:
    """Run code in a child process with Triton's interpreter on (TRITON_INTERPRET=1 must be set before
    triton is imported); its last line of output, a float."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([os.getcwd(), here]))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return float(p.stdout.strip().splitlines()[-1])


# ---- the hybrid block (depthpack.kernels.vit_block) -------------------------------------------------
def _block_case(B, S, D, H, hidden, layerscale, seed=0, qkv_bias=True, dtype=torch.float32, device="cpu"):
    """Fresh random tokens and block weights in vit_block's argument order."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, sc=1.0: (torch.randn(*s, generator=g) * sc).to(device)  # noqa: E731
    x = r(B, S, D)
    w = [1 + 0.1 * r(D), 0.1 * r(D), r(3 * D, D, sc=D ** -0.5), 0.1 * r(3 * D) if qkv_bias else None,
         r(D, D, sc=D ** -0.5), 0.1 * r(D), 0.5 + r(D).abs() if layerscale else None, 1 + 0.1 * r(D), 0.1 * r(D),
         r(hidden, D, sc=D ** -0.5), 0.1 * r(hidden), r(D, hidden, sc=hidden ** -0.5), 0.1 * r(D),
         0.5 + r(D).abs() if layerscale else None]
    w = [t.to(dtype) if t is not None else None for t in w]
    return x.to(dtype), w + [H, 1e-6, 1e-5]


@pytest.mark.skipif(not HAVE_TRITON, reason="needs triton for its interpreter")
def test_block_kernels_in_triton_interpreter_match_reference():
    code = textwrap.dedent("""
        from depthpack.kernels.vit_block import run_interpreted, vit_block_reference
        from test_kernels import _block_case
        worst = 0.0
        # S and D not multiples of the tiles, hidden not a multiple of the K split; LayerScale on and off,
        # no qkv bias; fc2 split over K with atomics (132 SMs) and whole (1 SM); attention's query tiles
        # of 64, 32 and 16 rows
        for i, (shape, sms) in enumerate([((2, 37, 96, 3, 384, True), 132), ((1, 70, 64, 2, 200, False), 132),
                                          ((3, 5, 32, 2, 128, True), 1), ((1, 300, 64, 2, 256, True), 1),
                                          ((1, 70, 64, 2, 200, True), 5), ((2, 41, 64, 2, 256, False), 7)]):
            x, w = _block_case(*shape, seed=200 + i, qkv_bias=i != 2)
            got = run_interpreted(x, *w, sms=sms)
            want = vit_block_reference(x, *w)
            assert not got.isnan().any(), "unwritten output"
            worst = max(worst, ((got - want).norm() / want.norm()).item())
        print(worst)
    """)
    assert _interpreted(code) < 1e-5


@pytest.mark.skipif(not HAVE_TRITON, reason="needs triton for its interpreter")
def test_one_way_block_kernels_in_triton_interpreter_match_reference_and_hide_the_patches():
    """The attention kernel's per-row key limit (the one-way prefix): against the reference on fresh inputs, query
    tiles wholly inside the prefix, across it and past it; and a prefix row's output does not move when every
    patch token does."""
    code = textwrap.dedent("""
        import torch
        from depthpack.kernels.vit_block import run_interpreted, vit_block_reference
        from test_kernels import _block_case
        worst = 0.0
        for i, (shape, sms, P) in enumerate([((2, 37, 96, 3, 384, True), 132, 5), ((1, 70, 64, 2, 200, False), 132, 20),
                                             ((1, 300, 64, 2, 256, True), 1, 193), ((2, 41, 64, 2, 256, False), 7, 17),
                                             ((1, 70, 64, 2, 200, True), 5, 64)]):
            x, w = _block_case(*shape, seed=400 + i)
            got = run_interpreted(x, *w, sms=sms, prefix=P)
            want = vit_block_reference(x, *w, prefix=P)
            assert not got.isnan().any(), "unwritten output"
            assert ((vit_block_reference(x, *w) - want).norm() / want.norm()) > 1e-2  # the rule matters here
            worst = max(worst, ((got - want).norm() / want.norm()).item())
            moved = x.clone()
            moved[:, P:] = torch.randn(moved[:, P:].shape, generator=torch.Generator().manual_seed(i))
            again = run_interpreted(moved, *w, sms=sms, prefix=P)
            assert torch.allclose(again[:, :P], got[:, :P], rtol=0, atol=1e-6), "a prefix row read a patch token"
        print(worst)
    """)
    assert _interpreted(code) < 1e-5


@pytest.mark.parametrize("init_values", [None, 0.5])
@pytest.mark.parametrize("prefix", [0, 9])
def test_block_reference_is_the_models_block(init_values, prefix):
    """The reference the kernels are held to computes the model's block (timm's, one-way below the prefix), with
    and without LayerScale."""
    from depthpack.core.model import random_weights_
    from depthpack.kernels.vit_block import block_weights, vit_block_reference

    m = random_weights_(create_model("small", init_values=init_values), seed=3).eval()
    tokens = torch.randn(2, 41, m.cfg.embed_dim, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = got = tokens
        for blk in m.backbone.blocks:
            want, got = blk(want, prefix=prefix), vit_block_reference(got, *block_weights(blk), prefix=prefix)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_hybrid_recipe_checks_the_blocks_and_falls_back_on_cpu():
    import torch.nn as nn

    torch.manual_seed(0)
    m = create_model("tiny").eval()
    images, points = torch.rand(2, 3, 64, 64), torch.rand(2, 16, 2) * 63.9
    hybrid = Recipe(blocks="hybrid")
    with torch.no_grad():
        off = m.packed_core(images, points, 16)
        on = m.deployed(hybrid).packed_core(images, points, 16)  # CPU tensors: the blocks themselves
    torch.testing.assert_close(on, off, rtol=0, atol=0)
    with pytest.raises(ValueError, match="recipe blocks 'all'"):
        Recipe(blocks="all")
    m.backbone.blocks[1].mlp.act = nn.ReLU()
    with pytest.raises(ValueError, match="mlp.act is ReLU"):
        m.deployed(hybrid)
    m.backbone.blocks[1].mlp.act = nn.GELU()
    m.backbone.blocks[0].norm2 = nn.LayerNorm(m.cfg.embed_dim, elementwise_affine=False)
    with pytest.raises(ValueError, match="LayerNorms with weight and bias"):
        m.deployed(hybrid)


def test_deployed_copy_leaves_the_model_and_runs_the_recipes_kernels():
    """deployed() is a copy with the recipe's kernels: the caller's model keeps the reference, and on the CPU
    the counting selection and the GELU epilogue compute the packed forward within float32 rounding."""
    torch.manual_seed(0)
    m = create_model("tiny").eval()
    images, points = torch.rand(2, 3, 64, 64), torch.rand(2, 30, 2) * 63.9
    fast = m.deployed(Recipe(selection="count", gelu_epilogue=True))
    assert m.selection == "topk" and fast.selection == "count" and fast is not m
    assert all(type(b) is PrefixBlock for b in m.backbone.blocks) and all(type(b) is EpilogueBlock for b in fast.backbone.blocks)
    assert fast.state_dict().keys() == m.state_dict().keys()  # the same parameters under the same names
    hybrid = m.deployed(Recipe(blocks="hybrid", gelu_epilogue=True))
    assert all(type(b) is HybridBlock and b.gelu_epilogue for b in hybrid.backbone.blocks)
    with torch.no_grad():
        for d in (fast, hybrid):  # on the CPU the hybrid blocks are the blocks they replaced
            torch.testing.assert_close(d.packed_core(images, points, 32), m.packed_core(images, points, 32),
                                       rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", ["hybrid", "hybrid+epilogue"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_gpu_block_kernels_match_reference_eager_compiled_graphed(kind, dtype, tol):
    """The hybrid block (with and without fc1's GELU epilogue): vits at batch 1 and 321 tokens (B1 Q256: fc2
    split over K), at batch 8 and 577 tokens (fc2 whole), and an odd shape; against the float32 reference,
    eager, compiled and replayed from a CUDA graph (twice, the output poisoned before each replay)."""
    from depthpack.kernels.vit_block import hybrid_block, vit_block_reference

    torch._dynamo.reset()
    ops = torch.ops.depthpack
    op = {"hybrid": lambda x, *w, prefix: hybrid_block(x, *w, attn_proj=ops.attn_proj_res, fc2=ops.fc2_res,
                                                       prefix=prefix),
          "hybrid+epilogue": lambda x, *w, prefix: hybrid_block(x, *w, attn_proj=ops.attn_proj_res, fc2=ops.fc2_res,
                                                                gelu_epilogue=True, prefix=prefix)}[kind]
    if kind == "hybrid+epilogue" and dtype == torch.float32:
        tol = 1e-3  # cuBLASLt's tanh GELU against the reference's erf GELU
    # (shape, one-way prefix): vits at 420x560 has 1 + 192 prefix tokens
    for seed, (shape, P) in enumerate([((1, 321, 384, 6, 1536, True), 0), ((1, 449, 384, 6, 1536, True), 193),
                                       ((8, 577, 384, 6, 1536, False), 193), ((3, 37, 96, 3, 200, True), 0)]):
        x, w = _block_case(*shape, seed=300 + seed, dtype=dtype, device="cuda")
        want = vit_block_reference(x.float(), *[t.float() if torch.is_tensor(t) else t for t in w], prefix=P)
        def check(got, how):
            err = ((got - want).norm() / want.norm()).item()
            assert err < tol, f"{how} {shape} prefix {P}: relative error {err:.2e} > {tol}"
        check(op(x, *w, prefix=P), "eager")
        check(torch.compile(lambda x: op(x, *w, prefix=P), fullgraph=True, dynamic=False)(x), "compiled")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = op(x, *w, prefix=P)
        for replay in range(2):
            out.fill_(float("nan"))
            graph.replay()
            check(out, f"graph replay {replay}")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("batch", [1, 8])
def test_gpu_fast_recipe_model_matches_plain_and_float32_masked(batch):
    """vits bf16 with the fast recipe's kernels (hybrid blocks at batch 1, timm's at 8; counting selection,
    GELU epilogue): within bf16 rounding of the plain model, and within the fast paths' bound (5 mm on random
    vits weights) of the float32 masked path."""
    from depthpack.core.fast import fast_recipe, without_runtime
    from depthpack.core.model import random_weights_

    m32 = random_weights_(create_model("vits"), seed=1).eval().cuda()
    m16 = create_model("vits").eval().cuda()
    m16.load_state_dict(m32.state_dict())
    m16 = m16.to(torch.bfloat16)
    g = torch.Generator().manual_seed(9)
    images = torch.rand(batch, 3, 518, 518, generator=g).cuda()
    points = (torch.rand(batch, 256, 2, generator=g) * 517).cuda()
    with torch.inference_mode():
        masked = m32.forward_masked(images, points)
        off = m16.packed_core(images, points, 256)
        on = m16.deployed(without_runtime(fast_recipe("cuda", batch))).packed_core(images, points, 256)
    assert (on - off).abs().max().item() < 3e-2 * off.abs().max().item()
    assert (on - masked).abs().max().item() <= max(5e-3, 1.5 * (off - masked).abs().max().item())
