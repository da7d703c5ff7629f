"""Every store the gateway keeps state in, and the one place a backend is chosen: ``open_stores``.

Three backends, chosen by the settings alone:

- ``redis`` (``SATGATE_REDIS_URL``): budgets, duplicate records, rate buckets, revocations and DELETE
  tombstones shared by every process on one Redis;
- ``sqlite`` (the default): the state folder's database (``SATGATE_STATE_DIR``), so a restart or a deploy
  never hands a token a fresh budget; rate buckets stay in memory (a restart refills them; not a spend);
- ``memory`` (``SATGATE_STATE_DIR=memory``): everything in this process, gone with it.

Policy, auth and the app take a ``Stores``; nothing outside this package imports ``sqlite3`` or ``redis``.
The decisions the stores carry out (budget arithmetic, duplicate transitions) are policy's pure functions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from satgate_mcp.auth.revocation import RevocationSettings, RevocationStore, UnionRevocationStore
from satgate_mcp.errors import ConfigError
from satgate_mcp.oauth_grants import GrantStore
from satgate_mcp.policy.admissions import Admissions
from satgate_mcp.policy.approvals import ApprovalStore
from satgate_mcp.policy.budget import BudgetStore
from satgate_mcp.policy.duplicates import DuplicateStore
from satgate_mcp.policy.limits import RateLimiter
from satgate_mcp.policy.pins import PinStore
from satgate_mcp.policy.spend import SpendStore
from satgate_mcp.sessions import TombstoneStore
from satgate_mcp.stores.errors import STORE_ERRORS
from satgate_mcp.stores.files import FileRevocationStore
from satgate_mcp.stores.folder import MEMORY, StateSettings, resolve_state_dir, state_folder
from satgate_mcp.stores.memory import (
    MemoryBudgetStore,
    MemoryDuplicateStore,
    MemoryPinStore,
    MemoryRevocationStore,
)
from satgate_mcp.stores.memory_approvals import MemoryApprovalStore
from satgate_mcp.stores.memory_grants import MemoryGrantStore
from satgate_mcp.stores.memory_spend import MemorySpendStore
from satgate_mcp.stores.redis.admissions import RedisAdmissions
from satgate_mcp.stores.redis.approvals import RedisApprovalStore
from satgate_mcp.stores.redis.console import RedisBoard
from satgate_mcp.stores.redis.grants import RedisGrantStore
from satgate_mcp.stores.redis.pins import RedisPinStore
from satgate_mcp.stores.redis.policy import RedisProbe, RedisStores
from satgate_mcp.stores.redis.revocations import RedisRevocationStore
from satgate_mcp.stores.redis.spend import RedisSpendStore
from satgate_mcp.stores.redis.task_owners import RedisTaskOwners
from satgate_mcp.stores.redis.tombstones import RedisTombstones
from satgate_mcp.stores.sqlite import (
    DB_NAME,
    LocalState,
    open_approvals_database,
    open_grants_database,
    open_pins_database,
    open_revocations_database,
)
from satgate_mcp.stores.sqlite.approvals import SqliteApprovalStore
from satgate_mcp.stores.sqlite.grants import SqliteGrantStore
from satgate_mcp.stores.sqlite.pins import SqlitePinStore
from satgate_mcp.stores.sqlite.spend import SqliteSpendStore
from satgate_mcp.stores.sqlite.task_owners import SqliteTaskOwners
from satgate_mcp.task_owners import TaskOwnerStore

Closer = Callable[[], Awaitable[None]]


class StoreSettings(StateSettings, Protocol):
    """What ``open_stores`` reads; ``Settings`` fits."""

    @property
    def auth_mode(self) -> str: ...

    @property
    def redis_max_connections(self) -> int: ...


class StoreProbe(Protocol):
    """Whether the store answers now (bounded by SATGATE_REDIS_TIMEOUT; never raises): what ``/readyz`` reports."""

    async def __call__(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Stores:
    """Every store one gateway process uses; ``start`` follows the shared ones, ``aclose`` closes all once."""

    #: ``redis``, ``sqlite`` or ``memory``.
    kind: str
    #: Shared rate buckets (Redis); None: the policy keeps them in this process (a restart refills them).
    rate_limiter: RateLimiter | None
    budgets: BudgetStore
    duplicates: DuplicateStore
    #: A guarded call's arrival and charge in one operation, where the backend can (the state database).
    admissions: Admissions | None
    revocations: RevocationStore
    #: The watched revocation files among ``revocations`` (``/metrics`` reports on them).
    revocation_files: tuple[FileRevocationStore, ...]
    #: DELETE tombstones that outlive the process (the state database); None: the registry keeps its own.
    tombstones: TombstoneStore | None
    #: DELETEs every process sees (Redis); None without it.
    shared_tombstones: RedisTombstones | None
    #: ``/readyz``'s look at the store (never raises); None when nothing can be down (memory).
    probe: StoreProbe | None
    #: The bound of one call's store waits (``SATGATE_REDIS_TIMEOUT``); None: the stores never wait.
    timeout: float | None
    closers: tuple[Closer, ...] = ()
    #: Pinned tool definitions (``SATGATE_TOOL_PINNING``): in the state database or on Redis, like the rest.
    pins: PinStore = field(default_factory=MemoryPinStore)
    #: Where each process publishes the console's figures for the others (Redis); None: this process alone.
    board: RedisBoard | None = None
    #: Spend-limit sums of tool controls: in the state database or on Redis, like the rest.
    spend: SpendStore = field(default_factory=MemorySpendStore)
    #: Held calls waiting for an operator (approval holds): in the state database or on Redis, like the rest.
    approvals: ApprovalStore = field(default_factory=MemoryApprovalStore)
    #: Users' grants to "oauth_user" upstreams and the authorizations waiting for them: like the rest.
    grants: GrantStore = field(default_factory=MemoryGrantStore)
    #: Who created each relayed task (2025-11-25 ``tasks/list``); None: each process remembers its own only.
    task_owners: TaskOwnerStore | None = None

    def start(self) -> None:
        """Follow what other processes publish (revocations, DELETEs), before the first request."""
        self.revocations.start()
        if self.shared_tombstones is not None:
            self.shared_tombstones.start()

    async def aclose(self) -> None:
        for close in self.closers:
            await close()


def uses_revocations(auth_mode: str) -> bool:
    """Only verified tokens carry ids that can be revoked: the stores for them are opened for these modes."""
    return auth_mode in ("header", "oauth")


def open_stores(settings: StoreSettings, *, environ: Mapping[str, str] | None = None,
                on_error: Callable[[str], None] = lambda _op: None) -> Stores:
    """The stores these settings name, opened (a database created, Redis clients made; nothing awaited).

    ``on_error`` counts a shared-tombstone operation Redis could not take (the metric's ``op`` label).
    Raises ConfigError for a state folder that cannot be used or a revocation file that is a folder.
    """
    configured = _configured(settings) if uses_revocations(settings.auth_mode) else None
    files = tuple(revocation_files(configured))
    if settings.redis_url:
        return _redis_stores(settings.redis_url, settings.redis_timeout, settings.redis_max_connections,
                             configured or MemoryRevocationStore(), files, on_error)
    folder = state_folder(settings, environ)
    if folder is None:
        revocations = configured or MemoryRevocationStore()
        return Stores(MEMORY, None, MemoryBudgetStore(), MemoryDuplicateStore(), None, revocations,
                      files, None, None, None, None, (revocations.aclose,))
    return local_stores(LocalState.open(folder, timeout=settings.redis_timeout), configured, files)


def local_stores(state: LocalState, configured: RevocationStore | None = None,
                 files: tuple[FileRevocationStore, ...] = ()) -> Stores:
    """The stores over a state database; revocations are its own, with ``configured`` (a file) if any.

    Every store wait is bounded like a Redis one (``state.timeout``): a locked file must not hang a call.
    """
    revocations = state.revocations if configured is None else UnionRevocationStore([configured, state.revocations])
    # The database closes last: after the revocations (and the policy and authenticator, closed before).
    return Stores("sqlite", None, state.budgets, state.duplicates, state.admissions, revocations,
                  files, state.tombstones, None, state.probe, state.timeout, (revocations.aclose, state.aclose),
                  pins=SqlitePinStore(state.db), spend=SqliteSpendStore(state.db),
                  approvals=SqliteApprovalStore(state.db), grants=SqliteGrantStore(state.db),
                  task_owners=SqliteTaskOwners(state.db))


def _redis_stores(url: str, timeout: float, max_connections: int, revocations: RevocationStore,
                  files: tuple[FileRevocationStore, ...], on_error: Callable[[str], None]) -> Stores:
    policy = RedisStores.from_url(url, timeout=timeout, max_connections=max_connections)
    tombstones = RedisTombstones(url, timeout=timeout, max_connections=max_connections, on_error=on_error)
    probe = RedisProbe(url, timeout)
    # The arrival of a guarded call and its charge in one script: one round trip where the stores would take two.
    admissions = RedisAdmissions(policy.client, clock=policy.rate_limiter.clock)
    return Stores("redis", policy.rate_limiter, policy.budgets, policy.duplicates, admissions, revocations, files,
                  None, tombstones, probe, timeout,
                  (revocations.aclose, tombstones.aclose, policy.aclose, probe.aclose),
                  pins=RedisPinStore(policy.client), board=RedisBoard(policy.client),
                  spend=RedisSpendStore(policy.client), approvals=RedisApprovalStore(policy.client),
                  grants=RedisGrantStore(policy.client), task_owners=RedisTaskOwners(policy.client))


def configured_revocations(settings: RevocationSettings) -> RevocationStore:
    """The file and/or Redis the settings name, in memory when neither: revocations without a state folder."""
    return _configured(settings) or MemoryRevocationStore()


def _configured(settings: RevocationSettings) -> RevocationStore | None:
    try:
        return revocation_store_from_settings(settings)
    except ValueError as exc:  # a directory for a file
        raise ConfigError(str(exc)) from None


def revocation_files(store: RevocationStore | None) -> list[FileRevocationStore]:
    if isinstance(store, FileRevocationStore):
        return [store]
    if isinstance(store, UnionRevocationStore):
        return [found for member in store.stores for found in revocation_files(member)]
    return []


def revocation_store_configured(settings: RevocationSettings) -> bool:
    return bool(settings.revocation_file) or bool(settings.redis_url)


def revocation_store_from_settings(settings: RevocationSettings, **file_options: Any) -> RevocationStore | None:
    """The file and/or Redis the operator configured; None when neither is set."""
    stores: list[RevocationStore] = []
    if settings.revocation_file:
        if Path(settings.revocation_file).is_dir():  # also what an empty SATGATE_REVOCATION_FILE parses to
            raise ValueError(f"SATGATE_REVOCATION_FILE={settings.revocation_file} is a directory, not a file")
        stores.append(FileRevocationStore(settings.revocation_file, **file_options))
    if settings.redis_url:
        stores.append(RedisRevocationStore(settings.redis_url, timeout=settings.redis_timeout))
    if not stores:
        return None
    if len(stores) == 1:
        return stores[0]
    return UnionRevocationStore(stores)


def cli_revocations(settings: StateSettings) -> RevocationStore | None:
    """Where ``token revoke`` writes and ``token inspect`` looks: the configured file/Redis, else the state folder.

    Only a state database that already exists is used (a daemon created it): a revoke run from the
    wrong folder must fail loudly instead of writing a database no daemon reads.
    """
    configured = revocation_store_from_settings(settings)
    if configured is not None:
        return configured
    folder = state_folder(settings)
    return None if folder is None else open_revocations_database(folder)


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


def cli_pins(settings: StateSettings) -> PinStore | str:
    """Where ``tools pins`` and ``tools approve`` read and write (``_cli_store``); else why not."""
    return _cli_store(settings, "pin store", "pins", lambda: RedisPinStore.from_url(
        settings.redis_url or "", timeout=settings.redis_timeout), open_pins_database)


def cli_approvals(settings: StateSettings) -> ApprovalStore | str:
    """Where ``approvals list|approve|deny`` read and decide (``_cli_store``); else why not."""
    return _cli_store(settings, "approval store", "held calls", lambda: RedisApprovalStore.from_url(
        settings.redis_url or "", timeout=settings.redis_timeout), open_approvals_database)


def cli_grants(settings: StateSettings) -> GrantStore | str:
    """Where ``credentials list|revoke`` (and ``token revoke``) read and forget users' upstream grants; else why
    not (``_cli_store``)."""
    return _cli_store(settings, "credential store", "users' upstream grants", lambda: RedisGrantStore.from_url(
        settings.redis_url or "", timeout=settings.redis_timeout), open_grants_database)


S = TypeVar("S")


def _cli_store(settings: StateSettings, what: str, kept: str, on_redis: Callable[[], S],
               in_folder: Callable[[Path], S | None]) -> S | str:
    """A command's store: Redis, else the state folder's database a daemon made (never a new one: run from the
    wrong folder it would decide where no daemon reads); else why there is none."""
    if settings.redis_url:
        return on_redis()
    folder = state_folder(settings)
    if folder is None:
        return (f"no {what}: SATGATE_STATE_DIR=memory keeps {kept} in each daemon's memory, and SATGATE_REDIS_URL "
                "is unset")
    store = in_folder(folder)
    if store is None:
        return (f"no {what}: no state database at {(folder / DB_NAME).absolute()} (run this where the daemon "
                "runs, or set SATGATE_STATE_DIR to its state folder, or SATGATE_REDIS_URL to its Redis)")
    return store


__all__ = [
    "MEMORY",
    "STORE_ERRORS",
    "LocalState",
    "StateSettings",
    "StoreProbe",
    "Stores",
    "cli_approvals",
    "cli_grants",
    "cli_pins",
    "cli_revocations",
    "configured_revocations",
    "local_stores",
    "no_cli_revocations_reason",
    "open_stores",
    "resolve_state_dir",
    "revocation_files",
    "revocation_store_configured",
    "revocation_store_from_settings",
    "state_folder",
    "uses_revocations",
]
