"""python -m depthpack.export: AOTInductor packages, manifest, reference and ONNX (depthpack.deploy.cli)."""
import sys

from .core import cli


def main(argv: list[str] | None = None) -> int:
    """depthpack.deploy.cli's command, imported inside the one-line contract (a Ctrl-C while torch imports too);
    a SIGTERM unwinds like a Ctrl-C (the compile children ended, the previous export untouched)."""
    return cli.run("export", cli.lazy("depthpack.deploy.cli:_main"), argv, sigterm=True)


if __name__ == "__main__":
    sys.exit(main())
