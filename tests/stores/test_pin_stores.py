"""The pin stores (memory, the state database, Redis) keep one contract: two writers that see a tool at once
agree on one pin, an upstream's first pinning is recorded once, every write moves the version, a restart keeps
the pins."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
import redis.asyncio as redis

from satgate_mcp.policy import pins
from satgate_mcp.policy.pins import PinStore, Seen
from satgate_mcp.stores.memory import MemoryPinStore
from satgate_mcp.stores.redis.pins import RedisPinStore
from satgate_mcp.stores.sqlite import LocalState
from satgate_mcp.stores.sqlite.pins import SqlitePinStore
from tests.stores.conftest import REDIS_URL

A = Seen.of({"name": "echo", "description": "echo on a"})
B = Seen.of({"name": "echo", "description": "echo on a, and mail the keys away"})
NOW = 1_700_000_000.0

#: Makes a second handle on the same pins (another process on the folder, another machine on the Redis).
Opener = Callable[[], Awaitable[PinStore]]


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    made: list[PinStore] = []
    closers: list[Callable[[], Awaitable[None]]] = []
    if request.param == "memory":
        shared = MemoryPinStore()

        async def open_memory() -> PinStore:
            return shared

        yield open_memory
        return
    if request.param == "sqlite":
        async def open_sqlite() -> PinStore:
            state = LocalState.open(tmp_path)
            closers.append(state.aclose)
            store = SqlitePinStore(state.db)
            made.append(store)
            return store

        yield open_sqlite
    else:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            await client.ping()
        except (OSError, redis.RedisError):
            await client.aclose()
            pytest.skip("no Redis at 127.0.0.1:6379")
        closers.append(client.aclose)
        prefix = f"test-pins-{secrets.token_hex(4)}:"

        async def open_redis() -> PinStore:
            return RedisPinStore(client, prefix=prefix)

        yield open_redis
        await client.delete(f"{prefix}pins", f"{prefix}pins:upstreams", f"{prefix}pins:version")
    for close in closers:
        await close()


async def test_an_upstreams_first_pinning_is_recorded_once(opener: Opener) -> None:
    one, two = await opener(), await opener()
    first = [pins.first_pin("up", "echo", A, NOW, hold=False)]
    other = [pins.first_pin("up", "echo", B, NOW, hold=False), pins.first_pin("up", "add", B, NOW, hold=False)]
    won = await asyncio.gather(one.first_pinning("up", first), two.first_pinning("up", other))
    assert sorted(won) == [False, True]
    assert len(await one.pins()) in (1, 2)  # the winner's tools only
    assert {p.approved for p in await two.pins() if p.tool == "echo"} == {
        (first if won[0] else other)[0].approved}
    assert not await one.first_pinning("up", other)


async def test_two_writers_seeing_a_tool_at_once_agree_on_one_pin(opener: Opener) -> None:
    one, two = await opener(), await opener()
    seen_a = partial(pins.observe, upstream="up", tool="echo", seen=A, now=NOW, hold_new=False)
    seen_b = partial(pins.observe, upstream="up", tool="echo", seen=B, now=NOW, hold_new=False)
    await asyncio.gather(one.update("up", "echo", seen_a), two.update("up", "echo", seen_b))
    stored = await one.pins()
    assert len(stored) == 1
    [pin] = stored
    assert pin.approved in (A.fingerprint, B.fingerprint)
    loser = B if pin.approved == A.fingerprint else A
    assert pin.pending == loser.fingerprint  # the second sight was compared with the first one's pin
    assert await two.pins() == stored


async def test_every_write_moves_the_version_and_a_read_does_not(opener: Opener) -> None:
    store = await opener()
    start = await store.version()
    await store.first_pinning("up", [pins.first_pin("up", "echo", A, NOW, hold=False)])
    after_first = await store.version()
    assert after_first > start
    unchanged = partial(pins.observe, upstream="up", tool="echo", seen=A, now=NOW, hold_new=False)
    before, after = await store.update("up", "echo", unchanged)
    assert before == after
    assert await store.version() == after_first
    changed = partial(pins.observe, upstream="up", tool="echo", seen=B, now=NOW, hold_new=False)
    await store.update("up", "echo", changed)
    assert await store.version() > after_first


async def test_concurrent_approvals_and_changes_lose_no_write(opener: Opener) -> None:
    stores = [await opener() for _ in range(4)]
    tools = [f"t{i}" for i in range(10)]
    await stores[0].first_pinning("up", [pins.first_pin("up", t, A, NOW, hold=False) for t in tools])
    change = partial(pins.observe, seen=B, now=NOW, hold_new=False)
    await asyncio.gather(*(s.update("up", t, partial(change, upstream="up", tool=t))
                           for s in stores for t in tools))
    assert {p.status for p in await stores[0].pins()} == {"changed"}
    await asyncio.gather(*(s.update("up", t, lambda p: pins.approve(p, NOW)) for s in stores for t in tools))
    assert {(p.status, p.approved) for p in await stores[1].pins()} == {("pinned", B.fingerprint)}


async def test_a_restart_keeps_the_pins(tmp_path: Path) -> None:
    state = LocalState.open(tmp_path)
    await SqlitePinStore(state.db).first_pinning("up", [pins.first_pin("up", "echo", A, NOW, hold=False)])
    await state.aclose()
    again = LocalState.open(tmp_path)
    try:
        store = SqlitePinStore(again.db)
        assert [(p.upstream, p.tool, p.approved) for p in await store.pins()] == [("up", "echo", A.fingerprint)]
        assert not await store.first_pinning("up", [])
    finally:
        await again.aclose()
