"""What a result came from: the commit of the code and the device it ran on, for results files."""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch


def commit(where: Path | None = None) -> str | None:
    """The short hash of the checkout this package (or where) runs from, "+dirty" when a tracked file differs from it
    (a copied tree can carry an older .git), None outside a git checkout."""
    here = where or Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=here).stdout.strip()
        if not head:
            return None
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                 text=True, timeout=30, cwd=here)
        return head + ("+dirty" if changed.returncode == 0 and changed.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU's (its architecture where the platform names no processor)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()
