"""The exporter's self-check: every package against eager on fresh inputs and on the reference file,
in a CHILD process (python -m depthpack.runtime.aoti --check), so a loader that crashes cannot take
the exporter down: it becomes one ExportError with the child's last words."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import torch

from ..core.model import DepthPack
from .contract import package_tag
from .package import ExportError, example_inputs, forward_of, has_map_package


def self_check(model: DepthPack, manifest_path: Path, buckets, batch: int, device, g: torch.Generator,
               timeout_s: int = 900, frame: dict | None = None) -> dict:
    """Every package on fresh random inputs and on the reference file, in a child process, against eager
    outputs computed here; a crash, a hang or a mismatch is an ExportError."""
    return finish_self_check(start_self_check(model, manifest_path, buckets, batch, device, g, timeout_s, frame))


class PendingCheck:
    """A self-check whose child process runs while the exporter does other work (the ONNX export)."""

    def __init__(self, device, inputs: Path, cmd: list[str], env: dict, timeout_s: int):
        self.device, self.inputs, self.timeout_s, self.result = device, inputs, timeout_s, {}
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
    """The eager outputs on fresh inputs, computed here (each bucket's package, and the map-only package
    where the model has one), and the child process started on them."""
    from safetensors.torch import save_file

    fresh = {}
    with torch.no_grad():
        for k in [*buckets, *([None] if has_map_package(model.cfg) else [])]:
            names = ["frames" if frame else "images", *(["points"] if k else []), "focal"]  # the inputs in call order
            args = example_inputs(model.cfg, batch, k, device, g, frame)
            out = forward_of(model, k, frame)(*args)
            outs = dict(zip(["depth", "map"] if k else ["map"], out if isinstance(out, tuple) else (out,)))
            fresh.update({f"{n}_{package_tag(k)}": t.cpu() for n, t in zip(names, args)})
            fresh.update({f"{n}_{package_tag(k)}": t.float().cpu() for n, t in outs.items()})
    inputs = manifest_path.parent / ".selfcheck_inputs.safetensors"
    save_file({n: t.contiguous() for n, t in fresh.items()}, str(inputs))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # so the child imports this depthpack
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-X", "faulthandler", "-m", "depthpack.runtime.aoti", "--check", str(manifest_path),
           "--device", str(device), "--inputs", str(inputs)]
    return PendingCheck(device, inputs, cmd, env, timeout_s)


def finish_self_check(pending: PendingCheck) -> dict:
    """Wait for the child and read its report; a crash, a hang or a mismatch is an ExportError."""
    pending.thread.join()
    pending.inputs.unlink(missing_ok=True)
    error = pending.result.get("error")
    if isinstance(error, subprocess.TimeoutExpired):
        raise ExportError(f"self-check: the child process loading the packages did not finish in {pending.timeout_s} s")
    if error is not None:
        raise error
    proc = pending.result["proc"]
    if proc.returncode < 0:
        tail = " | ".join(ln for ln in proc.stderr.strip().splitlines()[-5:] if not ln.startswith("Extension modules"))
        raise ExportError(f"self-check: loading the packages killed the child process with "
                          f"{signal.Signals(-proc.returncode).name} (torch {torch.__version__}, {pending.device}); "
                          f"the packages are NOT verified. The child's last words: {tail}")
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise ExportError(f"self-check: the child exited {proc.returncode} without a report: {proc.stderr[-1500:]}")
    report = json.loads(lines[-1])
    report["checker"] = "python (depthpack.runtime.aoti, child process)"
    if not report.get("ok"):
        if "error" in report:
            raise ExportError(f"self-check: {report['error']}")
        bad = {k: v for k, v in report["buckets"].items() if not v["ok"]}
        raise ExportError(f"self-check: packages differ from eager beyond the tolerance: buckets {bad}, "
                          f"reference {report['reference']}")
    return report
