"""Cost resolution and budget accounts, below the facade."""

from __future__ import annotations

import asyncio

import pytest

from satgate_mcp.auth.base import Identity
from satgate_mcp.policy.budget import Charge, child_account_ttl, initial_limit, resolve_cost, shown_remaining
from satgate_mcp.stores.memory import MemoryBudgetStore
from tests.fakes import FakeClock

COSTS = {"db_query": 5.0, "db_*": 3.0, "db_admin_*": 10.0, "search*": 0.5, "*": 2.0}


@pytest.mark.parametrize(
    ("tool", "costs", "expected"),
    [
        pytest.param("db_query", COSTS, 5.0, id="exact-name"),
        pytest.param("db_write", COSTS, 3.0, id="prefix"),
        pytest.param("db_admin_drop", COSTS, 10.0, id="longest-prefix-wins"),
        pytest.param("search", COSTS, 0.5, id="prefix-matches-bare-prefix"),
        pytest.param("weather", COSTS, 2.0, id="star"),
        pytest.param("weather", {"db_*": 3.0}, 1.0, id="default-cost"),
        pytest.param("db_query", {"db_query*": 7.0, "db_*": 3.0}, 7.0, id="longest-prefix-may-equal-name"),
        pytest.param("free", {"free": 0.0, "*": 2.0}, 0.0, id="zero-cost-exact"),
        pytest.param("", COSTS, 2.0, id="empty-name-falls-to-star"),
    ],
)
def test_resolve_cost(tool: str, costs: dict[str, float], expected: float) -> None:
    assert resolve_cost(tool, costs, default=1.0) == expected


@pytest.mark.parametrize(
    ("identity", "operator", "expected"),
    [
        pytest.param(Identity("t"), {}, None, id="no-limit-unlimited"),
        pytest.param(Identity("t", budget_limit=50), {}, 50, id="token-caveat"),
        pytest.param(Identity("t", budget_id="team", budget_limit=50), {"team": 20}, 20, id="operator-wins"),
        pytest.param(Identity("t", budget_limit=50), {"t": 80}, 80, id="operator-by-token-id"),
        pytest.param(Identity("t", budget_id="team"), {"t": 80}, None, id="keyed-by-budget-id-not-token"),
    ],
)
def test_initial_limit(identity: Identity, operator: dict[str, float], expected: float | None) -> None:
    assert initial_limit(identity, operator) == expected


@pytest.mark.parametrize(
    ("remaining", "shown"),
    [pytest.param(None, -1, id="unlimited"), pytest.param(-2.0, 0, id="overspent-in-observe"),
     pytest.param(3.5, 3.5, id="plain")],
)
def test_shown_remaining(remaining: float | None, shown: float) -> None:
    assert shown_remaining(remaining) == shown


async def test_control_refuses_what_does_not_fit_and_changes_nothing() -> None:
    store = MemoryBudgetStore()
    assert await store.charge("b", 4, limit=10, enforce=True) == Charge(True, 6)
    assert await store.charge("b", 7, limit=10, enforce=True) == Charge(False, 6, exceeded=True)
    assert await store.charge("b", 6, limit=10, enforce=True) == Charge(True, 0)
    assert await store.charge("b", 0, limit=10, enforce=True) == Charge(True, 0)


async def test_observe_charges_past_zero_and_flags_it() -> None:
    store = MemoryBudgetStore()
    assert await store.charge("b", 4, limit=3, enforce=False) == Charge(True, -1, exceeded=True)
    assert await store.remaining("b", limit=3) == -1


async def test_limit_applies_on_first_use_only() -> None:
    store = MemoryBudgetStore()
    await store.charge("b", 1, limit=10, enforce=True)
    assert await store.charge("b", 1, limit=1000, enforce=True) == Charge(True, 8)


async def test_unlimited_budget_is_not_stored() -> None:
    store = MemoryBudgetStore()
    assert await store.charge("b", 5, limit=None, enforce=True) == Charge(True, None)
    assert await store.remaining("b", limit=None) is None


async def test_floats_add_up() -> None:
    store = MemoryBudgetStore()
    assert [(await store.charge("b", 0.1, limit=0.3, enforce=True)).allowed for _ in range(4)] == [
        True, True, True, False]


async def test_refund_returns_credits() -> None:
    store = MemoryBudgetStore()
    await store.charge("b", 4, limit=5, enforce=True)
    await store.refund("b", 4)
    assert await store.remaining("b", limit=5) == 5


@pytest.mark.parametrize(
    ("parent_limit", "amount", "allowed", "parent_left"),
    [
        pytest.param(10.0, 4.0, True, 6.0, id="moves-credits"),
        pytest.param(10.0, 10.0, True, 0.0, id="everything"),
        pytest.param(3.0, 4.0, False, 3.0, id="insufficient"),
        pytest.param(None, 1e6, True, None, id="unlimited-parent-gives-freely"),
    ],
)
async def test_transfer(parent_limit: float | None, amount: float, allowed: bool, parent_left: float | None
                        ) -> None:
    store = MemoryBudgetStore()
    moved = await store.transfer("p", "c", amount, parent_limit=parent_limit)
    assert moved.allowed is allowed
    assert await store.remaining("p", limit=parent_limit) == parent_left
    assert await store.remaining("c", limit=None) == (amount if allowed else None)


async def test_transfer_never_reuses_a_child_id() -> None:
    store = MemoryBudgetStore()
    assert (await store.transfer("p", "c", 1, parent_limit=10)).allowed
    assert not (await store.transfer("p", "c", 1, parent_limit=10)).allowed
    assert await store.remaining("p", limit=10) == 9


async def test_concurrent_charges_never_overspend() -> None:
    store = MemoryBudgetStore()
    results = await asyncio.gather(*(store.charge("b", 1, limit=7, enforce=True) for _ in range(100)))
    assert sum(r.allowed for r in results) == 7
    assert await store.remaining("b", limit=7) == 0


async def test_attack_child_accounts_expire_with_the_child() -> None:
    """Minting children in a loop must not grow the store for ever: each account goes with its token."""
    clock = FakeClock()
    store = MemoryBudgetStore(clock=clock)
    for n in range(100):
        assert (await store.transfer("parent", f"child-{n}", 1, parent_limit=None, ttl=child_account_ttl(60))).allowed
    assert (await store.transfer("parent", "forever", 1, parent_limit=None)).allowed
    assert len(store) == 101
    clock.advance(60 + 299)
    assert await store.remaining("child-0", limit=None) == 1
    clock.advance(1)
    assert len(store) == 1  # only the child without an expiry is left
    assert await store.remaining("child-0", limit=None) is None
