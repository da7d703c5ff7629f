"""The store time one call may spend, retries and every operation included: one deadline, not one per command.

A metered call asks the store several times (rate bucket, duplicate record, charge, then settlement),
and each Redis command has its own socket timeout; a slow or paused store could otherwise cost a call
that timeout once per command. ``StoreTime`` is the call's one allowance (``SATGATE_REDIS_TIMEOUT``):
every store operation of the call runs under what is left of it, and once it is spent the next
operation fails at once, as a store fault (``TimeoutError``), without asking the store.

What is done after the call's answer (a lost charge resolved, a settlement finished: ledger.py, closing.py) is
retried instead, each try under an allowance of its own (``resolve``, ``in_background``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from satgate_mcp.errors import store_unavailable

T = TypeVar("T")

#: Tries of a resolution before the answer goes out, sharing one store timeout: a lost answer costs a call
#: at most twice the timeout.
RESOLVE_ATTEMPTS = 2
#: Background resolution: waits between tries, doubling to the cap, and tries in all (~10 minutes: the ledger's life).
RETRY_FIRST, RETRY_CAP, BACKGROUND_ATTEMPTS = 0.5, 30.0, 25


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


async def resolve(ask: Callable[[], Awaitable[T]], *, allowance: float | None,
                  errors: tuple[type[BaseException], ...], attempts: int = RESOLVE_ATTEMPTS) -> T:
    """``ask()`` tried up to ``attempts`` times, the ``allowance`` shared equally between them; the last of
    ``errors`` (what a store that cannot answer raises) when none was answered. Safe to repeat: a resolution
    answers the same however often it is asked."""
    each = None if allowance is None else allowance / attempts
    for attempt in range(attempts):
        try:
            return await StoreTime(each).run(ask)
        except errors:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def retry_delays(first: float = RETRY_FIRST, cap: float = RETRY_CAP, attempts: int = BACKGROUND_ATTEMPTS
                 ) -> list[float]:
    """The waits before each background try: at once, then doubling from ``first`` up to ``cap``."""
    return [0.0, *(min(cap, first * 2.0**n) for n in range(attempts - 1))]


async def in_background(ask: Callable[[], Awaitable[T]], *, allowance: float | None,
                        errors: tuple[type[BaseException], ...], delays: list[float] | None = None) -> T:
    """``resolve`` again and again, waiting between tries, until the store answers; the last error if it never does."""
    waits = retry_delays() if delays is None else delays
    for n, wait in enumerate(waits):
        await asyncio.sleep(wait)
        try:
            return await resolve(ask, allowance=allowance, errors=errors, attempts=1)
        except errors:
            if n == len(waits) - 1:
                raise
    raise AssertionError("unreachable")


async def never_waived(operation: Callable[[], Awaitable[T]], timeout: float | None, on_fault: Callable[[str], None]
                       ) -> T:
    """One store operation of a control that is never waived (a spend limit, an approval hold), bounded by
    ``timeout``: any fault is told to ``on_fault`` (a short description, for the metric and the log) and becomes the
    closed refusal (503 + ``Retry-After``)."""
    try:
        async with asyncio.timeout(timeout):
            return await operation()
    except Exception as exc:
        on_fault(f"{type(exc).__name__}: {exc}"[:300])
        raise store_unavailable() from None
