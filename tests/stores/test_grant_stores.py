"""Users' upstream grants and waiting authorizations in every store: a state is taken unused exactly once (two
handles racing on one folder or one Redis, as two machines would), a late or foreign one is told apart, the
per-owner bound holds, a refresh never writes back over a revoked or newer grant, and revocation forgets one
upstream's grant or all of an owner's."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio as redis

from satgate_mcp.oauth_grants import (
    STATE_TTL_SECONDS,
    GrantStore,
    PendingAuthorization,
    StoredGrant,
    callback_refusal,
    new_grant_id,
    new_state,
)
from satgate_mcp.stores.memory_grants import MemoryGrantStore
from satgate_mcp.stores.redis.grants import RedisGrantStore
from satgate_mcp.stores.sqlite import LocalState
from satgate_mcp.stores.sqlite.grants import SqliteGrantStore
from tests.stores.conftest import REDIS_URL

#: Opens another handle on the same records (another process on the folder, another machine on the Redis).
Opener = Callable[[], Awaitable[GrantStore]]
NOW = time.time()


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    closers: list[Callable[[], Awaitable[None]]] = []
    if request.param == "memory":
        shared = MemoryGrantStore()

        async def open_memory() -> GrantStore:
            return shared

        yield open_memory
    elif request.param == "sqlite":
        async def open_sqlite() -> GrantStore:
            state = LocalState.open(tmp_path)
            closers.append(state.aclose)
            return SqliteGrantStore(state.db)

        yield open_sqlite
    else:
        prefix = f"test-grants-{secrets.token_hex(4)}:"

        async def open_redis() -> GrantStore:
            client = redis.Redis.from_url(REDIS_URL)
            try:
                await client.ping()
            except (OSError, redis.RedisError):
                await client.aclose()
                pytest.skip("no Redis at 127.0.0.1:6379")
            closers.append(client.aclose)
            return RedisGrantStore(client, prefix=prefix)

        yield open_redis
    for close in closers:
        await close()


def pending(owner: str = "alice", upstream: str = "files", now: float = NOW) -> PendingAuthorization:
    return PendingAuthorization(new_state(), owner, upstream, "sealed-verifier", "https://gw.example.com/oauth/cb",
                                now, now + STATE_TTL_SECONDS)


def grant(owner: str = "alice", upstream: str = "files", sealed: str = "v1.sealed") -> StoredGrant:
    return StoredGrant(owner, upstream, new_grant_id(), sealed, NOW, NOW, "repo")


async def test_a_state_is_taken_unused_once_and_then_told_apart_from_an_unknown_one(opener: Opener) -> None:
    store = await opener()
    waiting = pending()
    assert await store.begin(waiting, NOW)
    first = await store.take(waiting.state, NOW + 1)
    assert first == waiting
    assert callback_refusal(first, "files", NOW + 1) is None
    again = await store.take(waiting.state, NOW + 2)
    assert again is not None
    assert again.used
    assert callback_refusal(again, "files", NOW + 2) == "unknown"
    assert await store.take(new_state(), NOW) is None


async def test_two_machines_racing_on_one_state_take_it_unused_once(opener: Opener) -> None:
    one, two = await opener(), await opener()
    waiting = pending()
    assert await one.begin(waiting, NOW)
    found = await asyncio.gather(*[(one if i % 2 else two).take(waiting.state, NOW + 1) for i in range(20)])
    assert sum(1 for f in found if f is not None and not f.used) == 1


async def test_an_expired_state_and_another_upstreams_state_are_refused(opener: Opener) -> None:
    store = await opener()
    late, foreign = pending(), pending(upstream="tickets")
    assert await store.begin(late, NOW)
    assert await store.begin(foreign, NOW)
    assert callback_refusal(await store.take(late.state, NOW + STATE_TTL_SECONDS + 1), "files",
                            NOW + STATE_TTL_SECONDS + 1) == "expired"
    assert callback_refusal(await store.take(foreign.state, NOW + 1), "files", NOW + 1) == "other_upstream"


async def test_an_owner_has_a_bounded_number_of_authorizations_waiting(opener: Opener) -> None:
    store = await opener()
    assert all([await store.begin(pending(), NOW, per_owner=3) for _ in range(3)])
    assert not await store.begin(pending(), NOW, per_owner=3)
    assert await store.begin(pending(owner="bob"), NOW, per_owner=3)  # another owner is not starved
    used = pending()
    assert not await store.begin(used, NOW + 1, per_owner=3)
    later = NOW + STATE_TTL_SECONDS + 1
    assert await store.begin(pending(now=later), later, per_owner=3)  # expired ones no longer count


async def test_a_refresh_writes_back_only_onto_the_grant_it_read(opener: Opener) -> None:
    one, two = await opener(), await opener()
    first = grant()
    await one.put(first)
    refreshed = replace(first, sealed="v1.rotated", refreshed_at=NOW + 5)
    assert await two.update(refreshed)
    assert await one.get("alice", "files") == refreshed
    newer = grant(sealed="v1.newer")
    await one.put(newer)
    assert not await two.update(replace(first, sealed="v1.stale"))  # replaced meanwhile: not resurrected
    assert not await two.drop("alice", "files", first.grant_id)
    assert await one.get("alice", "files") == newer
    assert await one.revoke("alice", "files") == 1
    assert not await two.update(replace(newer, sealed="v1.after-revoke"))  # revoked meanwhile: stays revoked
    assert await one.get("alice", "files") is None


async def test_revocation_forgets_one_upstream_or_every_grant_of_an_owner_and_nobody_elses(opener: Opener) -> None:
    store = await opener()
    for owner, upstream in (("alice", "files"), ("alice", "tickets"), ("bob", "files"), ("a:l/i ce", "files")):
        await store.put(grant(owner, upstream))
    assert [(g.owner, g.upstream) for g in await store.listing()] == [
        ("a:l/i ce", "files"), ("alice", "files"), ("alice", "tickets"), ("bob", "files")]
    assert [g.upstream for g in await store.listing("alice")] == ["files", "tickets"]
    assert await store.revoke("alice", "tickets") == 1
    assert await store.revoke("alice") == 1
    assert await store.revoke("alice") == 0
    assert [(g.owner, g.upstream) for g in await store.listing()] == [("a:l/i ce", "files"), ("bob", "files")]
    assert (await store.get("bob", "files")) is not None


async def test_a_grant_survives_a_reopened_handle(opener: Opener) -> None:
    kept = grant()
    await (await opener()).put(kept)
    assert await (await opener()).get("alice", "files") == kept
