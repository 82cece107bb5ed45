"""Train depthpack: `python -m depthpack.train` as a script (torchrun takes either), from a checkout.

    python train/train.py --config configs/demo.yaml
    python train/train.py --config configs/demo.yaml resume=true           # continue a stopped run
    torchrun --nproc_per_node=2 train/train.py --config configs/vits_nyu.yaml data.root=/data/nyu
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from depthpack.train.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
