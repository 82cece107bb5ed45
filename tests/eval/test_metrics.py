"""eval_depth against hand-computed values, the accumulator's two averages, SiLogLoss against DAv2's."""
import math

import pytest
import torch

from depthpack.train.losses import SiLogLoss
from depthpack.eval.metrics import METRICS, MetricAccumulator, eval_depth

# pred / gt ratios 1, 1.2, 1.8: inside 1.25 twice, inside 1.25^3 = 1.953 three times.
PRED = torch.tensor([2.0, 1.2, 1.8])
GT = torch.tensor([2.0, 1.0, 1.0])


def hand_metrics():
    g = [0.0, math.log(1.2), math.log(1.8)]
    return dict(d1=2 / 3, d2=2 / 3, d3=1.0, abs_rel=(0 + 0.2 + 0.8) / 3, sq_rel=(0 + 0.04 + 0.64) / 3,
                rmse=math.sqrt((0 + 0.04 + 0.64) / 3), rmse_log=math.sqrt(sum(x * x for x in g) / 3),
                log10=(0 + math.log10(1.2) + math.log10(1.8)) / 3,
                silog=math.sqrt(sum(x * x for x in g) / 3 - 0.5 * (sum(g) / 3) ** 2))


def test_eval_depth_hand_computed():
    got = eval_depth(PRED, GT)
    want = hand_metrics()
    assert set(got) == set(METRICS)
    for k in METRICS:
        assert got[k] == pytest.approx(want[k], rel=1e-6, abs=1e-12), k


def test_mask_ignores_invalid_points_and_shapes():
    pred = torch.tensor([[2.0, 1.2, 99.0], [1.8, 5.0, 0.0]])
    gt = torch.tensor([[2.0, 1.0, 0.0], [1.0, float("nan"), 3.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    got, want = eval_depth(pred, gt, mask), hand_metrics()
    for k in METRICS:
        assert got[k] == pytest.approx(want[k], rel=1e-6, abs=1e-12), k


def test_median_scaling_removes_a_global_scale():
    gt = torch.rand(50, dtype=torch.float64) * 5 + 0.5
    pred = 3.7 * gt
    plain = eval_depth(pred, gt)
    scaled = eval_depth(pred, gt, median_scaling=True)
    assert plain["abs_rel"] == pytest.approx(2.7, rel=1e-9) and plain["d3"] == 0.0
    assert scaled["abs_rel"] < 1e-9 and scaled["d1"] == 1.0 and scaled["silog"] < 1e-6


def test_bad_inputs_are_value_errors():
    with pytest.raises(ValueError, match="mask selects nothing"):
        eval_depth(PRED, GT, torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="pred must be"):
        eval_depth(torch.tensor([1.0, -1.0, 1.0]), GT)
    with pytest.raises(ValueError, match="target must be"):
        eval_depth(PRED, torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        eval_depth(PRED, GT[:2])


def test_accumulator_per_image_and_per_pixel():
    a_p, a_t = PRED, GT  # image 1: 3 points
    b_p, b_t = torch.tensor([1.0]), torch.tensor([2.0])  # image 2: 1 point, abs_rel 0.5
    per_image, per_pixel = MetricAccumulator("image"), MetricAccumulator("pixel")
    for acc in (per_image, per_pixel):
        acc.update(a_p, a_t)
        acc.update(b_p, b_t)
    assert per_image.compute()["abs_rel"] == pytest.approx((1 / 3 + 0.5) / 2)
    assert per_pixel.compute()["abs_rel"] == pytest.approx((0 + 0.2 + 0.8 + 0.5) / 4)
    assert per_pixel.compute()["rmse"] == pytest.approx(math.sqrt((0.04 + 0.64 + 1.0) / 4))
    pooled = eval_depth(torch.cat([a_p, b_p]), torch.cat([a_t, b_t]))
    for k in METRICS:
        assert per_pixel.compute()[k] == pytest.approx(pooled[k], rel=1e-9), k


def test_accumulator_batched_equals_one_by_one():
    g = torch.Generator().manual_seed(0)
    pred, gt = torch.rand(3, 4, 5, generator=g) + 0.1, torch.rand(3, 4, 5, generator=g) + 0.1
    mask = torch.rand(3, 4, 5, generator=g) > 0.3
    a, b = MetricAccumulator(), MetricAccumulator()
    a.update(pred, gt, mask, batched=True)
    for i in range(3):
        b.update(pred[i], gt[i], mask[i])
    assert a.images == 3 and a.compute() == b.compute()
    with pytest.raises(ValueError):
        MetricAccumulator().compute()


def dav2_silog(pred, target, valid_mask, lambd=0.5):
    """Depth-Anything-V2 metric_depth/util/loss.py, verbatim in substance."""
    diff_log = torch.log(target[valid_mask]) - torch.log(pred[valid_mask])
    return torch.sqrt(torch.pow(diff_log, 2).mean() - lambd * torch.pow(diff_log.mean(), 2))


@pytest.mark.parametrize("shape", [(2, 37), (2, 8, 9)])
def test_silog_matches_depth_anything_v2(shape):
    g = torch.Generator().manual_seed(1)
    pred = torch.rand(shape, generator=g) * 5 + 0.2
    target = torch.rand(shape, generator=g) * 5 + 0.2
    mask = torch.rand(shape, generator=g) > 0.4
    target = torch.where(mask, target, torch.zeros(()))  # invalid targets are 0, as in the data
    ours = SiLogLoss()(pred, target, mask)
    ref = dav2_silog(pred, torch.where(mask, target, torch.ones(())), mask)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)


def test_silog_gradients_finite_and_zero_where_masked():
    pred = torch.tensor([[1.0, 2.0, 3.0, 0.0]], requires_grad=True)
    target = torch.tensor([[1.5, 1.0, float("nan"), 0.0]])
    mask = torch.tensor([[True, True, False, False]])
    loss = SiLogLoss()(pred, target, mask)
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0
    assert torch.isfinite(pred.grad).all() and (pred.grad[0, 2:] == 0).all() and (pred.grad[0, :2] != 0).all()
    empty = SiLogLoss()(pred, target, torch.zeros_like(mask))
    assert empty.item() == 0.0 and empty.requires_grad
