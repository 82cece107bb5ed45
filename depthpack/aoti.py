"""Load and run exported AOTInductor packages (depthpack_k{K}.pt2) from Python, safely.

    manifest, runners = load_runners("export/tiny/manifest.json", "cpu")
    depth = run_chunked(runners, images, points)          # any Q, chunked like the C++ runner

What works where (measured):
  * torch 2.14.1 CPU (the CPU machine): CPU packages load and run in Python, by every route
    (the binding below, aoti_load_package, the container runner).
  * torch 2.11.0+cu130 on the H200 (Python 3.12): loading a CUDA package in Python kills the
    process with SIGSEGV inside the C++ constructor of AOTIModelPackageLoader -- through
    aoti_load_package (single-threaded or not) and through the binding called directly alike,
    in a fresh process or right after compiling; reading the package's metadata works. The C++
    runner (deploy_cpp) loads the same packages with the same class.
So this module never loads a package in a process that matters before a CHILD process has loaded
and run one (probe_loading, once per process and package): where the child dies, load_runners
raises a ValueError that says so and points to the C++ runner. The loader used is the binding the
C++ runner uses, `torch._C._aoti.AOTIModelPackageLoader(path, "model", run_single_threaded, 1,
device_index)`, after host-side checks (sha256, device, compute capability, CPU architecture, torch
version, tensor shapes); on CUDA it is single-threaded so that its run can be captured in a graph.

CLI:
    python -m depthpack.aoti --check DIR/manifest.json [--device cuda] [--inputs F] [--bench N]
compares the packages with the reference file (and with the eager outputs stored in F), prints one
JSON line, exit code 0 when everything is within the manifest's tolerance, 1 otherwise.
    python -m depthpack.aoti --check DIR/manifest.json --diagnose [--probes a,b]
tries each way of loading a package (the binding, aoti_load_package, the container runner, with
TORCH_USE_RTLD_GLOBAL, ...) in its own child process and reports which return, raise or crash.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .packing import chunk_plan

FORMAT = "depthpack-manifest/1"
Runner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ---- manifest and files ---------------------------------------------------------------------------
def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_file(path: Path, expected: str, what: str) -> None:
    """A clear ValueError when a file the manifest lists is missing or its sha256 differs."""
    if not path.is_file():
        raise ValueError(f"{what} {path} is listed in the manifest but missing")
    actual = sha256_file(path)
    if actual != expected:
        raise ValueError(f"{what} {path}: sha256 mismatch (manifest {expected[:16]}..., file {actual[:16]}...): "
                         f"the file changed after export or is corrupt; re-export it")


REQUIRED_KEYS = ("format", "model_config", "image_size", "patch_size", "batch_size", "device", "compute_capability",
                 "arch", "dtype", "torch_version", "min_depth", "max_depth", "preprocess", "tolerance", "buckets",
                 "reference")


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"manifest {path}: no such file")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"manifest {path}: not valid JSON ({e})") from None
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing or manifest.get("format") != FORMAT:
        raise ValueError(f"manifest {path}: not a {FORMAT} manifest (format {manifest.get('format')!r}, "
                         f"missing keys {missing})")
    if not manifest["buckets"]:
        raise ValueError(f"manifest {path}: lists no packages")
    return manifest


def device_capability(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def _minor_version(v: str) -> str:
    return ".".join(v.split("+")[0].split(".")[:2])


def check_device(manifest: dict, device: torch.device) -> None:
    """Refuse, with one clear message, a package this process cannot run (before the loader sees it)."""
    built, arch = manifest["device"], platform.machine()
    if manifest["arch"] != arch:
        raise ValueError(f"the packages were built for {manifest['arch']}, this machine is {arch}: "
                         f"a .pt2 holds native code for one CPU architecture; export on this machine")
    if built != device.type:
        raise ValueError(f"the packages were built for {built}, asked to run them on {device.type}")
    if built == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("the packages were built for CUDA, but CUDA is not available in this process")
        cc = device_capability(device)
        if cc != manifest["compute_capability"]:
            raise ValueError(f"the packages were built for compute capability {manifest['compute_capability']}, "
                             f"this GPU is {cc}: export on a GPU of the same kind")
    if _minor_version(manifest["torch_version"]) != _minor_version(torch.__version__):
        raise ValueError(f"the packages were built with torch {manifest['torch_version']}, this is torch "
                         f"{torch.__version__}: AOTInductor packages are tied to the torch they were built with")


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
    spec = {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in bucket["inputs"]}
    (img_shape, _), (pts_shape, _) = spec["images"], spec["points"]

    def run(images: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        for name, t, shape in (("images", images, img_shape), ("points", points, pts_shape)):
            if tuple(t.shape) != shape or t.dtype != torch.float32 or t.device.type != device.type:
                raise ValueError(f"package k{bucket['capacity']}: {name} must be float32 {list(shape)} on "
                                 f"{device.type}, got {t.dtype} {list(t.shape)} on {t.device}")
        return loader.run([images.contiguous(), points.contiguous()])[0]

    run.loader = loader  # keep the loader reachable (and inspectable)
    run.capacity = bucket["capacity"]
    return run


_PROBED: dict[tuple, str | None] = {}  # (torch, device, package sha256) -> None (loads fine) or the error


def _child_env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])  # so the child imports this depthpack
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
        cmd = [sys.executable, "-X", "faulthandler", "-m", "depthpack.aoti", "--probe", "binding",
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
                            f"(torch {torch.__version__}, {device}); this process did not try. Run the packages with "
                            f"the C++ runner (deploy_cpp/depthpack_run) instead. Child said: {tail}")
    if _PROBED[key] is not None:
        raise ValueError(_PROBED[key])


def load_runners(manifest_path: str | Path, device: str | torch.device,
                 probe: bool = True) -> tuple[dict, dict[int, Runner]]:
    """(manifest, {capacity K: fn(images [B,3,H,W], points [B,K,2]) -> depth [B,K]}).

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
        key = loader.get_metadata().get("AOTI_DEVICE_KEY", manifest["device"])
        if key != manifest["device"]:
            raise ValueError(f"package {b['file']} holds code for {key}, the manifest says {manifest['device']}")
        runners[int(b["capacity"])] = _make_runner(loader, b, device)
    return manifest, dict(sorted(runners.items()))


# ---- the chunking rule shared by every runner -----------------------------------------------------
def run_chunked(runners: dict[int, Runner], images: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """depth [B,Q] for any Q: chunks of at most the largest bucket, in order; each chunk runs on the
    smallest bucket >= its size, padded with copies of that chunk's first point (per image), and the
    padded results are dropped. The same rule as the C++ runner and the reference file."""
    B, Q = points.shape[:2]
    outs = []
    for s, e, k in chunk_plan(Q, tuple(sorted(runners))):
        chunk = points[:, s:e]  # [B,q,2]
        q = e - s
        if k > q:
            chunk = torch.cat([chunk, chunk[:, :1].expand(B, k - q, 2)], dim=1)  # [B,k,2]
        outs.append(runners[k](images, chunk.contiguous())[:, :q])
    if not outs:
        return torch.zeros(B, 0, device=images.device)
    return torch.cat(outs, dim=1)


def within(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> tuple[bool, float]:
    """(all |a - e| <= atol + rtol*|e|, max |a - e|), on float32 copies on the CPU."""
    a, e = actual.detach().float().cpu(), expected.detach().float().cpu()
    if a.shape != e.shape:
        return False, float("inf")
    diff = (a - e).abs()
    ok = bool(torch.isfinite(a).all()) and bool((diff <= atol + rtol * e.abs()).all())
    return ok, float(diff.max()) if diff.numel() else 0.0


# ---- latency (a measurement for the benchmark's output, never an assertion) -----------------------
def bench_runner(fn: Runner, images: torch.Tensor, points: torch.Tensor, iters: int = 100,
                 graph: bool = False) -> dict:
    """Median and p90 latency in ms of fn(images, points); on CUDA optionally captured in a graph."""
    cuda = images.is_cuda
    for _ in range(5):
        fn(images, points)
    call = lambda: fn(images, points)  # noqa: E731
    if graph:
        if not cuda:
            raise ValueError("CUDA graph capture needs CUDA tensors")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(images, points)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(images, points)
        call = g.replay
        for _ in range(5):
            call()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"median_ms": times[len(times) // 2], "p90_ms": times[int(len(times) * 0.9)], "iters": iters}


# ---- the self-check, run in a child process by the exporter ----------------------------------------
def check(manifest_path: str | Path, device: str | None = None, inputs: str | None = None,
          bench: int = 0, probe: bool = True) -> dict:
    """Compare every package with the reference file (chunked) and, when `inputs` is given, with the
    eager outputs stored there ("images_k{K}", "points_k{K}", "depth_k{K}"). Returns a report dict."""
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    manifest = read_manifest(manifest_path)
    dev = torch.device(device or manifest["device"])
    root = Path(manifest_path).parent
    manifest, runners = load_runners(manifest_path, dev, probe=probe)
    tol = manifest["tolerance"]
    report = {"device": str(dev), "torch": torch.__version__, "load_s": round(time.perf_counter() - t0, 3),
              "buckets": {}, "ok": True}
    with torch.inference_mode():
        if inputs:
            fresh = load_file(inputs)
            for k, fn in runners.items():
                out = fn(fresh[f"images_k{k}"].to(dev), fresh[f"points_k{k}"].to(dev))
                ok, err = within(out, fresh[f"depth_k{k}"], **tol)
                report["buckets"][k] = {"ok": ok, "max_abs_diff": err}
                report["ok"] &= ok
        ref_entry = manifest["reference"]
        verify_file(root / ref_entry["file"], ref_entry["sha256"], "reference file")
        ref = load_file(str(root / ref_entry["file"]))
        B = manifest["batch_size"]
        out = run_chunked(runners, ref["images"][:B].to(dev), ref["points"][:B].to(dev))
        ok, err = within(out, ref["depth"][:B], **tol)
        report["reference"] = {"ok": ok, "max_abs_diff": err, "points": int(ref["points"].shape[1])}
        report["ok"] &= ok
        if bench:
            report["latency"] = {}
            for k, fn in runners.items():
                images = ref["images"][:B].to(dev).contiguous()
                pts = ref["points"][:B, :k].to(dev).contiguous()
                lat = {"plain": bench_runner(fn, images, pts, bench)}
                if dev.type == "cuda":
                    lat["cuda_graph"] = bench_runner(fn, images, pts, bench, graph=True)
                report["latency"][k] = lat
    return report


# ---- diagnosis: which way of loading a package survives on this machine ----------------------------
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
        from .export import cast_model, compile_package, export_program, load_for_export
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
    procs = {m: subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "depthpack.aoti", "--probe", m,
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m depthpack.aoti", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", required=True, metavar="MANIFEST", help="DIR/manifest.json to check")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the manifest's device)")
    ap.add_argument("--inputs", default=None, help="safetensors of fresh inputs + eager depths (from the exporter)")
    ap.add_argument("--bench", type=int, default=0, metavar="N", help="also time each package N times")
    ap.add_argument("--no-probe", action="store_true",
                    help="load in this process without trying a child first (the exporter's own child does this)")
    ap.add_argument("--diagnose", action="store_true",
                    help="try every way of loading the first package, each in a child process; report which crash")
    ap.add_argument("--probes", default=",".join(PROBES), help=f"with --diagnose: which (default all: {','.join(PROBES)})")
    ap.add_argument("--probe", choices=PROBES, help=argparse.SUPPRESS)  # one method, in this process
    args = ap.parse_args(argv)
    try:
        if args.probe:
            print(json.dumps(_probe(args.probe, args.check, args.device)))
            return 0
        if args.diagnose:
            methods = [m for m in args.probes.split(",") if m]
            unknown = sorted(set(methods) - set(PROBES))
            if unknown:
                raise ValueError(f"--probes: unknown {unknown}; choose from {list(PROBES)}")
            print(json.dumps(diagnose(args.check, methods)))
            return 0
        report = check(args.check, args.device, args.inputs, args.bench, probe=not args.no_probe)
    except ValueError as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        return 1
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
