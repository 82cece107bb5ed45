"""The three paths compute what they promise, on fresh random inputs, in float32."""
import pytest
import torch

from depthpack import create_model
from depthpack.core.packing import bucket_for, pad_points, select_tokens
from conftest import randomize_

ATOL = 1e-4  # float32: packed and masked differ only in summation order


def rand_inputs(seed, B, Q, H=64, W=64):
    g = torch.Generator().manual_seed(seed)
    img = torch.rand(B, 3, H, W, generator=g)
    pts = torch.stack([torch.rand(B, Q, generator=g) * W, torch.rand(B, Q, generator=g) * H], -1)
    return img, pts


@pytest.mark.parametrize("B,Q,seed", [(1, 1, 0), (1, 7, 1), (2, 16, 2), (3, 30, 3), (2, 64, 4)])
def test_packed_equals_masked(tiny, B, Q, seed):
    img, pts = rand_inputs(seed, B, Q)
    with torch.no_grad():
        packed, masked = tiny(img, pts), tiny.forward_masked(img, pts)
    assert packed.shape == (B, Q) and packed.dtype == torch.float32
    assert (packed - masked).abs().max() < ATOL


@pytest.mark.parametrize("bucket", [8, 16, 32])
def test_packed_equals_masked_every_bucket(tiny, bucket):
    img, pts = rand_inputs(10 + bucket, 2, 5)
    with torch.no_grad():
        a = tiny.packed_core(img, pts, bucket)
        b = tiny.masked_core(img, pts, bucket)
    assert (a - b).abs().max() < ATOL


def test_duplicates_borders_and_edges(tiny):
    # duplicates, points on patch borders (multiples of 8), the first and the last pixel, sub-pixel
    pts = torch.tensor([[[0.0, 0.0], [63.999, 63.999], [8.0, 8.0], [7.999, 8.0], [8.0, 8.0],
                         [0.0, 0.0], [32.0, 63.0], [63.0, 0.0], [15.5, 40.25], [15.5, 40.25]]])
    img = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        packed, masked = tiny(img, pts), tiny.forward_masked(img, pts)
    assert (packed - masked).abs().max() < ATOL
    assert packed[0, 0] == packed[0, 5] and packed[0, 2] == packed[0, 4] and packed[0, 8] == packed[0, 9]


def test_selecting_every_token_equals_dense(tiny):
    img, pts = rand_inputs(7, 2, 20)
    n = tiny.cfg.num_patches
    with torch.no_grad():
        full = tiny.packed_core(img, pts, n)
        dense = tiny.forward_dense(img, pts)
        # the selection really is partial at a small bucket: the answer differs from dense
        small = tiny.packed_core(img, pts, 32)
    assert (full - dense).abs().max() < ATOL
    assert (small - dense).abs().max() > 1e-3


@pytest.fixture(scope="module")
def thumb():
    """The thumbnail layout with the direct head: the one whose answers can run without the anchors."""
    return randomize_(create_model("tiny", context="thumbnail")).eval()


def test_packed_ignores_unselected_patches(thumb):
    # a patch outside the selection cannot influence the packed answer, but does influence dense
    tiny = thumb
    pts = torch.tensor([[[4.0, 4.0]]])  # patch 0, bucket 8: its 3x3 neighbourhood + spread
    index, _ = select_tokens(pts, 8, 8, (8, 8), tiny.spread_rank)
    unselected = sorted(set(range(64)) - set(index[0].tolist()))[0]
    r, c = divmod(unselected, 8)
    img = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(8))
    img2 = img.clone()
    img2[:, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] = torch.rand(3, 8, 8)
    with torch.no_grad():  # without the anchors, which see a thumbnail of the whole image
        assert torch.equal(tiny(img, pts, anchors=False), tiny(img2, pts, anchors=False))
        assert not torch.equal(tiny.forward_dense(img, pts, anchors=False), tiny.forward_dense(img2, pts, anchors=False))


@pytest.mark.parametrize("layout", ["thumb", "tiny"])
def test_anchors_carry_global_context(layout, request):
    # every unselected patch changes: only the anchors (a thumbnail or the glance of the whole image) can see it
    tiny = request.getfixturevalue(layout)
    pts = torch.tensor([[[4.0, 4.0]]])
    index, _ = select_tokens(pts, 8, 8, (8, 8), tiny.spread_rank)
    img = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(9))
    img2 = 1 - img
    for i in index[0].tolist():
        r, c = divmod(i, 8)
        img2[:, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] = img[:, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8]
    with torch.no_grad():
        assert (tiny(img, pts) - tiny(img2, pts)).abs().max() > 1e-4
        if tiny.cfg.query_head == "direct":
            assert torch.equal(tiny(img, pts, anchors=False), tiny(img2, pts, anchors=False))
        else:  # the residual head corrects the glance depth: without the glance there is nothing to correct
            with pytest.raises(ValueError, match="needs the glance tokens"):
                tiny(img, pts, anchors=False)


def test_depth_map_equals_queries(tiny):
    img, _ = rand_inputs(11, 2, 1)
    g = torch.Generator().manual_seed(12)
    pts = torch.randint(0, 64, (2, 25, 2), generator=g)
    with torch.no_grad():
        dmap = tiny.forward_dense(img)
        q = tiny.forward_dense(img, pts)
    assert dmap.shape == (2, 64, 64)
    b = torch.arange(2)[:, None]
    assert (dmap[b, pts[..., 1], pts[..., 0]] - q).abs().max() < ATOL


def test_depth_in_configured_range():
    m = create_model("tiny").eval()
    randomize_(m, scale=20.0)  # push the head into saturation
    img, pts = rand_inputs(13, 2, 50)
    with torch.no_grad():
        d = m(img, pts)
    assert torch.isfinite(d).all()
    assert d.min() >= m.cfg.min_depth * (1 - 1e-5) and d.max() <= m.cfg.max_depth * (1 + 1e-5)


def test_chunking_beyond_largest_bucket(tiny):
    img, pts = rand_inputs(14, 2, 150)  # largest bucket 64 -> chunks 64, 64, 22
    with torch.no_grad():
        out = tiny(img, pts, prefix_once=False)
        once = tiny(img, pts)  # the one-way prefix run once, its keys and values read by every chunk
        parts = [tiny.packed_core(img, pad_points(pts[:, s:s + 64], k), k)[:, :min(64, 150 - s)]
                 for s, k in ((0, 64), (64, 64), (128, 32))]
        dense = tiny.forward_dense(img, pts)
    assert out.shape == (2, 150) and tiny.cfg.oneway
    assert torch.equal(out, torch.cat(parts, 1))
    torch.testing.assert_close(once, out, rtol=1e-5, atol=1e-5)
    # the last chunk ran in bucket 32: a partial selection, so not dense
    assert (out[:, 128:] - dense[:, 128:]).abs().max() > 1e-3


def test_chunking_with_full_buckets_equals_dense():
    # buckets that select every token: chunked and unchunked agree, both equal dense
    m = randomize_(create_model("tiny", buckets=(64,))).eval()
    big = randomize_(create_model("tiny", buckets=(64, 256))).eval()
    img, pts = rand_inputs(19, 2, 200)
    with torch.no_grad():
        chunked, unchunked, dense = m(img, pts), big(img, pts), m.forward_dense(img, pts)
    assert (chunked - dense).abs().max() < ATOL and (unchunked - dense).abs().max() < ATOL


def test_bucket_choice():
    m = create_model("tiny")
    assert [bucket_for(q, m.cfg.buckets) for q in (1, 8, 9, 33, 64)] == [8, 8, 16, 64, 64]
    with pytest.raises(ValueError, match="largest bucket"):
        bucket_for(65, m.cfg.buckets)


def test_integer_points_and_empty(tiny):
    img = torch.rand(2, 3, 64, 64)
    ipts = torch.tensor([[[3, 4], [60, 1]], [[0, 0], [63, 63]]])
    with torch.no_grad():
        assert torch.equal(tiny(img, ipts), tiny(img, ipts.float()))
        empty = tiny(img, torch.zeros(2, 0, 2))
    assert empty.shape == (2, 0)


def test_other_image_size_multiple_of_patch(tiny):
    img, pts = rand_inputs(15, 1, 10, H=48, W=80)
    with torch.no_grad():
        a, b = tiny(img, pts), tiny.forward_masked(img, pts)
    assert a.shape == (1, 10) and (a - b).abs().max() < ATOL


BAD = [
    (lambda: (torch.rand(1, 3, 64, 64), torch.tensor([[[64.0, 3.0]]])), "1 of 1 are outside the 64x64"),
    (lambda: (torch.rand(1, 3, 64, 64), torch.tensor([[[-0.5, 3.0], [1.0, 2.0]]])), "outside"),
    (lambda: (torch.rand(1, 3, 64, 64), torch.tensor([[[float("nan"), 3.0], [1, float("inf")]]])), "2 of 2 are not finite"),
    (lambda: (torch.rand(1, 3, 60, 64), torch.zeros(1, 1, 2)), "not a positive multiple of the patch size 8"),
    (lambda: (torch.rand(3, 64, 64), torch.zeros(1, 1, 2)), r"shape \[B,3,H,W\]"),
    (lambda: (torch.rand(1, 4, 64, 64), torch.zeros(1, 1, 2)), r"shape \[B,3,H,W\]"),
    (lambda: (torch.rand(2, 3, 64, 64), torch.zeros(1, 1, 2)), "batch mismatch: 2 images but points for 1"),
    (lambda: (torch.rand(1, 3, 64, 64), torch.zeros(1, 2)), r"shape \[B,Q,2\]"),
    (lambda: (torch.rand(1, 3, 64, 64), torch.zeros(1, 2, 3)), r"shape \[B,Q,2\]"),
    (lambda: (torch.rand(1, 3, 64, 64), torch.zeros(1, 2, 2, dtype=torch.bool)), "real numbers"),
    (lambda: ((torch.rand(1, 3, 64, 64) * 255).to(torch.uint8), torch.zeros(1, 1, 2)), "divide uint8 images by 255"),
    (lambda: (torch.rand(1, 3, 64, 64) * 2, torch.zeros(1, 1, 2)), r"in \[0,1\]"),
    (lambda: (torch.full((1, 3, 64, 64), float("nan")), torch.zeros(1, 1, 2)), "non-finite"),
    (lambda: ("not a tensor", torch.zeros(1, 1, 2)), "must be a torch.Tensor"),
]


@pytest.mark.parametrize("make,msg", BAD)
@pytest.mark.parametrize("path", ["forward", "forward_masked", "forward_dense"])
def test_bad_input_raises_clear_error(tiny, make, msg, path):
    img, pts = make()
    with pytest.raises(ValueError, match=msg):
        getattr(tiny, path)(img, pts)


def test_export_is_static_graph(tiny):
    class Packed(torch.nn.Module):
        def __init__(self, m, k):
            super().__init__()
            self.m, self.k = m, k

        def forward(self, images, points):
            return self.m.packed_core(images, points, self.k)

    img, pts = rand_inputs(16, 1, 16)
    ep = torch.export.export(Packed(tiny, 16), (img, pts), strict=False)
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    banned = [o for o in ops if any(b in o for b in ("nonzero", "unique", "aten.item", "_local_scalar_dense", "masked_select"))]
    assert not banned, banned
    assert not ep.range_constraints  # no symbolic, data-dependent sizes
    img2, pts2 = rand_inputs(17, 1, 16)
    with torch.no_grad():
        assert (ep.module()(img2, pts2) - tiny.packed_core(img2, pts2, 16)).abs().max() < ATOL


def test_embedding_equals_timm_conv(tiny):
    # patches and anchors are embedded as a matmul: it must equal timm's patch-embedding conv
    from depthpack.core.model import patchify

    x = torch.randn(2, 3, 64, 64)
    conv = tiny.backbone.patch_embed.proj(x).flatten(2).transpose(1, 2)
    index = torch.arange(64).expand(2, 64)
    with torch.no_grad():
        ours = tiny.embed_patches(x, index) - tiny.backbone.pos_embed[:, 1:]
    assert (ours - conv).abs().max() < 1e-5
    assert patchify(x, 8).shape == (2, 64, 192)


def test_timm_backbone_checkpoint_loads_unchanged(tmp_path):
    from safetensors.torch import save_file
    from timm.models.vision_transformer import VisionTransformer

    src = VisionTransformer(img_size=64, patch_size=8, embed_dim=64, depth=2, num_heads=2, init_values=1e-5, num_classes=0)
    torch.nn.init.normal_(src.pos_embed)
    path = tmp_path / "backbone.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    m = create_model("tiny", backbone_weights=str(path))
    for k, v in src.state_dict().items():
        assert torch.equal(m.backbone.state_dict()[k], v), k
    with pytest.raises(ValueError, match="no such file"):
        create_model("tiny", backbone_weights=str(tmp_path / "missing.pth"))


PARAMS_M = {"tiny": 0.13, "small": 0.88, "vits": 22.2, "vitb": 86.8, "vitl": 304.7}  # the README's table


@pytest.mark.parametrize("preset", sorted(PARAMS_M))
def test_presets(preset):
    """Every preset builds its architecture (on the meta device: no memory), with the README's size,
    the DINOv2 backbone shape for vit*, and a packed forward of the right shape."""
    from depthpack.core.config import model_config

    cfg = model_config(preset)
    with torch.device("meta"):
        m = create_model(preset).eval()
    assert abs(sum(p.numel() for p in m.parameters()) / 1e6 - PARAMS_M[preset]) <= 0.06
    if preset.startswith("vit"):
        assert (cfg.img_size, cfg.patch_size) == ((518, 518), 14)
        assert m.backbone.pos_embed.shape == (1, 1 + 37 * 37, cfg.embed_dim)  # DINOv2's 518 / 14 grid
        assert len(m.backbone.blocks) == cfg.depth and m.backbone.blocks[0].attn.num_heads == cfg.num_heads
    H, W = cfg.img_size
    img = torch.empty(1, 3, H, W, device="meta")
    pts = torch.empty(1, 5, 2, device="meta")
    with torch.no_grad():
        assert m.packed_core(img, pts, cfg.buckets[0]).shape == (1, 5)


def test_config_errors():
    from depthpack.core.config import model_config

    with pytest.raises(ValueError, match="unknown preset"):
        model_config("huge")
    with pytest.raises(ValueError, match="unknown ModelConfig key"):
        model_config("tiny", depht=3)
    with pytest.raises(ValueError, match="multiples of patch_size"):
        model_config("tiny", img_size=(60, 64))


def test_dtype_cast_keeps_selection_exact():
    # model.to(bf16) must not round the selection tie-breaker or the offset frequencies
    from depthpack.core.packing import spread_rank

    m = create_model("vits").to(torch.bfloat16)
    assert m.spread_rank.dtype == torch.int64 and len(set(m.spread_rank.tolist())) == m.cfg.num_patches
    assert torch.equal(m.spread_rank, spread_rank(*m.cfg.grid))
    assert m.head.freq.dtype == torch.float32


def test_bf16_close_to_float32(tiny):
    img, pts = rand_inputs(20, 2, 20)
    with torch.no_grad():
        ref = tiny(img, pts)
        low = create_model("tiny")
        low.load_state_dict(tiny.state_dict())
        low = low.to(torch.bfloat16).eval()
        out = low(img, pts)
    assert out.dtype == torch.float32
    assert ((out - ref).abs() / ref).max() < 5e-2  # bf16 operands: ~1e-2 relative


def test_head_position_term_keeps_the_paths_equal():
    """head_abs_pos: the head also reads where the point is; packed = masked, full bucket = dense,
    and the dense map equals querying each pixel."""
    m = randomize_(create_model("tiny", head_abs_pos=True, query_head="direct")).eval()
    img, pts = rand_inputs(21, 2, 12)
    ipts = pts.floor()
    with torch.no_grad():
        assert (m(img, pts) - m.forward_masked(img, pts)).abs().max() < ATOL
        assert (m.packed_core(img, pts, m.cfg.num_patches) - m.forward_dense(img, pts)).abs().max() < ATOL
        dmap, q = m.forward_dense(img), m.forward_dense(img, ipts)
        off = m.forward_dense(img, ipts)
    b, il = torch.arange(2)[:, None], ipts.long()
    assert (dmap[b, il[..., 1], il[..., 0]] - q).abs().max() < ATOL
    plain = create_model("tiny", query_head="direct").eval()
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("head.pos.")})
    with torch.no_grad():
        assert (plain.forward_dense(img, ipts) - off).abs().max() > 1e-3  # the term is really there


@pytest.mark.parametrize("kernels,tol", [({"selection": "count"}, 1e-5), ({"gelu_epilogue": True}, 2e-3),
                                         ({"selection": "count", "gelu_epilogue": True}, 2e-3),
                                         ({"fold_input": True}, 1e-5)])
def test_recipe_kernels_equal_the_plain_path(tiny, kernels, tol):
    """Each kernel of the fast recipe computes the plain path's function on fresh random inputs: the counting
    selection exactly the same set (float32 rounding in attention's key order), the GELU epilogue within
    its tanh approximation; the deployed copy keeps the state dict's keys and the caller's model is plain."""
    from depthpack.core.fast import Recipe

    fast = tiny.deployed(Recipe(**kernels))
    folded = {"folded_embedding.0", "folded_embedding.1"} if kernels.get("fold_input") else set()
    assert set(fast.state_dict()) == set(tiny.state_dict()) | folded and tiny.selection == "topk"
    for seed in range(3):
        img, pts = rand_inputs(40 + seed, 2, 37)
        with torch.no_grad():
            torch.testing.assert_close(fast(img, pts), tiny(img, pts), rtol=tol, atol=tol)
            torch.testing.assert_close(fast.forward_dense(img, pts), tiny.forward_dense(img, pts), rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="recipe selection 'sort'"):
        Recipe(selection="sort")


@pytest.mark.parametrize("over", [dict(), dict(context="glance", glance_grid=(4, 4)), dict(context="glance", glance_grid=(2, 4))])
def test_folded_input_normalization_is_the_same_embedding(over):
    """fold_input: the normalization folded into the patch embedding, K padded with zero columns to a multiple
    of 8 (3 * 14 * 14 = 588 -> 592 for vits), reads raw pixels and gives the normalized path's tokens in every
    context (each pools by averaging, which commutes with the per-channel affine normalization)."""
    from depthpack.core.fast import Recipe

    m = randomize_(create_model("tiny", **over), seed=3).eval()
    fast = m.deployed(Recipe(fold_input=True))
    img = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert fast.embedding_input(img) is img
        torch.testing.assert_close(fast.anchors(img), m.anchors(m.normalize(img)), rtol=1e-5, atol=1e-5)
        index = torch.randperm(64, generator=torch.Generator().manual_seed(6))[:16].expand(2, 16)
        torch.testing.assert_close(fast.embed_patches(img, index), m.embed_patches(m.normalize(img), index),
                                   rtol=1e-5, atol=1e-5)
    w, _ = create_model("vits").deployed(Recipe(fold_input=True)).patch_linear()
    assert w.shape == (384, 592) and w[:, 588:].abs().max() == 0


CONTEXTS = [dict(context="glance", glance_grid=(4, 4)), dict(context="glance", glance_grid=(2, 4), glance_depth=False),
            dict(context="glance", glance_grid=(8, 8), registers=4), dict(context="thumbnail", registers=2)]


@pytest.mark.parametrize("ctx", CONTEXTS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_context_tokens_keep_packed_equal_to_masked_and_dense(ctx):
    """Every context layout ([cls | registers | anchors | patches]): packed == masked exactly, every patch
    selected == dense, and the context tokens really carry the image (switched off, the answers move)."""
    m = randomize_(create_model("tiny", **ctx), seed=5).eval()
    assert m.num_prefix() == m.cfg.num_prefix == 1 + ctx.get("registers", 0) + m.cfg.num_anchors
    for seed in range(2):
        img, pts = rand_inputs(60 + seed, 2, 23)
        with torch.no_grad():
            packed = m(img, pts)
            torch.testing.assert_close(packed, m.forward_masked(img, pts), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(m.packed_core(img, pts, 64), m.forward_dense(img, pts), rtol=1e-5, atol=1e-5)
            if m.cfg.query_head == "residual":  # it corrects the glance depth: no answer without the glance
                with pytest.raises(ValueError, match="needs the glance tokens"):
                    m(img, pts, anchors=False)
                continue
            off = m(img, pts, anchors=False)
        assert (off - packed).abs().max() > 1e-3


def test_glance_tokens_see_the_whole_image_at_their_regions():
    """A glance token is its region of the image, box-filtered to one patch, at the position embedding of the
    region's centre: changing one region's pixels changes that token alone, and the token equals the patch
    embedding of the region's average when the region is flat."""
    m = randomize_(create_model("tiny", context="glance", glance_grid=(4, 4)), seed=6).eval()
    x = m.normalize(torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():
        a = m.anchors(x)
        y = x.clone()
        y[:, :, 16:32, 32:48] += 0.5  # region (1, 2) of the 4x4 grid
        b = m.anchors(y)
    changed = ((a - b).abs().amax(-1) > 1e-6)[0]
    assert changed.tolist() == [i == 1 * 4 + 2 for i in range(16)]
    flat = torch.zeros(1, 3, 64, 64)
    with torch.no_grad():
        tok = m.anchors(flat)[0, 5]
        w, bias = m.patch_linear()
        pos = torch.nn.functional.interpolate(m.patch_pos(8, 8).reshape(1, 8, 8, -1).permute(0, 3, 1, 2), size=(4, 4),
                                              mode="bicubic", align_corners=False, antialias=True)
        want = bias + pos[0, :, 1, 1] + m.anchor_scale[0, 0]
    torch.testing.assert_close(tok, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("over, msg", [(dict(context="glance", glance_grid=(5, 4)), "glance_grid \\(5, 4\\) must be two"),
                                       (dict(context="glance", glance_grid=(0, 4)), "glance_grid"),
                                       (dict(context="pooled"), "context 'pooled' must be one of"),
                                       (dict(registers=9), "registers 9 must lie in \\[0, 8\\]"),
                                       (dict(context="sparse"), "context 'sparse' must be one of")])
def test_context_config_errors_name_the_field(over, msg):
    with pytest.raises(ValueError, match=msg):
        create_model("tiny", **over)
