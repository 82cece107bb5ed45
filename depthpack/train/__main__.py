"""python -m depthpack.train --config CONFIG [key=value ...]: the train command (depthpack.train.cli)."""
import sys

from ..core import cli


def main(argv: list[str] | None = None) -> int:
    """depthpack.train.cli's command, imported inside the one-line contract (a Ctrl-C while torch imports too)."""
    return cli.run("train", cli.lazy("depthpack.train.cli:_main"), argv)


if __name__ == "__main__":
    sys.exit(main())
