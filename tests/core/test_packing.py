"""Token selection: deterministic, every query finds its own patch, no duplicates, fixed shapes."""
import torch
from hypothesis import given, settings, strategies as st

from depthpack.core.packing import key_mask_from_index, patch_of_points, select_tokens, spread_rank


def _points(g, B, Q, H, W):
    return torch.stack([torch.rand(B, Q, generator=g) * W, torch.rand(B, Q, generator=g) * H], -1)


@settings(max_examples=60, deadline=None)
@given(
    gh=st.integers(1, 9), gw=st.integers(1, 9), p=st.sampled_from([1, 2, 8, 14]),
    B=st.integers(1, 3), Q=st.integers(1, 40), extra=st.integers(0, 30), seed=st.integers(0, 2**31 - 1),
    dup=st.booleans(),
)
def test_selection_properties(gh, gw, p, B, Q, extra, seed, dup):
    H, W, n = gh * p, gw * p, gh * gw
    g = torch.Generator().manual_seed(seed)
    pts = _points(g, B, Q, H, W)
    if dup:  # duplicates and points exactly on patch borders / the last pixel
        pts[:, Q // 2:] = pts[:, : Q - Q // 2].clone()
        pts[:, 0] = torch.tensor([float((gw - 1) * p), float(H - 1)])
    bucket = Q + extra
    index, slot = select_tokens(pts, bucket, p, (gh, gw))
    slots = min(bucket, n)
    assert index.shape == (B, slots) and slot.shape == (B, Q)
    for b in range(B):
        assert len(set(index[b].tolist())) == slots  # no token twice
    qidx = patch_of_points(pts, p, (gh, gw))
    # every query maps to the slot that holds its own patch
    assert torch.equal(torch.gather(index, 1, slot), qidx)
    # deterministic
    index2, slot2 = select_tokens(pts.clone(), bucket, p, (gh, gw))
    assert torch.equal(index, index2) and torch.equal(slot, slot2)
    # duplicates in one patch share a slot
    same = qidx[:, :, None] == qidx[:, None, :]
    assert torch.equal(same, slot[:, :, None] == slot[:, None, :])
    # the counting selection (a fast-path switch) picks the same patches and maps queries to them
    index3, slot3 = select_tokens(pts, bucket, p, (gh, gw), method="count")
    for b in range(B):
        assert set(index3[b].tolist()) == set(index[b].tolist())
    assert torch.equal(torch.gather(index3, 1, slot3), qidx)


def test_patch_of_points_borders():
    p, grid = 8, (4, 5)  # H=32, W=40
    pts = torch.tensor([[[0.0, 0.0], [7.999, 7.999], [8.0, 0.0], [39.99, 31.99], [16.0, 24.0]]])
    assert patch_of_points(pts, p, grid).tolist() == [[0, 0, 1, 19, 17]]


def test_neighbours_before_context():
    # one query in the middle of a 7x7 grid, bucket 9: exactly its 3x3 neighbourhood
    p, grid = 4, (7, 7)
    pts = torch.tensor([[[14.0, 14.0]]])  # patch (3, 3) -> 24
    index, _ = select_tokens(pts, 9, p, grid)
    expect = {r * 7 + c for r in (2, 3, 4) for c in (2, 3, 4)}
    assert set(index[0].tolist()) == expect


def test_leftover_context_is_spread():
    # one query in the top-left corner of an 8x8 grid, bucket 8: the queried patch, its 3 neighbours,
    # and 4 context patches from the spread order, which must reach every quadrant of the image
    rank = spread_rank(8, 8)
    assert sorted(rank.tolist()) == list(range(64))  # distinct
    index, _ = select_tokens(torch.tensor([[[1.0, 1.0]]]), 8, 4, (8, 8))
    picked = set(index[0].tolist())
    assert {0, 1, 8, 9} <= picked
    context = picked - {0, 1, 8, 9}
    assert len(context) == 4
    quadrants = {(i // 8 >= 4, i % 8 >= 4) for i in context}
    assert quadrants >= {(False, True), (True, False), (True, True)}, sorted(context)


def test_key_mask():
    index = torch.tensor([[3, 0], [1, 2]])
    m = key_mask_from_index(index, 4, 2)
    assert m.tolist() == [[True, True, True, False, False, True], [True, True, False, True, True, False]]


def test_bucket_too_small_raises():
    import pytest

    with pytest.raises(ValueError, match="do not fit"):
        select_tokens(torch.zeros(1, 5, 2), 4, 8, (8, 8))
