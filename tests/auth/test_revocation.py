"""Revocation stores: the file is re-read when it changes, appends never lose a line, Redis is shared."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient
from structlog.testing import capture_logs

from satgate_mcp.app import create_app
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.auth.revocation import UnionRevocationStore, parse_revocation_text
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import Settings
from satgate_mcp.stores import configured_revocations, revocation_files, revocation_store_from_settings
from satgate_mcp.stores.files import FileRevocationStore, append_revocation
from satgate_mcp.stores.memory import MemoryRevocationStore
from satgate_mcp.stores.redis.revocations import RedisRevocationStore
from tests.fakes import AllowAllPolicy, FakeClock, FakePool

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


async def test_file_store_follows_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-a\n")
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock)
    assert await store.is_revoked("tok-a")

    tmp = tmp_path / "revoked.new"
    tmp.write_text("tok-z\n")
    os.replace(tmp, path)  # write the new file, rename it over the old: same size, new inode
    clock.advance(1)
    assert await store.is_revoked("tok-z"), "the rotated file's ids are picked up"
    assert await store.is_revoked("tok-a"), "and nothing revoked before comes back to life"
    assert store.problems == 0


def _delete(path: Path) -> None:
    path.unlink()


def _rename_away(path: Path) -> None:
    path.rename(path.with_name("revoked.old"))


def _rotate_without_the_id(path: Path) -> None:
    fresh = path.with_name("revoked.new")
    fresh.write_text("tok-other\n")
    os.replace(fresh, path)


def _rewrite_without_the_id(path: Path) -> None:
    path.write_text("")  # truncated in place, as a half-finished rewrite would leave it


def _directory_in_its_place(path: Path) -> None:
    path.unlink()
    path.mkdir()  # unreadable even as root (chmod 000 is not): reading it fails with IsADirectoryError


@pytest.mark.parametrize(
    ("attack", "problem"),
    [
        pytest.param(_delete, "missing", id="delete"),
        pytest.param(_rename_away, "missing", id="rename-away"),
        pytest.param(_rotate_without_the_id, "", id="replace-with-a-file-lacking-the-id"),
        pytest.param(_rewrite_without_the_id, "", id="rewrite-in-place-without-the-id"),
        pytest.param(_directory_in_its_place, "IsADirectoryError: Is a directory", id="unreadable"),
    ],
)
async def test_attack_removing_the_revocation_file_keeps_the_token_revoked(
    tmp_path: Path, attack: Callable[[Path], None], problem: str
) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-leaked\n")
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock)
    assert await store.is_revoked("tok-leaked")

    with capture_logs() as logs:
        attack(path)
        for _ in range(3):  # several checks: still revoked, and the problem is logged once
            clock.advance(1)
            assert await store.is_revoked("tok-leaked"), "revoked until restart"
    assert not await store.is_revoked("tok-innocent")
    assert store.problem == problem
    warnings = [e for e in logs if e["event"] == "revocation_file_unusable"]
    assert [w["problem"] for w in warnings] == ([problem] if problem else [])
    assert store.problems == len(warnings)


async def test_revocation_file_problems_are_counted_and_the_recovery_is_logged(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-a\n")
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock)
    assert await store.is_revoked("tok-a")

    async def step() -> None:
        clock.advance(1)
        await store.is_revoked("tok-a")

    with capture_logs() as logs:
        path.unlink()
        await step()
        path.mkdir()
        await step()
        path.rmdir()
        path.write_text("tok-b\n")
        await step()
    assert [(e["event"], e.get("problem")) for e in logs] == [
        ("revocation_file_unusable", "missing"),
        ("revocation_file_unusable", "IsADirectoryError: Is a directory"),
        ("revocation_file_readable", None),
    ]
    assert (store.problems, store.problem) == (2, "")
    assert await store.is_revoked("tok-a")
    assert await store.is_revoked("tok-b")


async def test_a_revocation_file_that_never_existed_is_nothing_revoked_not_a_problem(tmp_path: Path) -> None:
    store = FileRevocationStore(tmp_path / "revoked", clock=FakeClock())
    with capture_logs() as logs:
        assert not await store.is_revoked("tok-a")
    assert (logs, store.problems, store.problem) == ([], 0, "")


def _metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, text
    return values[0]


async def test_metrics_count_revocation_file_problems_without_any_lookup(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-a\n")
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock)
    metrics = Metrics()
    metrics.watch_revocation_files(revocation_files(UnionRevocationStore([MemoryRevocationStore(), store])))
    page = metrics.render().decode()
    assert (_metric(page, "satgate_revocation_file_errors_total"),
            _metric(page, "satgate_revocation_file_unusable")) == (0, 0)

    path.unlink()
    clock.advance(1)
    page = metrics.render().decode()  # the scrape itself checks the file: an idle gateway still tells
    assert (_metric(page, "satgate_revocation_file_errors_total"),
            _metric(page, "satgate_revocation_file_unusable")) == (1, 1)
    assert await store.is_revoked("tok-a")


async def test_file_store_missing_file_then_created(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    clock = FakeClock()
    store = FileRevocationStore(path, clock=clock)
    assert not await store.is_revoked("tok-a")
    path.write_text("tok-a\n")
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
        revocation_file=tmp_path / revocation_file if revocation_file else None, redis_url=redis_url,
        redis_timeout=2.0,
    )
    store = configured_revocations(settings)
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


async def test_a_revocation_on_one_process_reaches_the_others_mirror_by_pub_sub(redis_key: str) -> None:
    reader = RedisRevocationStore(REDIS_URL, key=redis_key)
    writer = RedisRevocationStore(REDIS_URL, key=redis_key)
    try:
        assert not await reader.is_revoked("tok-a")
        await asyncio.wait_for(reader.synced.wait(), 2)
        await writer.revoke("tok-a")
        assert await writer.is_revoked("tok-a")
        await asyncio.wait_for(reader.changed.wait(), 1)  # the bound: refused everywhere within 1 s
        assert await reader.is_revoked("tok-a")
    finally:
        await reader.aclose()
        await writer.aclose()


async def test_the_mirror_loads_what_was_revoked_before_the_process_started(redis_key: str) -> None:
    import redis.asyncio as aioredis

    admin = aioredis.from_url(REDIS_URL)
    await admin.sadd(redis_key, "tok-old")
    store = RedisRevocationStore(REDIS_URL, key=redis_key)
    try:
        assert await store.is_revoked("tok-old")  # before the first sync: asked directly
        await asyncio.wait_for(store.synced.wait(), 2)
        assert await store.is_revoked("tok-old")  # after it: from the mirror
    finally:
        await store.aclose()
        await admin.aclose()


async def test_attack_removing_an_id_from_redis_keeps_the_token_revoked(redis_key: str) -> None:
    import redis.asyncio as aioredis

    store = RedisRevocationStore(REDIS_URL, key=redis_key)
    admin = aioredis.from_url(REDIS_URL)
    try:
        await admin.sadd(redis_key, "tok-leaked")
        assert await store.is_revoked("tok-leaked")
        await admin.delete(redis_key)
        await asyncio.wait_for(store.synced.wait(), 2)
        assert await store.is_revoked("tok-leaked"), "revoked until restart"
    finally:
        await store.aclose()
        await admin.aclose()


def test_a_directory_is_not_a_revocation_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        revocation_store_from_settings(SimpleNamespace(revocation_file=tmp_path, redis_url=None))


# --- through the gateway ---------------------------------------------------------------------------

GATEWAY_KEY = "revocation-tests-root-key-0123456789abcdef"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}}


async def test_attack_deleting_the_revocation_file_under_a_gateway_keeps_refusing_and_shows_in_metrics(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-leaked\n")
    clock = FakeClock()
    settings = Settings(auth_mode="header", root_key=SecretStr(GATEWAY_KEY))
    store = FileRevocationStore(path, clock=clock)
    metrics = Metrics()
    metrics.watch_revocation_files([store])  # what create_app does for the file it opens itself
    auth = authenticator_from_settings(settings, revocations=store)
    client = await aiohttp_client(create_app(settings, authenticator=auth, pool=FakePool(["echo"]),
                                             policy=AllowAllPolicy(), metrics=metrics))
    headers = {"Authorization": f"Bearer {mint_token(GATEWAY_KEY, 'tok-leaked')}",
               "Accept": "application/json, text/event-stream"}

    async def initialize_status() -> int:
        async with client.post("/mcp", json=INITIALIZE, headers=headers) as answer:
            return answer.status

    async def metric(name: str) -> float:
        async with client.get("/metrics") as answer:
            return _metric(await answer.text(), name)

    assert await initialize_status() == 403
    path.unlink()
    clock.advance(1)
    assert await initialize_status() == 403, "deleting the file un-revokes nothing"
    assert await metric("satgate_revocation_file_errors_total") == 1
    assert await metric("satgate_revocation_file_unusable") == 1


async def test_the_revocation_file_the_gateway_opens_is_watched_by_metrics(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-leaked\n")
    settings = Settings(auth_mode="header", root_key=SecretStr(GATEWAY_KEY), revocation_file=path,
                        state_dir="memory")
    client = await aiohttp_client(create_app(settings, pool=FakePool(["echo"]), policy=AllowAllPolicy()))
    async with client.get("/metrics") as answer:
        assert _metric(await answer.text(), "satgate_revocation_file_unusable") == 0
