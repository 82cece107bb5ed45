"""python -m depthpack.bench (see depthpack.bench.ladder)."""
import sys

from ..core import cli
from .ladder import main

if __name__ == "__main__":
    sys.exit(cli.run("bench", main))  # a bad checkpoint, folder or config: one clear line, exit 1
