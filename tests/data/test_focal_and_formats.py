"""Focal lengths reach every sample at the model's size; NYU's raw .pgm is read right; unknown
depth extensions are refused."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from depthpack.core.preprocess import focal_at_size, scale_focal
from depthpack.data import DataConfig, make_dataset, read_depth
from depthpack.data.common import BadSample
from depthpack.data.formats import kinect_disparity_to_meters, read_pgm16
from depthpack.data.intrinsics import NYU_FOCAL, kitti_focal, read_intrinsics_file
from test_data import REAL, needs_real, pairs_file

import cv2


def test_focal_at_size_is_the_geometric_mean_after_the_resize():
    assert focal_at_size(500.0, 500.0, (480, 640), (240, 320)) == pytest.approx(250.0)
    # aspect change: fx scales with the width, fy with the height
    assert focal_at_size(518.0, 519.0, (480, 640), (64, 64)) == pytest.approx(math.sqrt(518 * 0.1 * 519 * 64 / 480))


def test_scale_focal_is_focal_at_size_as_a_tensor():
    f = scale_focal(torch.tensor([math.sqrt(518.0 * 519.0), 0.0]), (480, 640), (64, 64))
    assert float(f[0]) == pytest.approx(focal_at_size(518.0, 519.0, (480, 640), (64, 64)), rel=1e-6)
    assert float(f[1]) == 0.0 and f.dtype == torch.float32  # unknown stays unknown


def test_synthetic_samples_carry_the_renderers_focal():
    fixed = make_dataset(DataConfig(rig="fixed", scene="mixed", num_samples=3), "train", (64, 64), 0.1, 80.0)
    want = 32.0 / math.tan(math.radians(35.0))  # the fixed rig's 70-degree lens at 64 px
    assert all(float(fixed[i]["focal"]) == pytest.approx(want, rel=1e-6) for i in range(3))
    varied = make_dataset(DataConfig(rig="varied", scene="mixed", num_samples=6), "train", (48, 64), 0.1, 80.0)
    fs = [float(varied[i]["focal"]) for i in range(6)]
    assert len(set(fs)) == 6 and all(32.0 / math.tan(math.radians(45)) - 1e-3 <= f <= 32.0 / math.tan(math.radians(27.5)) + 1e-3
                                     for f in fs)
    assert varied[0]["focal"].dtype == torch.float32 and varied[0]["focal"].shape == ()


def write_pair(root: Path, name: str, hw=(30, 40)):
    (root / "rgb").mkdir(parents=True, exist_ok=True)
    (root / "depth").mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(root / "rgb" / f"{name}.png"), np.full((*hw, 3), 128, np.uint8))
    cv2.imwrite(str(root / "depth" / f"{name}.png"), np.full(hw, 2000, np.uint16))


def test_folder_focal_from_config_file_or_root(tmp_path):
    write_pair(tmp_path, "a")
    none = make_dataset(DataConfig(kind="folder", root=str(tmp_path)), "all", (15, 20), 0.1, 10.0)
    assert float(none[0]["focal"]) == 0.0  # unknown
    (tmp_path / "camera-intrinsics.txt").write_text("585 0 20\n0 585 15\n0 0 1\n")  # 7-Scenes' file
    auto = make_dataset(DataConfig(kind="folder", root=str(tmp_path)), "all", (15, 20), 0.1, 10.0)
    assert float(auto[0]["focal"]) == pytest.approx(292.5)
    k = tmp_path / "k.txt"
    k.write_text("100 120 20 15")  # fx fy cx cy
    given = make_dataset(DataConfig(kind="folder", root=str(tmp_path), intrinsics=str(k)), "all", (15, 20), 0.1, 10.0)
    assert float(given[0]["focal"]) == pytest.approx(math.sqrt(50 * 60))
    cfg = DataConfig(kind="folder", root=str(tmp_path), focal=200.0, resize="center_crop")
    crop = make_dataset(cfg, "all", (20, 20), 0.1, 10.0)  # 30x40 scaled to 20x27 to cover 20x20, then a crop
    assert float(crop[0]["focal"]) == pytest.approx(math.sqrt(200.0 * 27 / 40 * 200.0 * 20 / 30), rel=1e-6)
    with pytest.raises(ValueError, match="expected 9"):
        k.write_text("1 2 3")
        read_intrinsics_file(k)


def test_kitti_focal_from_each_calibration_layout(tmp_path):
    P2 = "721.5377 0 609.5593 44.85728 0 721.5377 172.854 0.2163791 0 0 1 0.002745884"
    P3 = "707.0493 0 604.0814 -379.7842 0 707.0493 180.5066 0 0 0 1 0"
    # raw: DATE/calib_cam_to_cam.txt above DATE/DRIVE/image_0X/data/NAME.png
    raw = tmp_path / "2011_09_26"
    (raw / "drive_sync" / "image_02" / "data").mkdir(parents=True)
    (raw / "drive_sync" / "image_03" / "data").mkdir(parents=True)
    (raw / "calib_cam_to_cam.txt").write_text(f"calib_time: x\nP_rect_02: {P2}\nP_rect_03: {P3}\n")
    assert kitti_focal(raw / "drive_sync" / "image_02" / "data" / "0000000005.png") == pytest.approx((721.5377, 721.5377))
    assert kitti_focal(raw / "drive_sync" / "image_03" / "data" / "0000000005.png") == pytest.approx((707.0493, 707.0493))
    # object style: calib/NAME.txt with P2
    (tmp_path / "obj" / "image_2").mkdir(parents=True)
    (tmp_path / "obj" / "calib").mkdir()
    (tmp_path / "obj" / "calib" / "000001.txt").write_text(f"P0: {P3}\nP2: {P2}\n")
    assert kitti_focal(tmp_path / "obj" / "image_2" / "000001.png") == pytest.approx((721.5377, 721.5377))
    # depth benchmark val_selection_cropped: intrinsics/NAME.txt (3x3 K)
    write_pair(tmp_path / "val", "x_image_5_image_02")
    (tmp_path / "val" / "image").mkdir()
    (tmp_path / "val" / "intrinsics").mkdir()
    (tmp_path / "val" / "intrinsics" / "d_image_1.txt").write_text("700 0 600 0 710 180 0 0 1")
    assert kitti_focal(tmp_path / "val" / "image" / "d_image_1.png") == pytest.approx((700.0, 710.0))
    assert kitti_focal(tmp_path / "nothing" / "rgb" / "a.png") is None
    # through the data set: per sample, scaled to the model's size
    kit = tmp_path / "k"
    write_pair(kit, "0000000005", hw=(375, 1242))
    (kit / "calib").mkdir()
    (kit / "calib" / "0000000005.txt").write_text(f"P2: {P2}\n")
    s = make_dataset(DataConfig(kind="kitti", root=str(kit)), "all", (125, 414), 0.1, 80.0)[0]
    assert float(s["focal"]) == pytest.approx(721.5377 / 3, rel=1e-5)


@needs_real
def test_real_samples_focal():
    nyu = make_dataset(DataConfig(kind="nyu", root=str(REAL / "nyu")), "all", (240, 320), 0.1, 10.0)[0]
    assert float(nyu["focal"]) == pytest.approx(math.sqrt(NYU_FOCAL[0] * NYU_FOCAL[1]) / 2, rel=1e-6)
    kitti = make_dataset(DataConfig(kind="kitti", root=str(REAL / "kitti")), "all", (125, 414), 0.1, 80.0)[0]
    assert float(kitti["focal"]) == 0.0  # these copies ship no calibration: unknown, the model's default


@needs_real
def test_real_7scenes_focal_from_its_intrinsics_file(tmp_path):
    line = "frame-000000.color.jpg frame-000000.depth.png"
    cfg = DataConfig(kind="folder", root=str(REAL / "7scenes"), split_file=pairs_file(tmp_path, line),
                     intrinsics=str(REAL / "7scenes" / "camera-intrinsics.txt"))
    s = make_dataset(cfg, "all", (240, 320), 0.1, 10.0)[0]
    assert float(s["focal"]) == pytest.approx(292.5)


# ----------------------------------------------------------------------------- NYU raw .pgm
def write_pgm(path: Path, raw: np.ndarray, byteorder: str = "<", comment: bool = False) -> None:
    h, w = raw.shape
    head = b"P5\n" + (b"# a comment\n" if comment else b"") + f"{w} {h}\n65535\n".encode()
    path.write_bytes(head + raw.astype(byteorder + "u2").tobytes())


def test_pgm_kinect_disparity_both_byte_orders(tmp_path):
    raw = np.array([[1000, 2047, 839], [1060, 1092, 1200]], np.uint16)
    want = np.array([[351.3 / 92.5, 0.0, 351.3 / 253.5], [10.0, 10.0, 0.0]], np.float32)
    for order, name in (("<", "le.pgm"), (">", "be.pgm")):
        write_pgm(tmp_path / name, raw, order, comment=order == ">")
        assert np.array_equal(read_pgm16(tmp_path / name), raw)
        np.testing.assert_allclose(read_depth(tmp_path / name), want, rtol=1e-6)
    # 1060 -> 10.8 m, clamped to 10 as the NYU toolbox does; 1200 -> negative: invalid; 2047: invalid
    np.testing.assert_allclose(kinect_disparity_to_meters(np.array([1060, 1200, 2047], np.uint16)), [10.0, 0.0, 0.0])


@pytest.mark.parametrize("make,msg", [
    (lambda p: write_pgm(p, np.array([[4000, 3000]], np.uint16)), "not 11-bit Kinect disparities"),
    (lambda p: p.write_bytes(b"P5\n2 1\n255\n\x01\x02"), "8-bit PGM"),
    (lambda p: p.write_bytes(b"P5\n2 2\n65535\n\x01\x02"), "header says 2x2x2"),
    (lambda p: p.write_bytes(b"P2\n2 1\n65535\n1 2\n"), "not a binary PGM"),
    (lambda p: p.write_bytes(b"P5\n2"), "truncated PGM header"),
])
def test_bad_pgm_is_a_bad_sample(tmp_path, make, msg):
    p = tmp_path / "d.pgm"
    make(p)
    with pytest.raises(BadSample, match=msg):
        read_depth(p)


@needs_real
def test_real_nyu_raw_pgm_through_a_split_file(tmp_path):
    cfg = DataConfig(kind="nyu", root=str(REAL / "nyu_raw"), split_file=pairs_file(tmp_path, "NYU_color.ppm NYU_depth.pgm"))
    s = make_dataset(cfg, "all", (480, 640), 1e-3, 1000.0)[0]
    d = s["depth"][s["valid"]]
    # README: raw 839..2047, valid 92.8 %, 1.386-6.691 m after conversion (the PNG path read 0.004-65 m, all valid)
    assert s["valid"].float().mean().item() == pytest.approx(0.928, abs=6e-4)
    assert d.min().item() == pytest.approx(1.386, abs=6e-4) and d.max().item() == pytest.approx(6.691, abs=6e-4)
    assert float(s["focal"]) == pytest.approx(math.sqrt(NYU_FOCAL[0] * NYU_FOCAL[1]), rel=1e-6)


def test_unknown_depth_extension_is_refused(tmp_path):
    write_pair(tmp_path, "a")
    with pytest.raises(ValueError, match=r"pairs.txt:1: depth file depth/a.tiff: unknown extension '.tiff'; depthpack reads"):
        make_dataset(DataConfig(kind="folder", root=str(tmp_path), split_file=pairs_file(tmp_path, "rgb/a.png depth/a.tiff")),
                     "all", (15, 20), 0.1, 10.0)
    (tmp_path / "d.exr").write_bytes(b"\x76\x2f\x31\x01")
    with pytest.raises(ValueError, match="unknown extension '.exr'"):
        read_depth(tmp_path / "d.exr")
    write_pgm(tmp_path / "d.pgm", np.array([[1000]], np.uint16))
    with pytest.raises(ValueError, match="does not apply to NYU's raw .pgm"):
        read_depth(tmp_path / "d.pgm", decode="sunrgbd")
