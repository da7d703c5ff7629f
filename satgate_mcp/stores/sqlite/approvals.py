"""Held calls in the state database: every process on the folder, and every restart, sees one record.

A record is one row (its JSON beside the columns a lookup needs); each operation is one ``immediate``
transaction, so two processes deciding, or consuming, one approval at once cannot both win. ``expires`` is
when the row may be purged (the record's grace past its expiry), ``until`` the approval's own expiry.
"""

from __future__ import annotations

import sqlite3

from satgate_mcp.policy.approvals import (
    Decision,
    HeldCall,
    HoldOutcome,
    consumption,
    decision,
    kept_until,
    repeat,
)
from satgate_mcp.stores.sqlite.database import Database
from satgate_mcp.stores.sqlite.transactions import immediate


def _put(conn: sqlite3.Connection, record: HeldCall, *, bound: bool) -> None:
    conn.execute("INSERT OR REPLACE INTO approvals (id, fingerprint, family, state, bound, created, until, expires, "
                 "record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (record.id, record.fingerprint, record.family_id, record.state, int(bound), record.created_at,
                  record.expires_at, kept_until(record), record.to_json()))


def _get(conn: sqlite3.Connection, approval_id: str, now: float) -> HeldCall | None:
    row = conn.execute("SELECT record FROM approvals WHERE id = ? AND expires > ?", (approval_id, now)).fetchone()
    return None if row is None else HeldCall.from_json(row[0])


class SqliteApprovalStore:
    """``ApprovalStore`` on the state database (its table is in the database's schema)."""

    def __init__(self, db: Database, *, owns_db: bool = False) -> None:
        self._db = db
        self._owns_db = owns_db

    async def hold(self, request: HeldCall, now: float, per_family: int) -> HoldOutcome:
        def hold(conn: sqlite3.Connection) -> HoldOutcome:
            with immediate(conn):
                row = conn.execute("SELECT record FROM approvals WHERE fingerprint = ? AND bound = 1 AND expires > ?",
                                   (request.fingerprint, now)).fetchone()
                current = None if row is None else HeldCall.from_json(row[0])
                pending = conn.execute("SELECT COUNT(*) FROM approvals WHERE family = ? AND state = 'pending' "
                                       "AND until > ?", (request.family_id, now)).fetchone()[0]
                outcome, keep = repeat(current, request, now, int(pending), per_family)
                if current is not None and keep is None:
                    changed = outcome.record if outcome.found == "approved" and outcome.record else current
                    _put(conn, changed, bound=False)
                if keep is not None:
                    _put(conn, keep, bound=True)
                return outcome

        return await self._db.run(hold)

    async def get(self, approval_id: str) -> HeldCall | None:
        now = self._db.clock()
        return await self._db.run(lambda conn: _get(conn, approval_id, now))

    async def consume(self, approval_id: str, now: float) -> HeldCall | None:
        def consume(conn: sqlite3.Connection) -> HeldCall | None:
            with immediate(conn):
                consumed = consumption(_get(conn, approval_id, now), now)
                if consumed is not None:
                    _put(conn, consumed, bound=False)
                return consumed

        return await self._db.run(consume)

    async def decide(self, approval_id: str, approve: bool, by: str, note: str | None, now: float) -> Decision:
        def decide(conn: sqlite3.Connection) -> Decision:
            with immediate(conn):
                current = _get(conn, approval_id, now)
                result, store = decision(current, approve, by, note, now)
                if store is not None:
                    bound = conn.execute("SELECT bound FROM approvals WHERE id = ?", (approval_id,)).fetchone()
                    _put(conn, store, bound=bool(bound and bound[0]))
                return result

        return await self._db.run(decide)

    async def listing(self, now: float, limit: int = 200) -> list[HeldCall]:
        rows = await self._db.run(lambda conn: conn.execute(
            "SELECT record FROM approvals WHERE expires > ? ORDER BY created DESC LIMIT ?", (now, limit)).fetchall())
        return [HeldCall.from_json(row[0]) for row in rows]

    async def close(self) -> None:
        if self._owns_db:
            await self._db.aclose()
