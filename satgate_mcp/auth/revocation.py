"""Revoked token ids: a small protocol, an in-memory store, a watched file, and Redis.

Callers only ever ask ``is_revoked(token_id)`` and ``revoke(token_id)``, so a shared store can
replace the file without touching the authenticator or the CLI. Every store answers from local
state that is at most a fraction of a second stale, which is what lets the authenticator ask on
every request instead of caching revocations itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

if TYPE_CHECKING:
    import redis.asyncio

try:  # flock keeps concurrent appends from separate processes from interleaving; POSIX only.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: A token id survives the one-id-per-line file format: no whitespace, no ``#``, bounded length.
TOKEN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+/=|-]{0,127}")

DEFAULT_CHECK_INTERVAL = 0.25
DEFAULT_REDIS_KEY = "satgate:revoked"

_log = structlog.get_logger(__name__)


def is_valid_token_id(token_id: str) -> bool:
    return TOKEN_ID_RE.fullmatch(token_id) is not None


def check_token_id(token_id: str) -> str:
    """The id unchanged, or ValueError: a newline in an id would forge extra revocation lines."""
    if not is_valid_token_id(token_id):
        raise ValueError(
            f"invalid token id {token_id!r}: use 1-128 of letters, digits and . _ : @ + / = | - "
            "(starting with a letter or digit)"
        )
    return token_id


def parse_revocation_text(text: str) -> frozenset[str]:
    """Ids of a revocation file: one per line; ``#`` starts a comment; anything after the id is ignored."""
    ids = set()
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            ids.add(words[0])
    return frozenset(ids)


class RevocationStore(Protocol):
    async def is_revoked(self, token_id: str) -> bool: ...

    async def revoke(self, token_id: str) -> None: ...

    async def aclose(self) -> None: ...


class MemoryRevocationStore:
    """One process, nothing persisted: tests, and ``auth_mode=header`` without a file or Redis."""

    def __init__(self, revoked: Iterable[str] = ()) -> None:
        self._ids = set(revoked)

    async def is_revoked(self, token_id: str) -> bool:
        return token_id in self._ids

    async def revoke(self, token_id: str) -> None:
        self._ids.add(check_token_id(token_id))

    async def aclose(self) -> None:
        return None


FileSignature = tuple[int, int, int, int]


def _file_signature(st: os.stat_result) -> FileSignature:
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


class FileRevocationStore:
    """The file named by ``SATGATE_REVOCATION_FILE``, re-read when it changes; it fails closed.

    A lookup stats the file at most once per ``check_interval`` and re-reads it only when inode,
    size or mtime changed. That beats a poller task here: nothing to start or cancel (the CLI and
    tests use the same object), an injected clock makes it deterministic, an idle daemon does no
    I/O, and a busy one does at most four ``stat`` calls a second while still seeing an edit, an
    append, or an atomic replace (new inode) within ``check_interval``.

    The set only grows while the process lives: an id once revoked stays revoked until restart,
    even if the file is deleted, renamed away, turns unreadable or is rewritten without it (a
    deleted or half-written file must never un-revoke a leaked token). A rotation (new file renamed
    over the old) adds what the new file names. A file that never existed yet is simply "nothing
    revoked"; once it was read, its absence is a problem like any read error: each new problem is
    logged once and counted in ``problems`` (``satgate_revocation_file_errors_total``).
    """

    def __init__(
        self,
        path: Path | str,
        *,
        clock: Callable[[], float] = time.monotonic,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._interval = check_interval
        self._next_check = float("-inf")
        self._signature: FileSignature | None = None
        self._ids: set[str] = set()
        #: What is wrong with the file at the last check ("" when it was read fine, or never existed).
        self.problem = ""
        #: How many times the file went from usable to a problem (or from one problem to another).
        self.problems = 0

    async def is_revoked(self, token_id: str) -> bool:
        self.check()
        return token_id in self._ids

    def check(self) -> None:
        """Pick up a change of the file, at most once per ``check_interval`` (lookups and /metrics call it)."""
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + self._interval
        try:
            signature = _file_signature(self.path.stat())
            if signature != self._signature:
                self._ids |= parse_revocation_text(self.path.read_bytes().decode("utf-8", errors="replace"))
                self._signature = signature
        except FileNotFoundError:
            self._note_problem("missing" if self._signature is not None else "")
        except OSError as exc:
            self._note_problem(f"{type(exc).__name__}: {exc.strerror or exc}")
        else:
            self._note_problem("")

    def _note_problem(self, problem: str) -> None:
        """Log each change of state once: a problem while it lasts, and the recovery."""
        if problem == self.problem:
            return
        if problem:
            self.problems += 1
            _log.warning("revocation_file_unusable", path=str(self.path), problem=problem,
                         kept_revoked_ids=len(self._ids))
        else:
            _log.info("revocation_file_readable", path=str(self.path), revoked_ids=len(self._ids))
        self.problem = problem

    async def revoke(self, token_id: str) -> None:
        check_token_id(token_id)
        await asyncio.to_thread(append_revocation, self.path, token_id)
        self._ids.add(token_id)

    async def aclose(self) -> None:
        return None


def append_revocation(path: Path, token_id: str) -> None:
    """Append one line with a single ``O_APPEND`` write under ``flock``: no concurrent revoke loses a line.

    The lock also covers the check for a missing final newline, so a hand-edited file without one
    never glues two ids together.
    """
    check_token_id(token_id)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        prefix = b""
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            prefix = b"\n"
        data = prefix + token_id.encode("ascii") + b"\n"
        written = os.write(fd, data)
        if written != len(data):  # pragma: no cover - only on a full disk
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock


class RedisRevocationStore:
    """A Redis set shared by every gateway process, mirrored in memory so a check never waits on Redis.

    The mirror is loaded once the store is first used, kept fresh by pub/sub (a ``revoke`` anywhere
    publishes the id; every process has it within milliseconds) and re-synced after every reconnect.
    Checks answer from it, also while Redis is down: what was revoked stays revoked, and nothing can be
    revoked during the outage anyway. Only before the first sync is Redis asked directly (bounded by
    the timeout; a failure then is a store fault the authenticator turns into 503 or lets through, per
    ``SATGATE_STORE_FAIL_MODE``). An id seen revoked stays revoked in this process until restart, as
    with the file, even if it is removed from Redis.
    """

    def __init__(self, url: str, *, key: str = DEFAULT_REDIS_KEY, timeout: float = 0.5) -> None:
        from satgate_mcp.pubsub import ChannelFollower
        from satgate_mcp.redis_client import connect

        # A paused or unreachable Redis must fail a command within the timeout, never hang the request.
        self._redis: redis.asyncio.Redis = connect(url, timeout=timeout)
        self._key = key
        self._revoked: set[str] = set()
        self._follower = ChannelFollower(url, f"{key}:events", timeout=timeout, on_message=self._published,
                                         on_subscribed=self._load, lost_event="revocation_sync_lost")
        #: Set once the mirror holds the whole set; cleared while the subscription is down.
        self.synced = self._follower.following
        #: Set whenever a published revocation reached the mirror (tests await it).
        self.changed = asyncio.Event()
        self._ever_synced = False

    def start(self) -> None:
        """Begin following (the daemon does at start-up, so the mirror is loaded before the first request)."""
        self._follower.start()

    async def is_revoked(self, token_id: str) -> bool:
        self._follower.start()
        if token_id in self._revoked:
            return True
        if self._ever_synced:  # the mirror is the answer, also while Redis is down
            return False
        revoked = bool(await self._redis.sismember(self._key, token_id))  # before the first sync only
        if revoked:
            self._revoked.add(token_id)
        return revoked

    async def revoke(self, token_id: str) -> None:
        check_token_id(token_id)
        await self._redis.sadd(self._key, token_id)
        await self._redis.publish(self._follower.channel, token_id)
        self._revoked.add(token_id)

    async def _load(self) -> None:
        """Once subscribed (so nothing published meanwhile is missed): the whole set."""
        from satgate_mcp.pubsub import text_of

        self._revoked.update(text_of(m) for m in await self._redis.smembers(self._key))
        self._ever_synced = True

    def _published(self, token_id: str) -> None:
        self._revoked.add(token_id)
        self.changed.set()

    async def aclose(self) -> None:
        await self._follower.aclose()
        await self._redis.aclose()


class UnionRevocationStore:
    """Several stores at once (a file and Redis): revoked if any says so; a revoke goes to all."""

    def __init__(self, stores: Sequence[RevocationStore]) -> None:
        self.stores = tuple(stores)

    async def is_revoked(self, token_id: str) -> bool:
        for store in self.stores:
            if await store.is_revoked(token_id):
                return True
        return False

    async def revoke(self, token_id: str) -> None:
        for store in self.stores:
            await store.revoke(token_id)

    def start(self) -> None:
        for store in self.stores:
            start_revocations(store)

    async def aclose(self) -> None:
        for store in self.stores:
            with contextlib.suppress(Exception):
                await store.aclose()


def start_revocations(store: object) -> None:
    """Start what follows a shared store (the Redis mirror) inside ``store``; the others need nothing."""
    start = getattr(store, "start", None)
    if callable(start):
        start()


def revocation_files(store: object) -> list[FileRevocationStore]:
    """The watched files inside ``store`` (a union's members too): what /metrics reports on."""
    if isinstance(store, FileRevocationStore):
        return [store]
    if isinstance(store, UnionRevocationStore):
        return [found for member in store.stores for found in revocation_files(member)]
    return []


class RevocationSettings(Protocol):
    """The two settings a store needs; ``Settings`` and the CLI's token settings both fit."""

    @property
    def revocation_file(self) -> Path | None: ...

    @property
    def redis_url(self) -> str | None: ...

    @property
    def redis_timeout(self) -> float: ...


#: Where the systemd unit's ``StateDirectory=`` puts revocations (README, config/satgate-mcp.env.example).
DOCUMENTED_REVOCATION_FOLDER = "/var/lib/satgate-mcp"


def missing_revocation_folder(path: Path | None, *, is_dir: Callable[[Path], bool] = Path.is_dir) -> Path | None:
    """The folder ``SATGATE_REVOCATION_FILE`` names that does not exist; None when there is no file or it does.

    Nobody creates it for the operator: ``token revoke`` usually runs as root, and a folder it made would be
    root's, with root's umask, so the daemon (``DynamicUser=`` under systemd) could neither read a file kept
    private nor revoke through it. The unit's ``StateDirectory=`` makes the documented folder with the right
    owner and mode; anywhere else the operator creates it on purpose.
    """
    if path is None or not str(path).strip():
        return None
    folder = path.parent
    return None if is_dir(folder) else folder


def revocation_folder_problem(path: Path | None, *, is_dir: Callable[[Path], bool] = Path.is_dir) -> str | None:
    """What ``token revoke`` says (exit 2) instead of a FileNotFoundError when the file's folder is missing."""
    folder = missing_revocation_folder(path, is_dir=is_dir)
    if folder is None:
        return None
    return (f"SATGATE_REVOCATION_FILE={path}: its folder {folder} does not exist; create it, writable by the user "
            f"the gateway runs as (the systemd unit's StateDirectory= makes {DOCUMENTED_REVOCATION_FOLDER})")


def warn_missing_revocation_folder(path: Path | None) -> bool:
    """At ``serve``: one warning, not a refusal, when the file's folder is missing (True when warned).

    Nothing can have been revoked through a file that cannot exist, so starting admits exactly the tokens an
    empty file would; ``token revoke`` refuses with the folder named, and once the folder and the file appear
    the running daemon reads them within a second, with no restart. Refusing to start would turn that into an
    outage (and systemd does not restart on exit 2).
    """
    folder = missing_revocation_folder(path)
    if folder is None:
        return False
    _log.warning("revocation_folder_missing", path=str(path), folder=str(folder),
                 hint="`satgate-mcp token revoke` cannot write there and nothing is revoked through this file "
                      "until the folder exists; create it, writable by the gateway's user (the systemd unit's "
                      f"StateDirectory= makes {DOCUMENTED_REVOCATION_FOLDER})")
    return True


def revocation_store_configured(settings: RevocationSettings) -> bool:
    return bool(settings.revocation_file) or bool(settings.redis_url)


def revocation_store_from_settings(settings: RevocationSettings, **file_options: Any) -> RevocationStore:
    """The file and/or Redis the operator configured; in memory when neither is set."""
    stores: list[RevocationStore] = []
    if settings.revocation_file:
        if Path(settings.revocation_file).is_dir():  # also what an empty SATGATE_REVOCATION_FILE parses to
            raise ValueError(f"SATGATE_REVOCATION_FILE={settings.revocation_file} is a directory, not a file")
        stores.append(FileRevocationStore(settings.revocation_file, **file_options))
    if settings.redis_url:
        stores.append(RedisRevocationStore(settings.redis_url, timeout=settings.redis_timeout))
    if not stores:
        return MemoryRevocationStore()
    if len(stores) == 1:
        return stores[0]
    return UnionRevocationStore(stores)
