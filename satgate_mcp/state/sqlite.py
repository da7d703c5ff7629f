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
from types import TracebackType
from typing import Any, TypeVar

import structlog

from satgate_mcp.auth.revocation import DEFAULT_CHECK_INTERVAL, check_token_id
from satgate_mcp.loops import running_loop
from satgate_mcp.policy.admissions import Arrived, ChargeAsk, refused_record
from satgate_mcp.policy.budget import EPSILON, Charge
from satgate_mcp.policy.duplicates import ARRIVAL, DUPLICATE_TTL_SECONDS, Arrival, Record, State, Table

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
PRAGMA user_version = {SCHEMA_VERSION};
COMMIT;
"""

_log = structlog.get_logger("satgate_mcp.state")


class StateError(Exception):
    """The state folder cannot be used (message says why); at start this is a configuration error."""


def _connect(path: Path, *, busy_timeout: float) -> sqlite3.Connection:
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
_PURGED = (("budgets", "key"), ("duplicates", "key"), ("tombstones", "session_id"))
#: SQLite's primary result codes for "another connection holds the lock".
_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED


class _Maintenance:
    """A worker chore outside the ordered jobs: checkpoint the WAL (expired rows are the loop's to purge)."""


_MAINTAIN = _Maintenance()


def _deliver(results: list[Result]) -> None:
    for future, value, exc in results:
        if future.cancelled():
            continue  # its caller went away; the job itself ran (or not) atomically
        if exc is None:
            future.set_result(value)
        else:
            future.set_exception(exc)


def _results(batch: list[Queued], outcomes: list[Outcome]) -> list[Result]:
    """What the waiting callers get; a write nobody waits for that failed is logged here instead."""
    results: list[Result] = []
    for (_, future), (value, error) in zip(batch, outcomes, strict=True):
        if future is not None:
            results.append((future, value, error))
        elif error is not None:
            _log.error("state_write_failed", error=f"{type(error).__name__}: {error}")
    return results


def _busy(exc: sqlite3.Error) -> bool:
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _BUSY_CODES


def _transact(conn: sqlite3.Connection, batch: list[Queued]) -> list[Outcome]:
    """Every job of ``batch`` in one transaction, skipping those whose caller already went away. Raises the
    sqlite3.Error of BEGIN or COMMIT (rolled back: then no job happened).

    Jobs are functions of the database alone, so the batch first runs as it is; only when a job fails is
    it all rolled back and run again with each job under its own savepoint, so that the failing job
    undoes only itself (two statements a job saved on the usual path).
    """
    try:
        conn.execute("BEGIN IMMEDIATE")  # with the lock held elsewhere, this is where the wait (or BUSY) is
        outcomes, failure = _run_jobs(conn, batch, savepoints=False)
        if failure is not None:
            conn.execute("ROLLBACK")
            if len(batch) == 1:  # nothing else to keep: the failure is the outcome
                return [(None, failure)]
            conn.execute("BEGIN IMMEDIATE")
            outcomes, _ = _run_jobs(conn, batch, savepoints=True)
        conn.execute("COMMIT")
    except sqlite3.Error:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return outcomes


def _run_jobs(conn: sqlite3.Connection, batch: list[Queued], *, savepoints: bool
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


class Database:
    """The state folder's database: jobs run on the event loop's own connection, once per turn of the loop.

    Everything asked for in one turn commits in one transaction (a failing job undoes only itself:
    ``_transact``), and results are handed back only after the commit, so an
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
            self._conn = _connect(path, busy_timeout=BUSY_TIMEOUT_SECONDS)
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                self._conn.close()
                raise StateError(f"{path} was written by a newer satgate-mcp (schema {version})")
            self._conn.executescript(_SCHEMA)
            self._reader = _connect(path, busy_timeout=LOOP_READ_TIMEOUT_SECONDS)
            self._loop_conn = _connect(path, busy_timeout=0.0)
            self._loop_conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.Error as exc:
            raise StateError(f"{path}: {exc}") from None
        #: The worker's jobs, each marked whether the loop counts it in ``_on_worker``.
        self._queue: queue.SimpleQueue[tuple[Queued, bool] | _Maintenance | None] = queue.SimpleQueue()
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

        Cancelling the wait (a timeout) drops the job unless it has already begun."""
        if self._closed:
            raise StateError(f"{self.path} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._ask((fn, future), loop)
        return await future

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
            outcomes = _transact(self._loop_conn, batch)
            committed = True
        except sqlite3.Error as exc:
            if _busy(exc):
                self._to_worker(batch)
                return
            outcomes = [(None, exc)] * len(batch)  # the database failed: no job of the batch happened
        _deliver(_results(batch, outcomes))
        if committed:  # housekeeping after the answers: the worker checkpoints, expired rows go now and then
            self._commits += 1
            if self._commits % CHECKPOINT_EVERY_COMMITS == 0:
                self._queue.put(_MAINTAIN)
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
            item: tuple[Queued, bool] | _Maintenance | None = first
            while True:
                if isinstance(item, _Maintenance):
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
            outcomes = _transact(self._conn, batch)
        except sqlite3.Error as exc:  # the lock or the commit failed: no job of the batch happened
            outcomes = [(None, exc)] * len(batch)
        by_loop: dict[asyncio.AbstractEventLoop, list[Result]] = {}
        for result in _results(batch, outcomes):
            by_loop.setdefault(result[0].get_loop(), []).append(result)
        for loop, results in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile wants nothing
                loop.call_soon_threadsafe(_deliver, results)
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
                for table, key in _PURGED:
                    deleted = conn.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} "
                                           "WHERE expires <= ? LIMIT ?)", (now, PURGE_BATCH)).rowcount
                    if deleted >= PURGE_BATCH:
                        self._next_purge = now
        except sqlite3.Error as exc:  # housekeeping only: never fails a job (busy: the next pass does it)
            if not _busy(exc):
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


# --- budgets ------------------------------------------------------------------------------------


Account = tuple[float, float, float | None]  # limit, spent, expires (None: never)


def _live_account(conn: sqlite3.Connection, key: str, now: float) -> Account | None:
    row = conn.execute("SELECT lim, spent, expires FROM budgets WHERE key = ?", (key,)).fetchone()
    if row is None or (row[2] is not None and row[2] <= now):
        return None
    return float(row[0]), float(row[1]), row[2]


def _put_account(conn: sqlite3.Connection, key: str, account: Account) -> None:
    conn.execute("INSERT OR REPLACE INTO budgets (key, lim, spent, expires) VALUES (?, ?, ?, ?)", (key, *account))


def charge_in(conn: sqlite3.Connection, key: str, cost: float, *, limit: float | None, enforce: bool,
              now: float) -> Charge:
    """``BudgetStore.charge`` as one step of a job, on whichever connection runs its batch."""
    if limit is None and _live_account(conn, key, now) is None:
        return Charge(True, None)  # unlimited: nothing to lock, nothing to store
    with immediate(conn):
        account = _live_account(conn, key, now)
        if account is None:
            if limit is None:
                return Charge(True, None)
            account = (limit, 0.0, None)
            _put_account(conn, key, account)  # a budget starts on first use, refused or not
        lim, spent, expires = account
        exceeded = cost > lim - spent + EPSILON
        if exceeded and enforce:
            return Charge(False, lim - spent, exceeded=True)
        _put_account(conn, key, (lim, spent + cost, expires))
        return Charge(True, lim - spent - cost, exceeded=exceeded)


def remaining_in(conn: sqlite3.Connection, key: str, *, limit: float | None, now: float) -> float | None:
    account = _live_account(conn, key, now)
    return limit if account is None else account[0] - account[1]


class SqliteBudgetStore:
    """``BudgetStore`` on the state database: one transaction per charge or transfer.

    An unlimited budget never gets a row: its charge is a read that finds none.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool) -> Charge:
        now = self._db.clock
        return await self._db.run(lambda conn: charge_in(conn, key, cost, limit=limit, enforce=enforce, now=now()))

    async def refund(self, key: str, amount: float) -> None:
        def refund(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE budgets SET spent = max(0.0, spent - ?) WHERE key = ? AND "
                         "(expires IS NULL OR expires > ?)", (amount, key, self._db.clock()))

        await self._db.run(refund)

    async def remaining(self, key: str, *, limit: float | None) -> float | None:
        now = self._db.clock
        return await self._db.run(lambda conn: remaining_in(conn, key, limit=limit, now=now()))

    async def transfer(self, parent: str, child: str, amount: float, *, parent_limit: float | None,
                       ttl: float | None = None) -> Charge:
        def transfer(conn: sqlite3.Connection) -> Charge:
            now = self._db.clock()
            with immediate(conn):
                if _live_account(conn, child, now) is not None:
                    return Charge(False, None)
                account = _live_account(conn, parent, now)
                if account is None and parent_limit is not None:
                    account = (parent_limit, 0.0, None)
                left: float | None = None
                if account is not None:
                    lim, spent, expires = account
                    if amount > lim - spent + EPSILON:
                        _put_account(conn, parent, account)
                        return Charge(False, lim - spent, exceeded=True)
                    _put_account(conn, parent, (lim, spent + amount, expires))
                    left = lim - spent - amount
                _put_account(conn, child, (amount, 0.0, None if ttl is None else now + ttl))
                return Charge(True, left)

        return await self._db.run(transfer)

    async def close(self) -> None:
        return None  # the database belongs to the LocalState


# --- duplicate records ----------------------------------------------------------------------------


class SqliteDuplicateStore:
    """``DuplicateStore`` on the state database: a transition table applied in one transaction."""

    def __init__(self, db: Database, *, ttl: float = DUPLICATE_TTL_SECONDS) -> None:
        self._db = db
        self._ttl = ttl

    async def apply(self, key: str, table: Table) -> str:
        return await self._db.run(lambda conn: apply_in(conn, key, table, now=self._db.clock(), ttl=self._ttl))

    def apply_behind(self, key: str, table: Table) -> None:
        """``apply`` written behind, for a caller that needs no answer: after every job already asked for, so
        this process's next copy of the call (queued later) sees it; a failure is logged."""
        self._db.submit(lambda conn: apply_in(conn, key, table, now=self._db.clock(), ttl=self._ttl))

    async def close(self) -> None:
        return None


def apply_in(conn: sqlite3.Connection, key: str, table: Table, *, now: float, ttl: float) -> str:
    """``DuplicateStore.apply`` as one step of a job, on whichever connection runs its batch.

    The two transitions every call makes are tried first as one conditional write: a record created
    where there is none (arrival), a running record deleted (settlement). Only when that write finds
    another state does the general read-then-write run.
    """
    with immediate(conn):
        created, outcome = table[None]
        if created is not None:
            if conn.execute("INSERT INTO duplicates (key, state, expires) VALUES (?, ?, ?) ON CONFLICT (key) "
                            "DO NOTHING", (key, created.value, now + ttl)).rowcount == 1:
                return outcome
        elif table[Record.RUNNING][0] is None and conn.execute(
                "DELETE FROM duplicates WHERE key = ? AND state = ? AND expires > ?",
                (key, Record.RUNNING.value, now)).rowcount == 1:
            return table[Record.RUNNING][1]
        row = conn.execute("SELECT state, expires FROM duplicates WHERE key = ?", (key,)).fetchone()
        current: State = Record(row[0]) if row is not None and row[1] > now else None
        new, outcome = table[current]
        if new is None:
            if row is not None:
                conn.execute("DELETE FROM duplicates WHERE key = ?", (key,))
        elif new is not current:
            conn.execute("INSERT OR REPLACE INTO duplicates (key, state, expires) VALUES (?, ?, ?)",
                         (key, new.value, now + ttl))
        return outcome


# --- a guarded call's admission -----------------------------------------------------------------


class SqliteAdmissions:
    """``Admissions`` on the state database: a guarded call's arrival and its charge in one job.

    One job instead of two (three when the charge is refused), so one transaction, and a refused
    charge takes its arrival record back in that same transaction: no refused call ever leaves a
    record, even for an instant.
    """

    def __init__(self, db: Database, *, ttl: float = DUPLICATE_TTL_SECONDS) -> None:
        self._db = db
        self._ttl = ttl

    async def arrive(self, key: str, ask: ChargeAsk) -> Arrived:
        def arrive(conn: sqlite3.Connection) -> Arrived:
            now = self._db.clock()
            arrival = Arrival(apply_in(conn, key, ARRIVAL, now=now, ttl=self._ttl))
            if arrival is Arrival.REPLAY:
                return Arrived(arrival, None, remaining_in(conn, ask.budget_key, limit=ask.limit, now=now))
            charge = charge_in(conn, ask.budget_key, ask.cost, limit=ask.limit, enforce=ask.enforce, now=now)
            if not charge.allowed and (undo := refused_record(arrival)) is not None:
                apply_in(conn, key, undo, now=now, ttl=self._ttl)
            return Arrived(arrival, charge, None)

        return await self._db.run(arrive)


# --- DELETE tombstones ----------------------------------------------------------------------------


class SqliteTombstoneStore:
    """The registry's ``TombstoneStore``: DELETEs that a restart, or another process on the folder, still sees.

    ``bury`` writes behind (the registry is synchronous and answers from its own map first), in
    order, so the row is committed within milliseconds of the DELETE's answer. A process
    killed in that window loses the tombstone: the session can then be resumed by its own token,
    which grants nothing a fresh ``initialize`` would not. ``is_buried`` is a primary-key read on the
    loop; if it cannot answer, the resume is refused (a DELETE must never be undone by a fault).
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    def bury(self, session_id: str, ttl: float) -> None:
        expires = self._db.clock() + ttl
        self._db.submit(lambda conn: conn.execute(
            "INSERT OR REPLACE INTO tombstones (session_id, expires) VALUES (?, ?)", (session_id, expires)))

    def is_buried(self, session_id: str) -> bool:
        try:
            rows = self._db.read_now("SELECT expires FROM tombstones WHERE session_id = ?", (session_id,))
        except sqlite3.Error as exc:
            _log.warning("tombstone_lookup_failed", session_id=session_id, error=f"{type(exc).__name__}: {exc}")
            return True
        return bool(rows) and float(rows[0][0]) > self._db.clock()


# --- revocations ----------------------------------------------------------------------------------

_NEW_REVOCATIONS = "SELECT seq, token_id FROM revocations WHERE seq > ? ORDER BY seq"


class SqliteRevocationStore:
    """Revoked ids in the state database: what ``token revoke`` writes when nothing else is configured.

    Answers come from a set in memory, loaded at start and topped up with the rows added since
    (one indexed read, at most once per ``check_interval``, awaited by the lookup that is due, for at
    most ``wait``), so a revocation from the CLI or another process is refused within that interval.
    A database that cannot answer keeps the ids known so far. Ids never leave the set while the process
    lives, as with the revocation file.
    """

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.monotonic,
                 check_interval: float = DEFAULT_CHECK_INTERVAL, owns_db: bool = False,
                 wait: float = REFRESH_WAIT_SECONDS) -> None:
        self._db = db
        self._wait = wait
        self._clock = clock
        self._interval = check_interval
        self._owns_db = owns_db
        self._ids: set[str] = set()
        self._seq = 0
        self._failing = False
        self._absorb(db.read_now(_NEW_REVOCATIONS, (0,)))
        self._next_check = clock() + check_interval

    def __len__(self) -> int:
        return len(self._ids)

    def _absorb(self, rows: list[tuple[Any, ...]]) -> None:
        for seq, token_id in rows:
            self._ids.add(str(token_id))
            self._seq = max(self._seq, int(seq))

    async def is_revoked(self, token_id: str) -> bool:
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + self._interval
            await self.refresh()
        return token_id in self._ids

    async def refresh(self) -> None:
        """Take in what was revoked since the last look; a failing database keeps the ids known so far."""
        seq = self._seq
        try:
            async with asyncio.timeout(self._wait):  # a locked database must not hold up the token check
                rows = await self._db.run(lambda conn: conn.execute(_NEW_REVOCATIONS, (seq,)).fetchall())
        except (sqlite3.Error, StateError, TimeoutError) as exc:
            if not self._failing:
                _log.warning("revocation_state_unreadable", path=str(self._db.path),
                             error=f"{type(exc).__name__}: {exc}", kept_revoked_ids=len(self._ids))
            self._failing = True
            return
        self._failing = False
        self._absorb(rows)

    async def revoke(self, token_id: str) -> None:
        check_token_id(token_id)
        await self._db.run(lambda conn: conn.execute(
            "INSERT OR IGNORE INTO revocations (token_id) VALUES (?)", (token_id,)))
        self._ids.add(token_id)

    async def aclose(self) -> None:
        if self._owns_db:
            await self._db.aclose()
