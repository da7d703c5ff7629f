"""Every Redis client keeps at most SATGATE_REDIS_MAX_CONNECTIONS connections: past that a command waits for a
free one within the timeout, then fails as a store fault, instead of opening connections without bound
(the real Redis at 127.0.0.1:6379)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as redis

from satgate_mcp.settings import Settings
from satgate_mcp.stores import open_stores
from satgate_mcp.stores.errors import STORE_ERRORS
from satgate_mcp.stores.redis.client import connect
from satgate_mcp.stores.redis.policy import RedisBudgetStore

REDIS_URL = "redis://127.0.0.1:6379/0"
TIMEOUT = 0.3


@pytest.fixture(autouse=True)
def needs_redis(redis_client: redis.Redis) -> None:
    """Skipped where no Redis listens."""


async def test_many_commands_at_once_share_the_capped_connections() -> None:
    client = connect(REDIS_URL, timeout=2.0, max_connections=2)
    try:
        assert await asyncio.gather(*(client.ping() for _ in range(40))) == [True] * 40
    finally:
        await client.aclose()


async def test_attack_with_every_connection_busy_a_command_fails_within_the_timeout_instead_of_opening_more() -> None:
    client = connect(REDIS_URL, timeout=TIMEOUT, max_connections=2)
    pool = client.connection_pool
    held = [await pool.get_connection(), await pool.get_connection()]  # type: ignore[no-untyped-call]
    try:
        started = time.monotonic()
        with pytest.raises(STORE_ERRORS):
            await client.ping()
        assert time.monotonic() - started < TIMEOUT * 4
    finally:
        for connection in held:
            await pool.release(connection)
    assert await client.ping()  # a freed connection serves the next command
    await client.aclose()


async def test_the_setting_reaches_the_stores_clients() -> None:
    stores = open_stores(Settings(redis_url=REDIS_URL, redis_max_connections=7))
    try:
        budgets = stores.budgets
        assert isinstance(budgets, RedisBudgetStore)
        assert budgets.client.connection_pool.max_connections == 7
    finally:
        await stores.aclose()
