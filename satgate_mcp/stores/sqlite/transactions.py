"""How the state database runs work: transactions of batched jobs, each job undoing only itself on failure.

Kept apart from ``Database`` (which decides when and where a batch runs: the loop or the worker thread)
so the transaction rules can be read, and tested, on a bare connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import structlog

_log = structlog.get_logger("satgate_mcp.state")
T = TypeVar("T")


class StateError(Exception):
    """The state folder cannot be used (message says why); at start this is a configuration error."""


def connect(path: Path, *, busy_timeout: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":  # pragma: no cover - a filesystem without shared memory (NFS)
        conn.close()
        raise StateError(f"{path}: SQLite could not use WAL here (journal mode {mode})")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


class immediate:
    """One read-modify-write transaction: the write lock is taken first, so no other writer interleaves.

    Inside a batch's transaction (the usual case) the batch already holds the lock, so this adds
    nothing. A class, not a generator: it is entered twice a call.
    """

    __slots__ = ("_began", "_conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._began = False

    def __enter__(self) -> sqlite3.Connection:
        if not self._conn.in_transaction:
            self._conn.execute("BEGIN IMMEDIATE")
            self._began = True
        return self._conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        if not self._began:
            return
        if kind is None:
            self._conn.execute("COMMIT")
        elif self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


Job = Callable[[sqlite3.Connection], Any]
#: A queued job and the future that wants its result (None: write-behind).
Queued = tuple[Job, "asyncio.Future[Any] | None"]
Outcome = tuple[Any, BaseException | None]
Result = tuple["asyncio.Future[Any]", Any, BaseException | None]
#: Most jobs one transaction carries: bounds how long the write lock is held.
MAX_BATCH = 64
#: The loop's connection never checkpoints (a checkpoint syncs the disk); the worker does, this often (about
#: SQLite's own default of a thousand pages).
CHECKPOINT_EVERY_COMMITS = 250
#: How long a write nobody waits for may wait for company: a job asked for meanwhile takes it along in its
#: transaction, so under load a settled call's record costs no commit of its own, and a lone one commits after
#: the answer has gone out rather than beside it.
WRITE_BEHIND_SECONDS = 0.005
#: Expired rows deleted in one pass, per table.
PURGE_BATCH = 500
#: Tables with expiring rows, and their keys.
PURGED = (("budgets", "key"), ("duplicates", "key"), ("tombstones", "session_id"), ("spend_sums", "key"),
          ("spend_holds", "key"), ("approvals", "id"), ("authorizations", "state"))
#: SQLite's primary result codes for "another connection holds the lock".
BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED


class Abandoned(Exception):
    """A job whose caller gave up before it began: it does nothing (its savepoint undoes nothing)."""


class Claim:
    """Who has a job first: the transaction that begins it, or its caller giving up on it (a timeout). Taken under a
    lock, since the worker thread begins jobs while the loop's caller may give up."""

    __slots__ = ("_lock", "_state")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = 0  # 0 waiting, 1 begun, 2 abandoned

    def begin(self) -> bool:
        """The job may run: it was not abandoned (a rerun under savepoints begins it again)."""
        with self._lock:
            if self._state == 2:
                return False
            self._state = 1
            return True

    def abandon(self) -> bool:
        """The caller gives up: True when the job had not begun (it never will)."""
        with self._lock:
            if self._state == 1:
                return False
            self._state = 2
            return True

    def guard(self, fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
        def claimed(conn: sqlite3.Connection) -> T:
            if not self.begin():
                raise Abandoned()
            return fn(conn)
        return claimed


class Maintenance:
    """A worker chore outside the ordered jobs: checkpoint the WAL (expired rows are the loop's to purge)."""


MAINTAIN = Maintenance()


def deliver(results: list[Result]) -> None:
    for future, value, exc in results:
        if future.cancelled():
            continue  # its caller went away; the job itself ran (or not) atomically
        if exc is None:
            future.set_result(value)
        else:
            future.set_exception(exc)


def results_for(batch: list[Queued], outcomes: list[Outcome]) -> list[Result]:
    """What the waiting callers get; a write nobody waits for that failed is logged here instead."""
    results: list[Result] = []
    for (_, future), (value, error) in zip(batch, outcomes, strict=True):
        if future is not None:
            results.append((future, value, error))
        elif error is not None:
            _log.error("state_write_failed", error=f"{type(error).__name__}: {error}")
    return results


def is_busy(exc: sqlite3.Error) -> bool:
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in BUSY_CODES


def transact(conn: sqlite3.Connection, batch: list[Queued]) -> list[Outcome]:
    """Every job of ``batch`` in one transaction, skipping those whose caller already went away. Raises the
    sqlite3.Error of BEGIN or COMMIT (rolled back: then no job happened).

    Jobs are functions of the database alone, so the batch first runs as it is; only when a job fails is
    it all rolled back and run again with each job under its own savepoint, so that the failing job
    undoes only itself (two statements a job saved on the usual path).
    """
    try:
        conn.execute("BEGIN IMMEDIATE")  # with the lock held elsewhere, this is where the wait (or BUSY) is
        outcomes, failure = run_jobs(conn, batch, savepoints=False)
        if failure is not None:
            conn.execute("ROLLBACK")
            if len(batch) == 1:  # nothing else to keep: the failure is the outcome
                return [(None, failure)]
            conn.execute("BEGIN IMMEDIATE")
            outcomes, _ = run_jobs(conn, batch, savepoints=True)
        conn.execute("COMMIT")
    except sqlite3.Error:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return outcomes


def run_jobs(conn: sqlite3.Connection, batch: list[Queued], *, savepoints: bool
              ) -> tuple[list[Outcome], BaseException | None]:
    """Each job's outcome. Without ``savepoints`` it stops at the first failure and returns it too (the
    caller rolls the transaction back); with them a failing job undoes only itself."""
    outcomes: list[Outcome] = []
    for job, future in batch:
        # Read across threads on purpose: a caller that gave up cancelled its future; skip its job.
        if future is not None and future.cancelled():
            outcomes.append((None, None))
            continue
        if not savepoints:
            try:
                outcomes.append((job(conn), None))
            except Exception as exc:
                return outcomes, exc
            continue
        conn.execute("SAVEPOINT job")
        try:
            outcomes.append((job(conn), None))
        except Exception as exc:
            conn.execute("ROLLBACK TO job")
            outcomes.append((None, exc))
        conn.execute("RELEASE job")
    return outcomes, None


