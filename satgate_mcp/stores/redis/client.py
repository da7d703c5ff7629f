"""How every Redis client of the gateway is made: bounded by ``SATGATE_REDIS_TIMEOUT`` and never retrying.

A command that fails fails at once, after at most the timeout: redis-py's own retries (its ``Redis()``
constructor retries three times with backoff, ``from_url`` does not, and that has changed between
releases) would multiply what a paused store costs a call. The call's store time (policy/store_time.py)
bounds the rest; reconnecting is redis-py's pool's business, on the next command.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import WatchError


def no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


#: Connections one client keeps open at most (``SATGATE_REDIS_MAX_CONNECTIONS``).
DEFAULT_MAX_CONNECTIONS = 64


def connect(url: str, *, timeout: float, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> redis.Redis:
    """A client whose every command and connect is bounded by ``timeout``, tried once, over at most
    ``max_connections`` connections: a slow Redis under load makes commands wait for a free connection (within
    the same timeout, and the call's store time) instead of opening connections without bound."""
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=timeout,
                                                 socket_timeout=timeout, socket_connect_timeout=timeout,
                                                 retry=no_retry())
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # as Redis.from_url does: closing the client closes its pool
    return client


def subscriber(url: str, *, timeout: float) -> redis.Redis:
    """A client for one pub/sub connection: it waits for messages (no read timeout), pings to notice a loss."""
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, health_check_interval=1, retry=no_retry())


#: Tries of one WATCH/MULTI read-modify-write against concurrent writers before it gives up (each loses only to a
#: write of what it read).
MAX_TRIES = 50
T = TypeVar("T")


async def watched(client: redis.Redis, body: Callable[[Pipeline], Awaitable[T]], what: str) -> T:
    """``body`` on a transaction pipeline (it WATCHes what it reads, then MULTI/EXECs its writes), again from the
    start whenever a concurrent write to what it read fails the EXEC."""
    async with client.pipeline(transaction=True) as pipe:
        for _ in range(MAX_TRIES):
            try:
                return await body(pipe)
            except WatchError:
                await pipe.reset()  # type: ignore[no-untyped-call]  # redis-py leaves these untyped
    raise RuntimeError(f"{what}: too many concurrent writers, try again")
