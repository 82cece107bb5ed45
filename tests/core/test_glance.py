"""The glance as a low-resolution depth model: its LIIF ensemble, the residual query head that corrects
it, its map, its loss, and packed == masked with both."""
import math

import pytest
import torch

from depthpack import create_model
from depthpack.core.model import GlanceHead, scaled_depth
from depthpack.train.batches import glance_targets
from depthpack.train.losses import PackedObjective
from conftest import randomize_
from test_model import ATOL, rand_inputs

GLANCE = dict(context="glance", glance_grid=(4, 4), glance_depth=True)


@pytest.fixture(scope="module")
def residual():
    return randomize_(create_model("tiny", query_head="residual", **GLANCE), seed=3).eval()


@pytest.mark.parametrize("B,Q,seed", [(1, 5, 0), (2, 16, 1), (2, 64, 2)])
def test_packed_equals_masked_with_the_glance_and_the_residual_head(residual, B, Q, seed):
    img, pts = rand_inputs(seed, B, Q)
    with torch.no_grad():
        packed, masked = residual(img, pts), residual.forward_masked(img, pts)
        dense = residual.forward_dense(img, pts)
    assert (packed - masked).abs().max() < ATOL and packed.shape == (B, Q)
    if Q >= 64:  # every patch selected: the packed buffer is the dense one
        assert (packed - dense).abs().max() < ATOL


def test_a_zero_residual_answers_with_the_glance_depth_at_the_point():
    m = randomize_(create_model("tiny", query_head="residual", **GLANCE), seed=4).eval()
    torch.nn.init.zeros_(m.head.mlp[-1].weight)
    torch.nn.init.zeros_(m.head.mlp[-1].bias)
    img, pts = rand_inputs(5, 2, 16)
    with torch.no_grad():
        index, slot = m.select(img, pts, 16)
        _, glance = m.encode(img, index)
        want = torch.exp(m.glance_head.log_depth(m.glance_head.token_features(glance), pts, (64, 64)))
        assert torch.allclose(m.packed_core(img, pts, 16), want.clamp(m.cfg.min_depth, m.cfg.max_depth), atol=1e-6)


def test_the_ensemble_blends_the_four_nearest_tokens_bilinearly():
    head = GlanceHead(8, 16, 2, (2, 3), (math.log(0.1), math.log(20.0)))
    g = torch.Generator().manual_seed(0)
    for p in head.parameters():
        p.data = torch.randn(p.shape, generator=g)
    gtok = torch.randn(1, 6, 16, generator=g)
    hw = (40, 60)  # cells of 20 x 20 pixels; centres at x = 10, 30, 50 and y = 10, 30

    def own(token, point):  # one token decoding the point nearest to `point` inside its own cell
        cy, cx = divmod(token, 3)
        u = (torch.tensor(point) / 20.0 - 0.5 - torch.tensor([cx, cy], dtype=torch.float32)).clamp(-0.5, 0.5)
        t = torch.sigmoid(head.value(gtok[0, token], u))
        return head.log_min + (head.log_max - head.log_min) * t
    at = lambda *xy: head.log_depth(gtok, torch.tensor([[list(xy)]], dtype=torch.float32), hw)[0, 0]  # noqa: E731
    assert torch.allclose(at(30.0, 10.0), own(1, [30.0, 10.0]), atol=1e-6)  # on a centre: that token alone
    # a quarter of the way from centre (0, 0) to (1, 1): bilinear weights 9/16, 3/16, 3/16, 1/16
    p = [15.0, 15.0]
    want = (9 * own(0, p) + 3 * own(1, p) + 3 * own(3, p) + own(4, p)) / 16
    assert torch.allclose(at(*p), want, atol=1e-6)
    # outside the outer centres the nearest ones carry it (no token beyond the grid)
    assert torch.allclose(at(2.0, 2.0), own(0, [2.0, 2.0]), atol=1e-6)
    # the map's decoding: the token of the point's own cell alone
    pts = torch.tensor([[[15.0, 15.0], [25.0, 5.0], [59.0, 39.0]]])
    want = torch.stack([own(0, [15.0, 15.0]), own(1, [25.0, 5.0]), own(5, [59.0, 39.0])])
    assert torch.allclose(head.own(gtok, pts, hw)[0], want, atol=1e-6)


def test_the_map_is_the_glance_head_at_every_pixel_of_the_glance_image(residual):
    img, pts = rand_inputs(7, 2, 10)
    with torch.no_grad():
        depth, dmap = residual.packed_map_core(img, pts, 16)
        assert torch.equal(depth, residual.packed_core(img, pts, 16))
        _, glance = residual.encode(img, residual.select(img, pts, 16)[0])
        rows, cols = residual.cfg.glance_map_size
        assert dmap.shape == (2, rows, cols) == (2, 32, 32)
        ys, xs = torch.meshgrid(torch.arange(rows) + 0.5, torch.arange(cols) + 0.5, indexing="ij")
        centres = torch.stack([xs * 64 / cols, ys * 64 / rows], -1).reshape(1, -1, 2).expand(2, -1, -1)
        alone = residual.glance_head.own(residual.glance_head.token_features(glance), centres, (64, 64))
        torch.testing.assert_close(dmap.reshape(2, -1), scaled_depth(alone, None, 0.1, 20.0, clamp=True))


def test_the_glance_loss_ignores_invalid_pixels(residual):
    img, pts = rand_inputs(8, 2, 8)
    depth = 1.0 + 5.0 * torch.rand(2, 64, 64, generator=torch.Generator().manual_seed(1))
    valid = torch.rand(2, 64, 64, generator=torch.Generator().manual_seed(2)) > 0.3
    target, tvalid = glance_targets(torch.where(valid, depth, 0.0), valid, residual.cfg.glance_map_size)
    assert tvalid.shape == (2, 32, 32) and 0 < tvalid.float().mean() < 1
    obj = PackedObjective(residual, 0.5)
    q = torch.ones(2, 8)
    args = (img, pts, q, q.bool(), 16, None, None)
    loss = obj(*args, (target, tvalid))[1]["glance"]
    for junk in (float("nan"), float("inf"), -3.0, 1e6):  # whatever the invalid pixels hold
        again = obj(*args, (torch.where(tvalid, target, junk), tvalid))[1]["glance"]
        assert torch.equal(loss, again)
    # the glance targets are the depth at the glance image's pixel centres, never a blend
    assert set(target[tvalid].tolist()) <= set(depth[valid].tolist())


@pytest.mark.parametrize("kw, match", [(dict(context="thumbnail", glance_depth=True), "glance_depth needs context 'glance'"),
                                       (dict(glance_depth=False, query_head="residual"), "needs glance_depth"),
                                       (dict(query_head="mixture"), "query_head 'mixture' must be one of")])
def test_the_glance_options_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        create_model("tiny", **kw)


@pytest.mark.parametrize("kw, layout", [({}, ("glance", (4, 4), True, "residual")),
                                        (dict(context="thumbnail"), ("thumbnail", None, False, "direct")),
                                        (dict(glance_depth=False), ("glance", (4, 4), False, "direct")),
                                        (dict(img_size=(48, 96)), ("glance", (2, 4), True, "residual"))])
def test_the_default_layout_follows_the_context(kw, layout):
    """The default is the glance with its depth and the residual head; the thumbnail context alone turns both
    off; the glance grid is the divisor of the image nearest 2.5 patches a region."""
    c = create_model("tiny", **kw).cfg
    assert (c.context, c.glance_grid, c.glance_depth, c.query_head) == layout
