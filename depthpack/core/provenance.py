"""What a result came from: the commit of the code and the device it ran on, for results files."""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch


def commit() -> str | None:
    """The short hash of the checkout this package runs from (None outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU's (its architecture where the platform names no processor)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()
