"""The stores over the state database: budgets, duplicate records, admissions, tombstones, revocations.

Each read-modify-write is one job (``Database.run``) in one ``immediate`` transaction, so two processes
on one folder never interleave inside a charge. A job's function takes the connection and nothing
else: the same function runs on the loop's connection or the worker's.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import structlog

from satgate_mcp.auth.revocation import DEFAULT_CHECK_INTERVAL, check_token_id
from satgate_mcp.policy.admissions import Arrived, ChargeAsk, refused_record
from satgate_mcp.policy.budget import Charge, decide
from satgate_mcp.policy.duplicates import ARRIVAL, DUPLICATE_TTL_SECONDS, Arrival, Record, State, Table
from satgate_mcp.stores.sqlite.database import REFRESH_WAIT_SECONDS, Database
from satgate_mcp.stores.sqlite.transactions import StateError, immediate

_log = structlog.get_logger("satgate_mcp.state")


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
        charge, spent_after = decide(lim, spent, cost, enforce=enforce)
        if charge.allowed:
            _put_account(conn, key, (lim, spent_after, expires))
        return charge


def remaining_in(conn: sqlite3.Connection, key: str, *, limit: float | None, now: float) -> float | None:
    account = _live_account(conn, key, now)
    return limit if account is None else account[0] - account[1]


class SqliteBudgetStore:
    """``BudgetStore`` on the state database: one transaction per charge or transfer.

    An unlimited budget never gets a row: its charge is a read that finds none.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool,
                     charge_id: str = "") -> Charge:
        now = self._db.clock
        return await self._db.run(lambda conn: charge_in(conn, key, cost, limit=limit, enforce=enforce, now=now()))

    async def refund(self, key: str, amount: float, *, refund_id: str = "") -> None:
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
                taken = Charge(True, None)
                if account is not None:
                    lim, spent, expires = account
                    taken, spent_after = decide(lim, spent, amount, enforce=True)
                    _put_account(conn, parent, (lim, spent_after, expires))  # a budget starts on first use
                    if not taken.allowed:
                        return taken
                _put_account(conn, child, (amount, 0.0, None if ttl is None else now + ttl))
                return taken

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

    def start(self) -> None:
        return None  # nothing to follow

    async def aclose(self) -> None:
        if self._owns_db:
            await self._db.aclose()
