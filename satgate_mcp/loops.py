"""The running event loop, or None: for code that also runs outside a loop (start-up, the CLI, threads)."""

from __future__ import annotations

import asyncio


def running_loop() -> asyncio.AbstractEventLoop | None:
    """``asyncio.get_running_loop`` without the exception: inside a loop (the hot path) nothing is raised."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
