"""Bad input, property-based: every call either answers correctly or raises one clear ValueError.

Random shapes, dtypes, NaN/inf, points on and outside every border, empty and huge query sets go
through the public Python API. "Correctly" means: the right shape, finite depths in the configured
range, and the packed answer equal to the masked one (they compute the same function).
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from depthpack import create_model
from conftest import randomize_

MODEL = randomize_(create_model("tiny")).eval()
H = W = 64

coord = st.one_of(
    st.floats(-3, 67, allow_nan=False),
    st.sampled_from([0.0, 63.0, 63.999, 64.0, -0.0, -1e-6, 8.0, 7.999, float("nan"), float("inf"), -float("inf"), 1e30]),
)


@st.composite
def calls(draw):
    B = draw(st.integers(0, 3))
    q = draw(st.sampled_from([0, 1, 2, 7, 64, 65, 300]))
    h = draw(st.sampled_from([64, 64, 64, 48, 60, 0]))
    w = draw(st.sampled_from([64, 64, 64, 80, 63]))
    c = draw(st.sampled_from([3, 3, 3, 1, 4]))
    img_dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.uint8, torch.int64]))
    pts_dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bool]))
    pb = draw(st.sampled_from([B, B, B, B + 1]))
    pts_last = draw(st.sampled_from([2, 2, 2, 3]))
    img = torch.rand(B, c, h, w)
    if img.numel() and draw(st.booleans()):
        img[..., 0, 0] = draw(st.sampled_from([float("nan"), 2.0, -1.0, 0.5]))
    img = img.to(img_dtype) if not img_dtype.is_floating_point else img.to(img_dtype)
    base = torch.rand(pb, q, pts_last) * torch.tensor([w, h, 1.0][:pts_last])
    n_special = min(q, draw(st.integers(0, 3))) if pb else 0
    for i in range(n_special):
        base[0, i, draw(st.integers(0, 1))] = draw(coord)
    pts = base.to(pts_dtype)
    return img, pts


def valid_call(img: torch.Tensor, pts: torch.Tensor) -> bool:
    """The API's contract, written independently of depthpack.core.validation: which inputs must be answered."""
    if not img.is_floating_point() or img.ndim != 4 or img.shape[1] != 3:
        return False
    h, w = img.shape[-2:]
    if h == 0 or w == 0 or h % 8 or w % 8:
        return False
    if img.numel() and not (torch.isfinite(img).all() and img.min() >= 0 and img.max() <= 1):
        return False
    if pts.dtype == torch.bool or pts.ndim != 3 or pts.shape[-1] != 2 or pts.shape[0] != img.shape[0]:
        return False
    p = pts.double()
    return bool(torch.isfinite(p).all() and (p[..., 0] >= 0).all() and (p[..., 0] < w).all()
                and (p[..., 1] >= 0).all() and (p[..., 1] < h).all())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls(), st.sampled_from(["forward", "forward_masked", "forward_dense"]))
def test_answers_correctly_or_raises_clear_error(call, path):
    img, pts = call
    should_answer = valid_call(img, pts)
    try:
        with torch.no_grad():
            out = getattr(MODEL, path)(img, pts)
    except ValueError as e:
        msg = str(e)
        assert msg and len(msg) < 400 and "\n" not in msg, msg
        assert not should_answer, f"a valid call was refused: {msg}"
        return
    assert should_answer, "an invalid call was answered"
    B, Q = pts.shape[0], pts.shape[1]
    assert out.shape == (B, Q) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert (out >= MODEL.cfg.min_depth * (1 - 1e-5)).all() and (out <= MODEL.cfg.max_depth * (1 + 1e-5)).all()
    if path == "forward" and Q and B:
        # the model computes in float32 whatever the input's float dtype: packed and masked see the
        # same converted image, so they agree to float32 rounding
        with torch.no_grad():
            ref = MODEL.forward_masked(img, pts)
        assert (out - ref).abs().max() < 1e-4


def test_valid_calls_of_every_kind_are_answered():
    """Positive controls: a change that refused valid input would fail here, whatever hypothesis draws."""
    g = torch.Generator().manual_seed(3)
    for img, pts in [(torch.rand(2, 3, 64, 64, generator=g), torch.rand(2, 7, 2, generator=g) * 63.9),
                     (torch.rand(1, 3, 48, 80, generator=g).double(), torch.tensor([[[0, 0], [79, 47]]])),
                     (torch.rand(1, 3, 64, 64, generator=g).bfloat16(), torch.zeros(1, 0, 2)),
                     (torch.zeros(1, 3, 64, 64), torch.full((1, 300, 2), 63.999))]:
        assert valid_call(img, pts)
        for path in ("forward", "forward_masked", "forward_dense"):
            with torch.no_grad():
                assert getattr(MODEL, path)(img, pts).shape == pts.shape[:2]


def test_numpy_and_list_points_accepted():
    img = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        a = MODEL(img, np.array([[[1.5, 2.5], [60, 3]]]))
        b = MODEL(img, [[[1.5, 2.5], [60, 3]]])
        c = MODEL(img, torch.tensor([[[1.5, 2.5], [60.0, 3.0]]]))
    assert torch.equal(a, c) and torch.equal(b, c)


@pytest.mark.parametrize("bad", [[[["a", "b"]]], object(), [[[1, 2], [3]]]])
def test_unconvertible_points(bad):
    with pytest.raises(ValueError, match="points"):
        MODEL(torch.rand(1, 3, 64, 64), bad)


def test_huge_query_set_chunks():
    img = torch.rand(1, 3, 64, 64)
    pts = torch.rand(1, 5000, 2) * 64
    with torch.no_grad():
        out = MODEL(img, pts)
        ref = MODEL.forward_dense(img, pts)  # the tiny ladder's last bucket selects every token
    assert out.shape == (1, 5000) and (out[:, : 4992] - ref[:, : 4992]).abs().max() < 1e-4
