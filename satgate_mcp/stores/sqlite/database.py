"""The embedded durable store: one SQLite database (WAL) in the state folder.

Durable across restarts and SIGKILL with no server to run, and safe for several processes on one
folder at once (a handover, two gateways on one machine): WAL lets readers run beside the one
writer, every read-modify-write is one short ``BEGIN IMMEDIATE`` transaction, and ``busy_timeout``
makes a writer wait its turn instead of failing. No lock is ever held between statements, and none
is exclusive for longer than one transaction.

Statements run on the event loop, on a connection that never waits for a lock (``busy_timeout`` 0)
and never checkpoints: what could block is handed to one worker thread instead. A batch that finds
the write lock taken goes to the worker, which waits for it; checkpoints (they sync the disk) are the
worker's. Commits use ``synchronous=NORMAL``: a committed transaction is in the WAL (a write to the
page cache, no sync) and survives the process being killed; only a power loss can lose the last ones.

Stored times are wall-clock seconds: they must mean the same after a restart and in another process.

Faults (the database locked by another process past ``busy_timeout``, unwritable, corrupt) are store
faults like a Redis outage: the caller bounds its wait (the policy's store time), and a job whose
caller stopped waiting before its transaction reached it is dropped, never run later: a call refused
with 503 is not charged once the lock goes away. (A job already started completes; its caller, if it
gave up in that instant, was refused anyway.)
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog

from satgate_mcp.loops import running_loop
from satgate_mcp.stores.sqlite.transactions import (
    CHECKPOINT_EVERY_COMMITS,
    MAINTAIN,
    MAX_BATCH,
    PURGE_BATCH,
    PURGED,
    WRITE_BEHIND_SECONDS,
    Claim,
    Maintenance,
    Queued,
    Result,
    StateError,
    connect,
    deliver,
    immediate,
    is_busy,
    results_for,
    transact,
)

T = TypeVar("T")

DB_NAME = "satgate.db"
SCHEMA_VERSION = 1
#: How long a writer waits for another process's transaction before giving up.
BUSY_TIMEOUT_SECONDS = 5.0
#: How long a revocation lookup waits for the database's news before answering from what it holds.
REFRESH_WAIT_SECONDS = 0.5
#: The one read on the event loop (a resume's tombstone lookup) waits at most this long.
LOOP_READ_TIMEOUT_SECONDS = 0.05
#: Expired rows (child budgets, duplicate records, tombstones) are deleted at most this often.
PURGE_INTERVAL_SECONDS = 60.0

_SCHEMA = f"""
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS budgets (
  key TEXT PRIMARY KEY, lim REAL NOT NULL, spent REAL NOT NULL, expires REAL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS budgets_expiring ON budgets (expires) WHERE expires IS NOT NULL;
CREATE TABLE IF NOT EXISTS duplicates (
  key TEXT PRIMARY KEY, state TEXT NOT NULL, expires REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS duplicates_expiring ON duplicates (expires);
CREATE TABLE IF NOT EXISTS tombstones (session_id TEXT PRIMARY KEY, expires REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tombstones_expiring ON tombstones (expires);
CREATE TABLE IF NOT EXISTS revocations (seq INTEGER PRIMARY KEY, token_id TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS pins (
  upstream TEXT NOT NULL, tool TEXT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (upstream, tool)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pinned_upstreams (upstream TEXT PRIMARY KEY, first_pinned REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS spend_sums (key TEXT PRIMARY KEY, total INTEGER NOT NULL, expires REAL NOT NULL)
  WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS spend_sums_expiring ON spend_sums (expires);
CREATE TABLE IF NOT EXISTS spend_holds (key TEXT PRIMARY KEY, charges TEXT NOT NULL, expires REAL NOT NULL)
  WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS spend_holds_expiring ON spend_holds (expires);
CREATE TABLE IF NOT EXISTS approvals (
  id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, family TEXT NOT NULL, state TEXT NOT NULL, bound INTEGER NOT NULL,
  created REAL NOT NULL, until REAL NOT NULL, expires REAL NOT NULL, record TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS approvals_bound ON approvals (fingerprint) WHERE bound = 1;
CREATE INDEX IF NOT EXISTS approvals_family ON approvals (family, state);
CREATE INDEX IF NOT EXISTS approvals_expiring ON approvals (expires);
CREATE TABLE IF NOT EXISTS authorizations (
  state TEXT PRIMARY KEY, owner TEXT NOT NULL, waiting INTEGER NOT NULL, until REAL NOT NULL, expires REAL NOT NULL,
  record TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS authorizations_owner ON authorizations (owner, waiting);
CREATE INDEX IF NOT EXISTS authorizations_expiring ON authorizations (expires);
CREATE TABLE IF NOT EXISTS grants (
  owner TEXT NOT NULL, upstream TEXT NOT NULL, grant_id TEXT NOT NULL, record TEXT NOT NULL,
  PRIMARY KEY (owner, upstream)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS task_owners (
  upstream TEXT NOT NULL, task_id TEXT NOT NULL, token_id TEXT NOT NULL, session_id TEXT NOT NULL,
  expires REAL NOT NULL, PRIMARY KEY (upstream, task_id)) WITHOUT ROWID;
PRAGMA user_version = {SCHEMA_VERSION};
COMMIT;
"""

_log = structlog.get_logger("satgate_mcp.state")



class Database:
    """The state folder's database: jobs run on the event loop's own connection, once per turn of the loop.

    Everything asked for in one turn commits in one transaction (a failing job undoes only itself:
    ``transact``), and results are handed back only after the commit, so an
    answered charge is on disk; a write nobody waits for waits up to ``WRITE_BEHIND_SECONDS`` for a
    job to share a transaction with. A commit in WAL mode with ``synchronous=NORMAL`` is a write to the
    page cache, cheaper than handing the job to a thread and back (two context switches, and on one
    core the whole of a call's latency waits for them). Only when another connection holds the write
    lock (another process on the folder, a checkpoint) does a batch go to the worker thread, which
    waits its turn with ``busy_timeout``; until the worker has finished, later jobs follow it there,
    so one process's jobs always run in the order asked. The worker also checkpoints the WAL (never
    the loop: a checkpoint syncs the disk); the loop purges expired rows, a bounded number at a time.
    """

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        #: Wall clock of every stored expiry.
        self.clock = clock
        try:
            self._conn = connect(path, busy_timeout=BUSY_TIMEOUT_SECONDS)
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                self._conn.close()
                raise StateError(f"{path} was written by a newer satgate-mcp (schema {version})")
            self._conn.executescript(_SCHEMA)
            self._reader = connect(path, busy_timeout=LOOP_READ_TIMEOUT_SECONDS)
            self._loop_conn = connect(path, busy_timeout=0.0)
            self._loop_conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.Error as exc:
            raise StateError(f"{path}: {exc}") from None
        #: The worker's jobs, each marked whether the loop counts it in ``_on_worker``.
        self._queue: queue.SimpleQueue[tuple[Queued, bool] | Maintenance | None] = queue.SimpleQueue()
        self._next_purge = 0.0
        self._closed = False
        #: Jobs asked for and not yet run, run together at the end of this turn of the loop (or, when none
        #: waits for its result, a little later).
        self._turn: list[Queued] = []
        self._armed: asyncio.Handle | None = None
        self._soon = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Jobs handed to the worker and not yet finished: while there are any, new jobs follow them.
        self._on_worker = 0
        self._commits = 0
        self._thread = threading.Thread(target=self._work, name="satgate-state", daemon=True)
        self._thread.start()

    # --- the loop's side ------------------------------------------------------------------------

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` atomic and committed when it returns; one process's jobs run in order.

        Cancelling the wait (a timeout) drops the job when it has not begun: it never runs, so the caller's store
        fault is the truth. A job that has begun is in a transaction about to commit or roll back (it holds the
        write lock by then): the wait goes on to its answer, which is returned, so a charge that landed is never
        reported as a fault (no answer is lost, and no ledger is needed)."""
        if self._closed:
            raise StateError(f"{self.path} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        claim = Claim()
        self._ask((claim.guard(fn), future), loop)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if claim.abandon():
                future.cancel()
                raise
        while True:  # begun: its answer comes within moments, and it is what happened
            with contextlib.suppress(asyncio.CancelledError):
                return await asyncio.shield(future)

    def submit(self, fn: Callable[[sqlite3.Connection], object]) -> None:
        """Write behind: after every job already asked for; a failure is logged."""
        if self._closed:
            return
        loop = running_loop()
        if loop is None:  # no loop in this thread: the worker keeps the order for such callers
            self._queue.put(((fn, None), False))
            return
        self._ask((fn, None), loop)

    def _ask(self, job: Queued, loop: asyncio.AbstractEventLoop) -> None:
        if self._on_worker:
            self._to_worker([job])
            return
        self._loop = loop
        self._turn.append(job)
        if job[1] is None:  # written behind: it may wait a little for company
            if self._armed is None:
                self._armed = loop.call_later(WRITE_BEHIND_SECONDS, self._run_turn)
        elif not self._soon:
            if self._armed is not None:
                self._armed.cancel()
            self._armed = loop.call_soon(self._run_turn)
            self._soon = True

    def _run_turn(self) -> None:
        """The jobs asked for in one transaction on the loop's connection, or, behind a lock, on the worker."""
        if self._armed is not None:
            self._armed.cancel()
        self._armed, self._soon = None, False
        batch, self._turn = self._turn, []
        if not batch:
            return
        if self._on_worker:  # a batch went to the worker since these were asked for: keep the order
            self._to_worker(batch)
            return
        committed = False
        try:
            outcomes = transact(self._loop_conn, batch)
            committed = True
        except sqlite3.Error as exc:
            if is_busy(exc):
                self._to_worker(batch)
                return
            outcomes = [(None, exc)] * len(batch)  # the database failed: no job of the batch happened
        deliver(results_for(batch, outcomes))
        if committed:  # housekeeping after the answers: the worker checkpoints, expired rows go now and then
            self._commits += 1
            if self._commits % CHECKPOINT_EVERY_COMMITS == 0:
                self._queue.put(MAINTAIN)
            self._purge_if_due(self._loop_conn)

    def _to_worker(self, jobs: list[Queued]) -> None:
        self._on_worker += len(jobs)
        for job in jobs:
            self._queue.put((job, True))

    def _worker_finished(self, count: int) -> None:
        self._on_worker -= count

    # --- the worker's side ----------------------------------------------------------------------

    def _work(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch: list[Queued] = []
            counted = 0
            maintain = False
            item: tuple[Queued, bool] | Maintenance | None = first
            while True:
                if isinstance(item, Maintenance):
                    maintain = True
                else:
                    assert item is not None
                    batch.append(item[0])
                    counted += item[1]
                if len(batch) >= MAX_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
            if batch:
                self._run_batch(batch, counted)
            if maintain:
                self._checkpoint()
        self._conn.close()

    def _run_batch(self, batch: list[Queued], counted: int) -> None:
        try:
            outcomes = transact(self._conn, batch)
        except sqlite3.Error as exc:  # the lock or the commit failed: no job of the batch happened
            outcomes = [(None, exc)] * len(batch)
        by_loop: dict[asyncio.AbstractEventLoop, list[Result]] = {}
        for result in results_for(batch, outcomes):
            by_loop.setdefault(result[0].get_loop(), []).append(result)
        for loop, results in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile wants nothing
                loop.call_soon_threadsafe(deliver, results)
        if counted and self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._worker_finished, counted)

    def _checkpoint(self) -> None:
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # housekeeping only
            _log.warning("state_checkpoint_failed", error=f"{type(exc).__name__}: {exc}")

    def _purge_if_due(self, conn: sqlite3.Connection) -> None:
        """Delete expired rows, at most ``PURGE_BATCH`` a table at a time (on the loop: a pass stays short);
        when a table had more, or the lock was elsewhere, the next pass is due at once."""
        now = self.clock()
        if now < self._next_purge:
            return
        self._next_purge = now + PURGE_INTERVAL_SECONDS
        try:
            with immediate(conn):
                for table, key in PURGED:
                    deleted = conn.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} "
                                           "WHERE expires <= ? LIMIT ?)", (now, PURGE_BATCH)).rowcount
                    if deleted >= PURGE_BATCH:
                        self._next_purge = now
        except sqlite3.Error as exc:  # housekeeping only: never fails a job (busy: the next pass does it)
            if not is_busy(exc):
                _log.warning("state_purge_failed", error=f"{type(exc).__name__}: {exc}")
            self._next_purge = now

    async def usable(self, timeout: float) -> bool:
        """``/readyz``'s look: a job through the write lock within ``timeout``; never raises."""
        try:
            async with asyncio.timeout(timeout):
                await self.run(lambda conn: conn.execute("SELECT 1 FROM budgets LIMIT 1").fetchall())
        except (sqlite3.Error, StateError, TimeoutError):
            return False
        return True

    def read_now(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """A read on the caller's own thread (the event loop): only for rare point lookups and start-up."""
        return self._reader.execute(sql, params).fetchall()

    async def aclose(self) -> None:
        """Let the jobs asked for finish, then close every connection."""
        if self._closed:
            return
        self._closed = True
        self._run_turn()  # what this turn asked for, written now (or handed to the worker, which runs it first)
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)
        self._reader.close()
        self._loop_conn.close()


