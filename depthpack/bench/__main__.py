"""python -m depthpack.bench (and the console script depthpack-bench; see depthpack.bench.ladder)."""
import sys

from ..core import cli


def run() -> None:
    # a bad checkpoint, folder or config: one clear line, exit 1
    sys.exit(cli.run("bench", cli.lazy("depthpack.bench.ladder:main")))


if __name__ == "__main__":
    run()
