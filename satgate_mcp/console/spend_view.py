"""Spend limits per window in the console: for the tokens holding sessions here, each limit's sum in its current
window as the spend store has it (every process on the store adds to the same sum), against its limit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from satgate_mcp.auth.base import Identity
from satgate_mcp.policy.control_values import decimal_text
from satgate_mcp.policy.spend import SpendStore, counter_key, spender
from satgate_mcp.policy.spend_windows import window_bounds
from satgate_mcp.sessions import SessionRegistry

#: Rows one answer shows at most (one per sum: a tenant's tokens share theirs).
MAX_ROWS = 200


def limit_rows(identities: Iterable[Identity], now: float) -> list[tuple[str, dict[str, Any]]]:
    """Each distinct sum the identities' spend limits add to now: its store key and its row (``spent`` to fill)."""
    rows: dict[str, dict[str, Any]] = {}
    for identity in identities:
        for caveat in identity.controls:
            for limit in caveat.spend_limits:
                bounds = window_bounds(limit.window, limit.tz, now)
                counter = counter_key(spender(identity), limit, bounds)
                if counter in rows or len(rows) >= MAX_ROWS:
                    continue
                rows[counter] = {"token_id": identity.token_id, "spender": spender(identity),
                                 "tool": ", ".join(limit.tools), "field": limit.field, "window": limit.window,
                                 "tz": limit.tz, "limit": decimal_text(limit.max), "spent": None,
                                 "resets_at": bounds.end.isoformat()}
    return list(rows.items())


class ConsoleSpendLimits:
    """The console's ``SpendLimits``: the sums of this process's sessions' tokens, read from the spend store."""

    def __init__(self, registry: SessionRegistry, store: SpendStore, clock: Callable[[], float],
                 timeout: float | None) -> None:
        self._registry = registry
        self._store = store
        self._clock = clock
        self._timeout = timeout

    async def list(self) -> list[dict[str, Any]]:
        identities = {session.identity.token_id: session.identity for session in self._registry
                      if session.identity.controls}
        rows = limit_rows(identities.values(), self._clock())
        for counter, row in rows:
            try:
                async with asyncio.timeout(self._timeout):
                    total = await self._store.total(counter)
            except Exception:  # a store that does not answer: the row says unknown, the page still loads
                continue
            row["spent"] = decimal_text(Decimal(total) / 10**6)
        return [row for _, row in rows]
