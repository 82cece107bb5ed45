"""Predictor's focal input: equal to the model's forward with the same focal (eager and a static,
compiled recipe), frames' focal scaled from frame pixels like their points, no recompile when the
focal changes, one clear ValueError for a bad focal, and a model without a focal input ignoring it."""
import numpy as np
import pytest
import torch

from conftest import randomize_
from depthpack import create_model
from depthpack.core.preprocess import frames_to_images, scale_focal, scale_points
from depthpack.core.fast import Recipe
from depthpack.runtime.engines import compile_counter
from depthpack.runtime.predictor import Predictor

FOCAL = dict(canonical_focal=48.0, focal_default=40.0)
MODEL = randomize_(create_model("tiny", buckets=(8, 16), **FOCAL), 3).eval()
PLAIN = randomize_(create_model("tiny", buckets=(8, 16)), 3).eval()
BACKENDS = ["eager", "compile"]  # compile: a static function of staged inputs (aot_eager on the CPU)
RECIPES = {"eager": "reference", "compile": Recipe(compile=True, backend="aot_eager")}


def _predictor(model, backend, **kw):
    return Predictor(model, device="cpu", recipe=RECIPES[backend], **kw)


def _inputs(B, Q, g):
    return torch.rand(B, 3, 64, 64, generator=g), torch.rand(B, Q, 2, generator=g) * (64 - 1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_focal_equals_the_model_forward_and_changes_nothing_else(backend):
    pred = _predictor(MODEL, backend, batch_size=2)
    g = torch.Generator().manual_seed(0)
    images, points = _inputs(2, 20, g)  # 20 points: two chunks (16 + 4)
    with torch.no_grad():
        default = MODEL(images, points)
        assert not torch.allclose(MODEL(images, points, torch.tensor([30.0, 70.0])), default)
    torch.testing.assert_close(pred.predict(images, points), default, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pred.predict(images, points, focal=0.0), default, rtol=1e-5, atol=1e-5)  # 0 = unknown
    before = compile_counter()
    for _ in range(4):  # fresh inputs and focals: a number, a list, a [B] tensor; no recompile
        images, points = _inputs(2, int(torch.randint(1, 30, (1,), generator=g)), g)
        f = (torch.rand(2, generator=g) * 80 + 10)
        for given in (f, f.tolist(), np.asarray(f)):
            with torch.no_grad():
                want = MODEL(images, points, f)
            torch.testing.assert_close(pred.predict(images, points, focal=given), want, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            want = MODEL(images, points, float(f[0]))
        torch.testing.assert_close(pred.predict(images, points, focal=float(f[0])), want, rtol=1e-5, atol=1e-5)
    assert compile_counter() == before, "a new focal recompiled"
    # a call without focal after calls with one: the staged focal goes back to the default
    torch.testing.assert_close(pred.predict(images, points), MODEL(images, points).detach(), rtol=1e-5, atol=1e-5)


def test_focal_scales_depth_exactly():
    """The canonical camera: twice the focal is twice the depth (the head's range is the canonical one)."""
    pred = _predictor(MODEL, "eager")
    images, points = _inputs(1, 12, torch.Generator().manual_seed(5))
    d1, d2 = pred.predict(images, points, focal=30.0), pred.predict(images, points, focal=60.0)
    torch.testing.assert_close(d2, 2 * d1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_frame_focal_is_in_frame_pixels(backend):
    """A 48x80 frame with focal f in its pixels: the model sees f * sqrt(64/80 * 64/48) at 64x64."""
    h, w = 48, 80
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
    pts = (torch.rand(2, 20, 2, generator=torch.Generator().manual_seed(1)) * torch.tensor([w - 1e-3, h - 1e-3]))
    f = torch.tensor([55.0, 90.0])
    pred = _predictor(MODEL, backend, batch_size=2, color="bgr")
    got = pred.predict(frames, pts, focal=f)
    images = frames_to_images(torch.from_numpy(frames), (64, 64), "bgr")
    with torch.no_grad():
        want = MODEL(images, scale_points(pts, (h, w), (64, 64)), scale_focal(f, (h, w), (64, 64)))
        unscaled = MODEL(images, scale_points(pts, (h, w), (64, 64)), f)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, unscaled, rtol=1e-3, atol=1e-3), "the focal was not scaled to the model's pixels"
    # one frame, one number
    torch.testing.assert_close(pred.predict(frames[0], pts[0], focal=55.0), want[:1], rtol=1e-5, atol=1e-5)


BAD = [(float("nan"), "not finite"), (-1.0, ">= 0"), ([1.0, 2.0, 3.0], "shape"), ("wide", "focal"),
       (torch.tensor([True]), "dtype"), (float("inf"), "not finite")]


@pytest.mark.parametrize("model", [MODEL, PLAIN], ids=["focal", "plain"])
@pytest.mark.parametrize("focal,words", BAD)
def test_bad_focal_is_one_clear_error(model, focal, words):
    pred = _predictor(model, "eager")
    images, points = _inputs(2, 5, torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="focal") as e:
        pred.predict(images, points, focal=focal)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_without_focal_input_ignores_it(backend):
    """Robots pass the camera's focal to every model: one without a focal input answers as without it."""
    pred = _predictor(PLAIN, backend, batch_size=2)
    assert not pred.uses_focal and pred.describe()["focal_input"] is False
    images, points = _inputs(2, 10, torch.Generator().manual_seed(4))
    want = pred.predict(images, points)
    torch.testing.assert_close(pred.predict(images, points, focal=[500.0, 600.0]), want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["graph", "fast"])
def test_gpu_focal_in_the_captured_graph(backend):
    """On CUDA the focal is a staged input of the captured graph: a new focal per call (number, list,
    [B] tensor; frames and images) equals the model's forward with it, with no recapture."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = randomize_(create_model("tiny", buckets=(8, 16), **FOCAL), 3).eval().cuda()
    pred = Predictor(model, device="cuda", dtype=torch.float32, recipe=Recipe(graph=True) if backend == "graph" else "fast",
                     batch_size=2, color="bgr")
    g = torch.Generator().manual_seed(7)
    h, w = 48, 80
    for i in range(5):
        images, points = _inputs(2, int(torch.randint(1, 30, (1,), generator=g)), g)
        f = torch.rand(2, generator=g) * 80 + 10
        given = (f, f.tolist(), float(f[0]), None, 0.0)[i]
        fw = None if given is None else torch.as_tensor(given, dtype=torch.float32).expand(2).cuda()
        with torch.no_grad():
            want = model(images.cuda(), points.cuda(), fw)
        torch.testing.assert_close(pred.predict(images, points, focal=given), want, rtol=1e-4, atol=1e-4)
        frames = torch.randint(0, 256, (2, h, w, 3), generator=g, dtype=torch.uint8)
        pts = torch.rand(2, 12, 2, generator=g) * torch.tensor([w - 1e-3, h - 1e-3])
        with torch.no_grad():
            want = model(frames_to_images(frames.cuda(), (64, 64), "bgr"), scale_points(pts, (h, w), (64, 64)).cuda(),
                         scale_focal(f, (h, w), (64, 64)).cuda())
        torch.testing.assert_close(pred.predict(frames.numpy(), pts, focal=f), want, rtol=1e-4, atol=1e-4)
    captures = pred.captures
    pred.predict(images, points, focal=[33.0, 44.0])
    assert pred.captures == captures, "a new focal recaptured"
