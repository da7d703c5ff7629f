"""The legacy HTTP+SSE transport (protocol 2024-11-05): GET /sse opens a stream, POST /message feeds it.

Kept for older clients. Its sessions live only as long as their stream: the stream is the session,
so unlike /mcp there is nothing to resume after a restart; the client reconnects and re-initializes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import partial

import structlog
from aiohttp import web

from satgate_mcp import jsonrpc
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.inflight import too_many_in_flight
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import RPC_METHOD, SESSION_ID
from satgate_mcp.sessions import CloseReason, Session
from satgate_mcp.transport import rules
from satgate_mcp.transport.answers import refusal_answer, rejected_answer, sse_event
from satgate_mcp.transport.call_runner import CallRunner
from satgate_mcp.transport.checks import RequestChecks
from satgate_mcp.transport.rules import Refusal, Rejected
from satgate_mcp.transport.session_gate import SessionGate
from satgate_mcp.transport.session_stream import StreamHub

LEGACY_VERSION = "2024-11-05"
KEEPALIVE_SECONDS = 15.0
#: Replies waiting for a slow SSE reader; past this the stream is closed rather than growing without bound.
MAX_QUEUED = 1000

log = structlog.get_logger("satgate_mcp.transport.sse")


@dataclass
class _Stream:
    session: Session
    #: One slot beyond MAX_QUEUED is kept for the None that closes an overflowing stream.
    queue: asyncio.Queue[JsonObj | None] = field(default_factory=lambda: asyncio.Queue(MAX_QUEUED + 1))
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class LegacySseTransport:
    def __init__(self, checks: RequestChecks, gate: SessionGate, runner: CallRunner, dispatcher: Dispatcher,
                 hub: StreamHub | None = None) -> None:
        """``hub``: where the pool's notices (list changes, updates of subscribed resources) reach open streams.

        Auth, Host/Origin checks, sessions and calls are the same pieces as /mcp's: reused, not restated.
        """
        self._checks = checks
        self._gate = gate
        self._runner = runner
        self._dispatcher = dispatcher
        self._hub = hub
        self._streams: dict[str, _Stream] = {}
        self._none_open = asyncio.Event()
        self._none_open.set()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/sse", self.stream)
        app.router.add_post("/message", self.message)
        app.on_shutdown.append(self.end_streams)

    async def end_streams(self, app: web.Application) -> None:
        """On SIGTERM: open streams would hold the drain until its deadline; end them so clients reconnect.

        Waits until each has written its end (the runner bounds the wait), so the drain does not count them as cut.
        """
        for state in self._streams.values():
            if not state.queue.full():  # replies already queued go out first
                state.queue.put_nowait(None)
        await self._none_open.wait()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        refusal = self._checks.check_host_origin(request)
        if refusal:
            return refusal_answer(refusal)
        principal = await self._checks.principal(request)
        if isinstance(principal, Refusal):
            return refusal_answer(principal)
        session = self._gate.open_session(principal, LEGACY_VERSION)
        if isinstance(session, Refusal):
            return refusal_answer(session)
        session.call_started()  # the open stream is the session: never evicted for its token's quota
        request[SESSION_ID] = session.id
        # The stream is the session's only one: the hub's notices go into the same queue as its answers.
        opened = self._hub.open(session) if self._hub is not None else None
        state = _Stream(session) if opened is None else _Stream(session, queue=opened.queue)
        self._streams[session.id] = state
        self._none_open.clear()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await response.prepare(request)
            await response.write(f"event: endpoint\ndata: /message?sessionId={session.id}\n\n".encode())
            while True:
                try:
                    item = await asyncio.wait_for(state.queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    self._gate.touch(state.session)  # an open stream is not an idle session
                    await response.write(b": keepalive\n\n")
                    continue
                if item is None:
                    await response.write_eof()
                    break
                await response.write(sse_event(item))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if opened is not None and self._hub is not None:
                self._hub.release(opened)
            self._streams.pop(session.id, None)
            if not self._streams:
                self._none_open.set()
            for task in state.tasks:
                task.cancel()
            self._gate.close_session(session, CloseReason.DISCONNECTED)
        return response

    async def message(self, request: web.Request) -> web.StreamResponse:
        checks, runner = self._checks, self._runner
        refusal = checks.check_host_origin(request) or rules.check_content_type(request.headers.get("Content-Type"))
        if refusal:
            return refusal_answer(refusal)
        session_id = request.query.get("sessionId", "")
        if session_id:
            request[SESSION_ID] = session_id
        state = self._streams.get(session_id)
        if state is None:
            return refusal_answer(rules.SESSION_NOT_FOUND)
        principal = await checks.principal(request)
        if isinstance(principal, Refusal):
            return refusal_answer(principal)
        found = self._gate.session(request, principal, session_id, may_resume=False)
        if isinstance(found, Refusal):
            return refusal_answer(found)
        raw = await checks.read_body(request)
        if isinstance(raw, Refusal):
            return refusal_answer(raw)
        message = rules.parse_single(raw)
        if isinstance(message, Rejected):
            return rejected_answer(message)
        if isinstance(message, jsonrpc.Request):
            request[RPC_METHOD] = message.method
            # The slot is taken here, before any task exists, so a flood of messages never piles up tasks.
            task = runner.spawn(state.session, message, partial(self._answer, state, message))
            if task is None:
                self._enqueue(state, too_many_in_flight(message.id))
            else:
                state.tasks.add(task)
                task.add_done_callback(state.tasks.discard)
        elif isinstance(message, jsonrpc.Notification):
            request[RPC_METHOD] = message.method
            runner.on_notification(state.session, message)
        else:
            request[RPC_METHOD] = "response"
            runner.on_response(state.session, message)
        return web.Response(status=202, text="Accepted")

    async def _answer(self, state: _Stream, message: jsonrpc.Request) -> None:
        for note in self._gate.owed(state.session, message):
            self._enqueue(state, note)
        if message.method == "initialize":
            state.session.declare(message.params)
            reply = jsonrpc.result_response(message.id, self._dispatcher.initialize_result(LEGACY_VERSION))
        else:
            async def emit(out: JsonObj) -> bool:
                return self._enqueue(state, out)

            # The one stream carries every call's traffic; ids keep the answers apart.
            relay = self._runner.relay(state.session, emit, streaming=True)
            try:
                reply = await self._runner.run_admitted(state.session, message, relay)
            finally:
                relay.close()
        self._enqueue(state, reply)

    def _enqueue(self, state: _Stream, message: JsonObj) -> bool:
        """Queue one message for the stream; False when it is gone or too far behind to take more."""
        if self._streams.get(state.session.id) is not state:
            return False
        if state.queue.qsize() < MAX_QUEUED:
            state.queue.put_nowait(message)
            return True
        if not state.queue.full():
            log.warning("sse_reader_too_slow", session_id=state.session.id)
            state.queue.put_nowait(None)
        return False
