"""The drain: requests in flight finish, idle keep-alive connections close only once they stayed idle.

Every response during a drain is sent with ``Connection: close``, so the client reconnects to the next
process. aiohttp's own ``runner.cleanup()`` closes every idle connection at once and drops bytes
that arrive on it afterwards; that is the race the drain loop avoids, by closing an idle connection
only after ``IDLE_GRACE_SECONDS`` without a request. It reads two private fields of
``aiohttp.web_protocol.RequestHandler`` (``_waiter``, ``_messages``), the same test aiohttp uses for
"idle" in its keep-alive timer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler

from satgate_mcp.exits import ExitCode

#: An idle keep-alive connection is closed during a drain only after this long without a request.
IDLE_GRACE_SECONDS = 1.0
#: How often the drain loop looks at connections (aiohttp offers no event for "request finished").
DRAIN_POLL_SECONDS = 0.05

DrainReason = Literal["clean", "deadline", "signal"]


def connection_idle(conn: RequestHandler) -> bool:
    """aiohttp's own idle test: waiting for the next request with nothing buffered."""
    waiter = conn._waiter
    return waiter is not None and not waiter.done() and not conn._messages


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


@dataclass
class DrainState:
    """Shared by the response hook and the drain loop."""

    draining: bool = False
    busy_seen: dict[RequestHandler, float] = field(default_factory=dict)

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        # The client then opens its next connection, which only the next process accepts. aiohttp
        # computes its Connection header before this hook runs, so the header is set here too.
        if self.draining:
            response.force_close()
            response.headers[hdrs.CONNECTION] = "close"



async def drain(server: web.Server, state: DrainState, *, deadline: float, cut: asyncio.Event,
                clock: Callable[[], float], adopted: int = 0) -> DrainReport:
    """Let requests finish; close idle connections once they stayed idle; stop at the deadline or on ``cut``."""
    started = clock()
    conns = server.connections
    report = DrainReport("clean", in_flight_at_start=sum(not connection_idle(c) for c in conns),
                         idle_at_start=sum(connection_idle(c) for c in conns), adopted=adopted)
    requests_before = server.requests_count
    closed: set[RequestHandler] = set()
    while True:
        now = clock()
        live = [c for c in server.connections if c not in closed]
        reason = drain_reason(connections=len(live), now=now, deadline=deadline, cut_requested=cut.is_set())
        if reason is not None:
            break
        for conn in live:
            if not connection_idle(conn):
                state.busy_seen[conn] = now
            elif idle_expired(now, state.busy_seen.get(conn, started), IDLE_GRACE_SECONDS):
                conn.force_close()
                closed.add(conn)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cut.wait(), timeout=max(0.0, min(DRAIN_POLL_SECONDS, deadline - now)))
    report.reason = reason
    report.started_during = server.requests_count - requests_before
    report.closed_idle = len(closed)
    report.cut = sum(not connection_idle(c) for c in live) if reason != "clean" else 0
    report.seconds = round(clock() - started, 3)
    return report

