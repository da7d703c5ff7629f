"""The real Redis the store tests share (127.0.0.1:6379): each test works under keys of its own."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis.asyncio as redis

from satgate_mcp.stores.sqlite import LocalState
from satgate_mcp.stores.sqlite.database import Database

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def redis_client() -> AsyncIterator[redis.Redis]:
    """A client of the machine's Redis; the test is skipped where none listens."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except (OSError, redis.RedisError):
        await client.aclose()
        pytest.skip("no Redis at 127.0.0.1:6379")
    yield client
    await client.aclose()


S = TypeVar("S")


@contextlib.asynccontextmanager
async def handles(kind: str, tmp_path: Path, *, memory: Callable[[], S], sqlite: Callable[[Database], S],
                  on_redis: Callable[[redis.Redis, str], S]) -> AsyncIterator[Callable[[], Awaitable[S]]]:
    """Opens handles on one store of ``kind`` (``memory``, ``sqlite``, ``redis``), as several processes on one folder
    or machines on one Redis hold them: the memory store is one shared object; each SQLite handle opens the folder's
    database again; each Redis handle is a client of its own, under one fresh key prefix. All closed at the end."""
    closers: list[Callable[[], Awaitable[None]]] = []
    shared = memory() if kind == "memory" else None
    prefix = f"test-{secrets.token_hex(4)}:"

    async def open_handle() -> S:
        if shared is not None:
            return shared
        if kind == "sqlite":
            state = LocalState.open(tmp_path)
            closers.append(state.aclose)
            return sqlite(state.db)
        client = redis.Redis.from_url(REDIS_URL)
        try:
            await client.ping()
        except (OSError, redis.RedisError):
            await client.aclose()
            pytest.skip("no Redis at 127.0.0.1:6379")
        closers.append(client.aclose)
        return on_redis(client, prefix)

    try:
        yield open_handle
    finally:
        for close in closers:
            await close()
