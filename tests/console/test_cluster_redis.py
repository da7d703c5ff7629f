"""The cluster view on the real Redis: every process's figures under a key that expires, read by every other."""

from __future__ import annotations

import secrets

import pytest
import redis.asyncio as redis

from satgate_mcp.console.cluster import LocalBoard, Sampler
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import SessionRegistry
from satgate_mcp.stores.redis.console import RedisBoard
from tests.fakes import FakePool
from tests.stores.conftest import redis_client

__all__ = ["redis_client"]
pytestmark = pytest.mark.process


def sampler(board: RedisBoard | LocalBoard, name: str) -> Sampler:
    found = Sampler(Metrics(), SessionRegistry(cap=10, idle_ttl=60, publisher=RecordingPublisher()), FakePool(), board,
                    store_up=None)
    found.name = name
    return found


async def test_each_process_sees_every_other_and_a_stopped_one_leaves(redis_client: redis.Redis) -> None:
    prefix = f"test-{secrets.token_hex(4)}:"
    one, two = sampler(RedisBoard(redis_client, prefix=prefix), "host:1"), sampler(
        RedisBoard(redis_client, prefix=prefix), "host:2")
    await one.tick()
    await two.tick()
    assert [f["process"] for f in await one.read_all()] == ["host:1", "host:2"]
    assert [f["process"] for f in await two.read_all()] == ["host:2", "host:1"]
    ttl = await redis_client.pttl(f"{prefix}console:process:host:2")
    assert 0 < ttl <= 15_000
    await redis_client.delete(f"{prefix}console:process:host:2")  # what its key's expiry does when it stops
    assert [f["process"] for f in await one.read_all()] == ["host:1"]
    await redis_client.delete(f"{prefix}console:process:host:1")


async def test_garbage_on_the_board_is_skipped(redis_client: redis.Redis) -> None:
    prefix = f"test-{secrets.token_hex(4)}:"
    await redis_client.set(f"{prefix}console:process:bad", b"{not json", px=5000)
    await redis_client.set(f"{prefix}console:process:list", b"[1, 2]", px=5000)
    assert await RedisBoard(redis_client, prefix=prefix).read() == []


async def test_alone_the_board_is_this_process() -> None:
    alone = sampler(LocalBoard(), "host:9")
    assert [f["process"] for f in await alone.read_all()] == ["host:9"]
