"""Triton gather+embed kernel against its torch reference on fresh random inputs: on the CPU through
Triton's interpreter (a child process with TRITON_INTERPRET=1), on a GPU directly, under torch.compile
and inside a CUDA graph; and the model's switch (fused_embed) leaves the packed forward unchanged."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from depthpack import create_model
from depthpack.kernels import fused_patch_embed, patch_embed_reference

HAVE_TRITON = importlib.util.find_spec("triton") is not None
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _case(B, C, H, W, p, D, K, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    n = (H // p) * (W // p)
    x = torch.randn(B, C, H, W, generator=g)
    index = torch.stack([torch.randperm(n, generator=g)[:K] for _ in range(B)])
    w = torch.randn(D, C * p * p, generator=g) / (C * p * p) ** 0.5
    b = torch.randn(D, generator=g)
    pos = torch.randn(n, D, generator=g)
    return [t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in (x, index, w, b, pos)] + [p]


@pytest.mark.skipif(not HAVE_TRITON, reason="needs triton for its interpreter")
def test_kernel_in_triton_interpreter_matches_reference():
    code = textwrap.dedent("""
        import torch
        from depthpack.kernels.patch_embed import run_interpreted, patch_embed_reference
        from test_kernels import _case
        worst = 0.0
        # odd sizes: K not a multiple of the block, 3*p*p not a multiple of BLOCK_K, D not of BLOCK_N
        for i, shape in enumerate([(1, 3, 56, 42, 14, 40, 11), (3, 3, 48, 40, 8, 70, 30), (2, 3, 16, 16, 4, 16, 16)]):
            args = _case(*shape, seed=100 + i)
            got, want = run_interpreted(*args), patch_embed_reference(*args)
            assert not got.isnan().any(), "unwritten output"
            worst = max(worst, ((got - want).norm() / want.norm()).item())
        print(worst)
    """)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([os.getcwd(), here]))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert float(p.stdout.strip().splitlines()[-1]) < 1e-5


def test_reference_is_the_models_embedding_and_switch_off_is_identity():
    torch.manual_seed(0)
    m = create_model("tiny").eval()
    x = m.normalize(torch.rand(2, 3, 64, 64))
    index = torch.stack([torch.randperm(64)[:16] for _ in range(2)])
    proj = m.backbone.patch_embed.proj
    with torch.no_grad():
        ref = patch_embed_reference(x, index, proj.weight.reshape(proj.weight.shape[0], -1), proj.bias,
                                    m.patch_pos(8, 8)[0], 8)
        torch.testing.assert_close(ref, m.embed_patches(x, index))
        images, points = torch.rand(2, 3, 64, 64), torch.rand(2, 16, 2) * 63.9
        off = m.forward_packed(images, points, 16)
        m.fused_embed = True  # on the CPU the switch falls back to the reference: same numbers
        torch.testing.assert_close(m.embed_patches(x, index), ref)
        # the anchors (a conv over the thumbnail when off) go through the same embedding when on
        torch.testing.assert_close(m.forward_packed(images, points, 16), off, rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_value_errors():
    x, index, w, b, pos, p = _case(1, 3, 16, 16, 4, 8, 4)
    with pytest.raises(ValueError, match="shapes"):
        fused_patch_embed(x, index, w[:, :-1], b, pos, p)
    with pytest.raises(ValueError, match="dtypes"):
        fused_patch_embed(x, index, w.double(), b, pos, p)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_gpu_kernel_matches_reference_eager_compiled_graphed(dtype, tol):
    torch._dynamo.reset()  # each shape is one compiled entry: stay clear of Dynamo's recompile limit
    for seed, shape in enumerate([(1, 3, 518, 518, 14, 384, 320), (8, 3, 518, 518, 14, 384, 512),
                                  (3, 3, 56, 42, 14, 40, 11)]):
        args = _case(*shape, dtype=dtype, device="cuda", seed=seed)
        want = patch_embed_reference(*[a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args])
        rel = lambda got: ((got.double() - want).norm() / want.norm()).item()  # noqa: E731
        assert rel(fused_patch_embed(*args)) < tol
        compiled = torch.compile(fused_patch_embed, fullgraph=True, dynamic=False)
        assert rel(compiled(*args)) < tol
        graph = torch.cuda.CUDAGraph()
        fused_patch_embed(*args)
        with torch.cuda.graph(graph):
            out = fused_patch_embed(*args)
        out.fill_(float("nan"))
        graph.replay()
        assert rel(out) < tol


@pytest.mark.gpu
@cuda
def test_gpu_model_switch_on_matches_off():
    torch.manual_seed(0)
    m = create_model("vits").eval().cuda().to(torch.bfloat16)
    images = torch.rand(2, 3, 518, 518, device="cuda")
    points = torch.rand(2, 256, 2, device="cuda") * 517
    with torch.inference_mode():
        off = m.forward_packed(images, points, 256)
        m.fused_embed = True
        on = m.forward_packed(images, points, 256)
    torch.testing.assert_close(on, off, rtol=3e-2, atol=3e-2)
