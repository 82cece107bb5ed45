"""The one-way glance stream (model.glance_stream oneway): the prefix (cls, registers, glance) reads only itself,
so its features and the map are one per image, whatever the points, the bucket, the chunks, or none; every
attention implementation keeps a prefix row from reading a patch key; the shared layout still loads and runs."""
import json

import pytest
import torch

from depthpack import create_model
from depthpack.core.checkpoint import load_model, save_checkpoint
from depthpack.core.config import model_config, stored_model_config, to_dict
from depthpack.kernels.vit_block import attention, attn_proj_res_reference
from conftest import randomize_
from test_model import ATOL, rand_inputs

GLANCE = dict(context="glance", glance_grid=(4, 4))


@pytest.fixture(scope="module")
def oneway():
    return randomize_(create_model("tiny", registers=2, **GLANCE), seed=11).eval()


def _glance(m, img, pts, bucket):
    return m.encode(img, m.select(img, pts, bucket)[0])[1]


def test_glance_features_and_map_do_not_depend_on_the_points(oneway):
    """Two point sets, every bucket, chunked Q and no points at all: one glance, one map (bit-equal here)."""
    assert oneway.cfg.glance_stream == "oneway" and oneway.cfg.num_prefix == 1 + 2 + 16
    img = rand_inputs(0, 2, 1)[0]
    with torch.no_grad():
        want = oneway.glance_map_core(img)
        glance0, _ = oneway.encode_prefix(img)
        for seed, (q, bucket) in enumerate([(3, 8), (8, 8), (11, 16), (30, 32), (64, 64)]):
            pts = rand_inputs(100 + seed, 2, q)[1]
            assert torch.equal(_glance(oneway, img, pts, bucket), glance0), f"glance features at Q{q} bucket {bucket}"
            _, dmap = oneway.packed_map_core(img, pts, bucket)
            assert torch.equal(dmap, want), f"map at Q{q} bucket {bucket}"
        _, dense_glance = oneway.encode(img)  # every patch: the dense path's glance is the same stream
        assert torch.equal(dense_glance, glance0)


def test_a_shared_glance_moves_with_the_points():
    """The reference the one-way rule is there for: with glance_stream shared the map depends on the points."""
    shared = randomize_(create_model("tiny", glance_stream="shared", **GLANCE), seed=11).eval()
    img, pts = rand_inputs(1, 2, 8)
    with torch.no_grad():
        a = shared.packed_map_core(img, pts, 8)[1]
        b = shared.packed_map_core(img, rand_inputs(2, 2, 8)[1], 8)[1]
    assert (a - b).abs().max() > 1e-3
    with pytest.raises(ValueError, match="glance_stream oneway"):
        shared.glance_map_core(img)


def test_chunks_read_the_prefix_run_once(oneway):
    """Q above the largest bucket: the prefix once, its keys and values read by each chunk, equal to each chunk
    running its own prefix (within float32 rounding: other GEMM shapes)."""
    img, pts = rand_inputs(3, 2, 150)
    with torch.no_grad():
        once, again = oneway(img, pts), oneway(img, pts, prefix_once=False)
    torch.testing.assert_close(once, again, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("B,Q,seed", [(1, 5, 0), (2, 16, 1), (2, 64, 2)])
def test_packed_equals_masked_and_dense_one_way(oneway, B, Q, seed):
    img, pts = rand_inputs(seed, B, Q)
    with torch.no_grad():
        packed, masked, dense = oneway(img, pts), oneway.forward_masked(img, pts), oneway.forward_dense(img, pts)
    assert (packed - masked).abs().max() < ATOL
    if Q >= 64:
        assert (packed - dense).abs().max() < ATOL


def _prefix_rows_blind(fn, P: int, S: int, seed: int) -> None:
    """fn(q, k, v) [B,H,S,hd] -> [B,S,H,hd]: the first P rows do not change when every key and value past P
    does; the other rows do (they read them)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, S, 16, generator=g) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, P:] += torch.randn(k2[:, :, P:].shape, generator=g)
    v2[:, :, P:] += torch.randn(v2[:, :, P:].shape, generator=g)
    a, b = fn(q, k, v), fn(q, k2, v2)
    assert torch.equal(a[:, :P], b[:, :P]), "a prefix row read a patch key"
    assert (a[:, P:] - b[:, P:]).abs().max() > 0


@pytest.mark.parametrize("P,S", [(1, 9), (5, 40), (17, 18)])
def test_no_prefix_row_sees_a_patch_key_eager(P, S):
    _prefix_rows_blind(lambda q, k, v: attention(q, k, v, P), P, S, seed=P)
    mask = torch.zeros(2, 1, 1, S)
    mask[0, ..., S - 1] = torch.finfo(torch.float32).min  # a key mask on the patch keys, as the masked path's
    _prefix_rows_blind(lambda q, k, v: attention(q, k, v, P, mask), P, S, seed=P + 1)
    # the one-way rule is the causal-like mask written out
    g = torch.Generator().manual_seed(P)
    q, k, v = (torch.randn(2, 3, S, 16, generator=g) for _ in range(3))
    allowed = torch.ones(S, S, dtype=torch.bool)
    allowed[:P, P:] = False
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(1, 2)
    torch.testing.assert_close(attention(q, k, v, P), want, rtol=1e-5, atol=1e-6)


def test_no_prefix_row_sees_a_patch_key_in_the_kernels_reference():
    """attn_proj_res_reference (what the Triton kernel is held to) takes the prefix the same way."""
    g = torch.Generator().manual_seed(5)
    B, S, D, H, P = 2, 30, 32, 2, 7
    qkv, x = torch.randn(B * S, 3 * D, generator=g), torch.randn(B, S, D, generator=g)
    w, b = torch.randn(D, D, generator=g) * D ** -0.5, torch.randn(D, generator=g)
    qkv2 = qkv.view(B, S, 3, D).clone()
    qkv2[:, P:, 1:] += torch.randn(qkv2[:, P:, 1:].shape, generator=g)  # every patch key and value
    a = attn_proj_res_reference(qkv, x, w, b, None, H, P)
    c = attn_proj_res_reference(qkv2.view(B * S, 3 * D), x, w, b, None, H, P)
    assert torch.equal(a[:, :P], c[:, :P]) and (a[:, P:] - c[:, P:]).abs().max() > 1e-3


def test_no_prefix_row_sees_a_patch_token_masked_path(oneway):
    """The masked baseline: its key mask combined with the one-way rule; the patches' pixels move, the glance
    stays (its features through the masked path equal the prefix run alone)."""
    img, pts = rand_inputs(6, 2, 16)
    with torch.no_grad():
        want, _ = oneway.encode_prefix(img)
        index, _ = oneway.select(img, pts, 16)
        from depthpack.core.packing import key_mask_from_index
        keep = key_mask_from_index(index, 64, oneway.num_prefix())
        mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)[:, None, None, :]
        _, got = oneway.encode(img, None, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_query_loss_trains_the_one_way_glance_too():
    """The patches read the glance (keys and values of every block) and the residual corrects its depth: the query
    loss alone reaches the glance's own parameters (a stop-gradient there, glance_detach, measured worse and left)."""
    from depthpack.train.losses import PackedObjective

    m = randomize_(create_model("tiny", **GLANCE), seed=2).train()
    img, pts = rand_inputs(7, 2, 16)
    target, valid = torch.rand(2, 16) * 5 + 1, torch.ones(2, 16, dtype=torch.bool)
    loss, _ = PackedObjective(m, 0.5)(img, pts, target, valid, 16)  # no glance loss given
    loss.backward()
    assert m.anchor_scale.grad.abs().max() > 0 and m.glance_head.tok.weight.grad.abs().max() > 0
    assert m.head.tok.weight.grad.abs().max() > 0


def test_old_checkpoints_load_as_shared(tmp_path):
    """A checkpoint stored before glance_stream existed ran the shared layout: it loads and runs as shared."""
    cfg = model_config("tiny", glance_stream="shared", **GLANCE)
    m = randomize_(create_model(cfg), seed=4).eval()
    stored = to_dict(cfg)
    del stored["glance_stream"]
    save_checkpoint(tmp_path, 1, m, {}, {"model": stored, "train": {}})
    loaded = load_model(tmp_path)
    assert loaded.cfg.glance_stream == "shared"
    img, pts = rand_inputs(8, 1, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(img, pts), m(img, pts), rtol=0, atol=0)
    assert stored_model_config(json.loads(json.dumps(to_dict(model_config("tiny"))))).glance_stream == "oneway"


@pytest.mark.parametrize("over, match", [
    (dict(glance_stream="twoway"), "glance_stream 'twoway' must be one of oneway, shared"),
    (dict(context="thumbnail", glance_stream="oneway"), "glance_stream 'oneway' needs context 'glance'"),
])
def test_bad_glance_stream_is_one_clear_error(over, match):
    with pytest.raises(ValueError, match=match):
        model_config("tiny", **over)
