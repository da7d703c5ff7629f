"""Task owners in the shared stores: what one process (or machine) notes, another reads; a record ends with its
time; and the owner a listing trusts is the one the creating call noted, never a guess."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
import redis.asyncio as redis

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.stores.redis.task_owners import RedisTaskOwners
from satgate_mcp.stores.sqlite import LocalState
from satgate_mcp.stores.sqlite.task_owners import SqliteTaskOwners
from satgate_mcp.task_ids import TaskRef
from satgate_mcp.task_owners import DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS, owner_ttl

ALICE = ("tok-alice", "mcp-session-a")
BOB = ("tok-bob", "token:tok-bob")
REF, OTHER = TaskRef("up", "t1"), TaskRef("up", "t2")


async def test_sqlite_owners_are_shared_by_the_folder_and_end_with_their_time(tmp_path: Path) -> None:
    now = [1000.0]
    first, second = LocalState.open(tmp_path, clock=lambda: now[0]), LocalState.open(tmp_path, clock=lambda: now[0])
    try:
        writer, reader = SqliteTaskOwners(first.db), SqliteTaskOwners(second.db)
        await writer.note(REF, ALICE, 60)
        await writer.note(TaskRef("elsewhere", "t1"), BOB, 60)  # the same id on another upstream: another task
        assert await reader.owners([REF, OTHER]) == {REF: ALICE}
        await writer.note(REF, BOB, 60)  # an upstream that reused an id: the newest creation holds it
        assert await reader.owners([REF]) == {REF: BOB}
        now[0] += 61
        assert await reader.owners([REF]) == {}
        assert await reader.owners([]) == {}
    finally:
        await first.aclose()
        await second.aclose()


async def test_redis_owners_are_shared_by_every_machine_and_end_with_their_time(redis_client: redis.Redis) -> None:
    prefix = f"test-task-owners-{secrets.token_hex(4)}:"
    other_client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        writer, reader = RedisTaskOwners(redis_client, prefix=prefix), RedisTaskOwners(other_client, prefix=prefix)
        await writer.note(REF, ALICE, 60)
        await writer.note(TaskRef("elsewhere", "t1"), BOB, 60)
        assert await reader.owners([REF, OTHER]) == {REF: ALICE}
        await writer.note(OTHER, BOB, 0.05)
        assert await reader.owners([OTHER]) == {OTHER: BOB}
        await asyncio.sleep(0.1)  # Redis's own expiry is the thing tested: time has to pass
        assert await reader.owners([OTHER]) == {}
        await redis_client.set(prefix + 'task-owner:["up","t9"]', "not json of two strings")
        assert await reader.owners([TaskRef("up", "t9")]) == {}  # a garbled record names nobody
    finally:
        await other_client.aclose()


@pytest.mark.parametrize(("reply", "ttl"), [
    ({"result": {"task": {"taskId": "t", "ttl": 60_000}}}, 60.0),  # 2025-11-25, milliseconds
    ({"result": {"resultType": "task", "taskId": "t", "ttlMs": 1_500}}, 1.5),  # 2026-07-28
    ({"result": {"task": {"taskId": "t"}}}, DEFAULT_TTL_SECONDS),
    ({"result": {"task": {"taskId": "t", "ttl": None}}}, DEFAULT_TTL_SECONDS),
    ({"result": {"task": {"taskId": "t", "ttl": -5}}}, DEFAULT_TTL_SECONDS),
    ({"result": {"task": {"taskId": "t", "ttl": True}}}, DEFAULT_TTL_SECONDS),
    ({"result": {"task": {"taskId": "t", "ttl": 10**12}}}, MAX_TTL_SECONDS),
    ({"error": {"code": 1, "message": "m"}}, DEFAULT_TTL_SECONDS),
])
def test_owner_ttl(reply: JsonObj, ttl: float) -> None:
    assert owner_ttl(reply) == ttl
