"""Users' upstream grants and waiting authorizations in the state database: every process on the folder sees them.

An authorization is a row keyed by its state (``waiting`` is 0 once used, ``until`` its own expiry, ``expires``
when the row may be purged); a grant is a row per (owner, upstream). Each operation is one ``immediate``
transaction, so two callbacks with one state cannot both take it unused.
"""

from __future__ import annotations

import sqlite3

from satgate_mcp.oauth_grants import (
    PENDING_PER_OWNER,
    PendingAuthorization,
    StoredGrant,
    kept_until,
    taken,
)
from satgate_mcp.stores.sqlite.database import Database
from satgate_mcp.stores.sqlite.transactions import immediate


def _keep(conn: sqlite3.Connection, pending: PendingAuthorization) -> None:
    conn.execute("INSERT OR REPLACE INTO authorizations (state, owner, waiting, until, expires, record) "
                 "VALUES (?, ?, ?, ?, ?, ?)", (pending.state, pending.owner, int(not pending.used),
                                               pending.expires_at, kept_until(pending), pending.to_json()))


def _grant(conn: sqlite3.Connection, owner: str, upstream: str) -> StoredGrant | None:
    row = conn.execute("SELECT record FROM grants WHERE owner = ? AND upstream = ?", (owner, upstream)).fetchone()
    return None if row is None else StoredGrant.from_json(row[0])


class SqliteGrantStore:
    """``GrantStore`` on the state database (its tables are in the database's schema)."""

    def __init__(self, db: Database, *, owns_db: bool = False) -> None:
        self._db = db
        self._owns_db = owns_db

    async def begin(self, pending: PendingAuthorization, now: float, per_owner: int = PENDING_PER_OWNER) -> bool:
        def begin(conn: sqlite3.Connection) -> bool:
            with immediate(conn):
                waiting = conn.execute("SELECT COUNT(*) FROM authorizations WHERE owner = ? AND waiting = 1 "
                                       "AND until > ?", (pending.owner, now)).fetchone()[0]
                if int(waiting) >= per_owner:
                    return False
                _keep(conn, pending)
                return True

        return await self._db.run(begin)

    async def take(self, state: str, now: float) -> PendingAuthorization | None:
        def take(conn: sqlite3.Connection) -> PendingAuthorization | None:
            with immediate(conn):
                row = conn.execute("SELECT record FROM authorizations WHERE state = ?", (state,)).fetchone()
                found, keep = taken(None if row is None else PendingAuthorization.from_json(row[0]), now)
                if keep is not None:
                    _keep(conn, keep)
                return found

        return await self._db.run(take)

    async def put(self, grant: StoredGrant) -> None:
        await self._db.run(lambda conn: conn.execute(
            "INSERT OR REPLACE INTO grants (owner, upstream, grant_id, record) VALUES (?, ?, ?, ?)",
            (grant.owner, grant.upstream, grant.grant_id, grant.to_json())))

    async def update(self, grant: StoredGrant) -> bool:
        def update(conn: sqlite3.Connection) -> bool:
            return conn.execute("UPDATE grants SET record = ? WHERE owner = ? AND upstream = ? AND grant_id = ?",
                                (grant.to_json(), grant.owner, grant.upstream, grant.grant_id)).rowcount > 0

        return await self._db.run(update)

    async def get(self, owner: str, upstream: str) -> StoredGrant | None:
        return await self._db.run(lambda conn: _grant(conn, owner, upstream))

    async def drop(self, owner: str, upstream: str, grant_id: str) -> bool:
        def drop(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM grants WHERE owner = ? AND upstream = ? AND grant_id = ?",
                                (owner, upstream, grant_id)).rowcount > 0

        return await self._db.run(drop)

    async def revoke(self, owner: str, upstream: str | None = None) -> int:
        def revoke(conn: sqlite3.Connection) -> int:
            if upstream is None:
                return int(conn.execute("DELETE FROM grants WHERE owner = ?", (owner,)).rowcount)
            return int(conn.execute("DELETE FROM grants WHERE owner = ? AND upstream = ?",
                                    (owner, upstream)).rowcount)

        return await self._db.run(revoke)

    async def listing(self, owner: str | None = None) -> list[StoredGrant]:
        def listing(conn: sqlite3.Connection) -> list[StoredGrant]:
            if owner is None:
                rows = conn.execute("SELECT record FROM grants ORDER BY owner, upstream").fetchall()
            else:
                rows = conn.execute("SELECT record FROM grants WHERE owner = ? ORDER BY upstream", (owner,)).fetchall()
            return [StoredGrant.from_json(row[0]) for row in rows]

        return await self._db.run(listing)

    async def close(self) -> None:
        if self._owns_db:
            await self._db.aclose()
