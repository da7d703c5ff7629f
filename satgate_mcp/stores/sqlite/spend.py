"""Spend-limit sums in the state database: every process on the folder, and every restart, sees one sum.

A reservation is one ``immediate`` transaction (checks every sum, adds to all or none, records the hold), and
its answer comes back only after the commit: a call is forwarded only once its amount is on disk, so a
``SIGKILL`` between reservation and answer loses nothing (the amount stays reserved; the call may have run).
Amounts are integer micro-units (SQLite INTEGER: exact).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from satgate_mcp.policy.spend import RESERVATION_TTL_SECONDS, Charge, Reservation
from satgate_mcp.stores.sqlite.database import Database
from satgate_mcp.stores.sqlite.transactions import immediate


def _sum(conn: sqlite3.Connection, counter: str, now: float) -> int:
    row = conn.execute("SELECT total FROM spend_sums WHERE key = ? AND expires > ?", (counter, now)).fetchone()
    return int(row[0]) if row is not None else 0


class SqliteSpendStore:
    """``SpendStore`` on the state database (its tables are in the database's schema)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def reserve(self, key: str, charges: Sequence[Charge], now: float) -> Reservation:
        def reserve(conn: sqlite3.Connection) -> Reservation:
            with immediate(conn):
                if conn.execute("SELECT 1 FROM spend_holds WHERE key = ? AND expires > ?", (key, now)).fetchone():
                    return Reservation(duplicate=True)
                totals = [_sum(conn, charge.counter, now) for charge in charges]
                for i, (charge, total) in enumerate(zip(charges, totals, strict=True)):
                    if total + charge.amount > charge.limit:
                        return Reservation(exceeded=i, total=total)
                for charge, total in zip(charges, totals, strict=True):
                    conn.execute("INSERT OR REPLACE INTO spend_sums (key, total, expires) VALUES (?, ?, ?)",
                                 (charge.counter, total + charge.amount, charge.expires_at))
                held = json.dumps([[c.counter, c.amount] for c in charges])
                conn.execute("INSERT OR REPLACE INTO spend_holds (key, charges, expires) VALUES (?, ?, ?)",
                             (key, held, now + RESERVATION_TTL_SECONDS))
                return Reservation()

        return await self._db.run(reserve)

    async def release(self, key: str, charges: Sequence[Charge]) -> None:
        now = self._db.clock()

        def release(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                row = conn.execute("DELETE FROM spend_holds WHERE key = ? RETURNING charges", (key,)).fetchone()
                if row is None:
                    return
                for counter, amount in json.loads(row[0]):
                    conn.execute("UPDATE spend_sums SET total = MAX(0, total - ?) WHERE key = ? AND expires > ?",
                                 (int(amount), counter, now))

        await self._db.run(release)

    async def settle(self, key: str) -> None:
        await self._db.run(lambda conn: conn.execute("DELETE FROM spend_holds WHERE key = ?", (key,)))

    async def total(self, counter: str) -> int:
        now = self._db.clock()
        return await self._db.run(lambda conn: _sum(conn, counter, now))

    async def close(self) -> None:
        return None  # the database is the state's, closed with it
