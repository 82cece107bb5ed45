"""Camera frames in: uint8 HWC frames of any size and channel order, preprocessed inside the graph by
the one definition (depthpack.core.preprocess), equal to the float path on the same frame; every bad
frame gets one clear error."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from conftest import randomize_
from depthpack import Predictor, create_model
from depthpack.core.fast import Recipe
from depthpack.core.preprocess import frames_to_images, read_rgb, scale_points, to_model_input

MODEL = randomize_(create_model("tiny"), 1).eval()
CPU_COMPILE = Recipe(compile=True, backend="aot_eager")  # the static path on a CPU without Inductor's minutes


def _frame(h=48, w=80, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _points(q, h=48, w=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(q, 2, generator=g) * torch.tensor([w - 1e-3, h - 1e-3])).numpy()


def _reference(frame: np.ndarray, pts: np.ndarray, color: str) -> torch.Tensor:
    """The float path on the same frame: preprocess on the host, then the checked packed forward."""
    h, w = frame.shape[:2]
    images = frames_to_images(torch.from_numpy(np.ascontiguousarray(frame))[None], (64, 64), color)
    with torch.no_grad():
        return MODEL(images, scale_points(torch.from_numpy(pts)[None], (h, w), (64, 64)))


# ---- the one preprocessing ---------------------------------------------------------------------------
@pytest.mark.parametrize("h,w", [(48, 80), (64, 64), (200, 150), (31, 97)])
def test_frames_to_images_is_cv2_bilinear_on_float(h, w):
    """Our definition is OpenCV's INTER_LINEAR (half-pixel centres, no antialias) computed in float:
    equal to cv2.resize of the float frame to float32 rounding (1e-5 of the 0..1 range)."""
    frame = _frame(h, w, seed=h)
    got = frames_to_images(torch.from_numpy(frame)[None], (64, 64), "rgb")[0]
    want = cv2.resize(frame.astype(np.float32), (64, 64), interpolation=cv2.INTER_LINEAR) / 255.0
    assert (got.permute(1, 2, 0).numpy() - want).__abs__().max() < 1e-5


def test_bgr_is_rgb_reversed_and_to_model_input_agrees():
    frame = _frame()
    rgb = frames_to_images(torch.from_numpy(frame)[None], (64, 64), "rgb")
    bgr = frames_to_images(torch.from_numpy(frame[..., ::-1].copy())[None], (64, 64), "bgr")
    torch.testing.assert_close(rgb, bgr, rtol=0, atol=0)
    torch.testing.assert_close(to_model_input(frame, (64, 64)), rgb[0], rtol=0, atol=0)


def test_truncated_images_are_refused(tmp_path):
    frame = _frame(60, 90)
    for ext in (".jpg", ".png"):
        path = tmp_path / f"f{ext}"
        cv2.imwrite(str(path), frame)
        assert read_rgb(path).shape == (60, 90, 3)
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * 0.6)])
        with pytest.raises(ValueError, match="truncated"):
            read_rgb(path)


# ---- the Predictor -----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["eager", "compile"])
@pytest.mark.parametrize("color", ["bgr", "rgb"])
def test_frame_path_equals_float_path(backend, color):
    pred = Predictor(MODEL, device="cpu", recipe=CPU_COMPILE if backend == "compile" else "reference", color=color)
    frame, pts = _frame(seed=3), _points(70, seed=3)  # 70 points: two chunks
    got = pred.predict(frame, pts)
    torch.testing.assert_close(got, _reference(frame, pts, color), rtol=1e-5, atol=1e-5)
    # the same frame as a torch tensor, as a batch, as a list, and as a non-contiguous ROI of a larger frame
    big = np.zeros((100, 120, 3), np.uint8)
    big[10:58, 20:100] = frame
    roi = big[10:58, 20:100]
    assert not roi.flags["C_CONTIGUOUS"]
    for same in (torch.from_numpy(frame), roi):
        torch.testing.assert_close(pred.predict(same, pts), got, rtol=0, atol=0)
    two = pred.predict([frame, roi], np.stack([pts, pts]))
    torch.testing.assert_close(two, got.expand(2, -1), rtol=1e-5, atol=1e-5)  # batch 2: another GEMM order
    torch.testing.assert_close(pred.predict(np.stack([frame, frame]), np.stack([pts, pts])), two, rtol=0, atol=0)


def test_out_is_written_in_place():
    pred = Predictor(MODEL, device="cpu", recipe=CPU_COMPILE, color="bgr")
    frame, pts = _frame(), _points(9)
    out = torch.full((1, 9), float("nan"))
    assert pred.predict(frame, pts, out=out) is out
    torch.testing.assert_close(out, _reference(frame, pts, "bgr"), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="out must be float32 \\[1,9\\]"):
        pred.predict(frame, pts, out=torch.empty(1, 8))


BAD = [
    (lambda f: f.astype(np.uint16), "uint8"),
    (lambda f: f.astype(np.float64), "float input must be images"),
    (lambda f: f[..., :1], "shape \\[H,W,3\\].*GRAY2BGR"),
    (lambda f: np.concatenate([f, f[..., :1]], -1), "BGRA2BGR"),
    (lambda f: f[:, :, 0], "shape \\[H,W,3\\], got \\[48, 80\\].*GRAY2BGR"),
    (lambda f: f[:0], "empty"),
]


@pytest.mark.parametrize("edit,message", BAD)
def test_bad_frames_are_one_clear_error(edit, message):
    pred = Predictor(MODEL, device="cpu", color="bgr")
    with pytest.raises(ValueError, match=message):
        pred.predict(edit(_frame()), _points(3))


def test_frame_batch_points_and_color_errors():
    pred = Predictor(MODEL, device="cpu", recipe=CPU_COMPILE, color="bgr")
    with pytest.raises(ValueError, match="share a size.*48x80.*60x80"):
        pred.predict([_frame(), _frame(60, 80)], np.stack([_points(3)] * 2))
    with pytest.raises(ValueError, match="outside the 80x48"):
        pred.predict(_frame(), np.array([[80.0, 3.0]], np.float32))
    with pytest.raises(ValueError, match="not finite"):
        pred.predict(_frame(), np.array([[np.nan, 3.0]], np.float32))
    pred.predict(_frame(), _points(3))  # the graphs now take 48x80 frames
    with pytest.raises(ValueError, match="take frames 48x80 bgr; got frames 60x80.*one Predictor per camera"):
        pred.predict(_frame(60, 80), _points(3, 60, 80))
    with pytest.raises(ValueError, match="color='bgr'"):
        Predictor(MODEL, device="cpu").predict(_frame(), _points(3))
    with pytest.raises(ValueError, match="color='bgr'"):
        Predictor(MODEL, device="cpu", color="BGR")


def test_float_images_still_accepted_and_checked():
    pred = Predictor(MODEL, device="cpu")
    images = torch.rand(2, 3, 64, 64)
    pts = torch.rand(2, 5, 2) * 63
    with torch.no_grad():
        torch.testing.assert_close(pred.predict(images, pts), MODEL(images, pts), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="outside"):
        pred.predict(images * 2, pts)


# ---- on the GPU: the same function, captured; no sync; nothing allocated in steady state ----------------
def _gpu_counts() -> dict:
    dev = {k: v for k, v in torch.cuda.memory_stats().items() if k.endswith(".allocated") and "allocation" in k}
    host = {k: v for k, v in getattr(torch.cuda, "host_memory_stats", dict)().items() if "alloc" in k and "peak" not in k
            and "current" not in k and "freed" not in k}
    return {**dev, **{f"host.{k}": v for k, v in host.items()}}


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["graph", "fast"])
def test_gpu_frames_in_the_graph_equal_the_float_path_no_sync_no_allocation(backend):
    pred = Predictor(MODEL, device="cuda", dtype=torch.float32, recipe=Recipe(graph=True) if backend == "graph" else "fast",
                     color="bgr", batch_size=1)
    frame, pts = _frame(seed=5), _points(70, seed=5)
    pred.warmup(buckets=(8, 64), frame_size=frame.shape[:2])  # 70 points: a chunk of 64, one of 6
    captures = pred.captures
    tol = dict(rtol=2e-4, atol=2e-3) if backend == "graph" else dict(rtol=2e-3, atol=2e-3)  # fast: tanh GELU
    torch.testing.assert_close(pred.predict(frame, pts).cpu(), _reference(frame, pts, "bgr"), **tol)
    frames = [_frame(seed=s) for s in range(4)]
    ptss = [_points(70, seed=s) for s in range(4)]
    out = torch.empty(1, 70, device="cuda")
    for i in range(8):  # steady state reached
        pred.predict(frames[i % 4], ptss[i % 4], out=out)
    torch.cuda.synchronize()
    before = _gpu_counts()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(200):
            pred.predict(frames[i % 4], ptss[i % 4], out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert _gpu_counts() == before, "allocated in steady state"
    assert pred.captures == captures, "recaptured"
    host = torch.empty(1, 70).pin_memory()
    pred.predict(frames[1], ptss[1], out=host)  # host out: ready on return
    torch.testing.assert_close(host, _reference(frames[1], ptss[1], "bgr"), **tol)
