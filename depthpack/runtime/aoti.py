"""Load and run exported AOTInductor packages (depthpack_k{K}.pt2) from Python.

    manifest, runners = load_runners("export/tiny/manifest.json", "cpu")
    depth = run_packages(runners, images, points)        # any Q, chunked like every runner

The loader is the binding the C++ runner uses, `torch._C._aoti.AOTIModelPackageLoader(path, "model",
run_single_threaded, 1, device_index)`, after host-side checks (sha256, device, compute capability,
CPU architecture, torch version, tensor shapes: depthpack.deploy.contract); on CUDA it is
single-threaded so that its run can be captured in a CUDA graph. Where loading a package kills the
process (torch 2.11.0+cu130 on the H200: docs/bench/h200/), a child process tries first
(probe_loading) and the caller gets a ValueError instead of dying.

CLI (the exporter's self-check runs it in a child process):
    python -m depthpack.runtime.aoti --check DIR/manifest.json [--device cuda] [--inputs F] [--bench N]
compares the packages with the reference file (and with the eager outputs stored in F), prints one
JSON line, exit code 0 when everything is within the manifest's tolerance, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from ..core.packing import run_chunked
from ..deploy.contract import (PACKAGE_BUCKET, PACKAGE_INPUTS, check_device, read_manifest, verify_file,
                               within)
from .graphs import capture, summarize, time_calls

Runner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ---- loading --------------------------------------------------------------------------------------
def _device_index(device: torch.device) -> int:
    if device.type != "cuda":
        return -1
    return device.index if device.index is not None else torch.cuda.current_device()


def load_package(path: str | Path, device: torch.device):
    """The loader object itself: the binding the C++ runner also uses, single-threaded on CUDA."""
    run_single_threaded = device.type == "cuda"  # no internal locking/stream juggling: graph-capturable
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", run_single_threaded, 1, _device_index(device))


def _make_runner(loader, bucket: dict, device: torch.device) -> Runner:
    """fn(images [B,3,H,W] f32, points [B,K,2] f32) -> depth [B,K] f32 on the package's device.

    Shapes, dtypes and devices are checked on the host (metadata only, no sync), because a package
    given the wrong shape reads out of bounds instead of raising.
    """
    specs = [(t["name"], tuple(t["shape"]), t["dtype"]) for t in bucket["inputs"]]

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        for (name, shape, dtype), t in zip(specs, inputs):
            if tuple(t.shape) != shape or t.dtype != getattr(torch, dtype) or t.device.type != device.type:
                raise ValueError(f"package k{bucket['bucket']}: {name} must be {dtype} {list(shape)} on "
                                 f"{device.type}, got {str(t.dtype)[6:]} {list(t.shape)} on {t.device}")
        return loader.run([t.contiguous() for t in inputs])[0]

    run.loader = loader  # keep the loader reachable (and inspectable)
    run.bucket = bucket["bucket"]
    return run


_PROBED: dict[tuple, str | None] = {}  # (torch, device, package sha256) -> None (loads fine) or the error


def _child_env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # so the child imports this depthpack
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def probe_loading(manifest_path: str | Path, device: torch.device, timeout_s: int = 600) -> None:
    """Load and run the first package in a CHILD process before this process does: where loading
    kills Python (torch 2.11.0+cu130 on the H200: SIGSEGV inside AOTIModelPackageLoader's constructor
    for CUDA packages), the caller gets a ValueError instead of dying. Once per process and package.
    DEPTHPACK_AOTI_PROBE=0 skips it (for a torch known to load packages fine)."""
    if os.environ.get("DEPTHPACK_AOTI_PROBE", "1") == "0":
        return
    manifest = read_manifest(manifest_path)
    key = (torch.__version__, str(device), manifest["buckets"][0]["sha256"])
    if key not in _PROBED:
        cmd = [sys.executable, "-X", "faulthandler", "-m", "depthpack.runtime.aoti", "--probe",
               "--check", str(manifest_path), "--device", str(device)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_child_env())
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            rc, err = None, f"timed out after {timeout_s} s"
        if rc == 0:
            _PROBED[key] = None
        else:
            what = (f"was killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0
                    else f"failed (exit {rc})")
            tail = " | ".join(ln.strip() for ln in err.strip().splitlines()[-4:])
            _PROBED[key] = (f"loading an AOTInductor package from Python {what} in a child process on this machine "
                            f"(torch {torch.__version__}, {device}); this process did not try. Child said: {tail}")
    if _PROBED[key] is not None:
        raise ValueError(_PROBED[key])


def load_runners(manifest_path: str | Path, device: str | torch.device,
                 probe: bool = True) -> tuple[dict, dict[int, Runner]]:
    """(manifest, {bucket K: fn(images [B,3,H,W], points [B,K,2]) -> depth [B,K]}).

    Every package's sha256 is checked against the manifest before anything is loaded (a clear
    ValueError on a missing or changed file), then the device, architecture and torch version, then
    (probe=True) loading is tried in a child process first, so a crashing loader raises here.
    """
    manifest = read_manifest(manifest_path)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    root = Path(manifest_path).parent
    for b in manifest["buckets"]:
        verify_file(root / b["file"], b["sha256"], "package")
    check_device(manifest, device)
    if probe:
        probe_loading(manifest_path, device)
    if device.type == "cuda":
        torch.cuda.init()
    runners: dict[int, Runner] = {}
    for b in manifest["buckets"]:
        loader = load_package(root / b["file"], device)
        meta = loader.get_metadata()
        key = meta.get("AOTI_DEVICE_KEY", manifest["device"])
        if key != manifest["device"]:
            raise ValueError(f"package {b['file']} holds code for {key}, the manifest says {manifest['device']}")
        check_package_metadata(meta, b)
        runners[int(b["bucket"])] = _make_runner(loader, b, device)
    return manifest, dict(sorted(runners.items()))


def check_package_metadata(meta: dict, entry: dict) -> None:
    """The package's own record of its bucket and inputs must be the manifest entry's: an entry that
    names another bucket's package (with that package's sha256) is refused here."""
    bucket, inputs = meta.get(PACKAGE_BUCKET), meta.get(PACKAGE_INPUTS)
    if bucket is None or inputs is None:
        raise ValueError(f"package {entry['file']} does not record its bucket and inputs (exported by an older "
                         f"depthpack?); re-export it")
    if int(bucket) != entry["bucket"] or json.loads(inputs) != entry["inputs"]:
        raise ValueError(f"package {entry['file']} is the package of bucket {bucket} with inputs {json.loads(inputs)}, "
                         f"but the manifest lists it for bucket {entry['bucket']} with {entry['inputs']}")


def run_packages(runners: dict[int, Runner], images: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """depth [B,Q] for any Q through the packages, chunked and padded by the one rule (packing.run_chunked)."""
    return run_chunked(lambda im, pts, k: runners[k](im, pts), images, points, tuple(sorted(runners)))


# ---- latency (a measurement for the benchmark's output, never an assertion) -----------------------
def bench_runner(fn: Runner, images: torch.Tensor, points: torch.Tensor, iters: int = 100,
                 graph: bool = False) -> dict:
    """Median and p90 latency (ms, one call + sync) of fn(images, points); on CUDA optionally its
    replay from a captured graph."""
    call = lambda i: fn(images, points)  # noqa: E731
    if graph:
        if not images.is_cuda:
            raise ValueError("CUDA graph capture needs CUDA tensors")
        g, _ = capture(lambda: fn(images, points), warmup=3)
        call = lambda i: g.replay()  # noqa: E731
    return summarize(time_calls(call, images.device, min_calls=iters, max_calls=iters))


# ---- the self-check, run in a child process by the exporter ----------------------------------------
def check(manifest_path: str | Path, device: str | None = None, inputs: str | None = None,
          bench: int = 0, probe: bool = True) -> dict:
    """Compare every package with the reference file (chunked) and, when `inputs` is given, with the
    eager outputs stored there ("images_k{K}", "points_k{K}", "depth_k{K}"). Returns a report dict."""
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    dev = torch.device(device or read_manifest(manifest_path)["device"])
    root = Path(manifest_path).parent
    manifest, runners = load_runners(manifest_path, dev, probe=probe)
    tol = manifest["tolerance"]
    report = {"device": str(dev), "torch": torch.__version__, "load_s": round(time.perf_counter() - t0, 3),
              "buckets": {}, "ok": True}
    with torch.inference_mode():
        name = manifest["buckets"][0]["inputs"][0]["name"]  # images | frames
        if inputs:
            fresh = load_file(inputs)
            for k, fn in runners.items():
                out = fn(fresh[f"{name}_k{k}"].to(dev), fresh[f"points_k{k}"].to(dev))
                ok, err = within(out, fresh[f"depth_k{k}"], **tol)
                report["buckets"][k] = {"ok": ok, "max_abs_diff": err}
                report["ok"] &= ok
        ref_entry = manifest["reference"]
        verify_file(root / ref_entry["file"], ref_entry["sha256"], "reference file")
        ref = load_file(str(root / ref_entry["file"]))
        B = manifest["batch_size"]
        out = run_packages(runners, ref[name][:B].to(dev), ref["points"][:B].to(dev))
        ok, err = within(out, ref["depth"][:B], **tol)
        report["reference"] = {"ok": ok, "max_abs_diff": err, "points": int(ref["points"].shape[1])}
        report["ok"] &= ok
        if bench:
            report["latency"] = {}
            for k, fn in runners.items():
                images = ref[name][:B].to(dev).contiguous()
                pts = ref["points"][:B, :k].to(dev).contiguous()
                lat = {"plain": bench_runner(fn, images, pts, bench)}
                if dev.type == "cuda":
                    lat["cuda_graph"] = bench_runner(fn, images, pts, bench, graph=True)
                report["latency"][k] = lat
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m depthpack.runtime.aoti", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", required=True, metavar="MANIFEST", help="DIR/manifest.json to check")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the manifest's device)")
    ap.add_argument("--inputs", default=None, help="safetensors of fresh inputs + eager depths (from the exporter)")
    ap.add_argument("--bench", type=int, default=0, metavar="N", help="also time each package N times")
    ap.add_argument("--no-probe", action="store_true",
                    help="load in this process without trying a child first (the exporter's own child does this)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # load and run one package, here
    args = ap.parse_args(argv)
    try:
        if args.probe:
            print(json.dumps(_probe(args.check, args.device)))
            return 0
        report = check(args.check, args.device, args.inputs, args.bench, probe=not args.no_probe)
    except ValueError as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        return 1
    print(json.dumps(report))
    return 0 if report["ok"] else 1


def _probe(manifest_path: str, device: str | None = None) -> dict:
    """Load and run the first package in this process (the child of probe_loading)."""
    manifest = read_manifest(manifest_path)
    bucket = manifest["buckets"][0]
    device = torch.device(device or manifest["device"])
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    loader = load_package(Path(manifest_path).parent / bucket["file"], device)
    inputs = [torch.randint(0, 256, t["shape"], dtype=torch.uint8, device=device) if t["dtype"] == "uint8"
              else torch.rand(t["shape"], device=device) * (4 if t["name"] == "points" else 1) for t in bucket["inputs"]]
    out = loader.run(inputs)[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"output_shape": list(out.shape), "finite": bool(torch.isfinite(out).all())}


if __name__ == "__main__":
    sys.exit(main())
