"""Approval holds: a call an operator must approve first, kept in the state store so every machine sees it.

A held call is a ``HeldCall`` record keyed by an unguessable id and bound to the call's *fingerprint* (the token
id, the tool and the canonical arguments). The agent repeats the identical call; the store answers, atomically,
what that repeat is (``HoldOutcome``): still pending, approved (and so consumed: the call runs **once**, on any
machine), denied, expired, or a new request (or none: the token's delegation family has too many pending). A
decision is taken once: the first approve or deny wins, every later one is refused and told what happened first.

Pure decisions here (the record, the fingerprint, what a repeat and a decision lead to); the stores
(stores/memory_approvals.py, stores/sqlite/approvals.py, stores/redis/approvals.py) apply them atomically.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

#: A held call's states: waiting for a person, decided, or used by the call it allowed.
State = Literal["pending", "approved", "denied", "consumed"]
#: What a repeat of a held call finds.
Found = Literal["requested", "pending", "approved", "denied", "expired", "full"]
#: What an operator's decision did.
Decided = Literal["decided", "already", "expired", "unknown"]

#: A decided or expired record stays listed (and a late decision is told what happened) this long.
RECORD_GRACE_SECONDS = 24 * 3600.0
#: What a record keeps of the call's arguments for the operator to read (longer is cut, and says so).
MAX_ARGUMENTS_CHARS = 4000
#: Approval ids: a prefix an operator recognises, then 128 random bits.
ID_PREFIX = "apr_"


@dataclass(frozen=True, slots=True)
class HeldCall:
    """One held call: what was asked, by whom, why it waits, and what became of it."""

    id: str
    fingerprint: str
    token_id: str
    family_id: str
    tool: str
    arguments: str
    reason: str
    created_at: float
    expires_at: float
    state: State = "pending"
    decided_by: str | None = None
    decided_at: float | None = None
    note: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | bytes) -> HeldCall:
        return HeldCall(**json.loads(text))

    def view(self, now: float) -> dict[str, Any]:
        """What ``approvals list --json`` and the console show: the record, with an expired pending one said so."""
        shown = asdict(self)
        if self.state in ("pending", "approved") and now >= self.expires_at:
            shown["state"] = "expired"
        return shown


@dataclass(frozen=True, slots=True)
class HoldOutcome:
    """A store's answer to a repeat: what it ``found`` and the record concerned (None only for ``full``)."""

    found: Found
    record: HeldCall | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A store's answer to an approve or deny: ``decided``, or why not, with the record as it stands."""

    outcome: Decided
    record: HeldCall | None = None


class ApprovalStore(Protocol):
    async def hold(self, request: HeldCall, now: float, per_family: int) -> HoldOutcome:
        """Atomically, for ``request.fingerprint`` (``repeat`` below); a new request is kept until
        ``expires_at + RECORD_GRACE_SECONDS``."""
        ...

    async def get(self, approval_id: str) -> HeldCall | None: ...

    async def consume(self, approval_id: str, now: float) -> HeldCall | None:
        """Atomically: an approved, unexpired record becomes ``consumed`` (returned); else None (not now)."""
        ...

    async def decide(self, approval_id: str, approve: bool, by: str, note: str | None, now: float) -> Decision:
        """Atomically ``decision``: exactly one of two operators deciding at once wins."""
        ...

    async def listing(self, now: float, limit: int = 200) -> list[HeldCall]:
        """The records kept, newest first (pending ones, and decided ones within their grace)."""
        ...

    async def close(self) -> None: ...


def fingerprint(token_id: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """The identical call: same token, tool and canonical arguments (key order and spacing do not count)."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    material = json.dumps([token_id, tool, canonical], separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()


def new_id() -> str:
    return ID_PREFIX + secrets.token_urlsafe(16)


def shown_arguments(arguments: Mapping[str, Any]) -> str:
    """The arguments as the operator reads them, bounded."""
    text = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_ARGUMENTS_CHARS else text[:MAX_ARGUMENTS_CHARS] + "... (cut)"


def repeat(current: HeldCall | None, request: HeldCall, now: float, pending_in_family: int,
           per_family: int) -> tuple[HoldOutcome, HeldCall | None]:
    """What a call whose fingerprint is bound to ``current`` (None: to nothing) finds, and the record to keep
    bound to the fingerprint afterwards (None: unbind it). ``current`` approved and unexpired: consumed now."""
    if current is None:
        if pending_in_family >= per_family:
            return HoldOutcome("full"), None
        return HoldOutcome("requested", request), request
    if current.state in ("pending", "approved") and now >= current.expires_at:
        return HoldOutcome("expired", current), None
    if current.state == "approved":
        return HoldOutcome("approved", replace(current, state="consumed")), None
    if current.state == "denied":
        return HoldOutcome("denied", current), None
    if current.state == "consumed":  # a bound record is never consumed; a new request then
        return repeat(None, request, now, pending_in_family, per_family)
    return HoldOutcome("pending", current), current


def decision(current: HeldCall | None, approve: bool, by: str, note: str | None, now: float
             ) -> tuple[Decision, HeldCall | None]:
    """What an operator's decision on ``current`` does, and the record to store (None: store nothing)."""
    if current is None:
        return Decision("unknown"), None
    if current.state != "pending":
        return Decision("already", current), None
    if now >= current.expires_at:
        return Decision("expired", current), None
    decided = replace(current, state="approved" if approve else "denied", decided_by=by[:200], decided_at=now,
                      note=None if note is None else note[:500])
    return Decision("decided", decided), decided


def consumption(current: HeldCall | None, now: float) -> HeldCall | None:
    """The consumed record when ``current`` is approved and unexpired; else None."""
    if current is None or current.state != "approved" or now >= current.expires_at:
        return None
    return replace(current, state="consumed")


def kept_until(record: HeldCall) -> float:
    return record.expires_at + RECORD_GRACE_SECONDS


def newest_first(records: Sequence[HeldCall], limit: int) -> list[HeldCall]:
    return sorted(records, key=lambda r: r.created_at, reverse=True)[:limit]


def iso(moment: float) -> str:
    """A moment as agents and operators read it: ISO 8601, UTC, whole seconds."""
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds")


def decided_before(record: HeldCall) -> str:
    """What happened first, for a late decision: ``approved by X at T`` and the like."""
    when = iso(record.decided_at) if record.decided_at is not None else "?"
    if record.state == "consumed":
        return f"approved by {record.decided_by} at {when}, and already used by the call"
    return f"{record.state} by {record.decided_by} at {when}"


def decision_text(approval_id: str, result: Decision) -> str:
    """What a decision that was not taken says: what happened first."""
    record = result.record
    if result.outcome == "unknown" or record is None:
        return f"no held call {approval_id} (satgate-mcp approvals list shows them; decided ones are kept a day)"
    if result.outcome == "expired":
        return f"{approval_id} expired undecided at {iso(record.expires_at)}: the agent must repeat its call"
    return f"{approval_id} was already {decided_before(record)}: a decision is taken once"
