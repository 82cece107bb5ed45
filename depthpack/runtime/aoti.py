"""Load and run exported AOTInductor packages (depthpack_k{K}.pt2) from Python.

    manifest, runners = load_runners("export/tiny/manifest.json", "cpu")
    depth = run_packages(runners, images, points)        # any Q, chunked like every runner
    depth = run_packages(runners, images, points, focal) # packages of a model with a focal input

The loader is the binding the C++ runner uses, `torch._C._aoti.AOTIModelPackageLoader(path, "model",
run_single_threaded, 1, device_index)`, after host-side checks (sha256, device, compute capability,
CPU architecture, torch version, tensor shapes: depthpack.deploy.contract); on CUDA it is
single-threaded so that its run can be captured in a CUDA graph. Every constant of the weights file is
checked against the package's own record of it (name, dtype, shape) before it is attached.

CLI (the exporter's self-check runs it in a child process):
    python -m depthpack.runtime.aoti --check DIR/manifest.json [--device cuda] [--inputs F] [--bench N]
compares the packages with the reference file (and with the eager outputs stored in F), prints one
JSON line, exit code 0 when everything is within the manifest's tolerance, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from ..core.packing import chunk_plan, pad_points, run_chunked
from ..deploy.contract import (PACKAGE_BUCKET, PACKAGE_CONSTANTS, PACKAGE_INPUTS, check_device, read_manifest,
                               verify_file, within)
from .graphs import capture, summarize, time_calls

Runner = Callable[..., torch.Tensor]  # (images|frames, points[, focal]) -> depth


# ---- loading --------------------------------------------------------------------------------------
def _device_index(device: torch.device) -> int:
    if device.type != "cuda":
        return -1
    return device.index if device.index is not None else torch.cuda.current_device()


def load_package(path: str | Path, device: torch.device):
    """The loader object itself: the binding the C++ runner also uses, single-threaded on CUDA."""
    run_single_threaded = device.type == "cuda"  # no internal locking/stream juggling: graph-capturable
    try:
        return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", run_single_threaded, 1, _device_index(device))
    except RuntimeError as e:  # a truncated or foreign file: the loader's words do not name it
        why = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise ValueError(f"package {path} cannot be loaded (truncated or not an AOTInductor package?): {why}") from None


def load_weights(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """The export's weights file (contract.WEIGHTS; safetensors, nothing unpickled) on the device."""
    from safetensors.torch import load_file

    return load_file(str(path), device=str(device))


def attach_weights(loader, weights: dict[str, torch.Tensor], package: str, weights_file: str) -> None:
    """Load the constants the package names into it, each checked first against the package's own record
    of its dtype and shape (PACKAGE_CONSTANTS): a package run with a missing or misshapen constant reads
    unset or foreign memory, so any mismatch is a ValueError naming the constant before the first call."""
    record = loader.get_metadata().get(PACKAGE_CONSTANTS)
    if record is None:
        raise ValueError(f"package {package} does not record the constants it expects (exported by an older "
                         f"depthpack); re-export")
    expected = json.loads(record)
    names = loader.get_constant_fqns()
    for name in names:
        t, want = weights.get(name), expected.get(name)
        if want is None:
            raise ValueError(f"package {package} names constant {name} but does not record its shape; re-export")
        if t is None:
            raise ValueError(f"weights {weights_file} lack constant {name} that package {package} needs: the weights "
                             f"are not this export's; re-export")
        got = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
        if got != want:
            raise ValueError(f"weights {weights_file}: constant {name} is {got['dtype']} {got['shape']}, package "
                             f"{package} expects {want['dtype']} {want['shape']}: the weights are not this export's")
    loader.load_constants({n: weights[n] for n in names}, False, True)  # (map, use_inactive, check_full_update)


def _make_runner(loader, bucket: dict, device: torch.device) -> Runner:
    """fn(images [B,3,H,W] f32, points [B,K,2] f32[, focal [B] f32]) -> depth [B,K] f32 (with a map
    output: (depth, map [B,rows,cols])) on the package's device: the manifest entry's inputs in call order.

    Shapes, dtypes and devices are checked on the host (metadata only, no sync), because a package
    given the wrong shape reads out of bounds instead of raising.
    """
    specs = [(t["name"], tuple(t["shape"]), t["dtype"]) for t in bucket["inputs"]]
    n_out = len(bucket["outputs"])

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != len(specs):
            raise ValueError(f"package k{bucket['bucket']} takes {len(specs)} inputs "
                             f"({', '.join(n for n, _, _ in specs)}), got {len(inputs)}")
        for (name, shape, dtype), t in zip(specs, inputs):
            if tuple(t.shape) != shape or t.dtype != getattr(torch, dtype) or t.device.type != device.type:
                raise ValueError(f"package k{bucket['bucket']}: {name} must be {dtype} {list(shape)} on "
                                 f"{device.type}, got {str(t.dtype)[6:]} {list(t.shape)} on {t.device}")
        out = loader.run([t.contiguous() for t in inputs])
        return out[0] if n_out == 1 else tuple(out[:n_out])

    run.loader = loader  # keep the loader reachable (and inspectable)
    run.bucket = bucket["bucket"]
    return run


def load_runners(manifest_path: str | Path, device: str | torch.device) -> tuple[dict, dict[int, Runner]]:
    """(manifest, {bucket K: fn(images [B,3,H,W], points [B,K,2]) -> depth [B,K]}).

    Every package's sha256 (and the weights file's) is checked against the manifest before anything
    is loaded (a clear ValueError on a missing or changed file), then the device, architecture and torch
    version, then each constant against the package's record (attach_weights).
    """
    manifest = read_manifest(manifest_path)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    root = Path(manifest_path).parent
    for b in manifest["buckets"]:
        verify_file(root / b["file"], b["sha256"], "package")
    if manifest["weights"] is not None:
        verify_file(root / manifest["weights"]["file"], manifest["weights"]["sha256"], "weights")
    if manifest["weights"] is None:
        raise ValueError(f"{manifest_path}: the packages hold their own weights (an older export layout); re-export")
    check_device(manifest, device)
    if device.type == "cuda":
        torch.cuda.init()
    weights = load_weights(root / manifest["weights"]["file"], device)
    runners: dict[int, Runner] = {}
    for b in manifest["buckets"]:
        loader = load_package(root / b["file"], device)
        meta = loader.get_metadata()
        key = meta.get("AOTI_DEVICE_KEY", manifest["device"])
        if key != manifest["device"]:
            raise ValueError(f"package {b['file']} holds code for {key}, the manifest says {manifest['device']}")
        check_package_metadata(meta, b)
        attach_weights(loader, weights, b["file"], manifest["weights"]["file"])
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


def run_packages(runners: dict[int, Runner], images: torch.Tensor, points: torch.Tensor,
                 focal: torch.Tensor | None = None) -> torch.Tensor:
    """depth [B,Q] for any Q through the packages, chunked and padded by the one rule (packing.run_chunked);
    focal [B] for packages that take it (pixels of their input)."""
    extra = (focal,) if focal is not None else ()

    def depth(im, pts, k, *f):
        out = runners[k](im, pts, *f)
        return out[0] if isinstance(out, tuple) else out
    return run_chunked(depth, images, points, tuple(sorted(runners)), *extra)


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
def check(manifest_path: str | Path, device: str | None = None, inputs: str | None = None, bench: int = 0) -> dict:
    """Compare every package with the reference file (chunked) and, when `inputs` is given, with the
    eager outputs stored there ("images_k{K}", "points_k{K}", ["focal_k{K}",] "depth_k{K}"). Returns a
    report dict."""
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    dev = torch.device(device or read_manifest(manifest_path)["device"])
    root = Path(manifest_path).parent
    manifest, runners = load_runners(manifest_path, dev)
    tol = manifest["tolerance"]
    report = {"device": str(dev), "torch": torch.__version__, "load_s": round(time.perf_counter() - t0, 3),
              "buckets": {}, "ok": True}
    with torch.inference_mode():
        names = [t["name"] for t in manifest["buckets"][0]["inputs"]]  # images | frames, points[, focal]
        name = names[0]
        if inputs:
            fresh = load_file(inputs)
            for k, fn in runners.items():
                out = fn(*[fresh[f"{n}_k{k}"].to(dev) for n in names])
                out = out if isinstance(out, tuple) else (out,)
                ok, err = within(out[0], fresh[f"depth_k{k}"], **tol)
                if f"map_k{k}" in fresh:  # the glance's map, the second output
                    ok_map, err_map = within(out[1], fresh[f"map_k{k}"], **tol)
                    ok, err = ok and ok_map, max(err, err_map)
                report["buckets"][k] = {"ok": ok, "max_abs_diff": err}
                report["ok"] &= ok
        ref_entry = manifest["reference"]
        verify_file(root / ref_entry["file"], ref_entry["sha256"], "reference file")
        ref = load_file(str(root / ref_entry["file"]))
        B = manifest["batch_size"]
        focal = ref["focal"][:B].to(dev) if "focal" in names else None
        out = run_packages(runners, ref[name][:B].to(dev), ref["points"][:B].to(dev), focal)
        ok, err = within(out, ref["depth"][:B], **tol)
        if "map" in ref:  # the map of the reference's first chunk (its bucket's package)
            k0 = chunk_plan(ref["points"].shape[1], tuple(sorted(runners)))[0][2]
            pts = pad_points(ref["points"][:B, :k0].to(dev), k0)
            ok_map, err_map = within(runners[k0](ref[name][:B].to(dev), pts, *((focal,) if focal is not None else ()))[1],
                                     ref["map"][:B], **tol)
            ok, err = ok and ok_map, max(err, err_map)
        report["reference"] = {"ok": ok, "max_abs_diff": err, "points": int(ref["points"].shape[1])}
        report["ok"] &= ok
        if bench:
            report["latency"] = {}
            for k, fn in runners.items():
                images = ref[name][:B].to(dev).contiguous()
                pts = ref["points"][:B, :k].to(dev).contiguous()
                run = fn if focal is None else (lambda im, p, fn=fn: fn(im, p, focal))
                lat = {"plain": bench_runner(run, images, pts, bench)}
                if dev.type == "cuda":
                    lat["cuda_graph"] = bench_runner(run, images, pts, bench, graph=True)
                report["latency"][k] = lat
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m depthpack.runtime.aoti", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", required=True, metavar="MANIFEST", help="DIR/manifest.json to check")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the manifest's device)")
    ap.add_argument("--inputs", default=None, help="safetensors of fresh inputs + eager depths (from the exporter)")
    ap.add_argument("--bench", type=int, default=0, metavar="N", help="also time each package N times")
    args = ap.parse_args(argv)
    try:
        report = check(args.check, args.device, args.inputs, args.bench)
    except ValueError as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        return 1
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
