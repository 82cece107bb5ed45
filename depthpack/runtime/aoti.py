"""Load and run exported AOTInductor packages (depthpack_k{K}.pt2) from Python.

    manifest, runners = load_runners("export/tiny/manifest.json", "cpu")
    depth = run_packages(runners, images, points)        # any Q, chunked like every runner
    depth = run_packages(runners, images, points, focal) # packages of a model with a focal input
    manifest, runners, map_fn = load_packages(...)      # and the map-only package's fn(images[, focal]) -> map

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
from ..deploy.contract import (MAP_BUCKET, PACKAGE_BUCKET, PACKAGE_CONSTANTS, PACKAGE_INPUTS, check_device, map_package,
                               package_tag, read_manifest, verify_file, within)
from .graphs import capture, summarize, time_calls

Runner = Callable[..., torch.Tensor]  # (images|frames, points[, focal]) -> depth; the map-only package's: no points


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


def entry_bucket(entry: dict) -> str:
    """A manifest entry's PACKAGE_BUCKET: its bucket, or MAP_BUCKET for the map-only package (no "bucket")."""
    return str(entry["bucket"]) if "bucket" in entry else MAP_BUCKET


def _label(entry: dict) -> str:
    return f"package k{entry['bucket']}" if "bucket" in entry else "the map-only package"


def _make_runner(loader, entry: dict, device: torch.device) -> Runner:
    """fn(images [B,3,H,W] f32, points [B,K,2] f32[, focal [B] f32]) -> depth [B,K] f32 (with a map
    output: (depth, map [B,rows,cols])) on the package's device: the manifest entry's inputs in call order
    (the map-only package's: no points, -> map).

    Shapes, dtypes and devices are checked on the host (metadata only, no sync), because a package
    given the wrong shape reads out of bounds instead of raising.
    """
    specs = [(t["name"], tuple(t["shape"]), t["dtype"]) for t in entry["inputs"]]
    n_out, what = len(entry["outputs"]), _label(entry)

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != len(specs):
            raise ValueError(f"{what} takes {len(specs)} inputs ({', '.join(n for n, _, _ in specs)}), got {len(inputs)}")
        for (name, shape, dtype), t in zip(specs, inputs):
            if tuple(t.shape) != shape or t.dtype != getattr(torch, dtype) or t.device.type != device.type:
                raise ValueError(f"{what}: {name} must be {dtype} {list(shape)} on "
                                 f"{device.type}, got {str(t.dtype)[6:]} {list(t.shape)} on {t.device}")
        out = loader.run([t.contiguous() for t in inputs])
        return out[0] if n_out == 1 else tuple(out[:n_out])

    run.loader = loader  # keep the loader reachable (and inspectable)
    run.bucket = entry.get("bucket")
    return run


def load_runners(manifest_path: str | Path, device: str | torch.device) -> tuple[dict, dict[int, Runner]]:
    """(manifest, {bucket K: fn(images [B,3,H,W], points [B,K,2]) -> depth [B,K]}): load_packages without
    the map-only package's function."""
    manifest, runners, _ = load_packages(manifest_path, device)
    return manifest, runners


def load_packages(manifest_path: str | Path, device: str | torch.device) -> tuple[dict, dict[int, Runner], Runner | None]:
    """(manifest, {bucket K: fn(images [B,3,H,W], points [B,K,2]) -> depth [B,K]}, the map-only package's
    fn(images[, focal]) -> map [B,rows,cols] or None where the manifest has none).

    Every package's sha256 (and the weights file's) is checked against the manifest before anything
    is loaded (a clear ValueError on a missing or changed file), then the device, architecture and torch
    version, then each constant against the package's record (attach_weights).
    """
    manifest = read_manifest(manifest_path)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    root = Path(manifest_path).parent
    entries = [*manifest["buckets"], *([map_package(manifest)] if map_package(manifest) else [])]
    for b in entries:
        verify_file(root / b["file"], b["sha256"], "package")
    if manifest["weights"] is not None:
        verify_file(root / manifest["weights"]["file"], manifest["weights"]["sha256"], "weights")
    if manifest["weights"] is None:
        raise ValueError(f"{manifest_path}: the packages hold their own weights (an older export layout); re-export")
    check_device(manifest, device)
    if device.type == "cuda":
        torch.cuda.init()
    weights = load_weights(root / manifest["weights"]["file"], device)
    fns = [_load_one(root / b["file"], b, manifest, weights, device) for b in entries]
    runners = {int(b["bucket"]): fn for b, fn in zip(manifest["buckets"], fns)}
    return manifest, dict(sorted(runners.items())), fns[-1] if len(fns) > len(runners) else None


def _load_one(path: Path, entry: dict, manifest: dict, weights: dict, device: torch.device) -> Runner:
    """One package, loaded, held to its entry (device, metadata) and given its constants."""
    loader = load_package(path, device)
    meta = loader.get_metadata()
    key = meta.get("AOTI_DEVICE_KEY", manifest["device"])
    if key != manifest["device"]:
        raise ValueError(f"package {entry['file']} holds code for {key}, the manifest says {manifest['device']}")
    check_package_metadata(meta, entry)
    attach_weights(loader, weights, entry["file"], manifest["weights"]["file"])
    return _make_runner(loader, entry, device)


def check_package_metadata(meta: dict, entry: dict) -> None:
    """The package's own record of its bucket and inputs must be the manifest entry's: an entry that
    names another bucket's package (with that package's sha256) is refused here."""
    bucket, inputs = meta.get(PACKAGE_BUCKET), meta.get(PACKAGE_INPUTS)
    if bucket is None or inputs is None:
        raise ValueError(f"package {entry['file']} does not record its bucket and inputs (exported by an older "
                         f"depthpack?); re-export it")
    if bucket != entry_bucket(entry) or json.loads(inputs) != entry["inputs"]:
        raise ValueError(f"package {entry['file']} is the package of bucket {bucket} with inputs {json.loads(inputs)}, "
                         f"but the manifest lists it for bucket {entry_bucket(entry)} with {entry['inputs']}")


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
    eager outputs stored there (each package's inputs and outputs by name, suffixed by its package_tag:
    "images_k{K}", "points_k{K}", ["focal_k{K}",] "depth_k{K}", ["map_k{K}"], "images_map", "map_map").
    Returns a report dict."""
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    dev = torch.device(device or read_manifest(manifest_path)["device"])
    manifest, runners, map_fn = load_packages(manifest_path, dev)
    report = {"device": str(dev), "torch": torch.__version__, "load_s": round(time.perf_counter() - t0, 3),
              "buckets": {}, "ok": True}
    entries = [(b["bucket"], runners[b["bucket"]], b) for b in manifest["buckets"]]
    entries += [(None, map_fn, map_package(manifest))] if map_fn else []
    with torch.inference_mode():
        if inputs:
            fresh = load_file(inputs)
            for k, fn, entry in entries:
                ok, err = _compare(fn(*[fresh[f"{t['name']}_{package_tag(k)}"].to(dev) for t in entry["inputs"]]),
                                   [fresh.get(f"{t['name']}_{package_tag(k)}") for t in entry["outputs"]], manifest)
                report["buckets"][k or MAP_BUCKET] = {"ok": ok, "max_abs_diff": err}
                report["ok"] &= ok
        ref_entry = manifest["reference"]
        verify_file(Path(manifest_path).parent / ref_entry["file"], ref_entry["sha256"], "reference file")
        ref = load_file(str(Path(manifest_path).parent / ref_entry["file"]))
        report["reference"] = _check_reference(manifest, runners, map_fn, ref, dev)
        report["ok"] &= report["reference"]["ok"]
        if bench:
            report["latency"] = _bench(manifest, runners, ref, dev, bench)
    return report


def _compare(out, want: list, manifest: dict) -> tuple[bool, float]:
    """A package's outputs against the expected ones (None: not stored), within the manifest's tolerance."""
    checks = [within(o, w, **manifest["tolerance"]) for o, w in zip(out if isinstance(out, tuple) else (out,), want)
              if w is not None]
    return all(ok for ok, _ in checks), max(err for _, err in checks)


def _check_reference(manifest: dict, runners: dict, map_fn, ref: dict, dev: torch.device) -> dict:
    """The reference's depths through the packages, chunked; its map through the first chunk's package and,
    where there is one, the map-only package."""
    names = [t["name"] for t in manifest["buckets"][0]["inputs"]]  # images | frames, points[, focal]
    B = manifest["batch_size"]
    image = ref[names[0]][:B].to(dev)
    focal = (ref["focal"][:B].to(dev),) if "focal" in names else ()
    out = run_packages(runners, image, ref["points"][:B].to(dev), *focal)
    ok, err = within(out, ref["depth"][:B], **manifest["tolerance"])
    if "map" in ref:  # the map of the reference's first chunk (its bucket's package)
        k0 = chunk_plan(ref["points"].shape[1], tuple(sorted(runners)))[0][2]
        pts = pad_points(ref["points"][:B, :k0].to(dev), k0)
        maps = [runners[k0](image, pts, *focal)[1]] + ([map_fn(image, *focal)] if map_fn else [])
        for ok_map, err_map in (within(m, ref["map"][:B], **manifest["tolerance"]) for m in maps):
            ok, err = ok and ok_map, max(err, err_map)
    return {"ok": ok, "max_abs_diff": err, "points": int(ref["points"].shape[1])}


def _bench(manifest: dict, runners: dict, ref: dict, dev: torch.device, iters: int) -> dict:
    names = [t["name"] for t in manifest["buckets"][0]["inputs"]]
    B = manifest["batch_size"]
    focal = ref["focal"][:B].to(dev) if "focal" in names else None
    latency = {}
    for k, fn in runners.items():
        images = ref[names[0]][:B].to(dev).contiguous()
        pts = ref["points"][:B, :k].to(dev).contiguous()
        run = fn if focal is None else (lambda im, p, fn=fn: fn(im, p, focal))
        lat = {"plain": bench_runner(run, images, pts, iters)}
        if dev.type == "cuda":
            lat["cuda_graph"] = bench_runner(run, images, pts, iters, graph=True)
        latency[k] = lat
    return latency


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
