"""How many cases each property-based fuzz test runs: a few thousand in all in CI, many more on request.

``FUZZ_SCALE`` multiplies every fuzz test's example count (scripts/chaos.py's long form sets it so the edge
suites run about 100,000 cases); unset, the counts stay small enough for CI.
"""

from __future__ import annotations

import os


def scale() -> int:
    try:
        return max(1, int(os.environ.get("FUZZ_SCALE", "1")))
    except ValueError:
        return 1


def examples(count: int) -> int:
    """``count`` cases in CI, ``count * FUZZ_SCALE`` when asked for more."""
    return count * scale()
