"""The depth-edge band: on a scene whose edge is known by construction (a box in front of a wall), the
band equals one computed by hand, the edge points fall inside it, the evaluation reports each point
set, and images without a band are counted, never divided by."""
import numpy as np
import pytest
import torch

from depthpack.core.model import create_model, random_weights_
from depthpack.data import raycast as rc
from depthpack.data import synthetic as syn
from depthpack.data.queries import depth_discontinuities, edge_band
from depthpack.eval.evaluate import EvalSettings, eval_points, evaluate, region
from depthpack.eval.metrics import boundary_f1, si_boundary_f1

H, W, F = 32, 48, 24.0
BOX_ROWS, BOX_COLS = range(12, 20), range(16, 32)  # the pixels whose centre rays hit the box (see box_scene)


def box_scene(with_box: bool = True) -> dict:
    """A wall at z = 6 and a box x, y in [-1, 1] x [-0.5, 0.5], front face z = 3, seen from the origin
    along +z (f = 24 px, centre (24, 16)): the box covers pixel centres with |j + 0.5 - 24| <= 8 and
    |i + 0.5 - 16| <= 4, i.e. rows 12-19, columns 16-31, at depth 3; the wall elsewhere at depth 6."""
    cam = syn.Camera(F, F, W / 2, H / 2, np.eye(3), np.zeros(3))
    wall = syn.Plane(np.array([0.0, 0.0, -1.0]), -6.0, np.eye(3)[0], np.eye(3)[1], 0)
    prims = [wall] + ([syn.Box(np.array([0.0, 0.0, 3.5]), np.array([1.0, 0.5, 0.5]), 0.0, 0)] if with_box else [])
    scene = syn.Scene(prims, [syn.Material("checker", np.full(3, 0.2), np.full(3, 0.8), 0.5)], np.array([0.0, -2.0, 1.0]),
                      False, 0.3, False)
    image, depth, _ = rc.cast_and_shade(rc.pack([(scene, cam)]), H, W)
    valid = depth[0] > 0
    return dict(image=image[0].permute(2, 0, 1).contiguous(), depth=depth[0], valid=valid, eval_mask=torch.ones_like(valid),
                focal=torch.tensor(F), name="box")


def hand_band(radius: int) -> np.ndarray:
    """The band by hand: the box's border pixels and the wall pixels beside them, grown by radius."""
    inside = np.zeros((H, W), bool)
    inside[BOX_ROWS.start:BOX_ROWS.stop, BOX_COLS.start:BOX_COLS.stop] = True
    edge = np.zeros((H, W), bool)
    for i in range(H):
        for j in range(W):
            for di, dj in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                a, b = i + di, j + dj
                if 0 <= a < H and 0 <= b < W and inside[a, b] != inside[i, j]:
                    edge[i, j] = True
    band = np.zeros((H, W), bool)
    for i, j in zip(*np.nonzero(edge)):
        band[max(0, i - radius):i + radius + 1, max(0, j - radius):j + radius + 1] = True
    return band


def test_the_band_of_a_box_in_front_of_a_wall_is_the_one_computed_by_hand():
    s = box_scene()
    d = s["depth"].numpy()
    assert (d[BOX_ROWS.start:BOX_ROWS.stop, BOX_COLS.start:BOX_COLS.stop] == 3.0).all() and (d == 3.0).sum() == 8 * 16
    for radius in (0, 1, 3):
        band = edge_band(s["depth"], s["valid"], radius).numpy()
        np.testing.assert_array_equal(band, hand_band(radius))
    # a ratio of 2 is a discontinuity at every threshold below 2, none above
    assert not depth_discontinuities(s["depth"], s["valid"], 2.01).any()
    assert depth_discontinuities(s["depth"], s["valid"], 1.99).sum() == hand_band(0).sum()


def test_edge_points_fall_in_the_band_and_uniform_points_anywhere():
    s = box_scene()
    band = torch.from_numpy(hand_band(2))
    pts = eval_points(s, 64, 0, 0, 0.0, region(s, "edge", 2, 1.1))
    assert band[pts[:, 1].long(), pts[:, 0].long()].all()
    uni = eval_points(s, 256, 0, 0, 0.0, region(s, "uniform", 2, 1.1))
    assert not band[uni[:, 1].long(), uni[:, 0].long()].all()


class Scenes(torch.utils.data.Dataset):
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def test_evaluate_reports_each_point_set_and_counts_images_without_a_band():
    model = random_weights_(create_model("tiny", img_size=(H, W), buckets=(8, 16, 32)), seed=1).eval()
    data = Scenes([box_scene(), box_scene(with_box=False), box_scene()])  # the wall alone has no edge
    s = EvalSettings(queries=(4, 16), paths=("packed", "dense"), anchors=(True,), points="both", band_radius=2,
                     figure_images=0, progress=False)
    r = evaluate(model, data, s)
    assert set(r["bands"]) == {"uniform", "edge"} and r["rows"] == r["bands"]["uniform"]["rows"]
    edge = r["bands"]["edge"]
    assert edge["images"] == 2 and edge["skipped_images"] == 1 and r["band"] == {"radius": 2, "threshold": 1.1,
                                                                                  "images_without_band": 1}
    assert r["bands"]["uniform"]["images"] == 3
    for row in edge["rows"]:
        assert row["images"] == 2 and set(row) >= {"abs_rel", "d1", "rmse", "silog"}
    # the best constant over the band sits between the box (3 m) and the wall (6 m); uniformly, at the wall
    assert 3.0 <= edge["constant"][0]["constant_m"] <= 6.0 and r["bands"]["uniform"]["constant"][0]["constant_m"] == 6.0
    # no image has a band: no row and no division by zero
    none = evaluate(model, Scenes([box_scene(with_box=False)]), EvalSettings(
        queries=(4,), paths=("packed",), anchors=(True,), points="edge", figure_images=0, progress=False))
    assert none["rows"] == [] and none["images"] == 0 and none["band"]["images_without_band"] == 1


@pytest.mark.parametrize("kw, match", [(dict(points="sobel"), "points must be one of"),
                                       (dict(band_radius=-1), "radius must be a whole number"),
                                       (dict(band_threshold=1.0), "threshold must be a depth ratio"),
                                       (dict(band_threshold=float("nan")), "threshold must be a depth ratio")])
def test_a_band_setting_out_of_range_is_one_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        EvalSettings(**kw)
    if "points" not in kw:
        s = box_scene()
        with pytest.raises(ValueError, match=match):
            edge_band(s["depth"], s["valid"], kw.get("band_radius", 1), kw.get("band_threshold", 1.1))


def test_boundary_f1_is_depth_pros():
    gt = torch.full((12, 12), 2.0)
    gt[:, 6:] = 4.0  # the left half occludes the right one: boundaries in one of the four directions
    valid = torch.ones_like(gt, dtype=torch.bool)
    assert boundary_f1(gt, gt, valid, 1.1) == pytest.approx(0.25)  # Depth Pro: a direction without one adds 0 recall
    box = torch.full((12, 12), 6.0)
    box[4:8, 4:8] = 3.0  # a box: boundaries in all four directions
    assert si_boundary_f1(box, box, valid) == pytest.approx(1.0)
    assert si_boundary_f1(box * 7.0, box, valid) == pytest.approx(1.0)  # scale-invariant
    assert si_boundary_f1(torch.full_like(box, 5.0), box, valid) == 0.0  # no boundary predicted
    wider = torch.full((12, 12), 6.0)
    wider[4:8, 4:9] = 3.0  # three sides right, the fourth one column off
    assert 0.5 < si_boundary_f1(wider, box, valid) < 1.0
    # a ratio below every threshold (1.05 .. 1.25) is no boundary; pairs with an invalid pixel do not count
    assert si_boundary_f1(box, torch.where(box == 3.0, 5.9, 6.0), valid) == 0.0
    hole = valid.clone()
    hole[4:8, 4:8] = False
    assert si_boundary_f1(box, box, hole) == 0.0
