"""Spend-limit sums in every store: a reservation is all or none, exact under 100 concurrent calls (two handles
on one folder or one Redis, as two processes or machines would hold), a duplicate is not charged twice, a
release gives back once, and a sum survives a reopened database."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest

from satgate_mcp.policy.spend import Charge, Reservation, SpendStore
from satgate_mcp.stores.memory_spend import MemorySpendStore
from satgate_mcp.stores.redis.spend import RedisSpendStore
from satgate_mcp.stores.sqlite import LocalState
from satgate_mcp.stores.sqlite.spend import SqliteSpendStore
from tests.stores.conftest import handles

MICROS = 10**6
#: Opens another handle on the same sums (another process on the folder, another machine on the Redis).
Opener = Callable[[], Awaitable[SpendStore]]


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    async with handles(request.param, tmp_path, memory=MemorySpendStore, sqlite=SqliteSpendStore,
                       on_redis=lambda client, prefix: RedisSpendStore(client, prefix=prefix)) as open_handle:
        yield cast(Opener, open_handle)  # each backend makes the one store type


def charge(counter: str, amount: str, limit: str, now: float) -> Charge:
    return Charge(counter, int(float(amount) * MICROS), int(float(limit) * MICROS), now + 3600)


def sum_name() -> str:
    return "sum-" + secrets.token_hex(6)


async def test_a_hundred_concurrent_calls_of_ten_against_two_hundred_reserve_exactly_twenty(opener: Opener) -> None:
    a, b = await opener(), await opener()
    now, counter = time.time(), sum_name()
    answers = await asyncio.gather(*((a if i % 2 else b).reserve(f"call-{i}", [charge(counter, "10", "200", now)],
                                                                 now) for i in range(100)))
    assert sum(1 for r in answers if r == Reservation()) == 20
    assert all(r.exceeded == 0 for r in answers if r != Reservation())
    assert await a.total(counter) == 200 * MICROS


async def test_all_or_none_and_what_is_left(opener: Opener) -> None:
    store = await opener()
    now, day, week = time.time(), sum_name(), sum_name()
    assert await store.reserve("k1", [charge(day, "150", "200", now), charge(week, "150", "1000", now)], now) \
        == Reservation()
    # The week has room, the day does not: neither sum moves.
    over = await store.reserve("k2", [charge(week, "60", "1000", now), charge(day, "60", "200", now)], now)
    assert (over.exceeded, over.total) == (1, 150 * MICROS)
    assert (await store.total(day), await store.total(week)) == (150 * MICROS, 150 * MICROS)
    assert await store.reserve("k3", [charge(day, "50", "200", now)], now) == Reservation()  # exactly to the limit
    assert (await store.reserve("k4", [charge(day, "0.000001", "200", now)], now)).exceeded == 0


async def test_a_duplicate_is_not_charged_and_a_release_gives_back_once(opener: Opener) -> None:
    a, b = await opener(), await opener()
    now, counter = time.time(), sum_name()
    charges = [charge(counter, "10.5", "200", now)]
    assert await a.reserve("same-call", charges, now) == Reservation()
    assert await b.reserve("same-call", charges, now) == Reservation(duplicate=True)
    assert await a.total(counter) == 10_500_000
    await asyncio.gather(a.release("same-call", charges), b.release("same-call", charges))
    assert await a.total(counter) == 0
    await a.release("same-call", charges)
    assert await a.total(counter) == 0
    # Settled (it ran): kept, and a later copy is a new call.
    assert await a.reserve("ran", charges, now) == Reservation()
    await a.settle("ran")
    assert await b.reserve("ran", charges, now) == Reservation()
    assert await a.total(counter) == 21 * MICROS


async def test_sqlite_sums_and_holds_survive_a_reopened_database(tmp_path: Path) -> None:
    now, counter = time.time(), sum_name()
    first = LocalState.open(tmp_path)
    assert await SqliteSpendStore(first.db).reserve("held", [charge(counter, "10", "20", now)], now) == Reservation()
    await first.aclose()
    again = LocalState.open(tmp_path)
    store = SqliteSpendStore(again.db)
    try:
        assert await store.total(counter) == 10 * MICROS
        assert await store.reserve("held", [charge(counter, "10", "20", now)], now) == Reservation(duplicate=True)
        assert (await store.reserve("other", [charge(counter, "11", "20", now)], now)).exceeded == 0
    finally:
        await again.aclose()
