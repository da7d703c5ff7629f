"""Revocations in a file (``SATGATE_REVOCATION_FILE``): one token id a line, watched, appended to under a lock.

The file is the store that needs nothing running: an operator can revoke with ``echo id >> file`` on a
machine with no Redis and no state folder, and every daemon reading the file sees it within a second.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from satgate_mcp.auth.revocation import DEFAULT_CHECK_INTERVAL, check_token_id, parse_revocation_text

try:  # flock keeps concurrent appends from separate processes from interleaving; POSIX only.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_log = structlog.get_logger("satgate_mcp.auth.revocation")


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

    def start(self) -> None:
        return None  # nothing to follow

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
