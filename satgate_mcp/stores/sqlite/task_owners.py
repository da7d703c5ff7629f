"""Task owners in the state database: every process on the folder, and every restart, knows whose task is whose.

One row per task; a note also deletes the rows whose time is up (there are few: one per task created).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from satgate_mcp.stores.sqlite.database import Database
from satgate_mcp.stores.sqlite.transactions import immediate
from satgate_mcp.task_ids import TaskRef
from satgate_mcp.task_owners import Owner


class SqliteTaskOwners:
    """``TaskOwnerStore`` on the state database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def note(self, ref: TaskRef, owner: Owner, ttl: float) -> None:
        now = self._db.clock()

        def note(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                conn.execute("DELETE FROM task_owners WHERE expires <= ?", (now,))
                conn.execute("INSERT OR REPLACE INTO task_owners (upstream, task_id, token_id, session_id, expires) "
                             "VALUES (?, ?, ?, ?, ?)", (ref.upstream, ref.task_id, owner[0], owner[1], now + ttl))

        await self._db.run(note)

    async def owners(self, refs: Sequence[TaskRef]) -> dict[TaskRef, Owner]:
        now = self._db.clock()

        def owners(conn: sqlite3.Connection) -> dict[TaskRef, Owner]:
            found: dict[TaskRef, Owner] = {}
            for ref in refs:
                row = conn.execute("SELECT token_id, session_id FROM task_owners WHERE upstream = ? AND task_id = ? "
                                   "AND expires > ?", (ref.upstream, ref.task_id, now)).fetchone()
                if row is not None:
                    found[ref] = (str(row[0]), str(row[1]))
            return found

        return await self._db.run(owners) if refs else {}
