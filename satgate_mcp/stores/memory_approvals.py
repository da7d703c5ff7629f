"""Held calls in this process's memory (``SATGATE_STATE_DIR=memory``): one machine, forgotten on restart.

Every operation runs without an ``await`` inside, so on one event loop each is atomic.
"""

from __future__ import annotations

from satgate_mcp.policy.approvals import (
    Decision,
    HeldCall,
    HoldOutcome,
    consumption,
    decision,
    kept_until,
    newest_first,
    repeat,
)


class MemoryApprovalStore:
    """``ApprovalStore`` in memory: records by id, and which record each fingerprint is bound to."""

    def __init__(self) -> None:
        self._records: dict[str, HeldCall] = {}
        self._bound: dict[str, str] = {}
        self._next_tidy = 0.0

    def _tidy(self, now: float) -> None:
        """Forget the records past their grace: a walk over all of them, so at most once a second."""
        if now < self._next_tidy:
            return
        self._next_tidy = now + 1.0
        for record in [r for r in self._records.values() if kept_until(r) <= now]:
            del self._records[record.id]
            if self._bound.get(record.fingerprint) == record.id:
                del self._bound[record.fingerprint]

    def _put(self, record: HeldCall) -> None:
        self._records[record.id] = record

    async def hold(self, request: HeldCall, now: float, per_family: int) -> HoldOutcome:
        self._tidy(now)
        bound = self._bound.get(request.fingerprint)
        current = self._records.get(bound) if bound is not None else None
        pending = sum(1 for r in self._records.values()
                      if r.family_id == request.family_id and r.state == "pending" and r.expires_at > now)
        outcome, keep = repeat(current, request, now, pending, per_family)
        if outcome.found == "approved" and outcome.record is not None:
            self._put(outcome.record)
        if keep is None:
            self._bound.pop(request.fingerprint, None)
        else:
            self._put(keep)
            self._bound[request.fingerprint] = keep.id
        return outcome

    async def get(self, approval_id: str) -> HeldCall | None:
        return self._records.get(approval_id)

    async def consume(self, approval_id: str, now: float) -> HeldCall | None:
        consumed = consumption(self._records.get(approval_id), now)
        if consumed is not None:
            self._put(consumed)
            if self._bound.get(consumed.fingerprint) == consumed.id:
                del self._bound[consumed.fingerprint]
        return consumed

    async def decide(self, approval_id: str, approve: bool, by: str, note: str | None, now: float) -> Decision:
        result, store = decision(self._records.get(approval_id), approve, by, note, now)
        if store is not None:
            self._put(store)
        return result

    async def listing(self, now: float, limit: int = 200) -> list[HeldCall]:
        self._tidy(now)
        return newest_first(list(self._records.values()), limit)

    async def close(self) -> None:
        return None
