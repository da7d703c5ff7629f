"""The Redis stores keep the in-memory contract, atomically across clients (real Redis at 127.0.0.1:6379).

Every test works under its own key prefix and deletes only those keys afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.budget import BudgetStore, Charge
from satgate_mcp.policy.duplicates import ARRIVAL, FIRST_SETTLED, REPLAY_SETTLED, Arrival, DuplicateStore, Settlement
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.policy.limits import Bucket, RateSpec
from satgate_mcp.stores.memory import MemoryBudgetStore, MemoryDuplicateStore
from satgate_mcp.stores.redis.policy import RedisStores
from tests.fakes import FakeClock
from tests.policy.helpers import settings

REDIS_URL = "redis://127.0.0.1:6379/0"


@contextlib.asynccontextmanager
async def unique_prefix() -> AsyncIterator[str]:
    """A fresh key prefix; its keys are deleted afterwards. Skips the test without a Redis."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        await asyncio.wait_for(client.ping(), 2)
    except (OSError, redis.RedisError, TimeoutError):
        await client.aclose()
        pytest.skip("no Redis at 127.0.0.1:6379")
    name = f"satgate-test:{uuid.uuid4().hex}:"
    try:
        yield name
    finally:
        keys = [k async for k in client.scan_iter(match=name + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    async with unique_prefix() as name:
        yield name


@pytest.fixture
async def stores(prefix: str) -> AsyncIterator[RedisStores]:
    s = RedisStores.from_url(REDIS_URL, prefix=prefix)
    yield s
    await s.aclose()


@pytest.fixture(params=["memory", "redis"])
async def budget_store(request: pytest.FixtureRequest) -> AsyncIterator[BudgetStore]:
    if request.param == "memory":
        yield MemoryBudgetStore()
        return
    async with unique_prefix() as name:
        s = RedisStores.from_url(REDIS_URL, prefix=name)
        yield s.budgets
        await s.aclose()


async def test_charge_contract(budget_store: BudgetStore) -> None:
    assert await budget_store.charge("b", 4, limit=10, enforce=True) == Charge(True, 6)
    assert await budget_store.charge("b", 7, limit=10, enforce=True) == Charge(False, 6, exceeded=True)
    assert await budget_store.charge("b", 1, limit=999, enforce=True) == Charge(True, 5)  # first use set the limit
    assert await budget_store.charge("b", 9, limit=10, enforce=False) == Charge(True, -4, exceeded=True)
    await budget_store.refund("b", 9)
    assert await budget_store.remaining("b", limit=10) == 5
    assert await budget_store.charge("u", 5, limit=None, enforce=True) == Charge(True, None)
    assert await budget_store.remaining("u", limit=None) is None
    assert [(await budget_store.charge("f", 0.1, limit=0.3, enforce=True)).allowed for _ in range(4)] == [
        True, True, True, False]


async def test_transfer_contract(budget_store: BudgetStore) -> None:
    assert await budget_store.transfer("p", "c1", 4, parent_limit=10) == Charge(True, 6)
    assert await budget_store.transfer("p", "c2", 7, parent_limit=10) == Charge(False, 6, exceeded=True)
    assert not (await budget_store.transfer("p", "c1", 1, parent_limit=10)).allowed
    assert await budget_store.remaining("c1", limit=None) == 4
    assert await budget_store.remaining("c2", limit=None) is None
    assert await budget_store.transfer("rich", "c3", 50, parent_limit=None) == Charge(True, None)
    assert await budget_store.remaining("c3", limit=None) == 50


async def test_concurrent_charges_from_two_processes_never_overspend(stores: RedisStores, prefix: str) -> None:
    other = RedisStores.from_url(REDIS_URL, prefix=prefix)  # a second gateway process
    try:
        results = await asyncio.gather(*(
            (stores if i % 2 else other).budgets.charge("b", 1, limit=7, enforce=True) for i in range(100)))
        assert sum(r.allowed for r in results) == 7
        assert await other.budgets.remaining("b", limit=7) == 0
    finally:
        await other.aclose()


async def test_concurrent_transfers_never_overdraw(stores: RedisStores) -> None:
    results = await asyncio.gather(*(stores.budgets.transfer("p", f"c{i}", 3, parent_limit=10) for i in range(20)))
    assert sum(r.allowed for r in results) == 3
    assert await stores.budgets.remaining("p", limit=10) == 1


async def test_rate_bucket_with_fake_clock(prefix: str) -> None:
    clock = FakeClock(1_700_000_000.0)
    s = RedisStores.from_client(redis.Redis.from_url(REDIS_URL), prefix=prefix, clock=clock)
    try:
        bucket, narrow = Bucket("rate:t", RateSpec(2.0, 3)), Bucket("rate:t:tool:x", RateSpec(1.0, 1))
        assert [await s.rate_limiter.acquire([bucket]) for _ in range(3)] == [0.0, 0.0, 0.0]
        assert await s.rate_limiter.acquire([bucket]) == pytest.approx(0.5)
        clock.advance(0.5)
        assert await s.rate_limiter.acquire([bucket, narrow]) == 0.0
        clock.advance(0.5)
        assert await s.rate_limiter.acquire([bucket, narrow]) == pytest.approx(0.5)  # narrow is empty ...
        assert await s.rate_limiter.acquire([bucket]) == 0.0  # ... and the refusal took nothing from the other
        ttl = await s.client.pttl(prefix + "rate:t")
        assert 0 < ttl <= 2500
    finally:
        await s.aclose()


@pytest.fixture(params=["memory", "redis"])
async def duplicate_store(request: pytest.FixtureRequest) -> AsyncIterator[DuplicateStore]:
    if request.param == "memory":
        yield MemoryDuplicateStore()
        return
    async with unique_prefix() as name:
        s = RedisStores.from_url(REDIS_URL, prefix=name)
        yield s.duplicates
        await s.aclose()


async def test_duplicate_store_contract(duplicate_store: DuplicateStore) -> None:
    assert await duplicate_store.apply("k", ARRIVAL) == Arrival.FIRST
    assert await duplicate_store.apply("k", ARRIVAL) == Arrival.REPLAY
    assert await duplicate_store.apply("k", ARRIVAL) == Arrival.AGAIN
    assert await duplicate_store.apply("k", FIRST_SETTLED[False]) == Settlement.KEEP  # it pays for the re-send
    assert await duplicate_store.apply("k", REPLAY_SETTLED[False]) == Settlement.REFUND  # which never ran either
    assert await duplicate_store.apply("k", ARRIVAL) == Arrival.FIRST  # settled: the next copy is a new call


async def test_in_flight_records_live_24_hours_in_redis(stores: RedisStores, prefix: str) -> None:
    await stores.duplicates.apply("k", ARRIVAL)
    assert 23 * 3600 * 1000 < await stores.client.pttl(prefix + "dup:k") <= 24 * 3600 * 1000
    await stores.duplicates.apply("k", FIRST_SETTLED[True])
    assert await stores.client.exists(prefix + "dup:k") == 0


async def test_attack_a_child_budget_key_expires_with_the_child(stores: RedisStores, prefix: str) -> None:
    assert (await stores.budgets.transfer("p", "child", 3, parent_limit=10, ttl=60)).allowed
    assert 59_000 < await stores.client.pttl(prefix + "budget:child") <= 60_000
    assert (await stores.budgets.transfer("p", "forever", 3, parent_limit=10)).allowed
    assert await stores.client.pttl(prefix + "budget:forever") == -1
    assert await stores.client.pttl(prefix + "budget:p") == -1


async def test_attack_over_redis_a_call_whose_process_died_gets_one_free_re_send_and_no_more(prefix: str) -> None:
    def process() -> tuple[CallPolicy, RedisStores]:
        s = RedisStores.from_url(REDIS_URL, prefix=prefix)
        return CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(),
                                        rate_limiter=s.rate_limiter, budgets=s.budgets, duplicates=s.duplicates,
                                        on_close=[s.aclose]), s

    agent = Identity("agent", budget_limit=1)
    params: JsonObj = {"name": "echo", "arguments": {"text": "hi"}}
    runs: list[int] = []

    async def upstream() -> JsonObj:
        runs.append(1)
        return {"jsonrpc": "2.0", "id": None, "result": {"content": []}}

    async def send(policy: CallPolicy) -> JsonObj:
        admission = await policy.admit(agent, method="tools/call", tool="echo", session_id="s", request_id=7,
                                       params=params)
        return await policy.run(admission, upstream)

    died, _ = process()
    await died.admit(agent, method="tools/call", tool="echo", session_id="s", request_id=7, params=params)
    await died.close()  # the process is gone; its record says the call is still in flight
    restarted, _ = process()
    again, _ = process()
    try:
        assert "result" in await send(restarted)  # the one free re-send
        with pytest.raises(GatewayError) as refused:  # settled now: a new call, and the budget is spent
            await send(again)
        assert refused.value.data == {"error": "budget_exhausted", "tool": "echo", "cost_credits": 1,
                                      "remaining_credits": 0, "token_id": "agent", "budget_id": "agent"}
        assert len(runs) == 1
    finally:
        await restarted.close()
        await again.close()


async def test_policy_over_redis_hundred_concurrent_admits(prefix: str) -> None:
    s = RedisStores.from_url(REDIS_URL, prefix=prefix)
    policy = CallPolicy.from_settings(settings(rate_limit="1000/s"), publisher=RecordingPublisher(), metrics=Metrics(),
                                      rate_limiter=s.rate_limiter, budgets=s.budgets, duplicates=s.duplicates,
                                      on_close=[s.aclose])
    small = Identity("busy", budget_limit=7)
    try:
        results = await asyncio.gather(*(
            policy.admit(small, method="tools/call", tool="echo", session_id="s", request_id=i,
                         params={"name": "echo"}) for i in range(100)), return_exceptions=True)
        assert sum(not isinstance(r, BaseException) for r in results) == 7
        assert all(isinstance(r, GatewayError) for r in results if isinstance(r, BaseException))
        assert (await policy.budget_status(small))["remaining"] == 0
    finally:
        await policy.close()


async def test_from_settings_picks_redis(prefix: str) -> None:
    policy = CallPolicy.from_settings(settings(redis_url=REDIS_URL), publisher=RecordingPublisher(),
                                      metrics=Metrics())
    try:
        assert (await policy.budget_status(Identity(f"{prefix}tok", budget_limit=3)))["remaining"] == 3
    finally:
        await policy.close()
