"""Spend limits: which running sums a call adds to, how much, against which limit; and when it is given back.

Pure decisions; the ``SpendStore`` (stores/) applies a reservation to every sum at once, all or none. Each
sum is keyed by who spends (tenant, else the token family), what is counted (tools and field), the window kind,
the zone and the window's first date, so a parent's and a child's limit on the same thing check one sum.
Amounts travel as integer micro-units (exact in SQLite and in Redis). A reservation is given back only when
the call certainly did not run (``did_not_run``), and is keyed like the duplicate guard's copies of one call,
so a re-send of a call whose first copy is unsettled (or whose process died) is not charged again.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import PARSE_ERROR, RATE_LIMITED, TOOL_NOT_ALLOWED, JsonObj, RequestId
from satgate_mcp.policy.control_values import decimal_text, micros, number_of
from satgate_mcp.policy.controls import Controls, SpendLimit, applies
from satgate_mcp.policy.duplicates import DUPLICATE_TTL_SECONDS, duplicate_key
from satgate_mcp.policy.refunds import failure_kind, refundable
from satgate_mcp.policy.spend_windows import Bounds, window_bounds

#: A window's sum outlives the window by this long (then the store may forget it).
SUM_GRACE_SECONDS = 24 * 3600.0
#: A reservation record lives as long as a duplicate record: long past any call's answer.
RESERVATION_TTL_SECONDS = DUPLICATE_TTL_SECONDS
#: ``data.error`` of refusals made before a call is forwarded (by a later guard, the rate limit, the budget, a
#: store that did not answer): such a call never ran.
REFUSED_BEFORE_SENDING = frozenset({"rate_limited", "budget_exhausted", "store_unavailable", "tool_not_allowed"})


@dataclass(frozen=True, slots=True)
class Charge:
    """One running sum a call adds to: the store's key, the amount and the limit (micro-units), how long to keep it."""

    counter: str
    amount: int
    limit: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class Planned:
    """A charge with what a refusal over its limit says."""

    charge: Charge
    limit: SpendLimit
    bounds: Bounds


@dataclass(frozen=True, slots=True)
class Reservation:
    """A store's answer: reserved (all charges), a duplicate of a reservation held (nothing charged), or the
    index of the first charge that did not fit (nothing charged) with that sum as it stands."""

    duplicate: bool = False
    exceeded: int | None = None
    total: int = 0


class SpendStore(Protocol):
    async def reserve(self, key: str, charges: Sequence[Charge], now: float) -> Reservation:
        """Atomically: ``key`` already held -> duplicate; else every charge fits its limit -> all added and held
        under ``key`` (for ``RESERVATION_TTL_SECONDS``); else nothing added."""
        ...

    async def release(self, key: str, charges: Sequence[Charge]) -> None:
        """Give back what ``key`` holds (``charges``, as reserved) and forget it: at most once, whoever asks."""
        ...

    async def settle(self, key: str) -> None:
        """Keep what ``key`` holds (the call ran) and forget the hold: a later copy is a new call."""
        ...

    async def total(self, counter: str) -> int: ...

    async def close(self) -> None: ...


def spender(identity: Identity) -> str:
    """Whose sums: the tenant's, else the token family's (narrowed and delegated tokens spend from their root's)."""
    return f"tenant:{identity.tenant}" if identity.tenant else f"token:{identity.family_id}"


def counter_key(who: str, limit: SpendLimit, bounds: Bounds) -> str:
    what = "\x1f".join([who, ",".join(sorted(set(limit.tools))), limit.field, limit.window, limit.tz, bounds.label])
    return hashlib.sha256(what.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def applicable(controls: tuple[Controls, ...], tool: str) -> list[SpendLimit]:
    return [limit for caveat in controls for limit in caveat.spend_limits if applies(limit.tools, tool)]


def amount_of(limit: SpendLimit, arguments: Mapping[str, Any]) -> Decimal | None:
    """The call's amount for ``limit``: a number from 0; None (a refusal) when missing, non-numeric or negative."""
    amount = number_of(arguments.get(limit.field))
    return amount if amount is not None and amount >= 0 else None


def plan(limits: Sequence[SpendLimit], identity: Identity, arguments: Mapping[str, Any], now: float
         ) -> list[Planned]:
    """The charges of one call (every amount already checked by ``amount_of``). Limits on one sum (a parent's and a
    child's on the same tools, field, window and zone) are one charge against the lowest of them: an amount is
    added to a sum once."""
    who = spender(identity)
    planned: dict[str, Planned] = {}
    for limit in limits:
        amount = amount_of(limit, arguments)
        assert amount is not None
        bounds = window_bounds(limit.window, limit.tz, now)
        expires = bounds.end.timestamp() + SUM_GRACE_SECONDS
        charge = Charge(counter_key(who, limit, bounds), micros(amount), micros(limit.max), expires)
        held = planned.get(charge.counter)
        if held is None or charge.limit < held.charge.limit:
            planned[charge.counter] = Planned(charge, limit, bounds)
    return list(planned.values())


def reservation_key(identity: Identity, session_id: str, request_id: RequestId | None, params: JsonObj) -> str:
    """Copies of one call share a key (the duplicate guard's); a stateless call (no session) gets its own."""
    if not session_id or request_id is None:
        return "once:" + secrets.token_hex(16)
    return "call:" + duplicate_key(identity.token_id, session_id, request_id, params)


def exceeded_data(tool: str, planned: Planned, total: int) -> dict[str, Any]:
    """What ``spend_limit_exceeded`` says: the limit, what remains of it, when the window resets."""
    remaining = max(0, planned.charge.limit - total)
    return {"tool": tool, "field": planned.limit.field, "window": planned.limit.window,
            "limit": decimal_text(planned.limit.max), "remaining": decimal_text(Decimal(remaining) / 10**6),
            "resets_at": planned.bounds.end.isoformat()}


def did_not_run(reply: JsonObj | None, failure: BaseException | None) -> bool:
    """The call certainly never ran upstream: never sent, refused before sending, or answered -32700, -32600,
    -32601 or -32602. Anything else (a timeout, a lost connection, a cancellation) may have run."""
    if refundable(failure_kind(reply, failure)):
        return True
    if isinstance(failure, GatewayError):
        data = failure.data if isinstance(failure.data, dict) else {}
        refused = failure.code in (TOOL_NOT_ALLOWED, RATE_LIMITED, PARSE_ERROR)
        return refused or data.get("error") in REFUSED_BEFORE_SENDING
    error = reply.get("error") if isinstance(reply, dict) else None
    return isinstance(error, dict) and error.get("code") == PARSE_ERROR
