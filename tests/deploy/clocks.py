"""Time for the runner's in-process tests: it passes only when the code under test sleeps, or never."""

from __future__ import annotations

import asyncio

from tests.fakes import FakeClock


class SteppingClock(FakeClock):
    """Time that passes only while the code under test sleeps, and then at once."""

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)


async def never(seconds: float) -> None:
    """A sleep that outlasts the test: code given it moves only on events."""
    await asyncio.Event().wait()
