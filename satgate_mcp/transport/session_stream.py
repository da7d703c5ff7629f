"""The session's own server-to-client stream: ``GET /mcp``.

What an upstream announces outside any call reaches clients here: ``notifications/*/list_changed``
when a merged list changes (every open stream), ``notifications/resources/updated`` (only the
sessions subscribed to that URI) and ``notifications/tasks/status`` (only the session that created
the task). One stream per session; it ends with the session, on shutdown, or when its reader falls
``MAX_QUEUED`` messages behind. Nothing is replayed: after a restart, or
a reconnect, a client's GET simply opens a new stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import structlog
from aiohttp import web

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.sessions import Session
from satgate_mcp.subscriptions import Origin, SubscriptionTable
from satgate_mcp.task_ids import TASK_STATUS
from satgate_mcp.task_relay import TaskRelay
from satgate_mcp.transport import rules
from satgate_mcp.transport.answers import refusal_answer
from satgate_mcp.transport.call_answer import SSE_HEADERS
from satgate_mcp.transport.checks import RequestChecks
from satgate_mcp.transport.replay import CallLog, ReplayBook
from satgate_mcp.transport.rules import SESSION_HEADER, VERSION_HEADER, Refusal
from satgate_mcp.transport.session_gate import SessionGate
from satgate_mcp.upstream.base import TaskNotice

KEEPALIVE_SECONDS = 15.0
#: Messages waiting for a slow reader; past this the stream is cut rather than growing without bound.
MAX_QUEUED = 1000
TOOLS_CHANGED = "notifications/tools/list_changed"
RESOURCE_UPDATED = "notifications/resources/updated"
#: Sessions at this revision or later get a priming event (an id, no data) first.
PRIMING_SINCE = "2025-11-25"

NOT_ACCEPTABLE = Refusal(406, "not_acceptable", "Accept must include text/event-stream")
ALREADY_OPEN = Refusal(409, "stream_already_open",
                       "This session already has an open stream; close it before opening another")

#: Once the drain began no stream opens here: it would hold the drain; the client reconnects to the successor.
SHUTTING_DOWN = Refusal(503, "shutting_down", "This process is shutting down; reconnect", headers={"Retry-After": "1"})

log = structlog.get_logger("satgate_mcp.transport.session_stream")


def sse_event_with_id(event_id: int, message: JsonObj | None) -> bytes:
    data = "" if message is None else json.dumps(message, separators=(",", ":"))
    return f"id: {event_id}\nevent: message\ndata: {data}\n\n".encode()


def recipients(method: str, params: JsonObj | None, open_sessions: frozenset[str],
               subscriptions: SubscriptionTable, origin: Origin | None = None) -> frozenset[str]:
    """Which open streams a notice goes to: list changes to all, a resource update to its subscribers only
    (from an isolated upstream's child, ``origin``: only those subscribed on that child)."""
    if method == RESOURCE_UPDATED:
        uri = (params or {}).get("uri")
        return subscriptions.subscribers(uri, origin) & open_sessions if isinstance(uri, str) else frozenset()
    return open_sessions


@dataclass
class OpenStream:
    session: Session
    #: One slot beyond MAX_QUEUED is kept for the None that ends an overflowing stream.
    queue: asyncio.Queue[JsonObj | None] = field(default_factory=lambda: asyncio.Queue(MAX_QUEUED + 1))
    next_id: int = 1
    #: Whether its client is still connected: a stream whose client left gives way to a new one at once.
    alive: Callable[[], bool] = lambda: True

    def deliver(self, message: JsonObj) -> None:
        if self.queue.qsize() < MAX_QUEUED:
            self.queue.put_nowait(message)
        elif not self.queue.full():
            log.warning("stream_reader_too_slow", session_id=self.session.id)
            self.queue.put_nowait(None)

    def end(self) -> None:
        if not self.queue.full():  # what is already queued goes out first
            self.queue.put_nowait(None)


class StreamHub:
    """The open streams, one per session, and the pool's notices routed to them."""

    def __init__(self, subscriptions: SubscriptionTable, tools_version: Callable[[], int]) -> None:
        self._subscriptions = subscriptions
        self._tools_version = tools_version
        self._streams: dict[str, OpenStream] = {}
        self._none_open = asyncio.Event()
        self._none_open.set()
        self.closing = False

    def __len__(self) -> int:
        return len(self._streams)

    def has_stream(self, session_id: str) -> bool:
        return session_id in self._streams

    def open(self, session: Session, alive: Callable[[], bool] = lambda: True) -> OpenStream | None:
        """The session's new stream, or None while it already has one whose client is connected (409)."""
        existing = self._streams.get(session.id)
        if existing is not None:
            if existing.alive():
                return None
            existing.end()
        stream = self._streams[session.id] = OpenStream(session, alive=alive)
        self._none_open.clear()
        return stream

    def release(self, stream: OpenStream) -> None:
        if self._streams.get(stream.session.id) is stream:
            del self._streams[stream.session.id]
        if not self._streams:
            self._none_open.set()

    async def all_released(self) -> None:
        """Until no stream is open: on shutdown, so the drain that follows finds them finished, not cut."""
        await self._none_open.wait()

    def end(self, session_id: str) -> None:
        """The session ended: so does its stream."""
        stream = self._streams.get(session_id)
        if stream is not None:
            stream.end()

    def end_all(self) -> None:
        self.closing = True
        for stream in self._streams.values():
            stream.end()

    def tell(self, method: str, only: Callable[[Session], bool]) -> None:
        """A list change for some sessions only (a policy reload changed what they, and no others, are shown)."""
        message = jsonrpc.notification_message(method, None)
        for stream in self._streams.values():
            if only(stream.session):
                if method == TOOLS_CHANGED:
                    stream.session.saw_tools(self._tools_version())
                stream.deliver(message)

    def send(self, session_id: str, message: JsonObj) -> bool:
        """One message for one session's stream (a task's status, for its creator); False when it has none open."""
        stream = self._streams.get(session_id)
        if stream is not None:
            stream.deliver(message)
        return stream is not None

    def task_notice(self, relay: TaskRelay) -> TaskNotice:
        """The pool's task listener: a task's status reaches the stream of the session that created it, alone."""

        def notice(upstream: str, method: str, params: JsonObj | None) -> None:
            found = relay.notice(upstream, method, params) if method == TASK_STATUS else None
            if found is not None and not self.send(*found):
                log.debug("task_notice_unheard", upstream=upstream, method=method)

        return notice

    def notice(self, method: str, params: JsonObj | None, origin: Origin | None = None) -> None:
        """The pool's listener: a merged list changed, or an upstream resource was updated."""
        message = jsonrpc.notification_message(method, params)
        for session_id in recipients(method, params, frozenset(self._streams), self._subscriptions, origin):
            stream = self._streams[session_id]
            if method == TOOLS_CHANGED:  # told now, so it is not owed again ahead of the next answer
                stream.session.saw_tools(self._tools_version())
            stream.deliver(message)


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


class StandaloneStream:
    """``GET /mcp``: the same checks as any request, then the session's stream until it ends."""

    def __init__(self, checks: RequestChecks, gate: SessionGate, hub: StreamHub,
                 replay: ReplayBook | None = None) -> None:
        """``replay``: the answer streams a ``Last-Event-ID`` may resume (None: a GET always opens a new stream)."""
        self._checks = checks
        self._gate = gate
        self._hub = hub
        self._replay = replay

    async def end_streams(self, app: web.Application) -> None:
        """On shutdown: open streams would hold the drain until its deadline; end them so clients reconnect.

        Waits until each has written its end: the runner bounds the wait, and a stream still writing
        when the drain is cut would be counted as a cut call.
        """
        self._hub.end_all()
        await self._hub.all_released()

    async def get(self, request: web.Request) -> web.StreamResponse:
        refusal = self._checks.check_host_origin(request) or (SHUTTING_DOWN if self._hub.closing else None)
        if refusal is None and not rules.accepts(request.headers.get("Accept"), "text/event-stream"):
            refusal = NOT_ACCEPTABLE
        session_id = request.headers.get(SESSION_HEADER)
        refusal = (refusal or rules.check_session_header(session_id)
                   or rules.check_protocol_header(request.headers.get(VERSION_HEADER)))
        if refusal:
            return refusal_answer(refusal)
        session = await self._gate.named_session(request, may_resume=True)
        if isinstance(session, Refusal):
            return refusal_answer(session)
        found = self._replay.find(session.id, request.headers.get("Last-Event-ID")) if self._replay else None
        if found is not None:
            return await self._resume(request, session, *found)
        stream = self._hub.open(session, partial(_connected, request))
        if stream is None:
            return refusal_answer(ALREADY_OPEN)
        try:
            return await self._serve(request, stream)
        finally:
            self._hub.release(stream)

    async def _resume(self, request: web.Request, session: Session, log: CallLog, after: int) -> web.StreamResponse:
        """A call's answer stream again, from the event after ``after``: what was missed, the rest live, the answer.

        Not the session's own stream (no 409 with it open): it ends with the call.
        """
        response = web.StreamResponse(headers={SESSION_HEADER: session.id, **SSE_HEADERS})
        cursor = after
        try:
            await response.prepare(request)
            while True:
                fresh, ended, more = log.since(cursor)
                for cursor, frame in fresh:  # noqa: B007 - the cursor is what the next round starts from
                    await response.write(frame)
                if ended:
                    break
                try:
                    await asyncio.wait_for(more.wait(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    self._gate.touch(session)
                    await response.write(b": keepalive\n\n")
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    async def _serve(self, request: web.Request, stream: OpenStream) -> web.StreamResponse:
        session = stream.session
        response = web.StreamResponse(headers={SESSION_HEADER: session.id, **SSE_HEADERS})
        try:
            await response.prepare(request)
            if session.protocol_version >= PRIMING_SINCE:
                await response.write(sse_event_with_id(0, None))
            else:
                await response.write(b": stream open\n\n")
            while True:
                try:
                    item = await asyncio.wait_for(stream.queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    self._gate.touch(session)  # an open stream is not an idle session
                    await response.write(b": keepalive\n\n")
                    continue
                if item is None:
                    await response.write_eof()
                    break
                await response.write(sse_event_with_id(stream.next_id, item))
                stream.next_id += 1
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response
