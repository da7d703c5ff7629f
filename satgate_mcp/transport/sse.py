"""The legacy HTTP+SSE transport (protocol 2024-11-05): GET /sse opens a stream, POST /message feeds it.

Kept for older clients. Its sessions live only as long as their stream: the stream is the session,
so unlike /mcp there is nothing to resume after a restart; the client reconnects and re-initializes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from satgate_mcp import jsonrpc
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.inflight import too_many_in_flight
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import RPC_METHOD, SESSION_ID
from satgate_mcp.sessions import CloseReason, RegistryFull, Session, SessionRegistry
from satgate_mcp.transport import rules
from satgate_mcp.transport.rules import Refusal
from satgate_mcp.transport.streamable import StreamableHttpTransport, refusal_answer, registry_full_refusal

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
    def __init__(self, streamable: StreamableHttpTransport, registry: SessionRegistry, dispatcher: Dispatcher) -> None:
        # Auth, Host/Origin checks and session lookup are the same rules as /mcp; reuse them, do not restate them.
        self._mcp = streamable
        self._registry = registry
        self._dispatcher = dispatcher
        self._streams: dict[str, _Stream] = {}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/sse", self.stream)
        app.router.add_post("/message", self.message)
        app.on_shutdown.append(self.end_streams)

    async def end_streams(self, app: web.Application) -> None:
        """On SIGTERM: open streams would hold the drain until its deadline; end them so clients reconnect."""
        for state in self._streams.values():
            if not state.queue.full():  # replies already queued go out first
                state.queue.put_nowait(None)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        refusal = self._mcp.check_origin_and_host(request)
        if refusal:
            return refusal_answer(refusal)
        auth = await self._mcp.authenticate(request)
        if isinstance(auth, Refusal):
            return refusal_answer(auth)
        assert auth.identity is not None
        try:
            session = self._registry.open(auth.token, auth.identity, LEGACY_VERSION)
        except RegistryFull as full:
            return refusal_answer(registry_full_refusal(full))
        session.tools_seen = self._dispatcher.tools_version
        session.inflight += 1  # the open stream is the session: never evicted for its token's quota
        request[SESSION_ID] = session.id
        state = _Stream(session)
        self._streams[session.id] = state
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await response.prepare(request)
            await response.write(f"event: endpoint\ndata: /message?sessionId={session.id}\n\n".encode())
            while True:
                try:
                    item = await asyncio.wait_for(state.queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    self._registry.touch(state.session)  # an open stream is not an idle session
                    await response.write(b": keepalive\n\n")
                    continue
                if item is None:
                    break
                data = json.dumps(item, separators=(",", ":"))
                await response.write(f"event: message\ndata: {data}\n\n".encode())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._streams.pop(session.id, None)
            for task in state.tasks:
                task.cancel()
            self._registry.close(session.id, CloseReason.DISCONNECTED)
        return response

    async def message(self, request: web.Request) -> web.StreamResponse:
        refusal = self._mcp.check_origin_and_host(request) or rules.check_content_type(
            request.headers.get("Content-Type"))
        if refusal:
            return refusal_answer(refusal)
        session_id = request.query.get("sessionId", "")
        if session_id:
            request[SESSION_ID] = session_id
        state = self._streams.get(session_id)
        if state is None:
            return refusal_answer(rules.SESSION_NOT_FOUND)
        found = await self._mcp.session_for(request, session_id, may_resume=False)
        if isinstance(found, Refusal):
            return refusal_answer(found)
        raw = await self._mcp.read_body(request)
        if raw is None:
            return refusal_answer(rules.body_too_large(self._mcp.max_body_bytes))
        try:
            message = jsonrpc.parse_message(json.loads(raw))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return refusal_answer(rules.PARSE_ERROR)
        except jsonrpc.InvalidMessage as exc:
            return refusal_answer(rules.invalid_message(str(exc)), exc.request_id)
        if isinstance(message, jsonrpc.Request):
            request[RPC_METHOD] = message.method
            # The slot is taken here, before any task exists, so a flood of messages never piles up tasks.
            if not self._mcp.admit(state.session, message):
                self._enqueue(state, too_many_in_flight(message.id))
                return web.Response(status=202, text="Accepted")
            task = asyncio.create_task(self._answer(state, message))
            state.tasks.add(task)
            task.add_done_callback(state.tasks.discard)
            task.add_done_callback(lambda _t: self._mcp.limiter.release(state.session.quota_key))
        elif isinstance(message, jsonrpc.Notification):
            request[RPC_METHOD] = message.method
            self._mcp.on_notification(state.session, message)
        return web.Response(status=202, text="Accepted")

    async def _answer(self, state: _Stream, message: jsonrpc.Request) -> None:
        for note in self._mcp.pending_notifications(state.session, message):
            self._enqueue(state, note)
        if message.method == "initialize":
            reply = jsonrpc.result_response(message.id, self._dispatcher.initialize_result(LEGACY_VERSION))
        else:
            reply = await self._mcp.run_admitted(state.session, message, None)
        self._enqueue(state, reply)

    @staticmethod
    def _enqueue(state: _Stream, message: JsonObj) -> None:
        if state.queue.qsize() < MAX_QUEUED:
            state.queue.put_nowait(message)
        elif not state.queue.full():
            log.warning("sse_reader_too_slow", session_id=state.session.id)
            state.queue.put_nowait(None)
