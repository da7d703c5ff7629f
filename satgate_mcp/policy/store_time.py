"""The store time one call may spend, retries and every operation included: one deadline, not one per command.

A metered call asks the store several times (rate bucket, duplicate record, charge, then settlement),
and each Redis command has its own socket timeout; a slow or paused store could otherwise cost a call
that timeout once per command. ``StoreTime`` is the call's one allowance (``SATGATE_REDIS_TIMEOUT``):
every store operation of the call runs under what is left of it, and once it is spent the next
operation fails at once, as a store fault (``TimeoutError``), without asking the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class StoreTime:
    """Seconds of store time left to one call; None means unbounded (stores in memory never wait)."""

    __slots__ = ("left",)

    def __init__(self, allowance: float | None) -> None:
        self.left = allowance

    @property
    def spent(self) -> bool:
        return self.left is not None and self.left <= 0

    async def run(self, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation()`` within what is left; TimeoutError when that runs out (or already had)."""
        if self.left is None:
            return await operation()
        if self.left <= 0:
            raise TimeoutError("this call's store time is spent")
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self.left):
                return await operation()
        finally:
            self.left -= loop.time() - started
