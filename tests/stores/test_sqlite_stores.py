"""The state folder's SQLite stores keep the in-memory contract, durably and across connections.

Every test uses real database files under tmp_path. A second ``LocalState`` on the same folder is
another process as far as SQLite is concerned: its own connections, its own locks.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from satgate_mcp.auth.revocation import UnionRevocationStore
from satgate_mcp.errors import ConfigError
from satgate_mcp.policy.admissions import Arrived, ChargeAsk, refused_record
from satgate_mcp.policy.budget import Charge
from satgate_mcp.policy.duplicates import ARRIVAL, FIRST_SETTLED, REFUSED, REPLAY_SETTLED, STATES, Arrival, State, Table
from satgate_mcp.settings import Settings
from satgate_mcp.stores import (
    LocalState,
    local_stores,
    no_cli_revocations_reason,
    open_stores,
    resolve_state_dir,
    state_folder,
)
from satgate_mcp.stores.files import FileRevocationStore
from satgate_mcp.stores.folder import DEFAULT_STATE_DIR
from satgate_mcp.stores.memory import MemoryBudgetStore, MemoryDuplicateStore
from satgate_mcp.stores.sqlite.database import DB_NAME, PURGE_INTERVAL_SECONDS, Database
from satgate_mcp.stores.sqlite.transactions import CHECKPOINT_EVERY_COMMITS
from tests.fakes import FakeClock

WALL = 1_700_000_000.0


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(WALL)


@pytest.fixture
async def state(tmp_path: Path, wall: FakeClock) -> AsyncIterator[LocalState]:
    local = LocalState.open(tmp_path / "state", clock=wall)
    yield local
    await local.aclose()


@pytest.fixture
async def other(tmp_path: Path, wall: FakeClock) -> AsyncIterator[LocalState]:
    """A second process on the same state folder."""
    local = LocalState.open(tmp_path / "state", clock=wall)
    yield local
    await local.aclose()


# --- which folder ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("configured", "environ", "expected"), [
    pytest.param(None, {}, Path(DEFAULT_STATE_DIR), id="default-in-the-working-directory"),
    pytest.param(None, {"STATE_DIRECTORY": "/var/lib/satgate-mcp"}, Path("/var/lib/satgate-mcp"), id="systemd"),
    pytest.param(None, {"STATE_DIRECTORY": "/var/lib/a:/var/lib/b"}, Path("/var/lib/a"), id="systemd-first-of-many"),
    pytest.param("/srv/state", {"STATE_DIRECTORY": "/var/lib/satgate-mcp"}, Path("/srv/state"),
                 id="setting-wins-over-systemd"),
    pytest.param("memory", {"STATE_DIRECTORY": "/var/lib/satgate-mcp"}, None, id="memory"),
    pytest.param(" Memory ", {}, None, id="memory-any-case"),
    pytest.param("  ", {}, Path(DEFAULT_STATE_DIR), id="blank-is-unset"),
])
def test_resolve_state_dir(configured: str | None, environ: dict[str, str], expected: Path | None) -> None:
    assert resolve_state_dir(configured, environ) == expected


def test_redis_shares_the_state_so_no_folder_is_used(tmp_path: Path) -> None:
    settings = Settings(redis_url="redis://127.0.0.1:6379/0", state_dir=str(tmp_path / "state"))
    assert state_folder(settings) is None
    assert open_stores(settings).kind == "redis"
    assert not (tmp_path / "state").exists()


def test_memory_opens_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert open_stores(Settings(state_dir="memory")).kind == "memory"
    assert list(tmp_path.iterdir()) == []


def test_an_unusable_state_folder_is_one_config_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"SATGATE_STATE_DIR=.*not-a-folder"):
        LocalState.open(blocker)


def test_the_folder_is_private_and_the_database_in_wal_mode(tmp_path: Path) -> None:
    folder = tmp_path / "deep" / "state"
    local = LocalState.open(folder)
    try:
        assert folder.stat().st_mode & 0o777 == 0o700
        assert local.db.read_now("PRAGMA journal_mode", ()) == [("wal",)]
    finally:
        asyncio.run(local.aclose())


async def test_jobs_queued_together_commit_together_and_a_failing_one_undoes_only_itself(state: LocalState) -> None:
    def failing(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO revocations (token_id) VALUES ('half-done')")
        raise RuntimeError("boom")

    results = await asyncio.gather(
        state.budgets.charge("b", 1, limit=5, enforce=True), state.db.run(failing),
        state.budgets.charge("b", 1, limit=5, enforce=True), return_exceptions=True)
    assert results[0] == Charge(True, 4)
    assert isinstance(results[1], RuntimeError)
    assert results[2] == Charge(True, 3)
    assert state.db.read_now("SELECT count(*) FROM revocations", ()) == [(0,)]


async def test_a_caller_that_goes_away_leaves_the_charge_whole(state: LocalState) -> None:
    charging = asyncio.ensure_future(state.budgets.charge("b", 1, limit=5, enforce=True))
    await asyncio.sleep(0)
    charging.cancel()
    assert await state.budgets.remaining("b", limit=5) in (4, 5)  # done entirely or not at all, never half


def insert(token_id: str) -> Callable[[sqlite3.Connection], int]:
    """A job that leaves a row saying it ran (``revocations`` keeps the order of its rows), and the thread it ran on."""
    def job(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO revocations (token_id) VALUES (?)", (token_id,))
        return threading.get_ident()
    return job


async def test_a_job_runs_on_the_loops_own_thread_with_no_hand_off(state: LocalState) -> None:
    assert await state.db.run(lambda conn: threading.get_ident()) == threading.get_ident()


async def test_behind_another_processs_lock_jobs_wait_on_the_worker_in_the_order_asked(state: LocalState) -> None:
    worker_began = threading.Event()  # the worker's connection started a transaction: it now waits on the lock
    state.db._conn.set_trace_callback(lambda sql: worker_began.set() if sql.startswith("BEGIN") else None)
    locker = sqlite3.connect(state.db.path, isolation_level=None, timeout=0)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        first = asyncio.ensure_future(state.db.run(insert("first")))
        await asyncio.sleep(0)  # its turn ends: the lock is elsewhere, so the job goes to the worker
        state.db.submit(insert("behind"))
        last = asyncio.ensure_future(state.db.run(insert("last")))
        assert await asyncio.to_thread(worker_began.wait, 5)
        assert not first.done()  # waiting for the lock, not failed
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert await asyncio.wait_for(first, 5) != threading.get_ident()  # the worker ran it
    await asyncio.wait_for(last, 5)
    assert state.db.read_now("SELECT token_id FROM revocations ORDER BY seq", ()) == [
        ("first",), ("behind",), ("last",)]
    # Back on the loop once the worker is done (its own housekeeping may hold the lock a moment longer).
    threads = [await state.db.run(lambda conn: threading.get_ident()) for _ in range(20)]
    assert threads[-1] == threading.get_ident()


async def test_writes_nobody_waits_for_ride_along_in_the_next_jobs_transaction_in_order(state: LocalState) -> None:
    commits = state.db._commits
    for n in range(3):
        state.db.submit(insert(f"behind-{n}"))
    await state.db.run(insert("waited-for"))
    assert state.db._commits == commits + 1
    assert state.db.read_now("SELECT token_id FROM revocations ORDER BY seq", ()) == [
        ("behind-0",), ("behind-1",), ("behind-2",), ("waited-for",)]


async def test_the_loop_never_checkpoints_and_the_worker_is_asked_to(
        state: LocalState, monkeypatch: pytest.MonkeyPatch) -> None:
    assert state.db._loop_conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)  # a checkpoint syncs
    checkpointed = threading.Event()
    real = Database._checkpoint

    def checkpoint(db: Database) -> None:
        real(db)
        checkpointed.set()

    monkeypatch.setattr(Database, "_checkpoint", checkpoint)
    for n in range(CHECKPOINT_EVERY_COMMITS):
        await state.budgets.charge(f"b{n}", 1, limit=5, enforce=True)
    assert await asyncio.to_thread(checkpointed.wait, 5)


# --- budgets ----------------------------------------------------------------------------------------


async def test_charge_contract_matches_memory(state: LocalState) -> None:
    memory = MemoryBudgetStore()
    for store in (memory, state.budgets):
        assert await store.charge("b", 4, limit=10, enforce=True) == Charge(True, 6)
        assert await store.charge("b", 7, limit=10, enforce=True) == Charge(False, 6, exceeded=True)
        assert await store.charge("b", 1, limit=999, enforce=True) == Charge(True, 5)  # first use set the limit
        assert await store.charge("b", 9, limit=10, enforce=False) == Charge(True, -4, exceeded=True)
        await store.refund("b", 9)
        assert await store.remaining("b", limit=10) == 5
        await store.refund("b", 100)
        assert await store.remaining("b", limit=10) == 10  # a refund never goes below nothing spent
        assert await store.charge("u", 5, limit=None, enforce=True) == Charge(True, None)
        assert await store.remaining("u", limit=None) is None
        assert [(await store.charge("f", 0.1, limit=0.3, enforce=True)).allowed for _ in range(4)] == [
            True, True, True, False]
        assert await store.charge("z", 5, limit=1, enforce=True) == Charge(False, 1, exceeded=True)
        assert await store.remaining("z", limit=99) == 1  # started on first use, although refused


async def test_an_unlimited_budget_gets_no_row(state: LocalState) -> None:
    for _ in range(3):
        assert await state.budgets.charge("free", 1, limit=None, enforce=True) == Charge(True, None)
    assert state.db.read_now("SELECT count(*) FROM budgets", ()) == [(0,)]


async def test_transfer_contract_matches_memory(state: LocalState) -> None:
    memory = MemoryBudgetStore()
    for store in (memory, state.budgets):
        assert await store.transfer("p", "c1", 4, parent_limit=10) == Charge(True, 6)
        assert await store.transfer("p", "c2", 7, parent_limit=10) == Charge(False, 6, exceeded=True)
        assert not (await store.transfer("p", "c1", 1, parent_limit=10)).allowed
        assert await store.remaining("c1", limit=None) == 4
        assert await store.remaining("c2", limit=None) is None
        assert await store.transfer("rich", "c3", 50, parent_limit=None) == Charge(True, None)
        assert await store.remaining("c3", limit=None) == 50
        assert await store.transfer("c1", "g1", 3, parent_limit=None) == Charge(True, 1)  # a child gives on


async def test_a_childs_account_expires_with_its_ttl(state: LocalState, wall: FakeClock) -> None:
    assert (await state.budgets.transfer("p", "child", 5, parent_limit=10, ttl=60)).allowed
    assert await state.budgets.charge("child", 2, limit=None, enforce=True) == Charge(True, 3)
    wall.advance(61)
    assert await state.budgets.remaining("child", limit=None) is None
    assert await state.budgets.charge("child", 2, limit=None, enforce=True) == Charge(True, None)
    wall.advance(PURGE_INTERVAL_SECONDS)
    await state.budgets.remaining("p", limit=10)  # any statement purges expired rows now and then
    assert state.db.read_now("SELECT key FROM budgets", ()) == [("p",)]


async def test_charges_from_two_processes_never_overspend(state: LocalState, other: LocalState) -> None:
    results = await asyncio.gather(*(
        (state if i % 2 else other).budgets.charge("b", 1, limit=7, enforce=True) for i in range(100)))
    assert sum(r.allowed for r in results) == 7
    assert await other.budgets.remaining("b", limit=7) == 0


async def test_transfers_from_two_processes_never_overdraw(state: LocalState, other: LocalState) -> None:
    results = await asyncio.gather(*(
        (state if i % 2 else other).budgets.transfer("p", f"c{i}", 3, parent_limit=10) for i in range(20)))
    assert sum(r.allowed for r in results) == 3
    assert await state.budgets.remaining("p", limit=10) == 1


async def test_a_charge_is_on_disk_when_it_returns(state: LocalState, tmp_path: Path) -> None:
    await state.budgets.charge("b", 4, limit=10, enforce=True)
    reopened = LocalState.open(tmp_path / "state")  # a restart, while the first is still open (a handover)
    try:
        assert await reopened.budgets.remaining("b", limit=10) == 6
    finally:
        await reopened.aclose()


# --- duplicate records -------------------------------------------------------------------------------


def _force(state: State) -> Table:
    return {s: (state, "forced") for s in STATES}


TABLES = {"arrival": ARRIVAL, "refused": REFUSED, "first-ran": FIRST_SETTLED[True],
          "first-not-run": FIRST_SETTLED[False], "replay-ran": REPLAY_SETTLED[True],
          "replay-not-run": REPLAY_SETTLED[False]}


def _cases() -> Iterator[object]:
    for state in STATES:
        for name, table in TABLES.items():
            yield pytest.param(state, table, id=f"{state or 'none'}-{name}")


@pytest.mark.parametrize(("start", "table"), list(_cases()))
async def test_apply_matches_memory(state: LocalState, start: State, table: Table) -> None:
    memory = MemoryDuplicateStore()
    for store in (memory, state.duplicates):
        await store.apply("k", _force(start))
    outcome = await state.duplicates.apply("k", table)
    assert outcome == await memory.apply("k", table)
    expected = memory.get("k")
    rows = state.db.read_now("SELECT state FROM duplicates WHERE key = 'k'", ())
    assert rows == ([] if expected is None else [(expected.value,)])


@pytest.mark.parametrize("table", list(TABLES.values()), ids=list(TABLES))
@pytest.mark.parametrize("start", [s for s in STATES if s is not None], ids=lambda s: str(s))
async def test_an_expired_record_is_no_record_for_every_transition(state: LocalState, wall: FakeClock,
                                                                  start: State, table: Table) -> None:
    await state.duplicates.apply("k", _force(start))
    wall.advance(24 * 3600 + 1)
    expected_state, expected_outcome = table[None]
    assert await state.duplicates.apply("k", table) == expected_outcome
    rows = state.db.read_now("SELECT state, expires FROM duplicates WHERE key = 'k' AND expires > ?", (wall(),))
    assert [row[0] for row in rows] == ([] if expected_state is None else [expected_state.value])


async def test_a_record_is_kept_for_the_ttl(state: LocalState, wall: FakeClock) -> None:
    assert await state.duplicates.apply("k", ARRIVAL) == "first"
    wall.advance(24 * 3600 - 1)
    assert await state.duplicates.apply("k", ARRIVAL) == "replay"  # still there: one free re-send
    wall.advance(24 * 3600 + 1)
    assert await state.duplicates.apply("k", ARRIVAL) == "first"  # expired: a new call


async def test_records_are_shared_by_the_processes_on_a_folder(state: LocalState, other: LocalState) -> None:
    assert await state.duplicates.apply("k", ARRIVAL) == "first"
    outcomes = await asyncio.gather(*(other.duplicates.apply("k", ARRIVAL) for _ in range(5)))
    assert sorted(outcomes) == ["again"] * 4 + ["replay"]


# --- tombstones ---------------------------------------------------------------------------------------


async def test_a_tombstone_is_seen_by_another_process_and_expires(
        state: LocalState, other: LocalState, wall: FakeClock) -> None:
    state.tombstones.bury("mcp-deleted", 600)
    await state.db.run(lambda conn: None)  # the write behind is done once what was queued before it is
    assert other.tombstones.is_buried("mcp-deleted")
    assert not other.tombstones.is_buried("mcp-other")
    wall.advance(601)
    assert not other.tombstones.is_buried("mcp-deleted")


async def test_queued_tombstones_are_written_before_close(tmp_path: Path) -> None:
    first = LocalState.open(tmp_path / "state")
    for i in range(50):
        first.tombstones.bury(f"mcp-{i}", 600)
    await first.aclose()
    second = LocalState.open(tmp_path / "state")
    try:
        assert all(second.tombstones.is_buried(f"mcp-{i}") for i in range(50))
    finally:
        await second.aclose()


# --- revocations ----------------------------------------------------------------------------------------


async def test_a_revocation_from_another_process_is_seen_within_the_check_interval(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    daemon = LocalState.open(tmp_path / "state", monotonic=clock)
    cli = LocalState.open(tmp_path / "state")
    try:
        assert not await daemon.revocations.is_revoked("leaked")
        await cli.revocations.revoke("leaked")
        clock.advance(0.1)
        assert not await daemon.revocations.is_revoked("leaked")  # not looked again yet: at most 0.25 s stale
        clock.advance(0.15)
        assert await daemon.revocations.is_revoked("leaked")
    finally:
        await cli.aclose()
        await daemon.aclose()


async def test_revocations_are_loaded_at_start(tmp_path: Path) -> None:
    first = LocalState.open(tmp_path / "state")
    await first.revocations.revoke("a")
    await first.revocations.revoke("a")  # twice is once
    await first.aclose()
    second = LocalState.open(tmp_path / "state")
    try:
        assert await second.revocations.is_revoked("a")
        assert len(second.revocations) == 1
    finally:
        await second.aclose()


async def test_revoke_refuses_an_id_that_is_not_one(state: LocalState) -> None:
    with pytest.raises(ValueError, match="invalid token id"):
        await state.revocations.revoke("a\nb")


async def test_the_daemon_adds_the_state_folder_to_a_configured_file(state: LocalState, tmp_path: Path) -> None:
    assert local_stores(state).revocations is state.revocations
    joined = local_stores(state, FileRevocationStore(tmp_path / "revoked")).revocations
    assert isinstance(joined, UnionRevocationStore)
    assert joined.stores[1] is state.revocations


@pytest.mark.parametrize(("env", "made", "problem"), [
    pytest.param({}, False, "no state database at", id="no-daemon-ran-here"),
    pytest.param({}, True, None, id="the-daemons-folder"),
    pytest.param({"state_dir": "memory"}, True, "SATGATE_STATE_DIR=memory", id="memory"),
    pytest.param({"state_dir": "memory", "revocation_file": "revoked"}, False, None, id="a-file"),
])
def test_where_token_revoke_can_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, Any],
                                      made: bool, problem: str | None) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SATGATE_STATE_DIR", raising=False)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    if made:
        asyncio.run(LocalState.open(Path(DEFAULT_STATE_DIR)).aclose())
    reason = no_cli_revocations_reason(Settings(**env))
    assert (reason is None) if problem is None else (reason is not None and problem in reason)
    assert (tmp_path / "satgate-state" / DB_NAME).exists() == made


# --- a guarded call's admission in one job ---------------------------------------------------------


async def _general_path(duplicates: MemoryDuplicateStore, budgets: MemoryBudgetStore, key: str,
                        ask: ChargeAsk) -> Arrived:
    """The engine's general path, a step per store: what the one job must equal."""
    arrival = Arrival(await duplicates.apply(key, ARRIVAL))
    if arrival is Arrival.REPLAY:
        return Arrived(arrival, None, await budgets.remaining(ask.budget_key, limit=ask.limit))
    charge = await budgets.charge(ask.budget_key, ask.cost, limit=ask.limit, enforce=ask.enforce)
    if not charge.allowed and (undo := refused_record(arrival)) is not None:
        await duplicates.apply(key, undo)
    return Arrived(arrival, charge, None)


ASKS = {
    "room": ChargeAsk("b", 1, 10, True),
    "refused": ChargeAsk("b", 11, 10, True),
    "observed-overspend": ChargeAsk("b", 11, 10, False),
    "unlimited": ChargeAsk("b", 1, None, True),
}


@pytest.mark.parametrize(("start", "ask"), [
    pytest.param(start, ask, id=f"{start or 'none'}-{name}") for start in STATES for name, ask in ASKS.items()])
async def test_arrival_and_charge_in_one_job_match_the_general_path(state: LocalState, start: State,
                                                                    ask: ChargeAsk) -> None:
    duplicates, budgets = MemoryDuplicateStore(), MemoryBudgetStore()
    for store in (duplicates, state.duplicates):
        await store.apply("k", _force(start))
    expected = await _general_path(duplicates, budgets, "k", ask)
    assert await state.admissions.arrive("k", ask) == expected
    after = duplicates.get("k")
    assert state.db.read_now("SELECT state FROM duplicates WHERE key = 'k'", ()) == (
        [] if after is None else [(after.value,)])
    assert await state.budgets.remaining("b", limit=ask.limit) == await budgets.remaining("b", limit=ask.limit)


async def test_attack_a_refused_call_never_leaves_a_record_that_makes_its_re_send_free(
        state: LocalState, other: LocalState) -> None:
    poor = ChargeAsk("poor", 5, 1, True)
    for _ in range(3):  # each copy, in either process, is refused as a new call: none is a free re-send
        for local in (state, other):
            arrived = await local.admissions.arrive("k", poor)
            assert arrived.arrival is Arrival.FIRST
            assert arrived.charge == Charge(False, 1, exceeded=True)
    assert state.db.read_now("SELECT count(*) FROM duplicates", ()) == [(0,)]


async def test_a_record_written_behind_is_seen_by_the_next_job_and_survives_a_restart(tmp_path: Path) -> None:
    first = LocalState.open(tmp_path / "state")
    assert (await first.admissions.arrive("k", ASKS["room"])).arrival is Arrival.FIRST
    first.duplicates.apply_behind("k", FIRST_SETTLED[True])  # settled: the record goes, nobody waits for it
    assert (await first.admissions.arrive("k", ASKS["room"])).arrival is Arrival.FIRST  # a new call, charged
    first.duplicates.apply_behind("k", FIRST_SETTLED[True])
    await first.aclose()  # the process stops: what was queued is written before the database closes
    restarted = LocalState.open(tmp_path / "state")
    try:
        arrived = await restarted.admissions.arrive("k", ASKS["room"])
        assert arrived.arrival is Arrival.FIRST  # not a free re-send of a call that already settled
        assert arrived.charge == Charge(True, 7)
    finally:
        await restarted.aclose()
