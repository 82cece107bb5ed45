"""python -m depthpack.eval: accuracy of the packed, masked and dense paths of a checkpoint."""
import sys

from ..core import cli
from .evaluate import main

if __name__ == "__main__":
    sys.exit(cli.run("eval", main))  # bad input: one clear line, exit 1
