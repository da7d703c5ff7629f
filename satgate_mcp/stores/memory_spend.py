"""Spend-limit sums in this process's memory (``SATGATE_STATE_DIR=memory``): exact, forgotten on restart.

Every operation runs without an ``await`` inside, so on one event loop a reservation is atomic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from satgate_mcp.policy.spend import RESERVATION_TTL_SECONDS, Charge, Reservation


class MemorySpendStore:
    """``SpendStore`` in memory; expired sums and holds are dropped as they are met and on each reservation."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._sums: dict[str, tuple[int, float]] = {}
        self._holds: dict[str, tuple[tuple[tuple[str, int], ...], float]] = {}

    def _sum(self, counter: str, now: float) -> int:
        total, expires = self._sums.get(counter, (0, 0.0))
        return total if expires > now else 0

    def _tidy(self, now: float) -> None:
        if len(self._sums) + len(self._holds) > 10_000:
            self._sums = {k: v for k, v in self._sums.items() if v[1] > now}
            self._holds = {k: v for k, v in self._holds.items() if v[1] > now}

    async def reserve(self, key: str, charges: Sequence[Charge], now: float) -> Reservation:
        self._tidy(now)
        hold = self._holds.get(key)
        if hold is not None and hold[1] > now:
            return Reservation(duplicate=True)
        for i, charge in enumerate(charges):
            total = self._sum(charge.counter, now)
            if total + charge.amount > charge.limit:
                return Reservation(exceeded=i, total=total)
        for charge in charges:
            self._sums[charge.counter] = (self._sum(charge.counter, now) + charge.amount, charge.expires_at)
        self._holds[key] = (tuple((c.counter, c.amount) for c in charges), now + RESERVATION_TTL_SECONDS)
        return Reservation()

    async def release(self, key: str, charges: Sequence[Charge]) -> None:
        hold = self._holds.pop(key, None)
        if hold is None:
            return
        now = self._clock()
        for counter, amount in hold[0]:
            total, expires = self._sums.get(counter, (0, 0.0))
            if expires > now:
                self._sums[counter] = (max(0, total - amount), expires)

    async def settle(self, key: str) -> None:
        self._holds.pop(key, None)

    async def total(self, counter: str) -> int:
        return self._sum(counter, self._clock())

    async def close(self) -> None:
        return None
