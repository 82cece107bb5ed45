"""python -m depthpack.bench (see depthpack.bench.ladder)."""
import sys

from .ladder import main

if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # a bad checkpoint, folder or config: one clear line, exit 1
        print(f"bench: error: {e}", file=sys.stderr)
        sys.exit(1)
