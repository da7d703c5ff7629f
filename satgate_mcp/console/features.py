"""The console's seams for features built elsewhere: held calls (tool controls), the audit trail, the HTTP
upstream circuit breaker. Each is a small protocol the app hands in when the feature is configured; until
then the view says the feature is off, and its actions answer 409 naming what would turn it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Approvals(Protocol):
    """Held calls (``approvals list|approve|deny``). ``list`` gives each pending one as ``{"id", "token_id", "tool",
    "args", "reason", "age_s", "expires_at"}``; ``approve`` and ``deny`` take the admin's token id and delegation
    family and refuse (raise ``PermissionError``) an admin deciding a call of its own family; ``KeyError``: unknown
    id; ``ValueError``: decided already or expired (the message says what happened first)."""

    async def list(self) -> list[dict[str, Any]]: ...

    async def approve(self, approval_id: str, *, by: str, family: str | None) -> None: ...

    async def deny(self, approval_id: str, *, by: str, family: str | None) -> None: ...


class SpendLimits(Protocol):
    """Spend limits per window (tool controls): rows ``{"token_id", "spender", "tool", "field", "window", "tz",
    "limit", "spent", "resets_at"}``."""

    async def list(self) -> list[dict[str, Any]]: ...


class Audit(Protocol):
    """The audit trail (its file setting): ``record`` appends one console action; ``tail`` the last lines
    matching the filters (field -> exact value); ``verify`` the chain's status ``{"ok": bool, "detail": str}``."""

    async def record(self, *, who: str, action: str, target: str) -> None: ...

    async def tail(self, limit: int, filters: dict[str, str]) -> list[dict[str, Any]]: ...

    async def verify(self) -> dict[str, Any]: ...


class Breakers(Protocol):
    """The HTTP upstreams' circuit breakers: upstream name -> ``{"state": "closed"|"open"|"half_open", ...}``."""

    def states(self) -> dict[str, dict[str, Any]]: ...


@dataclass(slots=True)
class Features:
    """What the app connected; None: not on this gateway (or not configured), and the view says so."""

    approvals: Approvals | None = None
    spend_limits: SpendLimits | None = None
    audit: Audit | None = None
    breakers: Breakers | None = None


#: What a view shows for a feature that is absent, and the 409 its actions answer.
OFF: dict[str, str] = {
    "approvals": "Held calls are not shown: this gateway was built without them.",
    "spend_limits": "Spend limits per window are carried by header-mode tokens (macaroons) only.",
    "audit": "The audit trail is off: set SATGATE_AUDIT_FILE.",
    "breakers": "No circuit breaker is configured for any HTTP upstream.",
    "policy": "Policy rules are off: set SATGATE_POLICY_FILE.",
    "pins": "Pinned tool definitions are off: SATGATE_TOOL_PINNING=off.",
}


def off(feature: str) -> dict[str, Any]:
    return {"enabled": False, "message": OFF[feature]}
