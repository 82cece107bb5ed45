"""The exporter's self-check: every package against eager on fresh inputs and on the reference file,
in a CHILD process (python -m depthpack.runtime.aoti --check), so a loader that crashes cannot take
the exporter down; where Python's loader is killed by a signal, the same checks run through the C++
runner (deploy_cpp) when one is found."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import torch

from ..core.model import DepthPack
from .package import ExportError, PackedForward, example_inputs


CPP_RUNNER_CANDIDATES = ("deploy_cpp/build/depthpack_run",)


def find_cpp_runner(explicit: str | None = None) -> Path | None:
    """The C++ runner to check packages with when Python cannot load them: --cpp-runner, then
    $DEPTHPACK_RUN, then the usual build folders."""
    root = Path(__file__).resolve().parents[2]
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
    bucket (fresh inputs by name, eager depth) and on the reference file; each must exit 0."""
    from safetensors.torch import save_file

    report = {"checker": f"cpp ({runner})", "buckets": {}, "ok": True}
    files = {}
    for k in buckets:
        f = manifest_path.parent / f".selfcheck_k{k}.safetensors"
        save_file({n[: -len(f"_k{k}")]: t.contiguous() for n, t in fresh.items() if n.endswith(f"_k{k}")}, str(f))
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
               timeout_s: int = 900, cpp_runner: str | None = None, log=print, frame: dict | None = None) -> dict:
    """Run every package on fresh random inputs and on the reference file in a child process
    (python -m depthpack.runtime.aoti --check), against eager outputs computed here. A child that hangs or
    reports a mismatch is an ExportError. A child KILLED by a signal (torch 2.11 + CUDA packages on
    the H200: SIGSEGV in the loader) is the documented fallback: the same checks with the C++ runner
    (deploy_cpp) when one is found, else an ExportError that says how to get one."""
    return finish_self_check(start_self_check(model, manifest_path, buckets, batch, device, g, timeout_s, frame),
                             cpp_runner, log)


class PendingCheck:
    """A self-check whose child process runs while the exporter does other work (the ONNX export)."""

    def __init__(self, manifest_path: Path, buckets, device, fresh: dict, inputs: Path, cmd: list[str], env: dict,
                 timeout_s: int):
        self.manifest_path, self.buckets, self.device, self.fresh, self.inputs = manifest_path, buckets, device, fresh, inputs
        self.timeout_s, self.result = timeout_s, {}
        # a daemon thread waits on the child: an export that fails meanwhile is not held up at exit
        self.thread = threading.Thread(target=self._run, args=(cmd, env), daemon=True)
        self.thread.start()

    def _run(self, cmd: list[str], env: dict) -> None:
        try:
            self.result["proc"] = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, env=env)
        except BaseException as e:  # handed to finish_self_check
            self.result["error"] = e


def start_self_check(model: DepthPack, manifest_path: Path, buckets, batch: int, device, g: torch.Generator,
                     timeout_s: int = 900, frame: dict | None = None) -> PendingCheck:
    """The eager outputs on fresh inputs, computed here, and the child process started on them."""
    from safetensors.torch import save_file

    fresh = {}
    names = ["frames" if frame else "images", "points", "focal"]  # the inputs in call order
    with torch.no_grad():
        for k in buckets:
            args = example_inputs(model.cfg, batch, k, device, g, frame)
            fresh.update({f"{n}_k{k}": t.cpu() for n, t in zip(names, args)})
            fresh[f"depth_k{k}"] = PackedForward(model, k, frame)(*args).float().cpu()
    inputs = manifest_path.parent / ".selfcheck_inputs.safetensors"
    save_file({n: t.contiguous() for n, t in fresh.items()}, str(inputs))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # so the child imports this depthpack
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-X", "faulthandler", "-m", "depthpack.runtime.aoti", "--check", str(manifest_path),
           "--device", str(device), "--inputs", str(inputs), "--no-probe"]  # it is the probe
    return PendingCheck(manifest_path, buckets, device, fresh, inputs, cmd, env, timeout_s)


def finish_self_check(pending: PendingCheck, cpp_runner: str | None = None, log=print) -> dict:
    """Wait for the child and read its report (or fall back to the C++ runner: self_check)."""
    pending.thread.join()
    pending.inputs.unlink(missing_ok=True)
    manifest_path, buckets, fresh, timeout_s = pending.manifest_path, pending.buckets, pending.fresh, pending.timeout_s
    device = pending.device
    error = pending.result.get("error")
    if isinstance(error, subprocess.TimeoutExpired):
        raise ExportError(f"self-check: the child process loading the packages did not finish in {timeout_s} s")
    if error is not None:
        raise error
    proc = pending.result["proc"]
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
    report["checker"] = "python (depthpack.runtime.aoti, child process)"
    if not report.get("ok"):
        if "error" in report:
            raise ExportError(f"self-check: {report['error']}")
        bad = {k: v for k, v in report["buckets"].items() if not v["ok"]}
        raise ExportError(f"self-check: packages differ from eager beyond the tolerance: buckets {bad}, "
                          f"reference {report['reference']}")
    return report
