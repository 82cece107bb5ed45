"""python -m depthpack.eval: accuracy of the packed, masked and dense paths of a checkpoint."""
import sys

from .evaluate import main

if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # bad input: one clear line, exit 1
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
