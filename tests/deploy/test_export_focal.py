"""Export of a model with a focal input (tiny preset, canonical_focal set): the manifest's "focal"
entry, the packages' third input "focal" (pixels of their input: frame pixels for frame packages),
the reference and self-check with a non-default focal, ONNX with the same input, the Predictor over
the packages. Two exports of one bucket each: a couple of minutes on 2 CPU cores."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import with_buckets
from safetensors.torch import load_file

from depthpack.deploy.contract import FOCAL_UNITS, read_manifest
from depthpack.deploy.build import ExportOptions, export, load_for_export
from depthpack.deploy.package import PackedForward
from depthpack.runtime.aoti import load_runners, run_packages

pytestmark = pytest.mark.slow  # two AOTInductor exports
OVERRIDES = {"canonical_focal": 48.0, "focal_default": 40.0}  # pixels of the 64x64 model image
FRAME = (48, 80)


def _export(tmp_path_factory, name: str, **opts) -> SimpleNamespace:
    out = tmp_path_factory.mktemp(name) / "out"
    model, preset = load_for_export(preset="tiny", seed=0, overrides=OVERRIDES)
    summary = export(model, ExportOptions(out=str(out), buckets=(8,), onnx=True, **opts), preset, log=lambda m: None)
    return SimpleNamespace(out=out, model=model, summary=summary, manifest=read_manifest(out / "manifest.json"))


@pytest.fixture(scope="module")
def images_export(tmp_path_factory):
    return _export(tmp_path_factory, "focal_images")


@pytest.fixture(scope="module")
def frames_export(tmp_path_factory):
    return _export(tmp_path_factory, "focal_frames", frame_size=FRAME, frame_format="bgr8")


def _fresh(g, frame=False):
    if frame:
        inputs = torch.randint(0, 256, (1, *FRAME, 3), dtype=torch.uint8, generator=g)
        pts = torch.rand(1, 8, 2, generator=g) * torch.tensor([FRAME[1] - 0.01, FRAME[0] - 0.01])
    else:
        inputs, pts = torch.rand(1, 3, 64, 64, generator=g), torch.rand(1, 8, 2, generator=g) * 63.99
    return inputs, pts


def test_manifest_says_focal_and_packages_take_it(images_export, frames_export):
    m = images_export.manifest
    assert m["focal"] == {"default": 40.0, "canonical": 48.0, "units": FOCAL_UNITS}
    assert m["model_config"]["canonical_focal"] == 48.0 and m["preset"] is None  # not the tiny preset any more
    assert m["buckets"][0]["inputs"][2] == {"name": "focal", "shape": [1], "dtype": "float32"}
    # frame packages: the same focal in the frame's pixels (the package scales it to the model's)
    s = math.sqrt((64 / FRAME[1]) * (64 / FRAME[0]))
    fm = frames_export.manifest["focal"]
    assert fm["default"] == pytest.approx(40.0 / s) and fm["canonical"] == pytest.approx(48.0 / s)
    assert [t["name"] for t in frames_export.manifest["buckets"][0]["inputs"]] == ["frames", "points", "focal"]


@pytest.mark.parametrize("kind", ["images", "frames"])
def test_packages_follow_the_focal(kind, images_export, frames_export):
    ex = images_export if kind == "images" else frames_export
    frame = ex.manifest["frame"]
    _, runners = load_runners(ex.out / "manifest.json", "cpu")
    g = torch.Generator().manual_seed(7)
    for f in (ex.manifest["focal"]["default"], 25.0, 90.0, 0.0):  # 0 = unknown: the default inside
        inputs, pts = _fresh(g, frame is not None)
        focal = torch.tensor([f])
        with torch.no_grad():
            want = PackedForward(ex.model, 8, frame)(inputs, pts, focal)  # (depth, map)
        torch.testing.assert_close(runners[8](inputs, pts, focal), want, atol=1e-4, rtol=1e-4)
    d1, d2 = (runners[8](inputs, pts, torch.tensor([f]))[0] for f in (30.0, 60.0))
    torch.testing.assert_close(d2, 2 * d1, atol=1e-4, rtol=1e-4)  # depth follows the focal
    with pytest.raises(ValueError, match="takes 3 inputs"):
        runners[8](inputs, pts)


@pytest.mark.parametrize("kind", ["images", "frames"])
def test_reference_and_self_check_use_a_non_default_focal(kind, images_export, frames_export):
    ex = images_export if kind == "images" else frames_export
    ref = load_file(str(ex.out / "reference.safetensors"))
    default = ex.manifest["focal"]["default"]
    assert ref["focal"].shape == (1,) and float(ref["focal"][0]) == pytest.approx(1.25 * default)
    _, runners = load_runners(ex.out / "manifest.json", "cpu")
    name = "frames" if kind == "frames" else "images"
    got = run_packages(runners, ref[name], ref["points"], ref["focal"])
    torch.testing.assert_close(got, ref["depth"], **ex.manifest["tolerance"])
    at_default = run_packages(runners, ref[name], ref["points"], torch.tensor([default]))
    assert not torch.allclose(at_default, ref["depth"], **ex.manifest["tolerance"]), "the reference's focal changes nothing"
    assert ex.summary["check"]["reference"]["ok"] and all(b["ok"] for b in ex.summary["check"]["buckets"].values())


@pytest.mark.parametrize("kind", ["images", "frames"])
def test_onnx_takes_the_focal(kind, images_export, frames_export):
    import onnxruntime as ort

    ex = images_export if kind == "images" else frames_export
    frame = ex.manifest["frame"]
    sess = ort.InferenceSession(str(ex.out / "depthpack_k8.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == [kind, "points", "focal"]
    g = torch.Generator().manual_seed(9)
    for f in (33.0, 70.0):
        inputs, pts = _fresh(g, frame is not None)
        got = sess.run(["depth"], {kind: inputs.numpy(), "points": pts.numpy(), "focal": np.array([f], np.float32)})[0]
        with torch.no_grad():
            want = PackedForward(ex.model, 8, frame)(inputs, pts, torch.tensor([f]))[0]
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-4)


def test_predictor_over_focal_packages_equals_the_eager_predictor(frames_export):
    """Frames + focal in frame pixels through the packages == the eager Predictor's frame path."""
    from depthpack.runtime.predictor import Predictor

    manifest = str(frames_export.out / "manifest.json")
    packaged = Predictor.from_packages(manifest, device="cpu")
    eager = Predictor(with_buckets(frames_export.model, (8,)), device="cpu", recipe="reference", color="bgr")
    assert packaged.uses_focal and eager.uses_focal
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (*FRAME, 3), dtype=np.uint8)
    pts = (rng.random((11, 2)) * [FRAME[1] - 0.01, FRAME[0] - 0.01]).astype(np.float32)  # 11: two chunks
    for f in (None, 0.0, 31.0, 75.0):
        torch.testing.assert_close(packaged.predict(frame, pts, focal=f), eager.predict(frame, pts, focal=f),
                                   atol=1e-4, rtol=1e-4)
    assert not torch.allclose(packaged.predict(frame, pts, focal=31.0), packaged.predict(frame, pts, focal=75.0))
    with pytest.raises(ValueError, match="focal"):
        packaged.predict(frame, pts, focal=float("nan"))
