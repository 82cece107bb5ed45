"""Export: one AOTInductor package per capacity bucket, a manifest, a reference file, ONNX, a self-check.

    python export/export.py --preset tiny --out /tmp/dp_tiny --buckets 8,64 --onnx
    python export/export.py --checkpoint runs/vits --out /tmp/dp_export_vits --device cuda --dtype bfloat16

The contract of the folder (file names, tensor shapes, manifest keys, chunking rule) is shared with
the C++ runner (deploy_cpp/) and the Predictor's `aoti` backend (README, "Export"). In short, each
package runs model.forward_packed(images, points, K) -- token selection included -- on images
float32 [B,3,H,W] in [0,1] and points float32 [B,K,2], and returns depth float32 [B,K]; the package
normalizes and casts to its compute dtype inside.

Steps, in order (a failure at any step is one clear ExportError, a ValueError):
  1. refuse targets this process cannot build for (a .pt2 holds native code for one CPU architecture
     and one GPU compute capability: build it where it runs);
  2. per bucket: torch.export (strict=False) -> check the graph is static -> AOTInductor package;
  3. reference.png / reference_points.csv / reference.safetensors (eager, chunked like the runners);
  4. optional ONNX (float32, opset 20), checked with onnx.checker and onnxruntime against eager;
  5. self-check in a CHILD process (python -m depthpack.aoti --check): packages vs eager on fresh
     inputs and on the reference, within the dtype's tolerance. A crash there cannot take the
     exporter down: on torch 2.11 + CUDA (H200) loading a package kills Python with SIGSEGV, and
     the same checks then run with the C++ runner (--cpp-runner, deploy_cpp), or the export fails
     with a message saying so;
  6. only then manifest.json is written under its final name.
"""
from __future__ import annotations

import copy
import csv
import inspect
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from .aoti import FORMAT, run_chunked, sha256_file, within
from .config import PRESETS, ModelConfig, model_config, to_dict
from .model import DepthPack, create_model, random_weights_

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# |package - eager| <= atol + rtol * |eager|, depth in meters. float32 packages differ from eager only by
# kernel fusion order (~1e-6 measured); bf16/fp16 by rounding inside fused kernels, amplified by the
# exp(sigmoid) depth head (d depth / depth <= 0.25 * log(max/min) * d logit).
TOLERANCE = {"float32": {"atol": 1e-3, "rtol": 1e-3},
             "float16": {"atol": 2e-2, "rtol": 2e-2},
             "bfloat16": {"atol": 5e-2, "rtol": 5e-2}}
# named targets -> (CPU architecture, CUDA compute capability or None)
TARGETS = {"jetson-orin": ("aarch64", "8.7"), "jetson-xavier": ("aarch64", "7.2"),
           "h100": ("x86_64", "9.0"), "h200": ("x86_64", "9.0")}
PREPROCESS = {"channel_order": "RGB", "resize": "bilinear", "scale": 1.0 / 255.0, "layout": "NCHW",
              "normalize_inside": True, "points": "original image pixels (x, y), scaled by (W/w0, H/h0)"}
ONNX_OPSET = 20
# ATen ops that read tensor values into the host or make shapes data-dependent (by base name)
FORBIDDEN_OPS = {"nonzero", "nonzero_static", "_local_scalar_dense", "item", "unique", "_unique", "_unique2",
                 "unique_consecutive", "unique_dim", "masked_select", "_assert_scalar", "_assert_async",
                 "sym_constrain_range", "sym_constrain_range_for_size", "argwhere"}


class ExportError(ValueError):
    """Anything that stops an export: the message says what and what to do."""


@dataclass
class ExportOptions:
    out: str
    device: str = "cpu"  # cpu | cuda | cuda:N
    dtype: str = "float32"  # compute dtype inside the package
    buckets: tuple[int, ...] | None = None  # None: the model config's ladder
    batch: int = 1
    onnx: bool = False
    onnx_buckets: tuple[int, ...] | None = None  # None: every exported bucket (with onnx)
    max_autotune: bool = False
    target: str = "native"  # or a name in TARGETS, or "ARCH[:sm_XY]"
    seed: int = 0
    check_timeout_s: int = 900
    cpp_runner: str | None = None  # C++ runner for the self-check where Python cannot load packages


# ---- model ----------------------------------------------------------------------------------------
def preset_of(cfg: ModelConfig) -> str | None:
    """The preset whose config this is (ignoring the bucket ladder and the backbone file), else None."""
    def key(c: ModelConfig) -> dict:
        d = to_dict(c)
        d.pop("buckets"), d.pop("backbone_weights")
        return d
    return next((name for name in PRESETS if key(model_config(name)) == key(cfg)), None)


def load_for_export(checkpoint: str | None = None, preset: str | None = None, seed: int = 0) -> tuple[DepthPack, str | None]:
    """(float32 CPU model in eval mode, preset name or None). A checkpoint is rebuilt from its stored
    config and safetensors weights (nothing is unpickled); a preset gets seeded random weights."""
    if (checkpoint is None) == (preset is None):
        raise ExportError("give exactly one of --checkpoint CKPT or --preset NAME")
    if preset is not None:
        if preset not in PRESETS:
            raise ExportError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        model = random_weights_(create_model(preset, backbone_weights=None), seed)
        return model.eval(), preset
    if not Path(checkpoint).exists():
        raise ExportError(f"checkpoint {checkpoint}: no such file or folder")
    try:
        from .checkpoint import load_model
    except ImportError:  # older layout
        from .train import load_model
    model = load_model(checkpoint)
    model = model[0] if isinstance(model, tuple) else model
    return model.float().cpu().eval(), preset_of(model.cfg)


def cast_model(model: DepthPack, dtype: torch.dtype, device: torch.device) -> DepthPack:
    """A copy in the compute dtype on the device (the selection priorities and offset frequencies are
    integer buffers inside DepthPack, so the cast leaves them exact)."""
    model = copy.deepcopy(model).to(device=device, dtype=dtype)
    model.fused_embed = False  # the packages hold the torch reference path; Inductor fuses it itself
    return model.eval()


class PackedForward(nn.Module):
    """The exported function: images [B,3,H,W] f32, points [B,K,2] f32 -> depth [B,K] f32."""

    def __init__(self, model: DepthPack, capacity: int):
        super().__init__()
        self.model, self.capacity = model, capacity

    def forward(self, images: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        return self.model.forward_packed(images, points, self.capacity)


# ---- checks on the request ------------------------------------------------------------------------
def parse_target(target: str) -> tuple[str, str | None] | None:
    """None for 'native'; (arch, compute capability or None) for a name or 'ARCH[:sm_XY]'."""
    if target in ("native", "", None):
        return None
    if target in TARGETS:
        return TARGETS[target]
    arch, _, sm = target.partition(":")
    if arch not in ("x86_64", "aarch64") or (sm and not (sm.startswith("sm_") and sm[3:].isdigit() and len(sm) >= 5)):
        raise ExportError(f"unknown target {target!r}: use native, one of {sorted(TARGETS)}, or ARCH[:sm_XY] "
                          f"with ARCH x86_64 or aarch64 (e.g. aarch64:sm_87)")
    return arch, (f"{sm[3:-1]}.{sm[-1]}" if sm else None)


def resolve_device(device: str, target: str = "native") -> torch.device:
    """The device to build for, or an ExportError when this process cannot build for it: AOTInductor
    compiles for the CPU it runs on and the GPU it sees, so a package is built where it will run."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ExportError(f"--device {device!r}: use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ExportError(f"--device {device!r}: use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ExportError(f"--device {device}: CUDA is not available on this machine (torch {torch.__version__}); "
                              f"a CUDA package must be built on a machine with the GPU that will run it")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ExportError(f"--device {device}: only {torch.cuda.device_count()} GPU(s) visible")
    wanted = parse_target(target)
    if wanted is not None:
        arch, cc = wanted
        here = platform.machine()
        if arch != here:
            raise ExportError(f"cannot build for target {target} ({arch}{', sm_' + cc.replace('.', '') if cc else ''}) "
                              f"on this {here} machine: a .pt2 holds native code for the CPU it was built on; "
                              f"export on the target itself (deploy_cpp/README.md), or use --onnx and TensorRT there")
        if cc is not None:
            if dev.type != "cuda":
                raise ExportError(f"target {target} is a GPU (sm_{cc.replace('.', '')}): add --device cuda")
            have = "{}.{}".format(*torch.cuda.get_device_capability(dev))
            if have != cc:
                raise ExportError(f"cannot build for target {target} (sm_{cc.replace('.', '')}) on this GPU "
                                  f"(sm_{have.replace('.', '')}): export on a GPU of the target's compute capability")
    return dev


def check_buckets(buckets, cfg: ModelConfig) -> tuple[int, ...]:
    buckets = tuple(int(b) for b in buckets)
    if not buckets:
        raise ExportError("--buckets: give at least one capacity")
    if any(b < 1 for b in buckets):
        raise ExportError(f"--buckets {list(buckets)}: capacities must be positive")
    if any(a >= b for a, b in zip(buckets, buckets[1:])):
        raise ExportError(f"--buckets {list(buckets)}: capacities must be strictly ascending")
    if buckets[-1] > cfg.num_patches:
        raise ExportError(f"--buckets {list(buckets)}: {buckets[-1]} is more than the {cfg.num_patches} patches of a "
                          f"{cfg.img_size[0]}x{cfg.img_size[1]} image (patch {cfg.patch_size})")
    return buckets


# ---- torch.export + AOTInductor --------------------------------------------------------------------
def example_inputs(cfg: ModelConfig, batch: int, k: int, device, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images [B,3,H,W] in [0,1) and points [B,K,2] inside them; the last quarter of each row
    repeats the first point, like the runners' padding."""
    H, W = cfg.img_size
    images = torch.rand(batch, 3, H, W, generator=g)
    points = torch.rand(batch, k, 2, generator=g) * torch.tensor([W, H]) * (1 - 1e-6)
    pad = k // 4
    if pad:
        points[:, k - pad:] = points[:, :1]
    return images.to(device), points.to(device)


def static_graph_problems(ep: torch.export.ExportedProgram) -> list[str]:
    """What makes the exported graph data-dependent or dynamic (empty list: a static graph)."""
    problems = [f"range constraint on {s}" for s in ep.range_constraints]
    for node in ep.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target.__name__.split(".")[0] in FORBIDDEN_OPS:
                problems.append(f"data-dependent op {node.target} ({node.name})")
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not all(isinstance(s, int) for s in val.shape):
            problems.append(f"symbolic shape {tuple(val.shape)} at {node.name}")
    return problems


def export_program(model: DepthPack, k: int, batch: int, device, g: torch.Generator) -> torch.export.ExportedProgram:
    images, points = example_inputs(model.cfg, batch, k, device, g)
    with torch.no_grad():
        ep = torch.export.export(PackedForward(model, k).eval(), (images, points), strict=False)
    problems = static_graph_problems(ep)
    if problems:
        raise ExportError(f"bucket {k}: the packed forward is not one static graph: {'; '.join(problems[:5])}")
    return ep


def compile_package(ep: torch.export.ExportedProgram, path: Path, max_autotune: bool) -> Path:
    """AOTInductor-compile into a .pt2, written in a temporary folder under its final name (the
    archive's top folder is named after the file) and then moved into place."""
    tmp_dir = path.parent / ".tmp_packages"
    tmp_dir.mkdir(exist_ok=True)
    tmp = tmp_dir / path.name
    tmp.unlink(missing_ok=True)
    torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp),
                                             inductor_configs={"max_autotune": bool(max_autotune)})
    os.replace(tmp, path)
    tmp_dir.rmdir()
    return path


def tensor_spec(name: str, shape: list[int]) -> dict:
    """Every package input and output is a contiguous float32 tensor (the compute dtype is inside)."""
    return {"name": name, "shape": [int(s) for s in shape], "dtype": "float32"}


# ---- reference image, points, eager outputs --------------------------------------------------------
def reference_image(h0: int, w0: int, seed: int) -> np.ndarray:
    """uint8 RGB [h0,w0,3]: a rendered synthetic scene when depthpack.data has the renderer, else a
    procedural pattern (sky gradient, checkered floor, discs) with edges at every scale."""
    try:
        from .data.synthetic import render
        img = render(seed, 0, (h0, w0), scene="outdoor", split="test")["image"]
        return np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)
    except Exception:  # noqa: BLE001 - no renderer (or a broken one): the procedural pattern will do
        pass
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h0, 0:w0].astype(np.float32)
    img = np.stack([0.3 + 0.4 * y / h0, 0.5 + 0.3 * y / h0, np.full_like(y, 0.9)], -1)
    horizon = 0.45 * h0
    floor = y > horizon
    depth = 1.0 / np.maximum(y - horizon, 1.0)
    check = ((np.floor((x - w0 / 2) * depth * 2) + np.floor(depth * 200)) % 2).astype(np.float32)
    img[floor] = (0.25 + 0.5 * check[floor])[:, None] * np.array([0.9, 0.7, 0.5])
    for _ in range(6):
        cy, cx, r = rng.uniform(0.2, 0.9) * h0, rng.uniform(0, 1) * w0, rng.uniform(0.05, 0.15) * min(h0, w0)
        img[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0.1, 0.95, 3)
    return np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)


def reference_points(q: int, h0: int, w0: int, seed: int) -> np.ndarray:
    """[Q,2] (x, y) on a quarter-pixel grid inside the original image: exact in decimal text and in
    float32, so the CSV and the tensor hold the same numbers. A few duplicates on purpose."""
    rng = np.random.default_rng(seed + 1)
    pts = np.stack([rng.integers(0, 4 * w0, q), rng.integers(0, 4 * h0, q)], -1).astype(np.float32) / 4
    if q > 6:
        pts[5] = pts[2]
    return pts


def write_points_csv(path: Path, pts: np.ndarray) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["x", "y"])
        w.writerows([repr(float(x)), repr(float(y))] for x, y in pts)


def eager_runners(model: DepthPack, buckets) -> dict:
    def make(k):
        return lambda images, points: model.forward_packed(images, points, k)
    return {k: make(k) for k in buckets}


def write_reference(model: DepthPack, buckets, out: Path, batch: int, seed: int, device) -> dict:
    """reference.png (1.5x / 1.25x the model size, so resizing and point scaling are exercised),
    reference_points.csv (Q = largest bucket + 3, so chunking and padding are exercised) and
    reference.safetensors (images = preprocess(reference.png), points scaled, eager depth, chunked)."""
    import cv2
    from safetensors.torch import save_file
    from .preprocess import load_image, scale_points

    H, W = model.cfg.img_size
    h0, w0 = (3 * H) // 2, (5 * W) // 4
    rgb = reference_image(h0, w0, seed)
    if not cv2.imwrite(str(out / "reference.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
        raise ExportError(f"could not write {out / 'reference.png'}")
    image, orig = load_image(out / "reference.png", (H, W))  # [3,H,W], exactly what runners compute
    assert tuple(orig) == (h0, w0)
    q = buckets[-1] + 3
    pts0 = reference_points(q, h0, w0, seed)
    write_points_csv(out / "reference_points.csv", pts0)
    pts = scale_points(pts0, (h0, w0), (H, W))  # [Q,2] model pixels
    images = image.unsqueeze(0).repeat(batch, 1, 1, 1).contiguous()  # [B,3,H,W]
    points = torch.stack([pts.roll(b, 0) for b in range(batch)]).contiguous()  # [B,Q,2], row 0 = CSV order
    with torch.no_grad():
        depth = run_chunked(eager_runners(model, buckets), images.to(device), points.to(device)).float().cpu()
    tmp = out / ".tmp_reference.safetensors"
    save_file({"images": images, "points": points, "depth": depth.contiguous()}, str(tmp))
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / "reference.safetensors")
    return {"file": "reference.safetensors", "sha256": sha256_file(out / "reference.safetensors"),
            "image": "reference.png", "points_csv": "reference_points.csv"}


# ---- ONNX ------------------------------------------------------------------------------------------
def export_onnx(model32: DepthPack, k: int, batch: int, path: Path, g: torch.Generator) -> dict:
    """float32 ONNX (opset 20) of the packed forward; TensorRT picks fp16/bf16 itself (--fp16/--bf16).
    Tries the dynamo exporter, falls back to the TorchScript one; then onnx.checker, onnxruntime vs eager."""
    import onnx
    import onnxruntime as ort

    wrapper = PackedForward(model32, k).eval()
    images, points = example_inputs(model32.cfg, batch, k, "cpu", g)
    names = dict(input_names=["images", "points"], output_names=["depth"], opset_version=ONNX_OPSET)
    errors = []
    for dynamo in (True, False):
        try:
            path.unlink(missing_ok=True)
            with torch.no_grad():
                one_file = dynamo and "external_data" in inspect.signature(torch.onnx.export).parameters
                kw = {"external_data": False} if one_file else {}  # one self-contained file
                torch.onnx.export(wrapper, (images, points), str(path), dynamo=dynamo, **names, **kw)
            onnx.checker.check_model(onnx.load(str(path)), full_check=True)
            exporter = "dynamo" if dynamo else "torchscript"
            break
        except Exception as e:  # noqa: BLE001 - any exporter failure means: try the other one
            errors.append(f"{'dynamo' if dynamo else 'torchscript'}: {type(e).__name__}: {str(e)[:300]}")
    else:
        raise ExportError(f"ONNX export of bucket {k} failed with both exporters: {' | '.join(errors)}")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fresh_images, fresh_points = example_inputs(model32.cfg, batch, k, "cpu", g)
    got = sess.run(["depth"], {"images": fresh_images.numpy(), "points": fresh_points.numpy()})[0]
    with torch.no_grad():
        want = model32.forward_packed(fresh_images, fresh_points, k)
    ok, err = within(torch.from_numpy(got), want, **TOLERANCE["float32"])
    if not ok:
        raise ExportError(f"ONNX bucket {k}: onnxruntime differs from eager by up to {err:.3g} m "
                          f"(tolerance {TOLERANCE['float32']})")
    return {"capacity": k, "file": path.name, "sha256": sha256_file(path), "exporter": exporter, "max_abs_diff": err}


# ---- self-check in a child process ------------------------------------------------------------------
CPP_RUNNER_CANDIDATES = ("deploy_cpp/build/depthpack_run", "/tmp/dp_cpp_build/depthpack_run")


def find_cpp_runner(explicit: str | None = None) -> Path | None:
    """The C++ runner to check packages with when Python cannot load them: --cpp-runner, then
    $DEPTHPACK_RUN, then the usual build folders."""
    root = Path(__file__).resolve().parents[1]
    for c in (explicit, os.environ.get("DEPTHPACK_RUN"), *CPP_RUNNER_CANDIDATES):
        if c:
            p = Path(c) if Path(c).is_absolute() else root / c
            if p.is_file() and os.access(p, os.X_OK):
                return p
            if c == explicit:
                raise ExportError(f"--cpp-runner {explicit}: not an executable file")
    return None


def cpp_check(runner: Path, manifest_path: Path, fresh: dict, buckets, timeout_s: int = 600) -> dict:
    """The same checks with the C++ runner: `depthpack_run --manifest M --check F` on one file per
    bucket (fresh images, points [B,K,2], eager depth) and on the reference file; each must exit 0."""
    from safetensors.torch import save_file

    report = {"checker": f"cpp ({runner})", "buckets": {}, "ok": True}
    files = {}
    for k in buckets:
        f = manifest_path.parent / f".selfcheck_k{k}.safetensors"
        save_file({"images": fresh[f"images_k{k}"].contiguous(), "points": fresh[f"points_k{k}"].contiguous(),
                   "depth": fresh[f"depth_k{k}"].contiguous()}, str(f))
        files[k] = f
    manifest = json.loads(manifest_path.read_text())
    files["reference"] = manifest_path.parent / manifest["reference"]["file"]
    try:
        for k, f in files.items():
            cmd = [str(runner), "--manifest", str(manifest_path), "--check", str(f)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise ExportError(f"self-check (C++ runner): {' '.join(cmd)} did not finish in {timeout_s} s") from None
            m = re.search(r"max abs diff (\S+)", proc.stderr)
            entry = {"ok": proc.returncode == 0, "max_abs_diff": float(m[1]) if m else None,
                     "runner_says": proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else []}
            if proc.returncode < 0:
                entry["signal"] = signal.Signals(-proc.returncode).name
            if k == "reference":
                report["reference"] = entry
            else:
                report["buckets"][str(k)] = entry
            report["ok"] &= entry["ok"]
    finally:
        for k in buckets:
            files[k].unlink(missing_ok=True)
    return report


def self_check(model: DepthPack, manifest_path: Path, buckets, batch: int, device, g: torch.Generator,
               timeout_s: int = 900, cpp_runner: str | None = None, log=print) -> dict:
    """Run every package on fresh random inputs and on the reference file in a child process
    (python -m depthpack.aoti --check), against eager outputs computed here. A child that hangs or
    reports a mismatch is an ExportError. A child KILLED by a signal (torch 2.11 + CUDA packages on
    the H200: SIGSEGV in the loader) is the documented fallback: the same checks with the C++ runner
    (deploy_cpp) when one is found, else an ExportError that says how to get one."""
    from safetensors.torch import save_file

    fresh = {}
    with torch.no_grad():
        for k in buckets:
            images, points = example_inputs(model.cfg, batch, k, device, g)
            fresh[f"images_k{k}"], fresh[f"points_k{k}"] = images.cpu(), points.cpu()
            fresh[f"depth_k{k}"] = model.forward_packed(images, points, k).float().cpu()
    inputs = manifest_path.parent / ".selfcheck_inputs.safetensors"
    save_file({n: t.contiguous() for n, t in fresh.items()}, str(inputs))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])  # so the child imports this depthpack
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-X", "faulthandler", "-m", "depthpack.aoti", "--check", str(manifest_path),
           "--device", str(device), "--inputs", str(inputs), "--no-probe"]  # it is the probe
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise ExportError(f"self-check: the child process loading the packages did not finish in {timeout_s} s") from None
    finally:
        inputs.unlink(missing_ok=True)
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        tail = "\n".join(ln for ln in proc.stderr.strip().splitlines()[-15:] if not ln.startswith("Extension modules"))
        why = (f"loading the packages in Python killed the child process with {sig} (torch {torch.__version__}, "
               f"{device}; known on torch 2.11.0+cu130 with CUDA packages)")
        runner = find_cpp_runner(cpp_runner)
        if runner is None:
            raise ExportError(f"self-check: {why}; the packages are NOT verified. Build the C++ runner (deploy_cpp) and "
                              f"pass --cpp-runner PATH to check them with it. The child's last words:\n{tail}")
        log(f"self-check: {why}; checking with the C++ runner {runner} instead")
        report = cpp_check(runner, manifest_path, fresh, buckets, timeout_s)
        report["python_loader"] = f"killed by {sig}"
        if not report["ok"]:
            raise ExportError(f"self-check (C++ runner): packages differ from eager or the runner failed: "
                              f"buckets {report['buckets']}, reference {report.get('reference')}")
        report["load_s"] = None
        return report
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise ExportError(f"self-check: the child exited {proc.returncode} without a report:\n{proc.stderr[-2000:]}")
    report = json.loads(lines[-1])
    report["checker"] = "python (depthpack.aoti, child process)"
    if not report.get("ok"):
        if "error" in report:
            raise ExportError(f"self-check: {report['error']}")
        bad = {k: v for k, v in report["buckets"].items() if not v["ok"]}
        raise ExportError(f"self-check: packages differ from eager beyond the tolerance: buckets {bad}, "
                          f"reference {report['reference']}")
    return report


# ---- the whole export -------------------------------------------------------------------------------
def _atomic_write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".tmp_{path.name}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def build_manifest(cfg: ModelConfig, preset, opts: ExportOptions, device: torch.device, buckets, bucket_entries,
                   reference: dict, onnx_entries: list) -> dict:
    mcfg = to_dict(cfg)
    mcfg["buckets"] = list(buckets)
    mcfg["backbone_weights"] = None
    manifest = {
        "format": FORMAT, "preset": preset, "model_config": mcfg,
        "image_size": list(cfg.img_size), "patch_size": cfg.patch_size, "batch_size": opts.batch,
        "device": device.type,
        "compute_capability": "{}.{}".format(*torch.cuda.get_device_capability(device)) if device.type == "cuda" else None,
        "arch": platform.machine(), "dtype": opts.dtype, "torch_version": torch.__version__,
        "min_depth": cfg.min_depth, "max_depth": cfg.max_depth,
        "preprocess": dict(PREPROCESS), "tolerance": dict(TOLERANCE[opts.dtype]),
        "buckets": sorted(bucket_entries, key=lambda b: b["capacity"]),
    }
    if onnx_entries:
        manifest["onnx"] = [{k: e[k] for k in ("capacity", "file", "sha256")} for e in onnx_entries]
    manifest["reference"] = reference
    return manifest


def export(model: DepthPack, opts: ExportOptions, preset: str | None = None, log=print) -> dict:
    """Build the folder opts.out from a float32 CPU model; returns a summary with measured times.
    Raises ExportError (a ValueError) on any refusal or failed check."""
    if opts.dtype not in DTYPES:
        raise ExportError(f"--dtype {opts.dtype!r}: choose one of {sorted(DTYPES)}")
    if opts.batch < 1:
        raise ExportError(f"--batch {opts.batch}: must be >= 1")
    device = resolve_device(opts.device, opts.target)
    if opts.cpp_runner:
        find_cpp_runner(opts.cpp_runner)  # refuse a wrong path now, not after minutes of compiling
    buckets = check_buckets(opts.buckets or model.cfg.buckets, model.cfg)
    onnx_buckets = tuple(opts.onnx_buckets or buckets) if opts.onnx else ()
    if set(onnx_buckets) - set(buckets):
        raise ExportError(f"--onnx-buckets {list(onnx_buckets)}: each must be one of the exported buckets {list(buckets)}")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)  # a failed export leaves no manifest a runner would trust
    deployed = cast_model(model, DTYPES[opts.dtype], device)
    g = torch.Generator().manual_seed(opts.seed)
    times: dict = {"export_s": {}, "compile_s": {}}
    entries = []
    t_all = time.perf_counter()
    bar = tqdm(buckets, desc=f"AOTInductor {device.type} {opts.dtype}", unit="bucket", file=sys.stderr)
    for k in bar:
        bar.set_postfix_str(f"k={k} torch.export")
        t0 = time.perf_counter()
        ep = export_program(deployed, k, opts.batch, device, g)
        t1 = time.perf_counter()
        bar.set_postfix_str(f"k={k} compile")
        path = compile_package(ep, out / f"depthpack_k{k}.pt2", opts.max_autotune)
        t2 = time.perf_counter()
        times["export_s"][k], times["compile_s"][k] = round(t1 - t0, 2), round(t2 - t1, 2)
        log(f"bucket {k}: torch.export {t1 - t0:.1f} s, AOTInductor compile {t2 - t1:.1f} s -> {path.name}")
        B, (H, W) = opts.batch, deployed.cfg.img_size
        entries.append({"capacity": k, "file": path.name, "sha256": sha256_file(path),
                        "inputs": [tensor_spec("images", [B, 3, H, W]), tensor_spec("points", [B, k, 2])],
                        "outputs": [tensor_spec("depth", [B, k])]})
    reference = write_reference(deployed, buckets, out, opts.batch, opts.seed, device)
    onnx_entries = []
    for k in onnx_buckets:
        t0 = time.perf_counter()
        e = export_onnx(model, k, opts.batch, out / f"depthpack_k{k}.onnx", g)
        times.setdefault("onnx_s", {})[k] = round(time.perf_counter() - t0, 2)
        log(f"ONNX bucket {k}: {e['exporter']} exporter, onnxruntime vs eager max |diff| {e['max_abs_diff']:.2e} m")
        onnx_entries.append(e)
    manifest = build_manifest(model.cfg, preset, opts, device, buckets, entries, reference, onnx_entries)
    unchecked = out / ".manifest.unchecked.json"
    _atomic_write_json(unchecked, manifest)
    t0 = time.perf_counter()
    log("self-check: loading the packages in a child process (python -m depthpack.aoti --check)")
    report = self_check(deployed, unchecked, buckets, opts.batch, device, g, opts.check_timeout_s,
                        opts.cpp_runner, log)
    times["check_s"] = round(time.perf_counter() - t0, 2)
    os.replace(unchecked, out / "manifest.json")
    times["total_s"] = round(time.perf_counter() - t_all, 2)
    log(f"self-check ok ({report['checker']}): fresh inputs {report['buckets']}, reference {report['reference']}")
    check = {k: report[k] for k in ("checker", "buckets", "reference", "load_s", "python_loader") if k in report}
    return {"out": str(out), "manifest": str(out / "manifest.json"), "device": str(device), "dtype": opts.dtype,
            "buckets": list(buckets), "torch": torch.__version__, "times": times, "check": check,
            "onnx": [{k: e[k] for k in ("capacity", "exporter", "max_abs_diff")} for e in onnx_entries]}
