"""Revocation stores: the file is re-read when it changes, appends never lose a line, Redis is shared."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from satgate_mcp.auth.revocation import (
    FileRevocationStore,
    MemoryRevocationStore,
    RedisRevocationStore,
    UnionRevocationStore,
    append_revocation,
    parse_revocation_text,
    revocation_store_from_settings,
)
from tests.fakes import FakeClock

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        pytest.param("", set(), id="empty"),
        pytest.param("tok-a\ntok-b\n", {"tok-a", "tok-b"}, id="one-per-line"),
        pytest.param("# leaked keys\n\n   \ntok-a\n", {"tok-a"}, id="comments-and-blanks"),
        pytest.param("tok-a   # leaked 2024-05-01\n", {"tok-a"}, id="trailing-comment"),
        pytest.param("  tok-a  \r\ntok-b", {"tok-a", "tok-b"}, id="whitespace-crlf-no-final-newline"),
        pytest.param("tok-a revoked by ops\n", {"tok-a"}, id="words-after-id-ignored"),
        pytest.param("#tok-a\n", set(), id="commented-out"),
    ],
)
def test_parse_revocation_text(text: str, ids: set[str]) -> None:
    assert parse_revocation_text(text) == ids


async def test_memory_store() -> None:
    store = MemoryRevocationStore(["tok-a"])
    assert await store.is_revoked("tok-a")
    assert not await store.is_revoked("tok-b")
    await store.revoke("tok-b")
    assert await store.is_revoked("tok-b")


@pytest.mark.parametrize("bad", ["", "tok\nforged", "tok forged", "#x", "x" * 200])
async def test_revoke_refuses_ids_that_would_corrupt_the_file(tmp_path: Path, bad: str) -> None:
    store = FileRevocationStore(tmp_path / "revoked")
    with pytest.raises(ValueError, match="invalid token id"):
        await store.revoke(bad)
    assert not (tmp_path / "revoked").exists()


async def test_file_store_reads_comments_and_blanks(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("# revoked tokens\n\ntok-a\n  tok-b  # leaked\n")
    store = FileRevocationStore(path)
    assert await store.is_revoked("tok-a")
    assert await store.is_revoked("tok-b")
    assert not await store.is_revoked("tok-c")
    assert not await store.is_revoked("#")


async def test_file_store_sees_an_append_after_one_check_interval(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-a\n")
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock, check_interval=0.25)
    assert not await store.is_revoked("tok-b")

    with path.open("a") as fh:  # the operator (or another process) appends
        fh.write("tok-b\n")
    clock.advance(0.1)
    assert not await store.is_revoked("tok-b"), "stat is throttled to once per interval"
    clock.advance(0.15)
    assert await store.is_revoked("tok-b"), "seen well within one second"


async def test_file_store_follows_an_atomic_replace_and_a_removal(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-a\n")
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock)
    assert await store.is_revoked("tok-a")

    tmp = tmp_path / "revoked.new"
    tmp.write_text("tok-z\n")
    os.replace(tmp, path)  # same size, new inode
    clock.advance(1)
    assert await store.is_revoked("tok-z")
    assert not await store.is_revoked("tok-a"), "un-revoking by editing the file works too"

    path.unlink()
    clock.advance(1)
    assert not await store.is_revoked("tok-z")


async def test_file_store_missing_file_then_created(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock)
    assert not await store.is_revoked("tok-a")
    path.write_text("tok-a\n")
    clock.advance(1)
    assert await store.is_revoked("tok-a")


async def test_file_store_keeps_last_ids_when_the_file_turns_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-a\n")
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock)
    assert await store.is_revoked("tok-a")
    path.unlink()
    path.mkdir()  # reading it now fails with IsADirectoryError
    clock.advance(1)
    assert await store.is_revoked("tok-a")


async def test_revoke_appends_and_is_seen_at_once(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("# header without final newline\ntok-a")
    store = FileRevocationStore(path, clock=FakeClock())
    await store.revoke("tok-b")
    assert await store.is_revoked("tok-b")
    assert path.read_text().splitlines() == ["# header without final newline", "tok-a", "tok-b"]


async def test_concurrent_revokes_from_many_tasks_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    stores = [FileRevocationStore(path) for _ in range(4)]
    ids = [f"tok-{i}" for i in range(80)]
    await asyncio.gather(*(stores[i % 4].revoke(tid) for i, tid in enumerate(ids)))
    assert sorted(path.read_text().splitlines()) == sorted(ids)
    fresh = FileRevocationStore(path)
    assert all([await fresh.is_revoked(tid) for tid in ids])


def _append_many(path: str, prefix: str, count: int) -> None:
    for i in range(count):
        append_revocation(Path(path), f"{prefix}-{i}")


def test_concurrent_revokes_from_several_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-existing")  # no final newline: every writer must cope
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(path), f"p{n}", 100)) for n in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=20)
        assert proc.exitcode == 0
    lines = path.read_text().splitlines()
    expected = {"tok-existing"} | {f"p{n}-{i}" for n in range(4) for i in range(100)}
    assert len(lines) == len(expected)
    assert set(lines) == expected


async def test_union_store_revoked_if_any_says_so_and_revokes_in_all() -> None:
    first, second = MemoryRevocationStore(["tok-a"]), MemoryRevocationStore(["tok-b"])
    union = UnionRevocationStore([first, second])
    assert await union.is_revoked("tok-a")
    assert await union.is_revoked("tok-b")
    await union.revoke("tok-c")
    assert await first.is_revoked("tok-c")
    assert await second.is_revoked("tok-c")


@pytest.mark.parametrize(
    ("revocation_file", "redis_url", "kind"),
    [
        pytest.param(None, None, MemoryRevocationStore, id="nothing-configured"),
        pytest.param("revoked", None, FileRevocationStore, id="file"),
        pytest.param(None, REDIS_URL, RedisRevocationStore, id="redis"),
        pytest.param("revoked", REDIS_URL, UnionRevocationStore, id="both"),
    ],
)
async def test_store_from_settings(
    tmp_path: Path, revocation_file: str | None, redis_url: str | None, kind: type
) -> None:
    settings = SimpleNamespace(
        revocation_file=tmp_path / revocation_file if revocation_file else None, redis_url=redis_url
    )
    store = revocation_store_from_settings(settings)
    try:
        assert isinstance(store, kind)
    finally:
        await store.aclose()


# --- Redis (skipped when no server listens on 127.0.0.1:6379) -------------------------------------


@pytest.fixture
async def redis_key() -> AsyncIterator[str]:
    redis = pytest.importorskip("redis.asyncio")
    client = redis.from_url(REDIS_URL)
    try:
        await asyncio.wait_for(client.ping(), timeout=2)
    except Exception:
        await client.aclose()
        pytest.skip("no Redis on 127.0.0.1:6379")
    key = f"satgate-test:revoked:{uuid.uuid4().hex}"
    yield key
    await client.delete(key)
    await client.aclose()


async def test_redis_store_is_shared_and_caches_briefly(redis_key: str) -> None:
    clock = FakeClock()
    reader = RedisRevocationStore(REDIS_URL, key=redis_key, clock=clock, cache_seconds=0.5)
    writer = RedisRevocationStore(REDIS_URL, key=redis_key)
    try:
        assert not await reader.is_revoked("tok-a")
        await writer.revoke("tok-a")
        assert await writer.is_revoked("tok-a")
        assert not await reader.is_revoked("tok-a"), "a cached answer lives at most cache_seconds"
        clock.advance(0.5)
        assert await reader.is_revoked("tok-a")
    finally:
        await reader.aclose()
        await writer.aclose()


def test_a_directory_is_not_a_revocation_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        revocation_store_from_settings(SimpleNamespace(revocation_file=tmp_path, redis_url=None))
