"""Streamable HTTP at /mcp (revisions 2025-03-26, 2025-06-18, 2025-11-25).

The handler walks a fixed ladder of checks, each a pure function in ``rules``; the first refusal
is the answer. Sessions are found, or rebuilt from the verified token (resume), in the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from satgate_mcp import events, jsonrpc
from satgate_mcp.auth.base import Authenticator, AuthResult
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.events import Publisher
from satgate_mcp.inflight import InflightLimiter, too_many_in_flight
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.keys import RPC_METHOD, SESSION_ID
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import (
    RegistryFull,
    ResumeRefusal,
    Session,
    SessionRegistry,
    TokenSessionsBusy,
    is_valid_session_id_syntax,
)
from satgate_mcp.settings import Settings
from satgate_mcp.transport import rules
from satgate_mcp.transport.rules import Refusal

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"

log = structlog.get_logger("satgate_mcp.transport")

InflightKey = tuple[str, RequestId]


def json_answer(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(body, separators=(",", ":")),
                        content_type="application/json", headers=headers)


def refusal_answer(refusal: Refusal, request_id: RequestId | None = None) -> web.Response:
    return json_answer(refusal.body(request_id), refusal.status, dict(refusal.headers))


def registry_full_refusal(full: RegistryFull) -> Refusal:
    """The process cap (as ever), or this token's quota with every one of its sessions busy."""
    if isinstance(full, TokenSessionsBusy):
        return Refusal(503, full.reason, "Too many sessions for this token, all of them busy; retry later",
                       code=jsonrpc.SERVER_ERROR, headers={"Retry-After": str(full.retry_after)})
    return rules.session_cap_reached(full.retry_after)


def host_origin_refusal(request: web.Request, settings: Settings) -> Refusal | None:
    """The DNS-rebinding guard every browser-reachable endpoint shares (/mcp, /sse, /readyz, /metrics)."""
    return (rules.check_host(request.headers.get("Host"), settings.allowed_hosts, settings.host)
            or rules.check_origin(request.headers.get("Origin"), settings.allowed_origins))


def sse_event(message: JsonObj) -> bytes:
    return b"event: message\ndata: " + json.dumps(message, separators=(",", ":")).encode() + b"\n\n"


def _progress_token(request: jsonrpc.Request) -> object:
    meta = (request.params or {}).get("_meta")
    return meta.get("progressToken") if isinstance(meta, dict) else None


class StreamableHttpTransport:
    def __init__(self, *, settings: Settings, registry: SessionRegistry, authenticator: Authenticator,
                 dispatcher: Dispatcher, publisher: Publisher, metrics: Metrics,
                 limiter: InflightLimiter | None = None) -> None:
        self._settings = settings
        self._registry = registry
        self._auth = authenticator
        self._dispatcher = dispatcher
        self._publisher = publisher
        self._metrics = metrics
        self.limiter = limiter or InflightLimiter(per_token=settings.max_inflight_per_token,
                                                  total=settings.max_inflight)
        #: Calls in flight by (session, JSON-RPC id); a set, since a careless client may reuse an id concurrently.
        self._inflight: dict[InflightKey, set[asyncio.Task[JsonObj]]] = {}

    @property
    def resumes_sessions(self) -> bool:
        return self._auth.mode == "header"

    @property
    def max_body_bytes(self) -> int:
        return self._settings.max_body_bytes

    @property
    def _oauth_url(self) -> str | None:
        return self._settings.oauth_resource_metadata_url

    def add_routes(self, app: web.Application, path: str = "/mcp") -> None:
        app.router.add_post(path, self.post)
        app.router.add_delete(path, self.delete)
        app.router.add_get(path, self.get)
        app.router.add_route("*", path, self.other)

    # --- edges shared by every verb -------------------------------------------------------------

    def check_origin_and_host(self, request: web.Request) -> Refusal | None:
        return host_origin_refusal(request, self._settings)

    async def authenticate(self, request: web.Request) -> AuthResult | Refusal:
        result = await self._auth.authenticate(request.headers.get("Authorization"))
        if result.ok:
            return result
        self._metrics.refusals.labels(reason=str(result.outcome)).inc()
        self._publisher.publish(events.AUTH_FAILURE, outcome=str(result.outcome), reason=result.reason,
                                path=request.path, remote=request.remote)
        return rules.auth_refusal(result.outcome, self._oauth_url)

    async def session_for(self, request: web.Request, session_id: str, *, may_resume: bool) -> Session | Refusal:
        """The live session for this id and credential, or a session rebuilt from the verified token."""
        auth = await self.authenticate(request)
        if isinstance(auth, Refusal):
            return auth
        assert auth.identity is not None
        session = self._registry.get(session_id)
        if session is not None:
            if self._auth.mode != "none" and not session.answers_to(auth.token):
                self._metrics.refusals.labels(reason="session_token_mismatch").inc()
                self._publisher.publish(events.AUTH_FAILURE, outcome="session_token_mismatch",
                                        session_id=session_id, token_id=auth.identity.token_id)
                return rules.token_mismatch(self._oauth_url)
            session.identity = auth.identity
            self._registry.touch(session)
            return session
        if not (may_resume and self.resumes_sessions):
            return rules.SESSION_NOT_FOUND
        version = request.headers.get(VERSION_HEADER) or rules.DEFAULT_VERSION_WITHOUT_HEADER
        try:
            outcome = self._registry.resume(session_id, auth.token, auth.identity, version)
        except RegistryFull as full:
            self._metrics.refusals.labels(reason=full.reason).inc()
            return registry_full_refusal(full)
        if isinstance(outcome, ResumeRefusal):
            log.info("resume_refused", session_id=session_id, reason=str(outcome))
            self._metrics.refusals.labels(reason=f"resume_{outcome}").inc()
            return rules.SESSION_NOT_FOUND
        if outcome.created:
            outcome.session.tools_seen = self._dispatcher.tools_version
            self._metrics.sessions_resumed.inc()
        return outcome.session

    # --- verbs ----------------------------------------------------------------------------------

    async def get(self, request: web.Request) -> web.StreamResponse:
        """No server-initiated stream: 405 before and after a restart, and nothing is created."""
        refusal = self.check_origin_and_host(request)
        return refusal_answer(refusal or rules.GET_NOT_ALLOWED)

    async def other(self, request: web.Request) -> web.StreamResponse:
        """PUT, PATCH, ...: still a JSON-RPC body, so a client shows the reason."""
        return refusal_answer(rules.METHOD_NOT_ALLOWED)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        refusal = self.check_origin_and_host(request)
        if refusal:
            return refusal_answer(refusal)
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return refusal_answer(rules.MISSING_SESSION)
        if not is_valid_session_id_syntax(session_id):
            return refusal_answer(rules.INVALID_SESSION)
        request[SESSION_ID] = session_id
        found = await self.session_for(request, session_id, may_resume=False)
        if isinstance(found, Refusal):
            return refusal_answer(found)
        self._registry.delete(session_id)
        for key, tasks in list(self._inflight.items()):
            if key[0] == session_id:
                for task in tasks:
                    task.cancel()
        return web.Response(status=200, headers={SESSION_HEADER: session_id})

    async def post(self, request: web.Request) -> web.StreamResponse:
        refusal = (self.check_origin_and_host(request)
                   or rules.check_content_type(request.headers.get("Content-Type"))
                   or rules.check_accept(request.headers.get("Accept")))
        if refusal:
            return refusal_answer(refusal)
        raw = await self.read_body(request)
        if raw is None:
            return refusal_answer(rules.body_too_large(self._settings.max_body_bytes))
        try:
            decoded = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return refusal_answer(rules.PARSE_ERROR)
        is_batch = isinstance(decoded, list)
        items = decoded if is_batch else [decoded]
        if is_batch and not items:
            return refusal_answer(rules.EMPTY_BATCH)
        messages: list[jsonrpc.Message] = []
        for item in items:
            try:
                messages.append(jsonrpc.parse_message(item))
            except jsonrpc.InvalidMessage as exc:
                return refusal_answer(rules.invalid_message(str(exc)), exc.request_id)
        first_id = next(iter(rules.request_ids(messages)), None)
        request[RPC_METHOD] = next((m.method for m in messages if not isinstance(m, jsonrpc.Response)), "response")

        initializes = [m for m in messages if isinstance(m, jsonrpc.Request) and m.method == "initialize"]
        if initializes:
            if is_batch:
                return refusal_answer(rules.INITIALIZE_IN_BATCH, initializes[0].id)
            return await self._initialize(request, initializes[0])

        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return refusal_answer(rules.MISSING_SESSION, first_id)
        if not is_valid_session_id_syntax(session_id):
            return refusal_answer(rules.INVALID_SESSION, first_id)
        request[SESSION_ID] = session_id
        bad_version = rules.check_protocol_header(request.headers.get(VERSION_HEADER))
        if bad_version:
            return refusal_answer(bad_version, first_id)
        found = await self.session_for(request, session_id, may_resume=True)
        if isinstance(found, Refusal):
            return refusal_answer(found, first_id)
        session = found
        if is_batch and session.protocol_version != "2025-03-26":
            return refusal_answer(rules.BATCH_NOT_ALLOWED, first_id)

        for m in messages:
            if isinstance(m, jsonrpc.Notification):
                self.on_notification(session, m)
        requests = [m for m in messages if isinstance(m, jsonrpc.Request)]
        headers = {SESSION_HEADER: session.id}
        if not requests:
            return web.Response(status=202, headers=headers)
        if is_batch:
            return json_answer(await self.run_batch(session, requests), headers=headers)
        single = requests[0]
        if rules.accepts(request.headers.get("Accept"), "text/event-stream") and (
                _progress_token(single) is not None or self.tools_changed_for(session, single)):
            return await self._stream(request, session, single, headers)
        return json_answer(await self.run(session, single, None), headers=headers)

    # --- pieces ---------------------------------------------------------------------------------

    async def read_body(self, request: web.Request) -> bytes | None:
        """The body, or None once it passes the limit; we never buffer more than limit + one chunk."""
        limit = self._settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def _initialize(self, request: web.Request, init: jsonrpc.Request) -> web.StreamResponse:
        auth = await self.authenticate(request)
        if isinstance(auth, Refusal):
            return refusal_answer(auth, init.id)
        assert auth.identity is not None
        params = init.params or {}
        version = rules.negotiate_version(params.get("protocolVersion"))
        try:
            session = self._registry.open(auth.token, auth.identity, version)
        except RegistryFull as full:
            self._metrics.refusals.labels(reason=full.reason).inc()
            return refusal_answer(registry_full_refusal(full), init.id)
        session.tools_seen = self._dispatcher.tools_version
        self._metrics.sessions_opened.inc()
        request[SESSION_ID] = session.id
        body = jsonrpc.result_response(init.id, self._dispatcher.initialize_result(version))
        return json_answer(body, headers={SESSION_HEADER: session.id, VERSION_HEADER: version})

    def on_notification(self, session: Session, note: jsonrpc.Notification) -> None:
        if note.method == "notifications/cancelled":
            request_id = (note.params or {}).get("requestId")
            if isinstance(request_id, str | int) and not isinstance(request_id, bool):
                for task in self._inflight.get((session.id, request_id), ()):
                    task.cancel()

    def tools_changed_for(self, session: Session, request: jsonrpc.Request) -> bool:
        """The union of tools changed since this client last listed it (and it is not listing it now)."""
        return request.method != "tools/list" and session.tools_seen < self._dispatcher.tools_version

    def pending_notifications(self, session: Session, request: jsonrpc.Request) -> list[JsonObj]:
        """Notifications to deliver ahead of this request's answer; there is no GET stream to carry them."""
        if not self.tools_changed_for(session, request):
            return []
        session.tools_seen = self._dispatcher.tools_version
        return [jsonrpc.notification_message("notifications/tools/list_changed")]

    def admit(self, session: Session, request: jsonrpc.Request) -> bool:
        """Take an in-flight slot for this request, or count the refusal (the caller answers -32004)."""
        if self.limiter.try_acquire(session.quota_key):
            return True
        self._metrics.refusals.labels(reason="too_many_in_flight").inc()
        log.info("too_many_in_flight", session_id=session.id, token_id=session.quota_key, method=request.method)
        return False

    async def run_batch(self, session: Session, requests: list[jsonrpc.Request]) -> list[JsonObj]:
        """Every item of a batch, the excess over the in-flight bounds refused at once (no task for it)."""
        replies: list[JsonObj | None] = [None] * len(requests)
        tasks: dict[int, asyncio.Task[JsonObj]] = {}
        for index, request in enumerate(requests):
            if not self.admit(session, request):
                replies[index] = too_many_in_flight(request.id)
                continue
            task = asyncio.ensure_future(self.run_admitted(session, request, None))
            # A done callback runs even for a task cancelled before it started: the slot is never lost.
            task.add_done_callback(lambda _t: self.limiter.release(session.quota_key))
            tasks[index] = task
        if tasks:
            for index, reply in zip(tasks, await asyncio.gather(*tasks.values()), strict=True):
                replies[index] = reply
        return [reply for reply in replies if reply is not None]

    async def run(self, session: Session, request: jsonrpc.Request,
                   on_progress: Callable[[JsonObj], Awaitable[None]] | None) -> JsonObj:
        """One request within the in-flight bounds, or -32004 at once when past either of them."""
        if not self.admit(session, request):
            return too_many_in_flight(request.id)
        try:
            return await self.run_admitted(session, request, on_progress)
        finally:
            self.limiter.release(session.quota_key)

    async def run_admitted(self, session: Session, request: jsonrpc.Request,
                           on_progress: Callable[[JsonObj], Awaitable[None]] | None) -> JsonObj:
        """Run one request as its own task so a client's notifications/cancelled can stop it."""
        if request.method == "tools/list":
            session.tools_seen = self._dispatcher.tools_version
        key = (session.id, request.id)
        task = asyncio.ensure_future(self._dispatcher.handle(
            request, identity=session.identity, session_id=session.id, on_progress=on_progress))
        self._inflight.setdefault(key, set()).add(task)
        session.inflight += 1  # a session with a call running is never the one evicted for its token's quota
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            session.inflight -= 1
            tasks = self._inflight.get(key)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    del self._inflight[key]
        if task.cancelled():
            return jsonrpc.error_response(request.id, jsonrpc.REQUEST_CANCELLED, "Request cancelled",
                                          {"error": "cancelled"})
        return task.result()

    async def _stream(self, request: web.Request, session: Session, call: jsonrpc.Request,
                      headers: dict[str, str]) -> web.StreamResponse:
        """Progress notifications for this request, then its response, as one SSE stream."""
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache, no-transform"})
        await response.prepare(request)
        for note in self.pending_notifications(session, call):
            await response.write(sse_event(note))

        async def on_progress(params: JsonObj) -> None:
            # The client may have left; the call itself still completes and is settled.
            with contextlib.suppress(ConnectionError):
                await response.write(sse_event(jsonrpc.notification_message("notifications/progress", params)))

        reply = await self.run(session, call, on_progress)
        await response.write(sse_event(reply))
        await response.write_eof()
        return response
