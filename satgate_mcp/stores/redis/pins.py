"""Pinned tool definitions on Redis: every gateway process on it agrees on one pin per upstream tool.

Pins are one hash (field: the JSON of ``[upstream, tool]``, value: the pin's record as JSON). Every write is
a compare-and-set script that also moves a version counter, so two machines that see a tool at once write
one pin (the loser reads the winner's), and processes poll the counter (one GET) for approvals. An
upstream's first pinning (the marker and its tools' pins) is one script too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import redis.asyncio as redis

from satgate_mcp.policy.pins import Change, Pin
from satgate_mcp.stores.redis.client import connect
from satgate_mcp.stores.redis.policy import DEFAULT_PREFIX

#: Tries of one read-modify-write against concurrent writers before it gives up (each loses only to a write).
MAX_TRIES = 20

# KEYS pins hash, version counter; ARGV field, expected record ('' = none yet), new record.
# Returns the new version, or 0 when the pin was not what the caller read.
_SET_LUA = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (current == false and ARGV[2] == '') or current == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return redis.call('INCR', KEYS[2])
end
return 0
"""

# KEYS pins hash, pinned upstreams hash, version counter; ARGV upstream, now, then field/record pairs.
_FIRST_LUA = """
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
for i = 3, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('INCR', KEYS[3])
return 1
"""


def field_of(upstream: str, tool: str) -> str:
    return json.dumps([upstream, tool], separators=(",", ":"))


class RedisPinStore:
    """``PinStore`` on Redis, over the gateway's client (or, for the CLI, one of its own)."""

    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX, owns_client: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._hash, self._upstreams, self._version = f"{prefix}pins", f"{prefix}pins:upstreams", f"{prefix}pins:version"
        self._owns_client = owns_client
        self._clock = clock
        self._set = client.register_script(_SET_LUA)
        self._first = client.register_script(_FIRST_LUA)

    @classmethod
    def from_url(cls, url: str, *, timeout: float) -> RedisPinStore:
        return cls(connect(url, timeout=timeout), owns_client=True)

    async def pins(self) -> list[Pin]:
        records = await self._redis.hvals(self._hash)
        return sorted((Pin.from_json(record) for record in records), key=lambda pin: (pin.upstream, pin.tool))

    async def version(self) -> int:
        value = await self._redis.get(self._version)
        return int(value) if value is not None else 0

    async def first_pinning(self, upstream: str, pins: Sequence[Pin]) -> bool:
        args: list[str] = [upstream, repr(self._clock())]
        for pin in pins:
            args += [field_of(pin.upstream, pin.tool), pin.to_json()]
        return bool(await self._first(keys=[self._hash, self._upstreams, self._version], args=args))

    async def update(self, upstream: str, tool: str, change: Change) -> tuple[Pin | None, Pin | None]:
        field = field_of(upstream, tool)
        for _ in range(MAX_TRIES):
            raw = await self._redis.hget(self._hash, field)
            before = None if raw is None else Pin.from_json(raw)
            after = change(before)
            if after is None:
                return before, before
            expected = "" if raw is None else (raw.decode() if isinstance(raw, bytes) else str(raw))
            if await self._set(keys=[self._hash, self._version], args=[field, expected, after.to_json()]):
                return before, after
        raise TimeoutError(f"pin {upstream}/{tool}: {MAX_TRIES} concurrent writes in a row")

    async def aclose(self) -> None:
        if self._owns_client:
            await self._redis.aclose()
