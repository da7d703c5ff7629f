"""The drain: requests in flight finish, idle keep-alive connections close only once they stayed idle.

Every response during a drain is sent with ``Connection: close``, so the client reconnects to the next
process. aiohttp's own ``runner.cleanup()`` closes every idle connection at once and drops bytes
that arrive on it afterwards; that is the race the drain loop avoids, by closing an idle connection
only after ``IDLE_GRACE_SECONDS`` without a request.

Which connection is busy is tracked here, by the outermost middleware, from a request's arrival until
its response is completely written (a streamed SSE answer included); aiohttp's own idle test would
need its private fields. Every change wakes the drain, so it never polls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler

from satgate_mcp import jsonrpc
from satgate_mcp.exits import ExitCode
from satgate_mcp.transport.answers import refusal_answer
from satgate_mcp.transport.rules import Refusal

#: A new connection past SATGATE_MAX_CONNECTIONS: the client may retry in a moment, here or on another machine.
TOO_MANY_CONNECTIONS = Refusal(503, "too_many_connections", "Too many connections: retry in a moment",
                               code=jsonrpc.SERVER_ERROR, headers={"Retry-After": "1"})

#: An idle keep-alive connection is closed during a drain only after this long without a request.
IDLE_GRACE_SECONDS = 1.0

DrainReason = Literal["clean", "deadline", "signal"]
Sleep = Callable[[float], Awaitable[None]]


def idle_expired(now: float, idle_since: float, grace: float) -> bool:
    """Whether a connection idle since ``idle_since`` may be closed without racing its next request."""
    return now - idle_since >= grace


def drain_reason(*, connections: int, now: float, deadline: float, cut_requested: bool) -> DrainReason | None:
    """Why the drain ends now, or None while it goes on. A finished drain beats a late cut."""
    if connections == 0:
        return "clean"
    if cut_requested:
        return "signal"
    if now >= deadline:
        return "deadline"
    return None


def next_look(*, deadline: float, idle_since: Iterable[float], grace: float) -> float:
    """When the drain must look again if no request arrives or finishes: a grace runs out, or the deadline."""
    return min([deadline, *(since + grace for since in idle_since)])


def exit_code(reason: DrainReason) -> ExitCode:
    return ExitCode.OK if reason == "clean" else ExitCode.FAILED


@dataclass
class DrainReport:
    reason: DrainReason
    in_flight_at_start: int
    idle_at_start: int
    adopted: int = 0
    started_during: int = 0
    closed_idle: int = 0
    cut: int = 0
    seconds: float = 0.0

    @property
    def drained(self) -> int:
        """Requests that finished during the drain."""
        return self.in_flight_at_start + self.started_during - self.cut


async def _send_whole(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Write the response here, not just after the middleware returns, so "finished" is seen by the tracker.

    aiohttp's own finishing step then finds it sent and does nothing more.
    """
    with contextlib.suppress(ConnectionError):  # the client left: aiohttp notes it, as it always did
        await response.prepare(request)
        await response.write_eof()


class ConnectionTracker:
    """Which connections are busy, for the drain; and ``Connection: close`` on every answer once it drains."""

    def __init__(self, clock: Callable[[], float], *, max_connections: int = 4096) -> None:
        self._clock = clock
        self._max_connections = max_connections
        self._in_progress: dict[RequestHandler, int] = {}
        self._finished_at: dict[RequestHandler, float] = {}
        self._watched: set[RequestHandler] = set()
        #: Set on every arrival, finish and closed connection: what the drain waits on.
        self.changed = asyncio.Event()
        self.draining = False

    def busy(self, conn: RequestHandler) -> bool:
        return conn in self._in_progress

    def idle_since(self, conn: RequestHandler, drain_started: float) -> float:
        """When ``conn`` last finished a response; a connection idle from before the drain gets the whole grace."""
        return max(drain_started, self._finished_at.get(conn, drain_started))

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Outermost: a connection is busy until the response this request gets is completely written. A new
        connection past ``max_connections`` gets 503 and is closed (it counts once it sends a request)."""
        conn = request.protocol
        if conn not in self._watched and len(self._watched) >= self._max_connections:
            refused = refusal_answer(TOO_MANY_CONNECTIONS)
            refused.force_close()
            return refused
        self._arrived(conn, request.task)
        try:
            response = await handler(request)
            await _send_whole(request, response)
            return response
        except web.HTTPException as exc:
            await _send_whole(request, exc)
            raise
        finally:
            self._finished(conn)

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        # The client then opens its next connection, which only the next process accepts. aiohttp
        # computes its Connection header before this hook runs, so the header is set here too.
        if self.draining:
            response.force_close()
            response.headers[hdrs.CONNECTION] = "close"

    def _arrived(self, conn: RequestHandler, connection_task: asyncio.Task[None]) -> None:
        self._in_progress[conn] = self._in_progress.get(conn, 0) + 1
        if conn not in self._watched:
            # ``request.task`` serves the whole connection: it ends when the connection does.
            self._watched.add(conn)
            connection_task.add_done_callback(lambda _: self._gone(conn))
        self.changed.set()

    def _finished(self, conn: RequestHandler) -> None:
        left = self._in_progress.pop(conn, 1) - 1
        if left:
            self._in_progress[conn] = left
        self._finished_at[conn] = self._clock()
        self.changed.set()

    def _gone(self, conn: RequestHandler) -> None:
        self._watched.discard(conn)
        self._in_progress.pop(conn, None)
        self._finished_at.pop(conn, None)
        self.changed.set()


async def first_of(*waits: Awaitable[object]) -> None:
    """Until one of ``waits`` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def drain(server: web.Server, tracker: ConnectionTracker, *, deadline: float, cut: asyncio.Event,
                clock: Callable[[], float], sleep: Sleep = asyncio.sleep, idle_grace: float = IDLE_GRACE_SECONDS,
                adopted: int = 0) -> DrainReport:
    """Let requests finish; close idle connections once they stayed idle; stop at the deadline or on ``cut``.

    ``clock`` and ``sleep`` are the same time source (the loop's in the daemon, a fake one in tests).
    """
    started = clock()
    conns = server.connections
    busy_at_start = sum(tracker.busy(c) for c in conns)
    report = DrainReport("clean", in_flight_at_start=busy_at_start, idle_at_start=len(conns) - busy_at_start,
                         adopted=adopted)
    requests_before = server.requests_count
    closed: set[RequestHandler] = set()
    while True:
        tracker.changed.clear()
        now = clock()
        live = [c for c in server.connections if c not in closed]
        reason = drain_reason(connections=len(live), now=now, deadline=deadline, cut_requested=cut.is_set())
        if reason is not None:
            break
        idle = {c: tracker.idle_since(c, started) for c in live if not tracker.busy(c)}
        expired = [c for c, since in idle.items() if idle_expired(now, since, idle_grace)]
        for conn in expired:
            conn.force_close()
            closed.add(conn)
        if expired:
            continue
        wake_at = next_look(deadline=deadline, idle_since=idle.values(), grace=idle_grace)
        await first_of(tracker.changed.wait(), cut.wait(), sleep(max(0.0, wake_at - now)))
    report.reason = reason
    report.started_during = server.requests_count - requests_before
    report.closed_idle = len(closed)
    report.cut = sum(tracker.busy(c) for c in live) if reason != "clean" else 0
    report.seconds = round(clock() - started, 3)
    return report
