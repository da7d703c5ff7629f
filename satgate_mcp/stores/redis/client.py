"""How every Redis client of the gateway is made: bounded by ``SATGATE_REDIS_TIMEOUT`` and never retrying.

A command that fails fails at once, after at most the timeout: redis-py's own retries (its ``Redis()``
constructor retries three times with backoff, ``from_url`` does not, and that has changed between
releases) would multiply what a paused store costs a call. The call's store time (policy/store_time.py)
bounds the rest; reconnecting is redis-py's pool's business, on the next command.
"""

from __future__ import annotations

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


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
