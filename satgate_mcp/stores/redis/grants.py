"""Users' upstream grants and waiting authorizations on Redis: every gateway on it can finish what another began.

An authorization is one key per state (its JSON, kept until its grace ends), and its owner's waiting states a
sorted set (score: their expiry), so the per-owner bound is one ``ZCOUNT``. An owner's grants are one hash
(field: the upstream), so revoking them all is one ``DEL``. Owners are hashed into key names: a token id may
hold any character. Read-modify-writes run under ``WATCH`` and write in one ``MULTI``, so two callbacks with one
state cannot both take it unused, and a refresh never writes back over a revoked or newer grant.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as redis
from redis.asyncio.client import Pipeline

from satgate_mcp.oauth_grants import (
    PENDING_PER_OWNER,
    PendingAuthorization,
    StoredGrant,
    kept_until,
    ordered,
    taken,
)
from satgate_mcp.stores.redis.client import connect, watched
from satgate_mcp.stores.redis.policy import DEFAULT_PREFIX

T = TypeVar("T")


def _ms_until(when: float, now: float) -> int:
    return max(1, int((when - now) * 1000))


def _owner_tag(owner: str) -> str:
    return hashlib.sha256(owner.encode("utf-8")).hexdigest()[:32]


class RedisGrantStore:
    """``GrantStore`` on Redis, over the gateway's client (or the CLI's)."""

    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX, owns_client: bool = False) -> None:
        self._redis = client
        self._owns_client = owns_client
        self._prefix = prefix

    @classmethod
    def from_url(cls, url: str, *, timeout: float) -> RedisGrantStore:
        return cls(connect(url, timeout=timeout), owns_client=True)

    def _state_key(self, state: str) -> str:
        return f"{self._prefix}authorization:{state}"

    def _waiting_key(self, owner: str) -> str:
        return f"{self._prefix}authorizations-of:{_owner_tag(owner)}"

    def _grants_key(self, owner: str) -> str:
        return f"{self._prefix}grants:{_owner_tag(owner)}"

    async def _watched(self, body: Callable[[Pipeline], Awaitable[T]]) -> T:
        return await watched(self._redis, body, "grant store")

    async def begin(self, pending: PendingAuthorization, now: float, per_owner: int = PENDING_PER_OWNER) -> bool:
        waiting = self._waiting_key(pending.owner)

        async def body(pipe: Pipeline) -> bool:
            await pipe.watch(waiting)
            if int(await pipe.zcount(waiting, f"({now}", "+inf")) >= per_owner:
                await pipe.unwatch()  # type: ignore[no-untyped-call]
                return False
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.zremrangebyscore(waiting, "-inf", now)
            pipe.set(self._state_key(pending.state), pending.to_json(), px=_ms_until(kept_until(pending), now))
            pipe.zadd(waiting, {pending.state: pending.expires_at})
            pipe.pexpire(waiting, _ms_until(pending.expires_at, now))
            await pipe.execute()
            return True

        return await self._watched(body)

    async def take(self, state: str, now: float) -> PendingAuthorization | None:
        key = self._state_key(state)

        async def body(pipe: Pipeline) -> PendingAuthorization | None:
            await pipe.watch(key)
            text = await pipe.get(key)
            found, keep = taken(None if text is None else PendingAuthorization.from_json(text), now)
            if keep is None:
                await pipe.unwatch()  # type: ignore[no-untyped-call]
                return found
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.set(key, keep.to_json(), px=_ms_until(kept_until(keep), now))
            pipe.zrem(self._waiting_key(keep.owner), keep.state)
            await pipe.execute()
            return found

        return await self._watched(body)

    async def put(self, grant: StoredGrant) -> None:
        await self._redis.hset(self._grants_key(grant.owner), grant.upstream, grant.to_json())

    async def _swap(self, owner: str, upstream: str, grant_id: str, replacement: StoredGrant | None) -> bool:
        """Replace (or with None, delete) the owner's grant for ``upstream`` only while it is ``grant_id``."""
        key = self._grants_key(owner)

        async def body(pipe: Pipeline) -> bool:
            await pipe.watch(key)
            text = await pipe.hget(key, upstream)
            if text is None or StoredGrant.from_json(text).grant_id != grant_id:
                await pipe.unwatch()  # type: ignore[no-untyped-call]
                return False
            pipe.multi()  # type: ignore[no-untyped-call]
            if replacement is None:
                pipe.hdel(key, upstream)
            else:
                pipe.hset(key, upstream, replacement.to_json())
            await pipe.execute()
            return True

        return await self._watched(body)

    async def update(self, grant: StoredGrant) -> bool:
        return await self._swap(grant.owner, grant.upstream, grant.grant_id, grant)

    async def get(self, owner: str, upstream: str) -> StoredGrant | None:
        text = await self._redis.hget(self._grants_key(owner), upstream)
        return None if text is None else StoredGrant.from_json(text)

    async def drop(self, owner: str, upstream: str, grant_id: str) -> bool:
        return await self._swap(owner, upstream, grant_id, None)

    async def revoke(self, owner: str, upstream: str | None = None) -> int:
        key = self._grants_key(owner)
        if upstream is not None:
            return int(await self._redis.hdel(key, upstream))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hlen(key)
            pipe.delete(key)
            count, _ = await pipe.execute()
        return int(count)

    async def listing(self, owner: str | None = None) -> list[StoredGrant]:
        keys = [self._grants_key(owner)] if owner is not None else \
            [k async for k in self._redis.scan_iter(match=f"{self._prefix}grants:*", count=500)]
        found: list[StoredGrant] = []
        for key in keys:
            values = await self._redis.hgetall(key)
            found += [StoredGrant.from_json(text) for text in values.values()]
        return ordered(found)

    async def close(self) -> None:
        if self._owns_client:
            await self._redis.aclose()
