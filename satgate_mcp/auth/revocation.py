"""Revoked token ids: the protocol every revocation store keeps, and the rules a token id follows.

Callers only ever ask ``is_revoked(token_id)`` and ``revoke(token_id)``, so a shared store can
replace the file without touching the authenticator or the CLI. Every store answers from local
state that is at most a fraction of a second stale, which is what lets the authenticator ask on
every request instead of caching revocations itself. The stores themselves (memory, file, state
database, Redis) live in ``satgate_mcp.stores``; which one a deployment uses is chosen there.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import structlog

#: A token id survives the one-id-per-line file format: no whitespace, no ``#``, bounded length.
TOKEN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+/=|-]{0,127}")

DEFAULT_CHECK_INTERVAL = 0.25

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

    def start(self) -> None:
        """Begin following a shared store (the daemon calls it at start-up); a no-op for the others."""

    async def aclose(self) -> None: ...


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
            store.start()

    async def aclose(self) -> None:
        for store in self.stores:
            with contextlib.suppress(Exception):
                await store.aclose()


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


