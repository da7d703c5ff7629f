#!/usr/bin/env python3
"""Load benchmark of the gateway: a thin entry to the ``bench`` package at the repository's top level (see its
docstring for what is measured), kept because docs and hooks name this path.

    .venv/bin/python scripts/bench.py --clients 20 --calls 200 --auth header --client raw
    .venv/bin/python scripts/bench.py --compare --duration 2 --rounds 1 --json
    .venv/bin/python scripts/bench.py --tracing --duration 10 --rounds 3   # SATGATE_TRACING off vs otlp
    .venv/bin/python scripts/bench.py --policy --duration 10 --rounds 3    # no policy vs a 50-rule policy file
    .venv/bin/python scripts/bench.py --audit --duration 10 --rounds 3     # no audit trail vs SATGATE_AUDIT_FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    # Run as a script, this file's folder comes first on sys.path and this file is itself named bench: the
    # repository goes in front so that ``bench`` is the package.
    sys.path.insert(0, str(REPO))
    from bench.cli import main as bench_main

    return bench_main()


if __name__ == "__main__":
    sys.exit(main())
