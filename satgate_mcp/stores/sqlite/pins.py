"""Pinned tool definitions in the state database: every process on the folder, and every restart, agrees.

Each pin is one row holding its record as JSON (the tables are in the database's schema); a read-modify-write
is one ``immediate`` transaction, and every write moves a version counter (``counters``, row ``pins``) that
processes poll to pick up approvals made by ``tools approve``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from satgate_mcp.policy.pins import Change, Pin
from satgate_mcp.stores.sqlite.database import Database
from satgate_mcp.stores.sqlite.transactions import immediate


def _bump(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO counters (name, value) VALUES ('pins', 1) "
                 "ON CONFLICT (name) DO UPDATE SET value = value + 1")


def _get(conn: sqlite3.Connection, upstream: str, tool: str) -> Pin | None:
    row = conn.execute("SELECT record FROM pins WHERE upstream = ? AND tool = ?", (upstream, tool)).fetchone()
    return None if row is None else Pin.from_json(row[0])


def _put(conn: sqlite3.Connection, pin: Pin) -> None:
    conn.execute("INSERT OR REPLACE INTO pins (upstream, tool, record) VALUES (?, ?, ?)",
                 (pin.upstream, pin.tool, pin.to_json()))


class SqlitePinStore:
    """``PinStore`` on the state database."""

    def __init__(self, db: Database, *, owns_db: bool = False) -> None:
        self._db = db
        self._owns_db = owns_db

    async def pins(self) -> list[Pin]:
        rows = await self._db.run(lambda conn: conn.execute("SELECT record FROM pins ORDER BY upstream, tool")
                                  .fetchall())
        return [Pin.from_json(row[0]) for row in rows]

    async def version(self) -> int:
        rows = await self._db.run(lambda conn: conn.execute("SELECT value FROM counters WHERE name = 'pins'")
                                  .fetchall())
        return int(rows[0][0]) if rows else 0

    async def first_pinning(self, upstream: str, pins: Sequence[Pin]) -> bool:
        now = self._db.clock()

        def first(conn: sqlite3.Connection) -> bool:
            with immediate(conn):
                if conn.execute("INSERT OR IGNORE INTO pinned_upstreams (upstream, first_pinned) VALUES (?, ?)",
                                (upstream, now)).rowcount == 0:
                    return False
                conn.executemany("INSERT OR IGNORE INTO pins (upstream, tool, record) VALUES (?, ?, ?)",
                                 [(pin.upstream, pin.tool, pin.to_json()) for pin in pins])
                _bump(conn)
                return True

        return await self._db.run(first)

    async def update(self, upstream: str, tool: str, change: Change) -> tuple[Pin | None, Pin | None]:
        def update(conn: sqlite3.Connection) -> tuple[Pin | None, Pin | None]:
            with immediate(conn):
                before = _get(conn, upstream, tool)
                after = change(before)
                if after is None:
                    return before, before
                _put(conn, after)
                _bump(conn)
                return before, after

        return await self._db.run(update)

    async def aclose(self) -> None:
        if self._owns_db:
            await self._db.aclose()
