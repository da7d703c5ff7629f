"""Revocations shared by every gateway process on one Redis: a set, and pub/sub for the news.

Checks answer from a mirror in memory, so a revoked token is refused within milliseconds everywhere
and a check never waits on Redis once the mirror is loaded.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as redis

from satgate_mcp.auth.revocation import check_token_id
from satgate_mcp.stores.redis.channel import ChannelFollower, text_of
from satgate_mcp.stores.redis.client import connect

DEFAULT_REDIS_KEY = "satgate:revoked"


class RedisRevocationStore:
    """A Redis set shared by every gateway process, mirrored in memory so a check never waits on Redis.

    The mirror is loaded once the store is first used, kept fresh by pub/sub (a ``revoke`` anywhere
    publishes the id; every process has it within milliseconds) and re-synced after every reconnect.
    Checks answer from it, also while Redis is down: what was revoked stays revoked, and nothing can be
    revoked during the outage anyway. Only before the first sync is Redis asked directly (bounded by
    the timeout; a failure then is a store fault the authenticator turns into 503 or lets through, per
    ``SATGATE_STORE_FAIL_MODE``). An id seen revoked stays revoked in this process until restart, as
    with the file, even if it is removed from Redis.
    """

    def __init__(self, url: str, *, key: str = DEFAULT_REDIS_KEY, timeout: float = 0.5) -> None:
        # A paused or unreachable Redis must fail a command within the timeout, never hang the request.
        self._redis: redis.Redis = connect(url, timeout=timeout)
        self._key = key
        self._revoked: set[str] = set()
        self._follower = ChannelFollower(url, f"{key}:events", timeout=timeout, on_message=self._published,
                                         on_subscribed=self._load, lost_event="revocation_sync_lost")
        #: Set once the mirror holds the whole set; cleared while the subscription is down.
        self.synced = self._follower.following
        #: Set whenever a published revocation reached the mirror (tests await it).
        self.changed = asyncio.Event()
        self._ever_synced = False

    def start(self) -> None:
        """Begin following (the daemon does at start-up, so the mirror is loaded before the first request)."""
        self._follower.start()

    async def is_revoked(self, token_id: str) -> bool:
        self._follower.start()
        if token_id in self._revoked:
            return True
        if self._ever_synced:  # the mirror is the answer, also while Redis is down
            return False
        revoked = bool(await self._redis.sismember(self._key, token_id))  # before the first sync only
        if revoked:
            self._revoked.add(token_id)
        return revoked

    async def revoke(self, token_id: str) -> None:
        check_token_id(token_id)
        await self._redis.sadd(self._key, token_id)
        await self._redis.publish(self._follower.channel, token_id)
        self._revoked.add(token_id)

    async def _load(self) -> None:
        """Once subscribed (so nothing published meanwhile is missed): the whole set."""
        self._revoked.update(text_of(m) for m in await self._redis.smembers(self._key))
        self._ever_synced = True

    def _published(self, token_id: str) -> None:
        self._revoked.add(token_id)
        self.changed.set()

    async def aclose(self) -> None:
        await self._follower.aclose()
        await self._redis.aclose()
