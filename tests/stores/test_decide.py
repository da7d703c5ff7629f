"""One table for the budget arithmetic, run against ``decide`` and against the Lua that mirrors it in Redis.

The memory and SQLite stores call ``decide`` itself; Redis cannot, so its scripts carry a copy. A row
here that the copy answers differently fails, whichever side changed.
"""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as redis

from satgate_mcp.policy.budget import Charge, decide
from satgate_mcp.stores.redis.policy import RedisBudgetStore

#: limit, spent before, cost, enforce -> allowed, remaining, exceeded, spent after
TABLE: list[tuple[float, float, float, bool, bool, float, bool, float]] = [
    (10.0, 0.0, 3.0, True, True, 7.0, False, 3.0),
    (10.0, 7.0, 3.0, True, True, 0.0, False, 10.0),           # exactly what is left
    (10.0, 8.0, 3.0, True, False, 2.0, True, 8.0),            # refused: unchanged, what was left
    (10.0, 8.0, 3.0, False, True, -1.0, True, 11.0),          # observe: charged past the limit, flagged
    (1.0, 0.7, 0.3, True, True, 1.0 - (0.7 + 0.3), False, 0.7 + 0.3),  # within the epsilon, not exceeded
    (0.0, 0.0, 0.0, True, True, 0.0, False, 0.0),             # a free call on an empty budget
    (0.0, 0.0, 1.0, True, False, 0.0, True, 0.0),
    (5.0, 6.0, 0.5, True, False, -1.0, True, 6.0),            # already overdrawn (observe earlier)
    (1e9, 123.25, 0.125, True, True, 1e9 - (123.25 + 0.125), False, 123.25 + 0.125),
]


@pytest.mark.parametrize(("limit", "spent", "cost", "enforce", "allowed", "remaining", "exceeded", "after"), TABLE)
def test_decide(limit: float, spent: float, cost: float, enforce: bool, allowed: bool, remaining: float,
                exceeded: bool, after: float) -> None:
    assert decide(limit, spent, cost, enforce=enforce) == (Charge(allowed, remaining, exceeded=exceeded), after)


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


@pytest.mark.parametrize(("limit", "spent", "cost", "enforce", "allowed", "remaining", "exceeded", "after"), TABLE)
async def test_the_lua_copy_answers_every_row_alike(
        client: redis.Redis, limit: float, spent: float, cost: float, enforce: bool, allowed: bool,
        remaining: float, exceeded: bool, after: float) -> None:
    prefix = f"satgate-test:{uuid.uuid4().hex}:"
    store = RedisBudgetStore(client, prefix=prefix)
    key = prefix + "budget:b"
    await client.hset(key, mapping={"limit": repr(limit), "spent": repr(spent)})
    try:
        assert await store.charge("b", cost, limit=limit, enforce=enforce) == Charge(allowed, remaining,
                                                                                      exceeded=exceeded)
        assert float(await client.hget(key, "spent") or b"nan") == after
    finally:
        await client.delete(key)


@pytest.mark.parametrize(("limit", "spent", "cost", "enforce", "allowed", "remaining", "exceeded", "after"),
                         [row for row in TABLE if row[3]])
async def test_a_transfer_is_a_charge_that_must_fit_in_lua_too(
        client: redis.Redis, limit: float, spent: float, cost: float, enforce: bool, allowed: bool,
        remaining: float, exceeded: bool, after: float) -> None:
    prefix = f"satgate-test:{uuid.uuid4().hex}:"
    store = RedisBudgetStore(client, prefix=prefix)
    parent = prefix + "budget:parent"
    await client.hset(parent, mapping={"limit": repr(limit), "spent": repr(spent)})
    try:
        moved = await store.transfer("parent", "child", cost, parent_limit=limit)
        assert moved == Charge(allowed, remaining, exceeded=exceeded)
        assert float(await client.hget(parent, "spent") or b"nan") == after
    finally:
        await client.delete(parent, prefix + "budget:child")
