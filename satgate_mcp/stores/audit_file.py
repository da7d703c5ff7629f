"""The audit trail's writer (``SATGATE_AUDIT_FILE``): the one owner of the file, off the request path.

A store like the others: it keeps what the gateway must not lose, and only it touches the disk. Calls hand it a
record and go on (appended to a bounded list: no task is woken per call); the first record of a batch schedules
one write ``GATHER_SECONDS`` later of whatever has gathered by then (one write to the kernel, so a killed process
loses nothing written), and a ticker fsyncs it in a worker thread every 100 ms, so nothing waits on the disk but
the writer. At shutdown it writes and fsyncs everything pending: SIGTERM loses no line of a call that was
answered (the app closes it after the server has drained).

The chain continues across restarts (the file's last line is read at start) and across rotation: before each
batch the writer compares the path's inode with its open file's, and on a change (logrotate renamed the file, or
removed it) opens a new file at the path, whose first line chains from the old one's last. ``-`` writes the lines
to stdout, marked ``"log": "audit"``, from the event loop's thread (as structlog does), so lines never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

import structlog

from satgate_mcp.policy.audit import last_link, line_hash, seal

log = structlog.get_logger("satgate_mcp.audit")

#: Records waiting for the writer; past it a record is dropped (open) or the call refused (closed).
QUEUE_CAPACITY = 10_000
#: Lines written at once at most.
BATCH = 1_000
#: How long a batch gathers after its first line: one timer and one write for many calls under load, a line
#: late by this much (and on disk within the next fsync) when idle.
GATHER_SECONDS = 0.01
#: How often what was written is fsynced (and a rotated file noticed): at least every 100 ms, as promised.
SYNC_SECONDS = 0.1


def _tail(path: str) -> list[str]:
    """The file's last line (at most the last 64 KiB are read), as a one-item list; none: []."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:  # none yet, or unreadable: the chain starts afresh, and writing will say what is wrong
        return []
    return [line for line in lines if line.strip()][-1:]


def _write_stdout(text: bytes) -> None:
    """Beside structlog's lines, which go to the same buffer (a stand-in stream without one gets the text)."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(text.decode("utf-8"))
        sys.stdout.flush()
        return
    sys.stdout.flush()
    buffer.write(text)
    buffer.flush()


class AuditFile:
    """A chained JSON-lines file (or stdout) written by one task; ``healthy`` is False while the disk fails."""

    def __init__(self, path: str, *, capacity: int = QUEUE_CAPACITY, on_drop: Callable[[], None] | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._capacity = capacity
        self._pending: list[Mapping[str, Any]] = []
        self._scheduled: asyncio.TimerHandle | None = None
        self._on_drop = on_drop
        self._file: IO[bytes] | None = None
        self._inode: int | None = None
        self._prev, self._seq = "", 1
        self._tasks: list[asyncio.Task[None]] = []
        self._dirty = False
        self.healthy = True
        self.wall_clock = wall_clock

    @property
    def to_stdout(self) -> bool:
        return self.path == "-"

    @property
    def full(self) -> bool:
        return len(self._pending) >= self._capacity

    def submit(self, record: Mapping[str, Any]) -> bool:
        """Keep one record for the next write; False (and counted) when too many wait."""
        if len(self._pending) >= self._capacity:
            if self._on_drop is not None:
                self._on_drop()
            return False
        self._pending.append(record)
        if self._scheduled is None:
            try:
                self._scheduled = asyncio.get_running_loop().call_later(GATHER_SECONDS, self.flush)
            except RuntimeError:  # no loop runs here (a shutdown hook, a thread): written now
                self.flush()
        return True

    def flush(self) -> None:
        """Write every pending record now (the scheduled write, shutdown, and tests that read the file)."""
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), BATCH):
            self._write(pending[start:start + BATCH])

    async def start(self) -> None:
        """Find where the chain stands (the file's last line) and start the fsync ticker."""
        tail = [] if self.to_stdout else await asyncio.to_thread(_tail, self.path)
        self._prev, self._seq = last_link(tail)
        if not self.to_stdout:
            self._tasks = [asyncio.create_task(self._tick(), name="audit-fsync")]

    async def close(self) -> None:
        """Write and fsync whatever is pending, then stop."""
        self.flush()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._sync()
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    async def _tick(self) -> None:
        """Every ``SYNC_SECONDS``: what was written since is fsynced, in a worker thread."""
        while True:
            await asyncio.sleep(SYNC_SECONDS)
            await self._sync()

    async def _sync(self) -> None:
        if not self._dirty or self._file is None:
            return
        self._dirty = False
        try:
            await asyncio.to_thread(os.fsync, self._file.fileno())
        except (OSError, ValueError) as exc:
            self._failed(exc)

    def _write(self, batch: list[Mapping[str, Any]]) -> None:
        """In the loop's thread, as one write: a few hundred bytes a line cost less here than a thread hop."""
        lines = []
        prev, seq = self._prev, self._seq
        for record in batch:
            if self.to_stdout:
                record = {**record, "log": "audit"}
            line = seal(record, seq, prev)
            lines.append(line)
            prev, seq = line_hash(line), seq + 1
        text = b"\n".join(lines) + b"\n"
        try:
            if self.to_stdout:
                _write_stdout(text)
            else:
                self._reopen_if_rotated()
                assert self._file is not None
                self._file.write(text)
                self._file.flush()
                self._dirty = True
        except OSError as exc:
            self._failed(exc)
            if self._on_drop is not None:
                for _ in batch:
                    self._on_drop()
            return
        if not self.healthy:
            log.info("audit_write_recovered", path=self.path)
            self.healthy = True
        self._prev, self._seq = prev, seq

    def _failed(self, exc: BaseException) -> None:
        if self.healthy:
            log.error("audit_write_failed", path=self.path, error=str(exc))
        self.healthy = False
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _moved(self) -> bool:
        """Whether the path no longer names the open file (renamed or removed under us)."""
        try:
            return os.stat(self.path).st_ino != self._inode
        except FileNotFoundError:
            return True

    def _reopen_if_rotated(self) -> None:
        """Once a batch (every ``GATHER_SECONDS`` at most): one ``stat`` tells whether logrotate moved the file."""
        if self._file is not None and not self._moved():
            return
        if self._file is not None:
            log.info("audit_file_rotated", path=self.path)
            with contextlib.suppress(OSError):
                os.fsync(self._file.fileno())  # the old file's last lines are on disk before it is let go
                self._file.close()
        self._file = open(self.path, "ab")  # noqa: SIM115 (kept open)
        self._inode = os.fstat(self._file.fileno()).st_ino
