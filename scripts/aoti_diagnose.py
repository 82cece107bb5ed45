#!/usr/bin/env python
"""Which way of loading an AOTInductor package survives on this machine: each method in its own child
process (python -X faulthandler), reported as returned / raised / killed by a signal.

    python scripts/aoti_diagnose.py --check DIR/manifest.json [--probes a,b]

A lab for one torch build (torch 2.11.0+cu130 on the H200, where loading a package from Python died
with SIGSEGV), kept out of the library.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import torch  # noqa: E402

from depthpack.deploy.contract import read_manifest  # noqa: E402
from depthpack.runtime.aoti import _child_env, _device_index  # noqa: E402


PROBES = ("metadata", "device_info", "binding", "binding_multithreaded", "binding_before_cuda_init",
          "binding_rtld_global", "container_runner", "aoti_load_package", "aoti_load_package_single_threaded",
          "compile_then_load_in_process")


def _container_runner(path: str, device: torch.device):
    """The layer under the package loader: extract the .pt2 (a zip) and build the container runner
    from its .so and cubin folder directly (AOTIModelContainerRunnerCpu/Cuda)."""
    import tempfile
    import zipfile

    tmp = Path(tempfile.mkdtemp(prefix="dp_aoti_"))
    with zipfile.ZipFile(path) as z:
        z.extractall(tmp)
    so = next(tmp.rglob("*.so"))
    if device.type == "cuda":
        return torch._C._aoti.AOTIModelContainerRunnerCuda(str(so), 1, str(device), str(so.parent), True)
    return torch._C._aoti.AOTIModelContainerRunnerCpu(str(so), 1)


def _probe(method: str, manifest_path: str, device: str | None = None) -> dict:
    """One loading method, run in THIS process (the caller runs it in a child). Returns what it saw."""
    manifest = read_manifest(manifest_path)
    bucket = manifest["buckets"][0]
    path = str(Path(manifest_path).parent / bucket["file"])
    device = torch.device(device or manifest["device"])
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    if method == "binding_before_cuda_init":  # the loader first, before this process touches CUDA
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", device.type == "cuda", 1, _device_index(device))
    inputs = [torch.rand(t["shape"], device=device) * (4 if t["name"] == "points" else 1) for t in bucket["inputs"]]
    out = None
    if method == "binding_before_cuda_init":
        out = loader.run(inputs)[0]
    elif method == "container_runner":
        out = _container_runner(path, device).run(inputs)[0]
    elif method == "metadata":
        return {"metadata": torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(path, "model")}
    elif method == "device_info":
        from torch._inductor.codecache import get_device_information
        return {"device_info": get_device_information(device.type)}
    elif method in ("binding", "binding_multithreaded", "binding_rtld_global"):  # rtld: see diagnose()
        single = method != "binding_multithreaded" and device.type == "cuda"
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", single, 1, _device_index(device))
        out = loader.run(inputs)[0]
    elif method.startswith("aoti_load_package"):
        fn = torch._inductor.aoti_load_package(path, run_single_threaded=method.endswith("single_threaded"))
        out = fn(*inputs)
    elif method == "compile_then_load_in_process":  # the exporter's old pattern: compile, then load, one process
        import tempfile
        from depthpack.deploy.export import cast_model, compile_package, export_program, load_for_export
        model = cast_model(load_for_export(preset="tiny")[0], torch.float32, device)
        g = torch.Generator().manual_seed(0)
        pkg = Path(tempfile.mkdtemp()) / "probe_k8.pt2"
        compile_package(export_program(model, 8, 1, device, g), pkg, False)
        fn = torch._inductor.aoti_load_package(str(pkg))
        images = torch.rand(1, 3, *model.cfg.img_size, device=device)
        out = fn(images, torch.rand(1, 8, 2, device=device) * 8)
    else:
        raise ValueError(f"unknown probe {method!r}; choose from {PROBES}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"output_shape": list(out.shape), "finite": bool(torch.isfinite(out).all())}


def diagnose(manifest_path: str | Path, methods=PROBES, timeout_s: int = 300) -> dict:
    """Run each loading method in its own child process (python -X faulthandler) and report which
    return, which raise and which kill the process (signal), with the tail of their stderr."""
    env = _child_env()
    report = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
              "manifest": str(manifest_path), "probes": {}}
    t0 = time.perf_counter()
    # torch loads its libraries RTLD_LOCAL; a C++ program links them globally. TORCH_USE_RTLD_GLOBAL=1
    # makes Python do the same, to tell a symbol-resolution crash from one in the package itself.
    envs = {m: dict(env, TORCH_USE_RTLD_GLOBAL="1") if m == "binding_rtld_global" else env for m in methods}
    procs = {m: subprocess.Popen([sys.executable, "-X", "faulthandler", __file__, "--probe", m,
                                  "--check", str(manifest_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=envs[m]) for m in methods}  # concurrently: they are independent
    for method, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            rc, stdout, stderr = None, "", "timeout"
        entry = {"seconds_since_start": round(time.perf_counter() - t0, 2), "returncode": rc}
        if rc is not None and rc < 0:
            entry["signal"] = signal.Signals(-rc).name
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if rc == 0 and lines:
            entry["result"] = json.loads(lines[-1])
        else:
            entry["stderr_tail"] = stderr.strip().splitlines()[-12:]
        report["probes"][method] = entry
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", required=True, metavar="MANIFEST")
    ap.add_argument("--device", default=None)
    ap.add_argument("--probes", default=",".join(PROBES), help=f"which (default all: {','.join(PROBES)})")
    ap.add_argument("--probe", choices=PROBES, help=argparse.SUPPRESS)  # one method, in this process
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(_probe(args.probe, args.check, args.device)))
        return 0
    methods = [m for m in args.probes.split(",") if m]
    unknown = sorted(set(methods) - set(PROBES))
    if unknown:
        raise SystemExit(f"--probes: unknown {unknown}; choose from {list(PROBES)}")
    print(json.dumps(diagnose(args.check, methods)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
