#!/usr/bin/env python
"""Why loading an AOTInductor package from Python can die (torch 2.11.0+cu130 on the H200: SIGSEGV in
_load_aoti, for CPU and CUDA packages alike, while the same call under
LD_PRELOAD=$(g++ -print-file-name=libstdc++.so.6) works): each way of loading runs in its own child
process, and LD_DEBUG=bindings shows which library the package's C++ runtime symbols bind to.

    python scripts/aoti_diagnose.py --manifest DIR/manifest.json [--out report.json]
    python scripts/aoti_diagnose.py --build-tiny DIR [--dynamic-cxx-runtime] --device cuda   # then diagnose it

A lab for one torch build, kept out of the library; depthpack.runtime.aoti applies what it finds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOAD = """
import json, sys
{before}
import torch
{after}
m = json.load(open({manifest!r}))
b = m["buckets"][0]
dev = torch.device(m["device"], 0) if m["device"] == "cuda" else torch.device("cpu")
loader = torch._C._aoti.AOTIModelPackageLoader({pkg!r}, "model", dev.type == "cuda", 1, 0 if dev.type == "cuda" else -1)
if m.get("weights"):  # weight-free packages: their constants first (contract.WEIGHTS)
    from safetensors.torch import load_file
    w = load_file(str(__import__("pathlib").Path({manifest!r}).parent / m["weights"]["file"]), device=str(dev))
    loader.load_constants({{n: w[n] for n in loader.get_constant_fqns()}}, False, True)
inputs = [torch.randint(0, 256, t["shape"], dtype=torch.uint8, device=dev) if t["dtype"] == "uint8"
          else torch.rand(t["shape"], device=dev) * 4 for t in b["inputs"]]
out = loader.run(inputs)[0]
print(json.dumps({{"finite": bool(torch.isfinite(out).all()), "shape": list(out.shape)}}))
"""
PROMOTE = ("import ctypes, os\n"
           "ctypes.CDLL({lib!r}, mode=os.RTLD_GLOBAL)  # the C++ runtime into the global scope")
CXX_SYMBOL = re.compile(r"^(_ZN?K?St|_ZNSt|_ZNKSt|_ZTVN?St|_ZTIN?St|_ZTSN?St|__cxa_|__gxx_|_Zn[wa]|_Zd[la]|_ZSt|__once)")


def libstdcxx() -> str:
    out = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True).stdout.strip()
    return os.path.realpath(out) if out and os.path.isabs(out) else "libstdc++.so.6"


def child(code: str, env: dict | None = None, timeout: int = 240) -> dict:
    try:
        p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"returncode": None, "error": "timeout"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    return {"returncode": p.returncode, **(json.loads(lines[-1]) if p.returncode == 0 and lines else
                                          {"stderr_tail": p.stderr.strip().splitlines()[-6:]})}


def bindings(code: str, timeout: int = 300) -> dict:
    """LD_DEBUG=bindings of the plain load: the providers of the package's C++-runtime symbols."""
    env = {**os.environ, "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": "/tmp/aoti_ld_debug"}
    for f in Path("/tmp").glob("aoti_ld_debug*"):
        f.unlink()
    try:
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pass
    pat = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `([^'`]+)'")
    providers: Counter = Counter()
    wrong: dict[str, str] = {}
    pkg_files: Counter = Counter()
    for f in Path("/tmp").glob("aoti_ld_debug*"):
        for line in f.read_text(errors="replace").splitlines():
            m = pat.search(line)
            if not m:
                continue
            src, dst, sym = m.groups()
            if "/tmp" not in src or "aoti_ld_debug" in src or not src.endswith(".so"):
                continue  # only the package's own library, extracted under a temporary folder
            pkg_files[src] += 1
            if CXX_SYMBOL.match(sym):
                providers["(the package itself)" if dst == src else Path(dst).name] += 1
                if "libstdc++" not in dst and dst != src:  # its own template instances are fine
                    wrong.setdefault(sym, dst)
    return {"package_libraries": dict(pkg_files.most_common(3)), "cxx_symbol_providers": dict(providers),
            "cxx_symbols_from_another_library": dict(list(wrong.items())[:25]), "n_from_another_library": len(wrong)}


def build_tiny(folder: Path, device: str, static_cxx_runtime: bool) -> Path:
    """One package of the tiny preset (bucket 8), no self-check (which would load it), and a manifest
    with what the loading code above reads."""
    import torch

    sys.path.insert(0, str(ROOT))
    from depthpack.deploy.contract import io_specs
    from depthpack.deploy.export import load_for_export
    from depthpack.deploy.package import cast_model, compile_package, export_program

    folder.mkdir(parents=True, exist_ok=True)
    model = cast_model(load_for_export(preset="tiny")[0], torch.float32, torch.device(device))
    ep = export_program(model, 8, 1, device, torch.Generator().manual_seed(0))
    compile_package(ep, folder / "depthpack_k8.pt2", static_cxx_runtime=static_cxx_runtime)
    inputs, _ = io_specs(model.cfg.img_size, 1, 8)
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"device": device, "buckets": [{"file": "depthpack_k8.pt2", "inputs": inputs}]}))
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=None)
    ap.add_argument("--build-tiny", default=None, metavar="DIR", help="build a tiny package here first")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dynamic-cxx-runtime", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-bindings", action="store_true", help="skip the LD_DEBUG=bindings run (slow)")
    args = ap.parse_args(argv)
    if args.build_tiny:
        args.manifest = str(build_tiny(Path(args.build_tiny), args.device, not args.dynamic_cxx_runtime))
    manifest = json.loads(Path(args.manifest).read_text())
    pkg = str(Path(args.manifest).parent / manifest["buckets"][0]["file"])
    lib = libstdcxx()
    fmt = dict(manifest=str(args.manifest), pkg=pkg)
    plain = LOAD.format(before="", after="", **fmt)
    report = {"torch_python": sys.executable, "libstdcxx": lib, "runs": {
        "plain": child(plain),
        "ld_preload": child(plain, env={"LD_PRELOAD": lib}),
        "promote_before_torch": child(LOAD.format(before=PROMOTE.format(lib=lib), after="", **fmt)),
        "promote_after_torch": child(LOAD.format(before="", after=PROMOTE.format(lib=lib), **fmt)),
        "torch_rtld_global": child(plain, env={"TORCH_USE_RTLD_GLOBAL": "1"}),
    }}
    if not args.no_bindings:
        report["bindings_plain"] = bindings(plain)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
