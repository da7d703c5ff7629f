"""``python -m bench``: the same command as ``python scripts/bench.py``."""

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m bench"))
