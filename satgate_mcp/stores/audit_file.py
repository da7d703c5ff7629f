"""The audit trail's writer (``SATGATE_AUDIT_FILE``): the one owner of the file, off the request path.

A store like the others: it keeps what the gateway must not lose, and only it touches the disk. Calls hand it a
record and go on (a bounded queue); one task writes whatever has queued as one batch, then flushes and fsyncs it
in a worker thread, so a line is on disk within one batch's write (well under 100 ms at any load this machine can
make) and nothing waits on the disk but the writer. At shutdown it writes and fsyncs everything queued: SIGTERM
loses no line of a call that was answered (the app closes it after the server has drained).

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
#: Lines written (and fsynced) at once at most.
BATCH = 1_000


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
        self._task: asyncio.Task[None] | None = None
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
        """Find where the chain stands (the file's last line) and start the writer."""
        tail = [] if self.to_stdout else await asyncio.to_thread(_tail, self.path)
        self._prev, self._seq = last_link(tail)
        self._task = asyncio.create_task(self._run(), name="audit-writer")

    async def close(self) -> None:
        """Write and fsync whatever is queued, then stop."""
        if self._task is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write(self, batch: list[Mapping[str, Any]]) -> None:
        lines = []
        prev, seq = self._prev, self._seq
        for record in batch:
            line = seal({**record, "log": "audit"} if self.to_stdout else record, seq, prev)
            lines.append(line)
            prev, seq = line_hash(line), seq + 1
        text = "\n".join(lines) + "\n"
        if self.to_stdout:
            sys.stdout.write(text)
            sys.stdout.flush()
            ok = True
        else:
            ok = await asyncio.to_thread(self._append, text)
        if ok:
            self._prev, self._seq = prev, seq
        elif self._on_drop is not None:
            for _ in batch:
                self._on_drop()

    def _append(self, text: str) -> bool:
        """In the worker thread: (re)open when the path no longer names our file, append, flush, fsync."""
        try:
            self._reopen_if_rotated()
            assert self._file is not None
            self._file.write(text)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            if self.healthy:
                log.error("audit_write_failed", path=self.path, error=str(exc))
            self.healthy = False
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
            return False
        if not self.healthy:
            log.info("audit_write_recovered", path=self.path)
        self.healthy = True
        return True

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
                self._file.close()
        self._file = open(self.path, "a", encoding="utf-8", errors="surrogatepass")  # noqa: SIM115 (kept open)
        self._inode = os.fstat(self._file.fileno()).st_ino
