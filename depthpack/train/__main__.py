"""python -m depthpack.train --config CONFIG [key=value ...]: the train command (depthpack.train.loop.main)."""
import sys

from .loop import main

if __name__ == "__main__":
    sys.exit(main())
