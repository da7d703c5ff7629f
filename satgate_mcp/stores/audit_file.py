"""The audit trail's writer (``SATGATE_AUDIT_FILE``): the one owner of the file, off the request path.

A store like the others: it keeps what the gateway must not lose, and only it touches the disk. Calls hand it a
record and go on (a bounded queue); one task writes whatever has queued as one batch (one write to the kernel, so a
killed process loses nothing written), and a ticker fsyncs it in a worker thread every 100 ms, so nothing waits on
the disk but the writer. At shutdown it writes and fsyncs everything queued: SIGTERM loses no line of a call that
was answered (the app closes it after the server has drained).

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
#: How long the writer waits after a first line for others to join its batch: one wake-up, one write, one
#: stat for many calls under load, a line late by this much when idle.
GATHER_SECONDS = 0.002
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


class AuditFile:
    """A chained JSON-lines file (or stdout) written by one task; ``healthy`` is False while the disk fails."""

    def __init__(self, path: str, *, capacity: int = QUEUE_CAPACITY, on_drop: Callable[[], None] | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._queue: asyncio.Queue[Mapping[str, Any]] = asyncio.Queue(capacity)
        self._on_drop = on_drop
        self._file: IO[str] | None = None
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
        return self._queue.full()

    def submit(self, record: Mapping[str, Any]) -> bool:
        """Queue one record; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            if self._on_drop is not None:
                self._on_drop()
            return False
        return True

    async def start(self) -> None:
        """Find where the chain stands (the file's last line) and start the writer and its fsync ticker."""
        tail = [] if self.to_stdout else await asyncio.to_thread(_tail, self.path)
        self._prev, self._seq = last_link(tail)
        self._tasks = [asyncio.create_task(self._run(), name="audit-writer")]
        if not self.to_stdout:
            self._tasks.append(asyncio.create_task(self._tick(), name="audit-fsync"))

    async def close(self) -> None:
        """Write and fsync whatever is queued, then stop."""
        if not self._tasks:
            return
        await self._queue.join()
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

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(GATHER_SECONDS)  # let the lines of calls finishing now join this batch
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                self._write(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

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
            line = seal({**record, "log": "audit"} if self.to_stdout else record, seq, prev)
            lines.append(line)
            prev, seq = line_hash(line), seq + 1
        text = "\n".join(lines) + "\n"
        try:
            if self.to_stdout:
                sys.stdout.write(text)
                sys.stdout.flush()
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

    def _reopen_if_rotated(self) -> None:
        try:
            inode: int | None = os.stat(self.path).st_ino
        except FileNotFoundError:
            inode = None
        if self._file is not None and inode == self._inode:
            return
        if self._file is not None:
            log.info("audit_file_rotated", path=self.path)
            with contextlib.suppress(OSError):
                os.fsync(self._file.fileno())  # the old file's last lines are on disk before it is let go
                self._file.close()
        self._file = open(self.path, "a", encoding="utf-8", errors="surrogatepass")  # noqa: SIM115 (kept open)
        self._inode = os.fstat(self._file.fileno()).st_ino
