"""python -m depthpack.bench (and the console script depthpack-bench; see depthpack.bench.ladder)."""
import sys

from ..core import cli
from .ladder import main


def run() -> None:
    sys.exit(cli.run("bench", main))  # a bad checkpoint, folder or config: one clear line, exit 1


if __name__ == "__main__":
    run()
