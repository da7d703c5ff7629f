"""DELETE made final on every machine: session tombstones in Redis, and live copies ended by pub/sub.

Per-process tombstones (``sessions``) make a DELETE final on the process that saw it. With Redis,
a DELETE also writes ``<prefix><session id>`` (TTL = the idle TTL) before its 200 goes out, and
publishes the id. Why a DELETE that completed first always wins, cluster-wide: a resume anywhere
asks Redis for the tombstone before it rebuilds a session; a resume that starts after the DELETE's
200 therefore finds it (Redis serves one key linearizably). A resume that raced the DELETE (asked
before the write) may rebuild a copy, but the published id reaches that process and ends the copy,
and leaves a local tombstone, within a second. While Redis is down a resume checks the local
tombstones only: a DELETE made on another machine during the outage can be missed, and such a
resume grants nothing a fresh ``initialize`` with the same token would not.
"""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio as redis
import structlog

from satgate_mcp.stores.redis.channel import ChannelFollower
from satgate_mcp.stores.redis.client import DEFAULT_MAX_CONNECTIONS, connect

DEFAULT_PREFIX = "satgate:tomb:"

log = structlog.get_logger("satgate_mcp.shared_tombstones")


class RedisTombstones:
    """Tombstones shared by every process on one Redis; ``on_remote_delete`` ends a live copy here."""

    def __init__(self, url: str, *, timeout: float, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 prefix: str = DEFAULT_PREFIX,
                 on_remote_delete: Callable[[str], None] = lambda _: None,
                 on_error: Callable[[str], None] = lambda _: None) -> None:
        self._redis = connect(url, timeout=timeout, max_connections=max_connections)
        self._prefix = prefix
        self.on_remote_delete = on_remote_delete
        self._on_error = on_error
        self._follower = ChannelFollower(url, f"{prefix}events", timeout=timeout, on_message=self._published,
                                         lost_event="shared_tombstones_unfollowed")
        #: Set once the subscription is live (tests await it before a DELETE elsewhere).
        self.following = self._follower.following

    def start(self) -> None:
        self._follower.start()

    async def mark(self, session_id: str, ttl: float) -> bool:
        """Write the tombstone and tell the others; False (logged, counted) when Redis could not take it."""
        try:
            await self._redis.set(self._prefix + session_id, b"1", ex=max(1, int(ttl)))
            await self._redis.publish(self._follower.channel, session_id)
        except (redis.RedisError, OSError, TimeoutError) as exc:
            self._on_error("tombstone_mark")
            log.warning("shared_tombstone_not_written", session_id=session_id, error=type(exc).__name__)
            return False
        return True

    async def is_marked(self, session_id: str) -> bool:
        """Whether any process DELETEd this id within the idle TTL; False when Redis does not answer."""
        try:
            return bool(await self._redis.exists(self._prefix + session_id))
        except (redis.RedisError, OSError, TimeoutError) as exc:
            self._on_error("tombstone_check")
            log.info("shared_tombstone_unchecked", session_id=session_id, error=type(exc).__name__)
            return False

    def _published(self, session_id: str) -> None:
        self.on_remote_delete(session_id)

    async def aclose(self) -> None:
        await self._follower.aclose()
        await self._redis.aclose()
