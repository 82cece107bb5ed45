"""python -m depthpack.export: AOTInductor packages, manifest, reference and ONNX (depthpack.deploy.cli)."""
import sys

from .deploy.cli import main

if __name__ == "__main__":
    sys.exit(main())
