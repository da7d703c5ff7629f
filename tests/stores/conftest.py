"""The real Redis the store tests share (127.0.0.1:6379): each test works under keys of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

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
