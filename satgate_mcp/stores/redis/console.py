"""The console's cluster board on Redis: each gateway process's latest figures under a key that expires.

One key per process (``SET ... EX``), refreshed every few seconds by its sampler: a process that stops
leaves the list when its key expires. Reading is one SCAN over the board's keys and one MGET, bounded.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as redis

from satgate_mcp.stores.redis.policy import DEFAULT_PREFIX

#: The overview lists at most this many processes.
MAX_PROCESSES = 256


class RedisBoard:
    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._prefix = f"{prefix}console:process:"

    async def publish(self, process: str, figures: dict[str, Any], ttl: float) -> None:
        await self._client.set(self._prefix + process, json.dumps(figures), px=max(1, int(ttl * 1000)))

    async def read(self) -> list[dict[str, Any]]:
        keys: list[Any] = []
        async for key in self._client.scan_iter(match=self._prefix + "*", count=100):
            keys.append(key)
            if len(keys) >= MAX_PROCESSES:
                break
        if not keys:
            return []
        found = []
        for raw in await self._client.mget(keys):
            try:
                figures = json.loads(raw) if raw is not None else None
            except ValueError:
                continue
            if isinstance(figures, dict):
                found.append(figures)
        return found
