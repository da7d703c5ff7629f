"""Budgets: what a tool call costs and who pays.

Budgets are keyed by budget id (a token without one pays from its token id), never by
session, so a new or resumed session changes nothing. Credits are floats; comparisons allow
a tiny slack so ``0.1 + 0.2`` fits a budget of ``0.3``. A delegated child's account expires
with the child, so minting children in a loop does not grow the store for ever.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from satgate_mcp.auth.base import Identity
from satgate_mcp.patterns import most_specific

#: Float slack for "does the cost fit what remains".
EPSILON = 1e-9
#: A child's account outlives the child's token by this much, so that no clock skew between the
#: token's expiry (wall clock) and the account's (the store's clock) ever recreates a spent account.
CHILD_ACCOUNT_GRACE_SECONDS = 300.0


def child_account_ttl(child_ttl: float | None) -> float | None:
    """How long a delegated child's account is kept: its token's lifetime and a grace; None for ever."""
    return None if child_ttl is None else child_ttl + CHILD_ACCOUNT_GRACE_SECONDS


def resolve_cost(tool: str, costs: Mapping[str, float], default: float) -> float:
    """The cost of the most specific pattern (exact name, longest ``prefix*``, ``*``), else the default."""
    pattern = most_specific(costs.keys(), tool)
    return costs[pattern] if pattern is not None else default


def initial_limit(identity: Identity, operator_budgets: Mapping[str, float]) -> float | None:
    """The limit a budget starts with on first use; None means unlimited.

    An operator budget (``SATGATE_BUDGETS``, keyed by budget id or token id) wins over the
    token's ``budget_limit`` caveat: the operator configures the gateway, the token holder
    cannot raise it, and the operator can still lower a limit a token was minted with.
    """
    if identity.budget_key in operator_budgets:
        return operator_budgets[identity.budget_key]
    return identity.budget_limit


def kept_in_store(limit: float | None, budget_id: str | None) -> bool:
    """Whether a call's budget needs the store: a limit to keep, or a budget id another token may share.

    An unlimited budget of the token's own has nothing to charge and nothing to record, so such a call makes
    no store round trip at all (the unmetered default path). A budget id, even unlimited, may name an account
    another token opened with a limit: that one is charged as stored.
    """
    return limit is not None or budget_id is not None


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


def decide(limit: float, spent: float, cost: float, *, enforce: bool) -> tuple[Charge, float]:
    """One charge against a limited budget: the answer, and what is spent afterwards.

    The one copy of the arithmetic. The memory and SQLite stores call it; Redis runs it inside a Lua
    script (``stores/redis/policy.py``, ``DECIDE_LUA``) that mirrors it line for line, and
    ``tests/stores/test_decide.py`` runs one table against both. A transfer is a charge that must fit.
    """
    exceeded = cost > limit - spent + EPSILON
    if exceeded and enforce:
        return Charge(False, limit - spent, exceeded=True), spent
    spent += cost
    return Charge(True, limit - spent, exceeded=exceeded), spent


class BudgetStore(Protocol):
    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool,
                     charge_id: str = "") -> Charge:
        """Atomically take ``cost``; a budget unknown so far starts at ``limit`` (None: unlimited,
        and nothing is stored). With ``enforce``, a cost above what remains is refused unchanged.
        A store that can lose an answer (policy/ledger.py) takes a charge id once only."""
        ...

    async def refund(self, key: str, amount: float, *, refund_id: str = "") -> None:
        """Give ``amount`` back; with a ``refund_id``, once only, however often it is asked (where the store can)."""
        ...

    async def remaining(self, key: str, *, limit: float | None) -> float | None: ...

    async def transfer(self, parent: str, child: str, amount: float, *, parent_limit: float | None,
                       ttl: float | None = None) -> Charge:
        """Atomically move ``amount`` from ``parent`` into a new budget ``child`` holding exactly that.

        Refused (nothing changes) when the parent is limited and holds less, or ``child`` exists.
        An unlimited parent gives without being charged. ``child`` is dropped after ``ttl`` seconds."""
        ...

    async def close(self) -> None: ...
