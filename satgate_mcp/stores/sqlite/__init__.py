"""The state folder's database and the stores over it, opened together and closed once.

Without ``SATGATE_REDIS_URL``, budgets, duplicate records, DELETE tombstones and revocations live
in SQLite in the state folder, so a restart or a deploy never hands a token a fresh budget.
``database`` runs the jobs, ``transactions`` says how a batch commits, ``stores`` are the stores.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from satgate_mcp.errors import ConfigError
from satgate_mcp.stores.sqlite.approvals import SqliteApprovalStore
from satgate_mcp.stores.sqlite.database import DB_NAME, REFRESH_WAIT_SECONDS, Database
from satgate_mcp.stores.sqlite.grants import SqliteGrantStore
from satgate_mcp.stores.sqlite.pins import SqlitePinStore
from satgate_mcp.stores.sqlite.stores import (
    SqliteAdmissions,
    SqliteBudgetStore,
    SqliteDuplicateStore,
    SqliteRevocationStore,
    SqliteTombstoneStore,
)
from satgate_mcp.stores.sqlite.transactions import StateError


@dataclass(frozen=True, slots=True)
class LocalState:
    """The stores over one state database; ``aclose`` closes it once, after every user is done."""

    db: Database
    budgets: SqliteBudgetStore
    duplicates: SqliteDuplicateStore
    tombstones: SqliteTombstoneStore
    revocations: SqliteRevocationStore
    admissions: SqliteAdmissions
    #: How long a look at the database may take (``SATGATE_REDIS_TIMEOUT``: the bound of any store wait).
    timeout: float = REFRESH_WAIT_SECONDS

    @classmethod
    def open(cls, folder: Path, *, clock: Callable[[], float] = time.time,
             monotonic: Callable[[], float] = time.monotonic, timeout: float = REFRESH_WAIT_SECONDS) -> LocalState:
        """Create the folder (mode 0700) and the database as needed; ConfigError naming the folder if impossible."""
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            db = Database(folder / DB_NAME, clock=clock)
        except (OSError, StateError) as exc:
            raise ConfigError(f"SATGATE_STATE_DIR={folder}: cannot keep state there: {exc}") from None
        return cls(db, SqliteBudgetStore(db), SqliteDuplicateStore(db), SqliteTombstoneStore(db),
                   SqliteRevocationStore(db, clock=monotonic, wait=timeout), SqliteAdmissions(db), timeout)

    async def probe(self) -> bool:
        """Whether the database takes a job now, within the timeout: what ``/readyz`` reports as ``store``."""
        return await self.db.usable(self.timeout)

    async def aclose(self) -> None:
        await self.db.aclose()


def open_revocations_database(folder: Path) -> SqliteRevocationStore | None:
    """The revocations of a database a daemon already made in ``folder`` (None: there is none).

    ``token revoke`` must not create one: run from the wrong folder, it would write where no daemon reads.
    """
    db = _existing_database(folder)
    return None if db is None else SqliteRevocationStore(db, owns_db=True)


def open_pins_database(folder: Path) -> SqlitePinStore | None:
    """The pins of a database a daemon already made in ``folder`` (None: there is none); ``tools approve`` must
    not create one."""
    db = _existing_database(folder)
    return None if db is None else SqlitePinStore(db, owns_db=True)


def open_approvals_database(folder: Path) -> SqliteApprovalStore | None:
    """The held calls of a database a daemon already made in ``folder`` (None: there is none)."""
    db = _existing_database(folder)
    return None if db is None else SqliteApprovalStore(db, owns_db=True)


def open_grants_database(folder: Path) -> SqliteGrantStore | None:
    """Users' upstream grants in a database a daemon already made in ``folder`` (None: there is none)."""
    db = _existing_database(folder)
    return None if db is None else SqliteGrantStore(db, owns_db=True)


def _existing_database(folder: Path) -> Database | None:
    """The database a daemon already made in ``folder``, opened; None when there is none (a command never makes one)."""
    if not (folder / DB_NAME).is_file():
        return None
    try:
        return Database(folder / DB_NAME)
    except StateError as exc:
        raise ConfigError(f"SATGATE_STATE_DIR={folder}: {exc}") from None


__all__ = ["DB_NAME", "LocalState", "StateError", "open_pins_database", "open_revocations_database"]
