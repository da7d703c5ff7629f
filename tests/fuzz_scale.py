"""How many cases each property-based fuzz test runs: a few thousand in all in CI, many more on request.

``FUZZ_SCALE`` multiplies every fuzz test's example count (scripts/chaos.py's long form sets it so the edge
suites run about 100,000 cases); unset, the counts stay small enough for CI.
"""

from __future__ import annotations

import gc
import os
import time


def scale() -> int:
    try:
        return max(1, int(os.environ.get("FUZZ_SCALE", "1")))
    except ValueError:
        return 1


def examples(count: int) -> int:
    """``count`` cases in CI, ``count * FUZZ_SCALE`` when asked for more."""
    return count * scale()


class InputCpu:
    """CPU seconds spent inside a ``with`` block, the garbage collector held off meanwhile: a collection of a long
    run's heap is the test session's cost, not the input's (the long form once met one of nearly 3 s)."""

    def __enter__(self) -> InputCpu:
        self._collecting = gc.isenabled()
        gc.disable()
        self._started = time.process_time()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.process_time() - self._started
        if self._collecting:
            gc.enable()
