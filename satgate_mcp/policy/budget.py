"""Budgets: what a tool call costs, who pays, and the guard that charges a re-sent call once.

Budgets are keyed by budget id (a token without one pays from its token id), never by
session, so a new or resumed session changes nothing. Credits are floats; comparisons allow
a tiny slack so ``0.1 + 0.2`` fits a budget of ``0.3``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from satgate_mcp.auth.base import Identity
from satgate_mcp.jsonrpc import JsonObj, RequestId

#: Float slack for "does the cost fit what remains".
EPSILON = 1e-9
#: How long a (session, request id, params) triple is remembered: 24 hours.
DUPLICATE_TTL_SECONDS = 24 * 3600.0


def resolve_cost(tool: str, costs: Mapping[str, float], default: float) -> float:
    """Exact name, then the longest matching ``prefix*``, then ``*``, then the default cost."""
    if tool in costs:
        return costs[tool]
    best: str | None = None
    for pattern in costs:
        if pattern.endswith("*") and tool.startswith(pattern[:-1]) and (best is None or len(pattern) > len(best)):
            best = pattern
    return costs[best] if best is not None else default


def initial_limit(identity: Identity, operator_budgets: Mapping[str, float]) -> float | None:
    """The limit a budget starts with on first use; None means unlimited.

    An operator budget (``SATGATE_BUDGETS``, keyed by budget id or token id) wins over the
    token's ``budget_limit`` caveat: the operator configures the gateway, the token holder
    cannot raise it, and the operator can still lower a limit a token was minted with.
    """
    if identity.budget_key in operator_budgets:
        return operator_budgets[identity.budget_key]
    return identity.budget_limit


def shown_remaining(remaining: float | None) -> float:
    """What clients and events see: -1 for unlimited, never below 0 (observe mode may overspend)."""
    if remaining is None:
        return -1
    return max(0.0, remaining)


@dataclass(frozen=True, slots=True)
class Charge:
    """Outcome of a charge or transfer.

    ``remaining`` is None for an unlimited budget; after the charge when allowed, before it
    when refused. ``exceeded`` says the cost did not fit what remained (in observe mode the
    charge still happens).
    """

    allowed: bool
    remaining: float | None
    exceeded: bool = False


class BudgetStore(Protocol):
    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool) -> Charge:
        """Atomically take ``cost``; a budget unknown so far starts at ``limit`` (None: unlimited,
        and nothing is stored). With ``enforce``, a cost above what remains is refused unchanged."""
        ...

    async def refund(self, key: str, amount: float) -> None: ...

    async def remaining(self, key: str, *, limit: float | None) -> float | None: ...

    async def transfer(self, parent: str, child: str, amount: float, *, parent_limit: float | None) -> Charge:
        """Atomically move ``amount`` from ``parent`` into a new budget ``child`` holding exactly that.

        Refused (nothing changes) when the parent is limited and holds less, or ``child`` exists.
        An unlimited parent gives without being charged."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Account:
    limit: float
    spent: float = 0.0

    @property
    def remaining(self) -> float:
        return self.limit - self.spent


class MemoryBudgetStore:
    """Budgets in this process; a restart starts them afresh. Methods never await, so each is atomic."""

    def __init__(self) -> None:
        self._accounts: dict[str, _Account] = {}

    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool) -> Charge:
        account = self._accounts.get(key)
        if account is None:
            if limit is None:
                return Charge(True, None)
            account = self._accounts[key] = _Account(limit)
        exceeded = cost > account.remaining + EPSILON
        if exceeded and enforce:
            return Charge(False, account.remaining, exceeded=True)
        account.spent += cost
        return Charge(True, account.remaining, exceeded=exceeded)

    async def refund(self, key: str, amount: float) -> None:
        account = self._accounts.get(key)
        if account is not None:
            account.spent = max(0.0, account.spent - amount)

    async def remaining(self, key: str, *, limit: float | None) -> float | None:
        account = self._accounts.get(key)
        if account is None:
            return limit
        return account.remaining

    async def transfer(self, parent: str, child: str, amount: float, *, parent_limit: float | None) -> Charge:
        if child in self._accounts:
            return Charge(False, None)
        account = self._accounts.get(parent)
        if account is None and parent_limit is not None:
            account = self._accounts[parent] = _Account(parent_limit)
        if account is not None:
            if amount > account.remaining + EPSILON:
                return Charge(False, account.remaining, exceeded=True)
            account.spent += amount
        self._accounts[child] = _Account(amount)
        return Charge(True, account.remaining if account is not None else None)

    async def close(self) -> None:
        return None


def duplicate_key(token_id: str, session_id: str, request_id: RequestId, params: JsonObj | None) -> str:
    """A hash of (token id, session id, request id, params without ``_meta``), stable across processes.

    ``_meta`` is left out: it carries transport details (progress tokens, tracing), not the call.
    The id keeps its JSON type, so ``1`` and ``"1"`` differ. The token id is there only so two
    callers can never collide, whatever session ids a transport hands in.
    """
    body = {k: v for k, v in (params or {}).items() if k != "_meta"}
    blob = json.dumps([token_id, session_id, request_id, body], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class DuplicateStore(Protocol):
    async def claim(self, key: str) -> bool:
        """True the first time ``key`` is seen within the window (and remember it); False after."""
        ...

    async def release(self, key: str) -> None:
        """Forget ``key``: the call it stood for was refunded, so a re-send must pay."""
        ...

    async def close(self) -> None: ...


class MemoryDuplicateStore:
    """Keys in insertion order, which is also expiry order (one TTL for all).

    Bounded: expired keys go first, then the oldest beyond ``cap`` (a re-send of a call that old
    would then be charged again; the cap is the price of bounded memory).
    """

    def __init__(self, *, ttl: float = DUPLICATE_TTL_SECONDS, cap: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._cap = cap
        self._clock = clock
        self._expiry: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    async def claim(self, key: str) -> bool:
        now = self._clock()
        while self._expiry:
            oldest, expires = next(iter(self._expiry.items()))
            if expires > now:
                break
            del self._expiry[oldest]
        if key in self._expiry:
            return False
        self._expiry[key] = now + self._ttl
        while len(self._expiry) > self._cap:
            self._expiry.popitem(last=False)
        return True

    async def release(self, key: str) -> None:
        self._expiry.pop(key, None)

    async def close(self) -> None:
        self._expiry.clear()
