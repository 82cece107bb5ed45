"""Metric depth that follows the focal length: the canonical-camera scaling, its bounds, its
defaults, the same function on every path, and a static graph with focal as a tensor input."""
import math

import pytest
import torch

from depthpack import create_model
from depthpack.core.config import model_config
from conftest import randomize_
from test_model import ATOL, rand_inputs

FC = 40.0


@pytest.fixture
def focal_model():
    return randomize_(create_model("tiny", canonical_focal=FC)).eval()


def test_off_by_default_weights_and_outputs_unchanged(tiny):
    assert tiny.cfg.canonical_focal is None and not tiny.cfg.uses_focal
    on = create_model("tiny", canonical_focal=FC)
    assert set(tiny.state_dict()) == set(on.state_dict())  # no new parameters: old checkpoints load
    img, pts = rand_inputs(0, 2, 9)
    with torch.no_grad():
        plain = tiny(img, pts)
        for f in (None, 10.0, [5.0, 80.0], torch.tensor([0.0, 33.0])):
            assert torch.equal(tiny(img, pts, f), plain)  # ignored without canonical_focal
        assert torch.equal(tiny.forward_dense(img, focal=30.0), tiny.forward_dense(img))
    assert tiny.focal_scale(img, torch.tensor([1.0, 2.0])) is None


def test_output_scales_with_the_focal_on_every_path(focal_model):
    m = focal_model
    img, pts = rand_inputs(1, 2, 12)
    with torch.no_grad():
        base = m(img, pts)
        assert torch.equal(m(img, pts, FC), base)  # the canonical camera itself
        assert torch.equal(m(img, pts, torch.tensor([0.0, 0.0])), base)  # 0 = unknown: the default (= FC)
        f = torch.tensor([FC * 1.5, FC * 0.75])
        scaled = m(img, pts, f)
        inside = (base * (f / FC)[:, None] > m.cfg.min_depth) & (base * (f / FC)[:, None] < m.cfg.max_depth)
        assert inside.all()
        torch.testing.assert_close(scaled, base * (f / FC)[:, None], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(m.forward_masked(img, pts, f), scaled, atol=ATOL, rtol=0)
        img_all, pts_all = rand_inputs(2, 2, 64)
        full = m.forward_dense(img_all, pts_all, f)
        torch.testing.assert_close(m(img_all, pts_all, f), full, atol=ATOL, rtol=0)  # 64 queries: every patch
        dmap = m.forward_dense(img, focal=f)  # the dense map too
        xy = pts.long()
        at = torch.stack([dmap[b, xy[b, :, 1], xy[b, :, 0]] for b in range(2)])
        torch.testing.assert_close(m.forward_dense(img, pts.floor(), f), at, atol=ATOL, rtol=0)


def test_focal_default_and_size_normalization():
    m = randomize_(create_model("tiny", canonical_focal=FC, focal_default=60.0)).eval()
    img, pts = rand_inputs(3, 1, 5)
    with torch.no_grad():
        assert torch.equal(m(img, pts), m(img, pts, 60.0))
        assert torch.equal(m(img, pts, 0.0), m(img, pts, 60.0))
    # the focal is compared at the model's size: twice the pixels, twice the focal, the same scale
    big = torch.rand(1, 3, 128, 128)
    assert torch.allclose(m.focal_scale(big, torch.tensor([2 * FC])), torch.tensor([1.0]))
    assert torch.allclose(m.focal_scale(img, torch.tensor([FC])), torch.tensor([1.0]))


def test_bounds_every_metric_depth_reachable_and_never_exceeded(focal_model):
    m = focal_model
    lo, hi = m.cfg.focal_ratio_range
    img, pts = rand_inputs(4, 1, 6)
    last = m.head.mlp[-1]
    with torch.no_grad():
        for bias, want in ((-1e4, m.cfg.min_depth), (1e4, m.cfg.max_depth)):  # the head's extremes
            last.weight.zero_()
            last.bias.fill_(bias)
            for ratio in (lo, 1.0, hi):  # each extreme of the metric range is reached at any supported ratio
                out = m(img, pts, FC * ratio)
                torch.testing.assert_close(out, torch.full_like(out, want), rtol=1e-5, atol=0)
            for ratio in (lo / 4, 4 * hi):  # outside the range: clamped to the metric range, never beyond
                out = m(img, pts, FC * ratio)
                assert (out >= m.cfg.min_depth).all() and (out <= m.cfg.max_depth).all()


def test_canonical_range_widened_by_the_ratio_range():
    for kw in (dict(query_head="direct"), {}):  # the direct head's range, or the glance head's (the residual's base)
        m = create_model("tiny", canonical_focal=FC, focal_ratio_range=(0.25, 4.0), **kw)
        head = m.head if m.cfg.query_head == "direct" else m.glance_head
        assert math.exp(head.log_min) == pytest.approx(m.cfg.min_depth / 4.0)
        assert math.exp(head.log_max) == pytest.approx(m.cfg.max_depth / 0.25)
        off = create_model("tiny", **kw)
        head = off.head if off.cfg.query_head == "direct" else off.glance_head
        assert (math.exp(head.log_min), math.exp(head.log_max)) == pytest.approx((off.cfg.min_depth, off.cfg.max_depth))


@pytest.mark.parametrize("focal,msg", [
    (-1.0, "not finite and >= 0"), (float("nan"), "not finite"), ([1.0, float("inf")], "first inf at \\[1\\]"),
    ([1.0, 2.0, 3.0], "shape \\[B\\] = \\[2\\]"), ("wide", "could not convert"), (torch.tensor([True, False]), "real numbers"),
])
def test_bad_focal_is_one_clear_error(focal_model, focal, msg):
    img, pts = rand_inputs(5, 2, 3)
    with pytest.raises(ValueError, match=msg):
        focal_model(img, pts, focal)


@pytest.mark.parametrize("bad,msg", [
    (dict(canonical_focal=-3.0), "canonical_focal must be a positive"),
    (dict(focal_default=50.0), "focal_default needs canonical_focal"),
    (dict(canonical_focal=40.0, focal_ratio_range=(1.5, 2.0)), "focal_ratio_range"),
])
def test_config_checks(bad, msg):
    with pytest.raises(ValueError, match=msg):
        model_config("tiny", **bad)


def test_export_with_focal_is_a_static_graph(focal_model):
    class Packed(torch.nn.Module):
        def __init__(self, m, k):
            super().__init__()
            self.m, self.k = m, k

        def forward(self, images, points, focal):
            return self.m.packed_core(images, points, self.k, focal)

    img, pts = rand_inputs(6, 2, 16)
    f = torch.tensor([30.0, 0.0])
    ep = torch.export.export(Packed(focal_model, 16), (img, pts, f), strict=False)
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert not [o for o in ops if any(b in o for b in ("nonzero", "aten.item", "_local_scalar_dense"))]
    assert not ep.range_constraints
    img2, pts2 = rand_inputs(7, 2, 16)
    f2 = torch.tensor([0.0, 55.0])
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(img2, pts2, f2), focal_model.packed_core(img2, pts2, 16, f2),
                                   atol=ATOL, rtol=0)


def test_training_objective_sees_the_focal():
    from depthpack.train.losses import PackedObjective

    m = randomize_(create_model("tiny", canonical_focal=FC))
    obj = PackedObjective(m, 0.5)
    img, pts = rand_inputs(8, 2, 8)
    target = torch.full((2, 8), 3.0)
    valid = torch.ones(2, 8, dtype=torch.bool)
    a = obj(img, pts, target, valid, 8, None, torch.tensor([FC, FC]))[0]
    b = obj(img, pts, target, valid, 8, None, torch.tensor([FC, 2 * FC]))[0]
    assert not torch.allclose(a, b)
    c = obj(img, pts, target, valid, 8, None, None)[0]
    torch.testing.assert_close(a, c)


def test_one_focal_factor_for_data_runtime_packages_and_model():
    """sqrt(fx' fy') after a resize: the data sets, the runtimes, the packages' manifest and the model
    all take it from core.preprocess.focal_factor, and it is what the definition says."""
    import math

    import torch

    from depthpack.core.model import create_model
    from depthpack.core.preprocess import focal_at_size, focal_factor, scale_focal
    from depthpack.deploy.contract import input_scale

    fx, fy, (h, w), (H, W) = 520.0, 515.0, (480, 640), (64, 96)
    want = math.sqrt((fx * W / w) * (fy * H / h))
    assert math.isclose(focal_at_size(fx, fy, (h, w), (H, W)), want, rel_tol=1e-12)
    f = torch.tensor([math.sqrt(fx * fy), 0.0])
    assert torch.allclose(scale_focal(f, (h, w), (H, W)), torch.tensor([want, 0.0]), rtol=1e-6)
    assert input_scale((H, W), {"size": (h, w)}) == focal_factor((h, w), (H, W)) and input_scale((H, W), None) == 1.0
    model = create_model("tiny", canonical_focal=48.0)
    H0, W0 = model.cfg.img_size
    images = torch.zeros(1, 3, 2 * H0, 2 * W0)  # the same camera at twice the size: twice the focal in pixels
    assert torch.allclose(model.focal_scale(images, torch.tensor([96.0])), torch.tensor([1.0]))
