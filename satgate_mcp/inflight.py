"""Bounds on requests in flight, per token id and per process (issue 9, hole 11).

A counter, not a queue: a request past either bound is refused at once (JSON-RPC -32004, the rate
limit's shape), so a flood of pipelined requests can never pile up tasks or replies in memory.
No I/O and no awaiting: acquiring is one synchronous step on the event loop, so it cannot race.
"""

from __future__ import annotations

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj, RequestId

#: What a refused request is told to wait: a slot frees as soon as any call of that token ends.
RETRY_AFTER_SECONDS = 1


class InflightLimiter:
    def __init__(self, *, per_token: int, total: int) -> None:
        self.per_token = per_token
        self.total = total
        self._held: dict[str, int] = {}
        self._count = 0

    @property
    def in_flight(self) -> int:
        return self._count

    def held_by(self, token_id: str) -> int:
        return self._held.get(token_id, 0)

    def room(self, token_id: str) -> int:
        """How many more requests this token may start now."""
        return max(0, min(self.per_token - self.held_by(token_id), self.total - self._count))

    def try_acquire(self, token_id: str) -> bool:
        if self.room(token_id) == 0:
            return False
        self._held[token_id] = self._held.get(token_id, 0) + 1
        self._count += 1
        return True

    def release(self, token_id: str) -> None:
        held = self._held.get(token_id, 0)
        if held <= 0:  # a release without an acquire is a bug elsewhere; never go negative
            return
        if held == 1:
            del self._held[token_id]
        else:
            self._held[token_id] = held - 1
        self._count -= 1


def too_many_in_flight(request_id: RequestId | None) -> JsonObj:
    return jsonrpc.error_response(request_id, jsonrpc.RATE_LIMITED, "Too many requests in flight; retry shortly",
                                  {"error": "rate_limited", "retry_after_seconds": RETRY_AFTER_SECONDS})
