#!/usr/bin/env python
"""Export DepthPack to AOTInductor packages (+ manifest, reference, optional ONNX): a thin CLI over
depthpack.deploy.build, also `python -m depthpack.export`. Any refusal or failed check is one line on
stderr and exit code 1. The packages run the fast recipe for their device and batch (--plain: the
reference model).

    python export/export.py --preset tiny --out /tmp/dp_tiny --buckets 8,64 --onnx
    python export/export.py --checkpoint runs/vits --out /tmp/dp_export_vits --device cuda
    python export/export.py --checkpoint runs/vits --out out/cam --device cuda --frame-size 640x480 --frame-format bgr8
    python export/export.py --checkpoint runs/vits2 --out out/v2 --device cuda --reuse-packages out/v1
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from depthpack.export import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
