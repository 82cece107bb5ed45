"""ONNX (opset 20, float32) of the packed forward of one bucket, checked three ways: onnx.checker,
onnxruntime, closeness to eager. Its inputs are the package's, by the same names (contract.io_specs:
images|frames, points and, for a model with a focal input, focal; outputs depth and, with a glance depth,
map). TensorRT builds its fp16/bf16 engines from it (deploy_cpp/README.md)."""
from __future__ import annotations

import inspect
from pathlib import Path

import torch

from ..core.files import sha256_file
from ..core.model import DepthPack
from .contract import TOLERANCE, within
from .package import ExportError, PackedForward, example_inputs

ONNX_OPSET = 20


def export_onnx(model32: DepthPack, k: int, batch: int, path: Path, g: torch.Generator, frame: dict | None = None) -> dict:
    """float32 ONNX (opset 20) of the packed forward; TensorRT picks fp16/bf16 itself (--fp16/--bf16).
    Tries the dynamo exporter, falls back to the TorchScript one; then onnx.checker, onnxruntime vs eager."""
    import onnx
    import onnxruntime as ort

    wrapper = PackedForward(model32, k, frame).eval()
    args = example_inputs(model32.cfg, batch, k, "cpu", g, frame)  # (images|frames, points[, focal])
    input_names = ["frames" if frame else "images", "points", "focal"][: len(args)]
    output_names = ["depth", "map"] if model32.cfg.glance_depth else ["depth"]
    names = dict(input_names=input_names, output_names=output_names, opset_version=ONNX_OPSET)
    errors = []
    for dynamo in (True, False):
        try:
            path.unlink(missing_ok=True)
            with torch.no_grad():
                one_file = dynamo and "external_data" in inspect.signature(torch.onnx.export).parameters
                kw = {"external_data": False} if one_file else {}  # one self-contained file
                torch.onnx.export(wrapper, args, str(path), dynamo=dynamo, **names, **kw)
            onnx.checker.check_model(onnx.load(str(path)), full_check=True)
            exporter = "dynamo" if dynamo else "torchscript"
            break
        except Exception as e:  # noqa: BLE001 - any exporter failure means: try the other one
            errors.append(f"{'dynamo' if dynamo else 'torchscript'}: {type(e).__name__}: {str(e)[:300]}")
    else:
        raise ExportError(f"ONNX export of bucket {k} failed with both exporters: {' | '.join(errors)}")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fresh = example_inputs(model32.cfg, batch, k, "cpu", g, frame)
    got = sess.run(output_names, {n: t.numpy() for n, t in zip(input_names, fresh)})
    with torch.no_grad():
        want = wrapper(*fresh)
    want = want if isinstance(want, tuple) else (want,)
    checks = [within(torch.from_numpy(g), w, **TOLERANCE["float32"]) for g, w in zip(got, want)]
    ok, err = all(c[0] for c in checks), max(c[1] for c in checks)
    if not ok:
        raise ExportError(f"ONNX bucket {k}: onnxruntime differs from eager by up to {err:.3g} m "
                          f"(tolerance {TOLERANCE['float32']})")
    return {"bucket": k, "file": path.name, "sha256": sha256_file(path), "exporter": exporter, "max_abs_diff": err}
