"""Where one machine keeps its state: the state folder (``SATGATE_STATE_DIR``) and what opens it.

Without ``SATGATE_REDIS_URL``, budgets, duplicate records, DELETE tombstones and revocations live
in SQLite in the state folder, so a restart or a deploy never hands a token a fresh budget.
``SATGATE_STATE_DIR=memory`` keeps them in the process, as before. With Redis, Redis shares them and
no folder is used. Rate buckets stay in memory either way (a restart refills them; they are not a
spend).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from satgate_mcp.auth.revocation import (
    MemoryRevocationStore,
    RevocationSettings,
    RevocationStore,
    UnionRevocationStore,
    revocation_store_configured,
    revocation_store_from_settings,
)
from satgate_mcp.errors import ConfigError
from satgate_mcp.state.sqlite import (
    DB_NAME,
    REFRESH_WAIT_SECONDS,
    Database,
    SqliteAdmissions,
    SqliteBudgetStore,
    SqliteDuplicateStore,
    SqliteRevocationStore,
    SqliteTombstoneStore,
    StateError,
)

MEMORY = "memory"
DEFAULT_STATE_DIR = "./satgate-state"
#: Set by systemd for a unit with ``StateDirectory=`` (several folders are separated by ``:``).
SYSTEMD_STATE_DIRECTORY = "STATE_DIRECTORY"


class StateSettings(RevocationSettings, Protocol):
    """What picks the state folder; ``Settings`` and the CLI's token settings both fit."""

    @property
    def state_dir(self) -> str | None: ...


def resolve_state_dir(configured: str | None, environ: Mapping[str, str]) -> Path | None:
    """The state folder, or None for ``memory``: the setting, else systemd's folder, else ``./satgate-state``."""
    value = (configured or "").strip()
    if value:
        return None if value.lower() == MEMORY else Path(value)
    systemd = environ.get(SYSTEMD_STATE_DIRECTORY, "").split(":")[0].strip()
    return Path(systemd or DEFAULT_STATE_DIR)


def state_folder(settings: StateSettings, environ: Mapping[str, str] | None = None) -> Path | None:
    """The folder this configuration keeps state in; None with Redis (it shares the state) or ``memory``."""
    if settings.redis_url:
        return None
    return resolve_state_dir(settings.state_dir, os.environ if environ is None else environ)


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

    def revocations_with(self, configured: RevocationStore) -> RevocationStore:
        """The daemon's revocations: the state folder's, with the configured file if there is one."""
        if isinstance(configured, MemoryRevocationStore):
            return self.revocations
        return UnionRevocationStore([configured, self.revocations])

    async def aclose(self) -> None:
        await self.db.aclose()


def open_state(settings: StateSettings, environ: Mapping[str, str] | None = None) -> LocalState | None:
    """The durable stores of one machine, or None when Redis is configured or the state is ``memory``."""
    folder = state_folder(settings, environ)
    return None if folder is None else LocalState.open(folder, timeout=settings.redis_timeout)


def cli_revocations(settings: StateSettings) -> RevocationStore | None:
    """Where ``token revoke`` writes and ``token inspect`` looks: the configured file/Redis, else the state folder.

    Only a state database that already exists is used (a daemon created it): a revoke run from the
    wrong folder must fail loudly instead of writing a database no daemon reads.
    """
    if revocation_store_configured(settings):
        return revocation_store_from_settings(settings)
    folder = state_folder(settings)
    if folder is None or not (folder / DB_NAME).is_file():
        return None
    try:
        db = Database(folder / DB_NAME)
    except StateError as exc:
        raise ConfigError(f"SATGATE_STATE_DIR={folder}: {exc}") from None
    return SqliteRevocationStore(db, owns_db=True)


def no_cli_revocations_reason(settings: StateSettings) -> str | None:
    """Why ``token revoke`` has nowhere to write (None: it has), said so an operator can fix it."""
    if revocation_store_configured(settings):
        return None
    folder = state_folder(settings)
    if folder is None:
        return ("no revocation store: SATGATE_STATE_DIR=memory and neither SATGATE_REVOCATION_FILE nor "
                "SATGATE_REDIS_URL is set")
    if (folder / DB_NAME).is_file():
        return None
    return (f"no revocation store: no state database at {(folder / DB_NAME).absolute()} (run this where the "
            "daemon runs, or set SATGATE_STATE_DIR to its state folder), and neither SATGATE_REVOCATION_FILE "
            "nor SATGATE_REDIS_URL is set")


__all__ = [
    "DEFAULT_STATE_DIR",
    "MEMORY",
    "LocalState",
    "StateSettings",
    "cli_revocations",
    "no_cli_revocations_reason",
    "open_state",
    "resolve_state_dir",
    "state_folder",
]
