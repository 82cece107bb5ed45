"""Train depthpack: a thin CLI over depthpack.train.train.

    python train/train.py --config configs/demo.yaml                       # the embedded default
    python train/train.py --config configs/tiny.yaml steps=5 out_dir=runs/t model.depth=1
    python train/train.py --config configs/demo.yaml resume=true           # continue a killed run
    torchrun --nproc_per_node=2 train/train.py --config configs/vits_nyu.yaml data.root=/data/nyu

The YAML holds only what differs from TrainConfig's defaults (depthpack/train/config.py); key=value
overrides (dotted keys for nested fields: model.*, data.*) apply on top; unknown keys are an error.
The merged config is written to OUT_DIR/config.yaml. A refusal (bad config, a run folder that cannot
be written, a checkpoint that cannot be used) is one line on stderr and exit code 1 (depthpack.core.cli).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from depthpack.core import cli  # noqa: E402
from depthpack.train import load_train_config, train  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = cli.Parser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                    formatter_class=argparse.RawDescriptionHelpFormatter, name="train")
    ap.add_argument("--config", default=None, help="YAML with the fields that differ from the defaults")
    ap.add_argument("overrides", nargs="*", help="key=value (dotted keys for model.* and data.*)")
    a = ap.parse_args(argv)
    summary = train(load_train_config(a.config, a.overrides))
    if "val" in summary:  # rank 0 only
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    sys.exit(cli.run("train", main))
