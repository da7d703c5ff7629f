"""Held calls in the console: the pending ones, and an admin's approve or deny, taken once through the store.

An admin never decides a call of its own delegation family (the token that asked, one delegated from it, or
its parent): an agent holding an admin token could otherwise approve what it asked for. A decision wakes the
call this process keeps waiting at once; others look within half a second.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from satgate_mcp import events
from satgate_mcp.events import Publisher
from satgate_mcp.policy.approvals import ApprovalStore, HeldCall, decision_text, iso
from satgate_mcp.policy.holds import Holds


def row(record: HeldCall, now: float) -> dict[str, Any]:
    """One held call as the console's table shows it."""
    return {"id": record.id, "token_id": record.token_id, "tool": record.tool, "args": record.arguments,
            "reason": record.reason, "age_s": round(max(0.0, now - record.created_at), 1),
            "expires_at": iso(record.expires_at)}


def own_call(record: HeldCall, by: str, family: str | None) -> bool:
    """Whether the deciding admin is the caller itself, or of its delegation family."""
    return by == record.token_id or (family is not None and family == record.family_id)


class ConsoleApprovals:
    """The console's ``Approvals`` over the state store."""

    def __init__(self, store: ApprovalStore, holds: Holds, publisher: Publisher, clock: Callable[[], float]) -> None:
        self._store = store
        self._holds = holds
        self._publisher = publisher
        self._clock = clock

    async def list(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [row(r, now) for r in await self._store.listing(now) if r.view(now)["state"] == "pending"]

    async def approve(self, approval_id: str, *, by: str, family: str | None) -> None:
        await self._decide(approval_id, True, by, family)

    async def deny(self, approval_id: str, *, by: str, family: str | None) -> None:
        await self._decide(approval_id, False, by, family)

    async def _decide(self, approval_id: str, approve: bool, by: str, family: str | None) -> None:
        record = await self._store.get(approval_id)
        if record is None:
            raise KeyError(approval_id)
        if own_call(record, by, family):
            raise PermissionError(f"{approval_id} was asked for by token {record.token_id}, of your own delegation "
                                  "family: another operator must decide it")
        result = await self._store.decide(approval_id, approve, by, None, self._clock())
        if result.outcome != "decided" or result.record is None:
            raise ValueError(decision_text(approval_id, result))
        self._holds.decided(approval_id)
        self._publisher.publish(events.APPROVAL_DECIDED, approval_id=approval_id, decision=result.record.state,
                                by=by, token_id=record.token_id, tool=record.tool)
