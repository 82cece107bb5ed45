"""python -m depthpack.eval (and the console script depthpack-eval): accuracy of the packed, masked
and dense paths of a checkpoint."""
import sys

from ..core import cli


def run() -> None:
    sys.exit(cli.run("eval", cli.lazy("depthpack.eval.evaluate:main")))  # bad input: one clear line, exit 1


if __name__ == "__main__":
    run()
