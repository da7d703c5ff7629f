"""Call streams a client can resume: ``GET /mcp`` with ``Last-Event-ID`` after its answer stream broke.

On 2025-11-25 sessions every event of a call's answer stream carries an id ``<stream>-<n>`` and is
kept here while the call runs. A client whose connection dropped (or whose stream the gateway closed
because the upstream closed its own) reconnects with the last id it saw and gets what followed,
then the rest live, then the answer. Kept in this process only: a resumption that lands elsewhere,
or after a restart, finds nothing and opens the session's ordinary stream. A stream is replayed
only to the session it belongs to.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

#: Events one call stream keeps for a resumption; an older cursor cannot be resumed.
MAX_EVENTS = 1000
#: How long the end of a stream whose client was gone at the end stays resumable.
RETAIN_SECONDS = 120.0
#: A stream written to its end may still be lost on the way (the client's side of the connection broke first):
#: it stays resumable this long.
DELIVERED_RETAIN_SECONDS = 5.0
#: Ended streams kept per process, and the bytes they may hold.
MAX_RETAINED = 1000
MAX_RETAINED_BYTES = 64 * 1024 * 1024
#: What a client waits before reconnecting (the SSE ``retry`` field, milliseconds).
RETRY_MS = 500
_HEX = frozenset("0123456789abcdef")
#: This process's stream ids: a random prefix (unique across processes) and a count (no system call per stream).
#: They need not be secret: a stream is replayed only to its own session.
_PREFIX = secrets.token_hex(6)
_COUNT = itertools.count(1)


def new_stream_id() -> str:
    return f"{_PREFIX}{next(_COUNT):x}"


def parse_event_id(value: str | None) -> tuple[str, int] | None:
    """``<stream>-<n>`` -> (stream, n); None for anything else (an id of the session's own GET stream, junk)."""
    if not value or len(value) > 64:
        return None
    stream, sep, number = value.rpartition("-")
    if (not sep or not stream or not _HEX.issuperset(stream) or not number.isascii() or not number.isdigit()
            or len(number) > 9):
        return None
    return stream, int(number)


@dataclass(eq=False)
class CallLog:
    """One call stream's events, in order, until its final event."""

    session_id: str
    stream_id: str
    #: (n, the whole SSE frame as written)
    events: list[tuple[int, bytes]] = field(default_factory=list)
    size: int = 0
    done: bool = False
    #: Set when more arrives; made only once a reader waits (most streams are never resumed).
    _more: asyncio.Event | None = None

    def add(self, number: int, frame: bytes) -> None:
        self.events.append((number, frame))
        self.size += len(frame)
        if len(self.events) > MAX_EVENTS:
            self.size -= len(self.events.pop(0)[1])
        self._wake()

    def end(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        more, self._more = self._more, None
        if more is not None:
            more.set()

    def resumable_after(self, number: int) -> bool:
        """Whether every event after ``number`` is still here."""
        return number >= 0 and (not self.events or self.events[0][0] <= number + 1)

    def since(self, cursor: int) -> tuple[list[tuple[int, bytes]], bool, asyncio.Event]:
        """Events after ``cursor``, whether the stream has ended, and what is set when more arrives.

        The three are read together, so nothing added in between is missed by a reader that waits.
        """
        if self._more is None:
            self._more = asyncio.Event()
        return [(n, f) for n, f in self.events if n > cursor], self.done, self._more


class ReplayBook:
    """This process's resumable call streams: running ones, and ended ones kept a while for a late resumption."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._running: dict[str, CallLog] = {}
        #: delivered or not -> stream id -> (log, when it stops being resumable); each oldest first, one TTL each
        self._kept: dict[bool, OrderedDict[str, tuple[CallLog, float]]] = {True: OrderedDict(), False: OrderedDict()}
        self._kept_bytes = 0

    def __len__(self) -> int:
        return len(self._running) + sum(len(kept) for kept in self._kept.values())

    def open(self, session_id: str) -> CallLog:
        log = CallLog(session_id, new_stream_id())
        self._running[log.stream_id] = log
        return log

    def close(self, log: CallLog, *, delivered: bool) -> None:
        """The call ended; its stream stays resumable a while: briefly when its end was written, else longer."""
        log.end()
        self._running.pop(log.stream_id, None)
        self._expire()
        ttl = DELIVERED_RETAIN_SECONDS if delivered else RETAIN_SECONDS
        self._kept[delivered][log.stream_id] = (log, self._clock() + ttl)
        self._kept_bytes += log.size
        while self._kept_bytes > MAX_RETAINED_BYTES or len(self._kept[True]) + len(self._kept[False]) > MAX_RETAINED:
            # the delivered ones go first: their client most likely read them
            self._drop_oldest(self._kept[True] or self._kept[False])

    def find(self, session_id: str, last_event_id: str | None) -> tuple[CallLog, int] | None:
        """The stream a ``Last-Event-ID`` resumes, and its cursor; never another session's stream."""
        parsed = parse_event_id(last_event_id)
        if parsed is None:
            return None
        stream_id, number = parsed
        self._expire()
        log = self._running.get(stream_id)
        for kept in self._kept.values():
            if log is None and stream_id in kept:
                log = kept[stream_id][0]
        if log is None or log.session_id != session_id or not log.resumable_after(number):
            return None
        return log, number

    def _drop_oldest(self, kept: OrderedDict[str, tuple[CallLog, float]]) -> None:
        _, (log, _) = kept.popitem(last=False)
        self._kept_bytes -= log.size

    def _expire(self) -> None:
        now = self._clock()
        for kept in self._kept.values():
            while kept and next(iter(kept.values()))[1] <= now:
                self._drop_oldest(kept)
