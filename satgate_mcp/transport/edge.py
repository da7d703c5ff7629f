"""The HTTP edge every transport shares: what happens to a request before and after the dispatcher.

A transport is a ladder of steps; each step here answers a value or a ``Refusal``, and the first
refusal is the answer. Authentication happens in ``principal`` only, the session registry is met
in ``open_session`` and ``session`` only, and every call runs through ``run`` (or ``spawn``):
in-flight bounds, cancellation, and what a session is owed before its answer live here once.

Nothing here assumes a session: a principal and a call work without one (a stateless transport
bounds its calls by the token's in-flight quota; cancelling by id needs a session to scope it).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

import structlog
from aiohttp import web

from satgate_mcp import events, jsonrpc
from satgate_mcp.auth.base import Authenticator, Identity, per_token_quota
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.events import Publisher
from satgate_mcp.inflight import InflightLimiter, too_many_in_flight
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.keys import SESSION_ID, TOKEN_ID
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import CloseReason, RegistryFull, ResumeRefusal, Session, SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.transport import rules
from satgate_mcp.transport.relay import CallRelay, Emit, Pause, PendingAsks, is_log_level, most_verbose
from satgate_mcp.transport.rules import SESSION_HEADER, Refusal

log = structlog.get_logger("satgate_mcp.transport")

T = TypeVar("T")
OnProgress = Callable[[JsonObj], Awaitable[None]]


# --- answers ------------------------------------------------------------------------------------


def json_answer(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=jsonrpc.dumps(body), content_type="application/json", headers=headers)


def refusal_answer(refusal: Refusal, request_id: RequestId | None = None) -> web.Response:
    return json_answer(refusal.body(request_id), refusal.status, dict(refusal.headers))


def rejected_answer(rejected: rules.Rejected) -> web.Response:
    return refusal_answer(rejected.refusal, rejected.request_id)


def sse_event(message: JsonObj) -> bytes:
    return b"event: message\ndata: " + jsonrpc.dumps(message) + b"\n\n"


def host_origin_refusal(request: web.Request, settings: Settings) -> Refusal | None:
    """The DNS-rebinding guard every browser-reachable endpoint shares (/mcp, /sse, /readyz, /metrics)."""
    return _host_origin_verdict(settings, request.headers.get("Host"), request.headers.get("Origin"))


def _host_origin_verdict(settings: Settings, host: str | None, origin: str | None) -> Refusal | None:
    return (rules.check_host(host, settings.allowed_hosts, settings.host)
            or rules.check_origin(origin, settings.allowed_origins))


#: Distinct (Host, Origin) pairs whose verdict an edge keeps: a client chooses them, so the cache is bounded.
HOST_ORIGIN_CACHE = 256


# --- who is asking ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Principal:
    """A verified credential: the bearer as presented (only ever hashed) and what it says."""

    token: str
    identity: Identity

    @property
    def quota_key(self) -> str:
        return self.identity.family_id


class SharedTombstones(Protocol):
    """DELETEs every process sees (``satgate_mcp.shared_tombstones``); absent without Redis."""

    async def mark(self, session_id: str, ttl: float) -> bool: ...

    async def is_marked(self, session_id: str) -> bool: ...


#: Whom a call runs for: a session, or (stateless) a principal alone.
Caller = Session | Principal

#: Calls in flight by (session id, JSON-RPC id); a set, since a careless client may reuse an id concurrently.
InflightKey = tuple[str, RequestId]


class RunningCall:
    """A call in flight, run in its caller's own task (no task of its own): how a cancel reaches it.

    ``stop`` cancels that task; the call's ``run_admitted`` tells its own cancellation from one
    that came from outside (a handler aiohttp cancels) by the flag, and takes back only its own.
    """

    __slots__ = ("stopped", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped and not self.task.done():
            self.stopped = True
            self.task.cancel()


class Edge:
    def __init__(self, *, settings: Settings, registry: SessionRegistry, authenticator: Authenticator,
                 dispatcher: Dispatcher, publisher: Publisher, metrics: Metrics,
                 limiter: InflightLimiter | None = None, tombstones: SharedTombstones | None = None) -> None:
        self._settings = settings
        self._tombstones = tombstones
        self._registry = registry
        self._auth = authenticator
        self._dispatcher = dispatcher
        self._publisher = publisher
        self._metrics = metrics
        # A shared identity (none, config) has no per-token bound: only the process's (see per_token_quota).
        per_token = per_token_quota(authenticator.mode, settings.max_inflight_per_token)
        self.limiter = limiter or InflightLimiter(per_token=settings.max_inflight if per_token is None else per_token,
                                                  total=settings.max_inflight)
        self._inflight: dict[InflightKey, set[RunningCall]] = {}
        #: Upstream requests relayed to clients, waiting for their answers.
        self.asks = PendingAsks()
        #: The level upstreams were last set to (the most verbose any session asked for).
        self._upstream_log_level: str | None = None
        # The guard is a pure function of the two headers and the settings, and parses an IP address per
        # request: decided once per pair of values.
        self._host_origin = functools.lru_cache(maxsize=HOST_ORIGIN_CACHE)(partial(_host_origin_verdict, settings))

    @property
    def resumes_sessions(self) -> bool:
        """Only header and OAuth modes verify a token by themselves, so only they may serve an id this process
        never made (a static token is one shared secret: it says nothing about whose session it is)."""
        return self._auth.mode in ("header", "oauth")

    def scope_refusal(self, principal: Principal, requests: Sequence[jsonrpc.Request]) -> Refusal | None:
        refusal = rules.scope_refusal(principal.identity, requests, self._settings.oauth_resource_metadata_url)
        if refusal is not None:
            self._metrics.refusals.labels(reason="insufficient_scope").inc()
            self._publisher.publish(events.NOT_ALLOWED, token_id=principal.identity.token_id, method="tools/call",
                                    kind="scope", scope=refusal.extra.get("scope"))
        return refusal

    def initialize_result(self, protocol_version: str) -> JsonObj:
        return self._dispatcher.initialize_result(protocol_version)

    def discover_result(self, supported_versions: list[str]) -> JsonObj:
        return self._dispatcher.discover_result(supported_versions)

    def tool_schema(self, name: str) -> object:
        return self._dispatcher.tool_schema(name)

    @property
    def server_info(self) -> JsonObj:
        return self._dispatcher.server_info

    def capabilities(self) -> JsonObj:
        return self._dispatcher.capabilities()

    async def subscribe_resource(self, key: str, uri: str) -> bool:
        """One URI of a listen stream, subscribed upstream (reference-counted with the 2025 sessions')."""
        try:
            reply = await self._dispatcher.subscriptions.subscribe(key, {"uri": uri})
        except Exception as exc:  # an upstream that cannot subscribe: the URI is left out of the acknowledgement
            log.info("listen_subscribe_failed", uri=uri[:200], error=type(exc).__name__)
            return False
        return "error" not in reply

    def release_subscriptions(self, key: str) -> None:
        self._dispatcher.subscriptions.end_session(key)

    @property
    def cache_scope(self) -> str:
        """What a modern client may share a cached answer with: nobody once tokens decide what is seen."""
        return "public" if self._auth.mode == "none" else "private"

    # --- checks and body ------------------------------------------------------------------------

    def check_host_origin(self, request: web.Request) -> Refusal | None:
        headers = request.headers
        return self._host_origin(headers.get("Host"), headers.get("Origin"))

    async def read_body(self, request: web.Request) -> bytes | Refusal:
        """The body, or 413 once it passes the limit; we never buffer more than limit + one chunk."""
        limit = self._settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return rules.body_too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                return rules.body_too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    # --- the principal: the one place a credential is verified ---------------------------------

    async def principal(self, request: web.Request) -> Principal | Refusal:
        result = await self._auth.authenticate(request.headers.get("Authorization"))
        if result.ok and result.identity is not None:
            request[TOKEN_ID] = result.identity.token_id
            return Principal(result.token, result.identity)
        self._metrics.refusals.labels(reason=str(result.outcome)).inc()
        # A revoked or expired token verified its signature: its id is the holder's, and worth logging.
        named: dict[str, str] = {"token_id": result.identity.token_id} if result.identity is not None else {}
        if result.hint:  # what the operator can fix (a root key mismatch); the client's answer stays the same
            named["hint"] = result.hint
        self._publisher.publish(events.AUTH_FAILURE, outcome=str(result.outcome), reason=result.reason,
                                path=request.path, remote=request.remote, **named)
        return rules.auth_refusal(result.outcome, self._settings.oauth_resource_metadata_url)

    # --- sessions -------------------------------------------------------------------------------

    def open_session(self, principal: Principal, protocol_version: str,
                     init_params: JsonObj | None = None) -> Session | Refusal:
        """A new session; ``init_params`` (the client's initialize) say which client features it offers."""
        try:
            session = self._registry.open(principal.token, principal.identity, protocol_version)
        except RegistryFull as full:
            return self._registry_full(full)
        session.declare(init_params)
        self._saw_tools(session)
        self._metrics.sessions_opened.inc()
        return session

    def session(self, request: web.Request, principal: Principal, session_id: str, *,
                may_resume: bool) -> Session | Refusal:
        """The live session for this id and principal, or (header mode) one rebuilt from the verified token."""
        session = self._registry.get(session_id)
        if session is not None:
            if self._auth.mode != "none" and not session.answers_to(principal.token):
                self._metrics.refusals.labels(reason="session_token_mismatch").inc()
                self._publisher.publish(events.AUTH_FAILURE, outcome="session_token_mismatch",
                                        session_id=session_id, token_id=principal.identity.token_id)
                return rules.token_mismatch(self._settings.oauth_resource_metadata_url)
            session.rebind(principal.identity)
            self._registry.touch(session)
            return session
        if not (may_resume and self.resumes_sessions):
            return rules.SESSION_NOT_FOUND
        version = request.headers.get(rules.VERSION_HEADER) or rules.DEFAULT_VERSION_WITHOUT_HEADER
        try:
            outcome = self._registry.resume(session_id, principal.token, principal.identity, version)
        except RegistryFull as full:
            return self._registry_full(full)
        if isinstance(outcome, ResumeRefusal):
            log.info("resume_refused", session_id=session_id, reason=str(outcome))
            self._metrics.refusals.labels(reason=f"resume_{outcome}").inc()
            return rules.SESSION_NOT_FOUND
        if outcome.created:
            self._saw_tools(outcome.session)
            self._metrics.sessions_resumed.inc()
        return outcome.session

    async def named_session(self, request: web.Request, *, may_resume: bool) -> Session | Refusal:
        """The session the request's ``Mcp-Session-Id`` names, after its token: the steps GET and DELETE share."""
        session_id = request.headers.get(SESSION_HEADER)
        refusal = rules.check_session_header(session_id)
        if refusal:
            return refusal
        assert session_id is not None
        request[SESSION_ID] = session_id
        principal = await self.principal(request)
        if isinstance(principal, Refusal):
            return principal
        return await self.find_session(request, principal, session_id, may_resume=may_resume)

    async def find_session(self, request: web.Request, principal: Principal, session_id: str, *,
                           may_resume: bool) -> Session | Refusal:
        """``session``, after asking the shared tombstones (Redis) whether another process DELETEd the id."""
        if (may_resume and self._tombstones is not None and self.resumes_sessions
                and self._registry.get(session_id) is None and await self._tombstones.is_marked(session_id)):
            log.info("resume_refused", session_id=session_id, reason="deleted_elsewhere")
            self._metrics.refusals.labels(reason="resume_deleted").inc()
            return rules.SESSION_NOT_FOUND
        return self.session(request, principal, session_id, may_resume=may_resume)

    def touch(self, session: Session) -> None:
        self._registry.touch(session)

    async def delete_session(self, session: Session) -> None:
        """DELETE: ended here, and (with Redis) tombstoned for every process before the answer goes out."""
        self.end_session(session)
        if self._tombstones is not None:
            await self._tombstones.mark(session.id, self._registry.idle_ttl)

    def end_remote(self, session_id: str) -> None:
        """Another process DELETEd this id: a live copy here ends too (and leaves a local tombstone)."""
        session = self._registry.get(session_id)
        if session is not None:
            self.end_session(session)

    def end_session(self, session: Session) -> None:
        """DELETE: a tombstone, and every call still running on it is cancelled."""
        self._registry.delete(session.id)
        for key, calls in list(self._inflight.items()):
            if key[0] == session.id:
                for call in calls:
                    call.stop()

    def close_session(self, session: Session, reason: CloseReason) -> None:
        """Forget a session that can never be resumed (a legacy stream that ended): no tombstone."""
        self._registry.close(session.id, reason)

    def _registry_full(self, full: RegistryFull) -> Refusal:
        self._metrics.refusals.labels(reason=full.reason).inc()
        return rules.registry_full(full)

    # --- what a session is owed before its answer ----------------------------------------------

    def _saw_tools(self, session: Session) -> None:
        """This client now knows the current tool list."""
        session.saw_tools(self._dispatcher.tools_version)

    def owes(self, session: Session, request: jsonrpc.Request) -> bool:
        return rules.owes_tools_changed(request.method, session.tools_seen, self._dispatcher.tools_version)

    def owed(self, session: Session, request: jsonrpc.Request) -> list[JsonObj]:
        """Notifications to deliver ahead of this answer, once: there is no GET stream to carry them."""
        if not self.owes(session, request):
            return []
        self._saw_tools(session)
        return [jsonrpc.notification_message("notifications/tools/list_changed")]

    # --- what goes back to the client during a call ----------------------------------------------

    def relay(self, session: Session, emit: Emit, *, streaming: bool, pause: Pause | None = None) -> CallRelay:
        """A call's channel back to its client; ``streaming`` False (JSON only) refuses upstream requests."""
        return CallRelay(session_key=session.id, emit=emit, asks=self.asks, streaming=streaming, pause=pause,
                         capabilities=lambda: session.client_capabilities, log_level=lambda: session.log_level)

    def on_response(self, session: Session, response: jsonrpc.Response) -> None:
        """A client's answer to a request the gateway relayed to it: back to the upstream that asked."""
        self.asks.answer(session.id, response)

    async def _set_log_level(self, session: Session, request: jsonrpc.Request) -> JsonObj:
        """Kept per session; upstreams get the most verbose level any live session asked for."""
        level = (request.params or {}).get("level")
        if not is_log_level(level):
            return jsonrpc.error_response(request.id, jsonrpc.INVALID_PARAMS, "logging/setLevel needs a valid level",
                                          {"error": "invalid_params", "level": str(level)[:40]})
        assert isinstance(level, str)
        session.set_log_level(level)
        await self._dispatcher.set_session_log_level(session.identity.token_id, session.id, level)
        wanted = most_verbose(self._registry.log_levels())
        if wanted is not None and wanted != self._upstream_log_level:
            self._upstream_log_level = wanted
            await self._dispatcher.set_upstream_log_level(wanted)
        return jsonrpc.result_response(request.id, {})

    # --- calls ----------------------------------------------------------------------------------

    def on_notification(self, caller: Caller, note: jsonrpc.Notification) -> None:
        if note.method != "notifications/cancelled" or not isinstance(caller, Session):
            return
        request_id = (note.params or {}).get("requestId")
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            for call in tuple(self._inflight.get((caller.id, request_id), ())):
                call.stop()

    def _admit(self, caller: Caller, request: jsonrpc.Request) -> bool:
        """Take an in-flight slot for this request, or count the refusal (the caller answers -32004)."""
        if self.limiter.try_acquire(caller.quota_key):
            return True
        self._metrics.refusals.labels(reason="too_many_in_flight").inc()
        log.info("too_many_in_flight", session_id=caller.id if isinstance(caller, Session) else None,
                 token_id=caller.quota_key, method=request.method)
        return False

    def spawn(self, caller: Caller, request: jsonrpc.Request,
              work: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Task[T] | None:
        """``work`` as a task holding this request's in-flight slot; None (no task) when past the bounds."""
        if not self._admit(caller, request):
            return None
        task = asyncio.ensure_future(work())
        # A done callback runs even for a task cancelled before it started: the slot is never lost.
        task.add_done_callback(lambda _t: self.limiter.release(caller.quota_key))
        return task

    async def run(self, caller: Caller, request: jsonrpc.Request, on_progress: OnProgress | None = None) -> JsonObj:
        """One request within the in-flight bounds, or -32004 at once when past either of them."""
        if not self._admit(caller, request):
            return too_many_in_flight(request.id)
        try:
            return await self.run_admitted(caller, request, on_progress)
        finally:
            self.limiter.release(caller.quota_key)

    async def run_batch(self, caller: Caller, requests: list[jsonrpc.Request]) -> list[JsonObj]:
        """Every item of a batch, the excess over the in-flight bounds refused at once (no task for it)."""
        tasks = [self.spawn(caller, r, partial(self.run_admitted, caller, r)) for r in requests]
        running = [t for t in tasks if t is not None]
        replies = iter(await asyncio.gather(*running) if running else [])
        return [too_many_in_flight(r.id) if t is None else next(replies) for r, t in zip(requests, tasks, strict=True)]

    async def run_admitted(self, caller: Caller, request: jsonrpc.Request,
                           on_progress: OnProgress | None = None) -> JsonObj:
        """Run one admitted request in the caller's task, registered so a client's notifications/cancelled
        (or a DELETE) can stop it: a task and a wait per call would cost more than many a call itself."""
        session = caller if isinstance(caller, Session) else None
        if session is None:
            return await self._dispatch(caller, request, on_progress)
        if request.method == "logging/setLevel":
            return await self._set_log_level(session, request)
        if request.method == "tools/list":
            self._saw_tools(session)
        task = asyncio.current_task()
        assert task is not None  # every handler, and every batch item, runs in a task
        key = (session.id, request.id)
        running = RunningCall(task)
        self._inflight.setdefault(key, set()).add(running)
        session.call_started()  # a session with a call running is never the one evicted for its token's quota
        try:
            reply = await self._dispatch(session, request, on_progress)
        except asyncio.CancelledError:
            # Only our own cancel becomes an answer; one from outside as well (count left) goes on up.
            if running.stopped and task.uncancel() == 0:
                return jsonrpc.error_response(request.id, jsonrpc.REQUEST_CANCELLED, "Request cancelled",
                                              {"error": "cancelled"})
            raise
        finally:
            session.call_ended()
            calls = self._inflight.get(key)
            if calls is not None:
                calls.discard(running)
                if not calls:
                    del self._inflight[key]
        if running.stopped:  # the call swallowed the cancel and answered: nothing is left pending
            task.uncancel()
        return reply

    async def _dispatch(self, caller: Caller, request: jsonrpc.Request, on_progress: OnProgress | None) -> JsonObj:
        """The one call into the dispatcher (its signature is the router's to change).

        Without a session (2026-07-28) the duplicate guard keys by token id + request id + params."""
        session_id = caller.id if isinstance(caller, Session) else f"token:{caller.identity.token_id}"
        return await self._dispatcher.handle(request, identity=caller.identity, session_id=session_id,
                                       on_progress=on_progress)
