"""Held calls on Redis: every gateway on it sees one record per held call, and one decision.

A record is one key (its JSON, kept until its grace past expiry ends); a fingerprint key names the record the
identical call is bound to; a sorted set per delegation family holds its pending ids (score: their expiry), so
the queue bound is one ``ZCOUNT``; a sorted set of every id (score: when its record goes) is the listing, trimmed
of the gone ones at each new hold, so it never outgrows the records. Each operation
reads under ``WATCH`` and writes in one ``MULTI``: a concurrent write to what it read makes it read again, so
two machines consuming one approval, or two operators deciding one, cannot both win.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as redis
from redis.asyncio.client import Pipeline

from satgate_mcp.policy.approvals import (
    Decision,
    HeldCall,
    HoldOutcome,
    consumption,
    decision,
    kept_until,
    newest_first,
    repeat,
)
from satgate_mcp.stores.redis.client import connect, watched
from satgate_mcp.stores.redis.policy import DEFAULT_PREFIX

T = TypeVar("T")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms_until(when: float, now: float) -> int:
    return max(1, int((when - now) * 1000))


class RedisApprovalStore:
    """``ApprovalStore`` on Redis, over the gateway's client (or the CLI's)."""

    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX, owns_client: bool = False) -> None:
        self._redis = client
        self._owns_client = owns_client
        self._prefix = prefix + "approval"

    @classmethod
    def from_url(cls, url: str, *, timeout: float) -> RedisApprovalStore:
        return cls(connect(url, timeout=timeout), owns_client=True)

    def _record_key(self, approval_id: str) -> str:
        return f"{self._prefix}:{approval_id}"

    def _bound_key(self, fingerprint: str) -> str:
        return f"{self._prefix}-fp:{fingerprint}"

    def _family_key(self, family: str) -> str:
        return f"{self._prefix}-family:{family}"

    @property
    def _all_key(self) -> str:
        return f"{self._prefix}s"

    async def _watched(self, body: Callable[[Pipeline], Awaitable[T]]) -> T:
        return await watched(self._redis, body, "approval store")

    async def _read(self, pipe: Pipeline | redis.Redis, approval_id: Any) -> HeldCall | None:
        if approval_id is None:
            return None
        text = await pipe.get(self._record_key(_text(approval_id)))
        return None if text is None else HeldCall.from_json(text)

    def _write(self, pipe: Pipeline, record: HeldCall, now: float) -> None:
        pipe.set(self._record_key(record.id), record.to_json(), px=_ms_until(kept_until(record), now))
        family = self._family_key(record.family_id)
        if record.state == "pending":
            pipe.zadd(family, {record.id: record.expires_at})
            pipe.pexpire(family, _ms_until(record.expires_at, now))
        else:
            pipe.zrem(family, record.id)

    async def hold(self, request: HeldCall, now: float, per_family: int) -> HoldOutcome:
        bound_key, family = self._bound_key(request.fingerprint), self._family_key(request.family_id)

        async def body(pipe: Pipeline) -> HoldOutcome:
            await pipe.watch(bound_key, family)
            bound_id = await pipe.get(bound_key)
            if bound_id is not None:
                await pipe.watch(self._record_key(_text(bound_id)))
            current = await self._read(pipe, bound_id)
            pending = int(await pipe.zcount(family, now, "+inf"))
            outcome, keep = repeat(current, request, now, pending, per_family)
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.zremrangebyscore(family, "-inf", now)
            pipe.zremrangebyscore(self._all_key, "-inf", now)  # ids whose records have gone
            if current is not None and keep is None:
                self._write(pipe, outcome.record if outcome.found == "approved" and outcome.record else current, now)
                pipe.delete(bound_key)
            if keep is not None:
                self._write(pipe, keep, now)
                pipe.set(bound_key, keep.id, px=_ms_until(kept_until(keep), now))
                pipe.zadd(self._all_key, {keep.id: kept_until(keep)})
            await pipe.execute()
            return outcome

        return await self._watched(body)

    async def get(self, approval_id: str) -> HeldCall | None:
        return await self._read(self._redis, approval_id)

    async def consume(self, approval_id: str, now: float) -> HeldCall | None:
        async def body(pipe: Pipeline) -> HeldCall | None:
            await pipe.watch(self._record_key(approval_id))
            consumed = consumption(await self._read(pipe, approval_id), now)
            if consumed is None:
                await pipe.unwatch()  # type: ignore[no-untyped-call]
                return None
            bound_key = self._bound_key(consumed.fingerprint)
            await pipe.watch(bound_key)
            bound_id = await pipe.get(bound_key)
            pipe.multi()  # type: ignore[no-untyped-call]
            self._write(pipe, consumed, now)
            if bound_id is not None and _text(bound_id) == approval_id:
                pipe.delete(bound_key)
            await pipe.execute()
            return consumed

        return await self._watched(body)

    async def decide(self, approval_id: str, approve: bool, by: str, note: str | None, now: float) -> Decision:
        async def body(pipe: Pipeline) -> Decision:
            await pipe.watch(self._record_key(approval_id))
            result, store = decision(await self._read(pipe, approval_id), approve, by, note, now)
            if store is None:
                await pipe.unwatch()  # type: ignore[no-untyped-call]
                return result
            pipe.multi()  # type: ignore[no-untyped-call]
            self._write(pipe, store, now)
            await pipe.execute()
            return result

        return await self._watched(body)

    async def listing(self, now: float, limit: int = 200) -> list[HeldCall]:
        ids = [_text(i) for i in await self._redis.zrevrange(self._all_key, 0, max(0, limit * 2 - 1))]
        texts = await self._redis.mget([self._record_key(i) for i in ids]) if ids else []
        gone = [i for i, text in zip(ids, texts, strict=True) if text is None]
        if gone:
            await self._redis.zrem(self._all_key, *gone)
        return newest_first([HeldCall.from_json(t) for t in texts if t is not None], limit)

    async def close(self) -> None:
        if self._owns_client:
            await self._redis.aclose()
