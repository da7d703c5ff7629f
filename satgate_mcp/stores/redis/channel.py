"""One Redis pub/sub channel followed for a process's life: what the revocation mirror and the shared tombstones share.

Subscribe first, then let the owner load what it needs (so nothing published meanwhile is missed),
then hand every message to the owner; after any fault start over, at least every ``resync_interval``
while Redis is down. redis-py's asyncio ``get_message`` can swallow a cancellation, so ``aclose``
tells the loop to stop and closes its connection under it, and waits for it a bounded time only.

Keys live in the URL's database, but Redis has one pub/sub space for all its databases: a channel is
therefore named for its database (``channel_in``), so deployments on two databases of one server never
hear each other's revocations or DELETEs. Database 0 keeps the plain name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import redis.asyncio as redis
import structlog

from satgate_mcp.stores.redis.client import subscriber

RESYNC_INTERVAL_SECONDS = 0.5
CLOSE_WAIT_SECONDS = 1.0

log = structlog.get_logger("satgate_mcp.pubsub")


async def _nothing() -> None:
    return None


def channel_in(url: str, channel: str) -> str:
    """``channel`` as published and followed for the database ``url`` names (``channel@db<N>``; db 0: as is)."""
    db = int(redis.connection.parse_url(url).get("db", 0) or 0)
    return channel if db == 0 else f"{channel}@db{db}"


def text_of(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ChannelFollower:
    def __init__(self, url: str, channel: str, *, timeout: float, on_message: Callable[[str], None],
                 on_subscribed: Callable[[], Awaitable[None]] = _nothing, lost_event: str = "pubsub_lost",
                 resync_interval: float = RESYNC_INTERVAL_SECONDS) -> None:
        # The subscriber waits for messages: no read timeout, a health-check ping instead.
        self._client = subscriber(url, timeout=timeout)
        #: The channel as Redis knows it: named for the URL's database.
        self.channel = channel_in(url, channel)
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._lost_event = lost_event
        self._resync_interval = resync_interval
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: Set while subscribed (and ``on_subscribed`` done); cleared while the subscription is down.
        self.following = asyncio.Event()

    def start(self) -> None:
        if self._task is None and not self._closing:
            self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        while not self._closing:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                await self._on_subscribed()
                self.following.set()
                while not self._closing:
                    message = await pubsub.get_message(timeout=self._resync_interval)
                    if message is not None and message.get("type") == "message":
                        self._on_message(text_of(message["data"]))
            except (redis.RedisError, OSError, TimeoutError) as exc:
                if self.following.is_set():
                    log.warning(self._lost_event, channel=self.channel, error=type(exc).__name__)
                self.following.clear()
            finally:
                # redis-py typed PubSub.aclose in 8.x; through a typed name, the call checks on older and newer alike.
                close: Callable[[], Awaitable[None]] = pubsub.aclose
                with contextlib.suppress(Exception):
                    await close()
            if not self._closing:
                await asyncio.sleep(self._resync_interval)

    async def aclose(self) -> None:
        self._closing = True
        task, self._task = self._task, None
        with contextlib.suppress(Exception):
            await self._client.aclose()
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=CLOSE_WAIT_SECONDS)
