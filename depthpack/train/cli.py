"""The train command over depthpack.train.train: python -m depthpack.train, the console script
depthpack-train and train/train.py run it (depthpack/train/__main__.py, lazily). A refusal is one line on
stderr and exit code 1; Ctrl-C is one line and exit code 130, the last complete checkpoint and the log kept."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..core import cli
from .config import load_train_config
from .loop import train
from .run_folder import resume_point

EXAMPLES = """\
    python -m depthpack.train --config configs/tiny.yaml steps=5 out_dir=runs/t model.depth=1
    python -m depthpack.train --config configs/demo.yaml resume=true        # continue a stopped run
    python -m depthpack.train --config configs/demo.yaml queries.edge_frac=0.3 queries.extra_points=8
    torchrun --nproc_per_node=2 -m depthpack.train --config configs/vits_nyu.yaml data.root=/data/nyu

The YAML holds what differs from TrainConfig's defaults; key=value overrides (model.*, data.*, queries.*)
go on top; the merged config is written to OUT_DIR/config.yaml. A refusal is one line on stderr and exit
code 1; Ctrl-C is one line and exit code 130, the last complete checkpoint and the log kept.
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = cli.Parser(prog="python -m depthpack.train", description="Train depthpack (train/train.py is the same).",
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter, name="train")
    ap.add_argument("--config", default=None, help="YAML with the fields that differ from the defaults")
    ap.add_argument("overrides", nargs="*", help="key=value (dotted keys for model.*, data.* and queries.*)")
    return ap.parse_args(argv)


def _main(argv: list[str] | None = None) -> dict[str, Any] | int:
    args = parse_args(argv)
    cfg = load_train_config(args.config, args.overrides)
    try:
        summary = train(cfg)
    except KeyboardInterrupt:  # as a kill: the last complete checkpoint and the log stay; one line, no traceback
        print(f"train: interrupted; {resume_point(Path(cfg.out_dir))}", file=sys.stderr, flush=True)
        return 130
    if "val" in summary:  # rank 0 only
        print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    """The train command: 0, 1 on a refusal (ValueError, OSError: one line), 130 on Ctrl-C."""
    return cli.run("train", _main, argv)

