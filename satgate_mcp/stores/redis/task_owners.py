"""Task owners on Redis: every gateway machine on it knows whose task is whose.

One key per task (its upstream and id, as JSON, under the prefix), holding ``[token id, session id]`` and
expiring with the task; a listing reads them in one ``MGET``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import redis.asyncio as redis

from satgate_mcp.stores.redis.policy import DEFAULT_PREFIX
from satgate_mcp.task_ids import TaskRef
from satgate_mcp.task_owners import Owner


class RedisTaskOwners:
    """``TaskOwnerStore`` on Redis, over the gateway's client."""

    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._redis = client
        self._prefix = f"{prefix}task-owner:"

    def _key(self, ref: TaskRef) -> str:
        return self._prefix + json.dumps([ref.upstream, ref.task_id], separators=(",", ":"))

    async def note(self, ref: TaskRef, owner: Owner, ttl: float) -> None:
        await self._redis.set(self._key(ref), json.dumps(list(owner)), px=max(1, int(ttl * 1000)))

    async def owners(self, refs: Sequence[TaskRef]) -> dict[TaskRef, Owner]:
        if not refs:
            return {}
        found: dict[TaskRef, Owner] = {}
        for ref, raw in zip(refs, await self._redis.mget([self._key(ref) for ref in refs]), strict=True):
            value = _owner(raw)
            if value is not None:
                found[ref] = value
        return found


def _owner(raw: bytes | str | None) -> Owner | None:
    """A stored owner, or None for a missing or garbled record (it names nobody)."""
    try:
        value = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0], value[1]
    return None
