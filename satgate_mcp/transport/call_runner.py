"""Every call runs here: in-flight bounds, cancellation, log levels, and the call's channel back to its client.

Shared by every transport, with or without a session: a call without one (2026-07-28) is bounded by its
token's in-flight quota; cancelling by id (``notifications/cancelled``, or a DELETE through
``stop_session``) needs a session to scope it. A call runs in its caller's own task: a task and a wait
per call would cost more than many a call itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import structlog

from satgate_mcp import jsonrpc, tracing
from satgate_mcp.auth.base import per_token_quota
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.guards import ClientFacts
from satgate_mcp.inflight import InflightLimiter, too_many_in_flight
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import Session, SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.transport.call_trace import traced_call
from satgate_mcp.transport.checks import Principal
from satgate_mcp.transport.relay import CallRelay, Emit, Pause, PendingAsks, is_log_level, most_verbose
from satgate_mcp.transport.stateless_rules import META_CLIENT_INFO, MODERN_VERSION

log = structlog.get_logger("satgate_mcp.transport")

T = TypeVar("T")
OnProgress = Callable[[JsonObj], Awaitable[None]]

#: Whom a call runs for: a session, or (stateless) a principal alone.
Caller = Session | Principal

#: Calls in flight by (session id, JSON-RPC id); a set, since a careless client may reuse an id concurrently.
InflightKey = tuple[str, RequestId]


def inflight_limiter(settings: Settings, auth_mode: str) -> InflightLimiter:
    """The bounds from settings; a shared identity (none, config) has no per-token bound: only the process's."""
    per_token = per_token_quota(auth_mode, settings.max_inflight_per_token)
    return InflightLimiter(per_token=settings.max_inflight if per_token is None else per_token,
                           total=settings.max_inflight)


def stateless_session_id(token_id: str) -> str:
    """What a 2026-07-28 caller's requests run under in place of a session (duplicate keys, task ids): its token."""
    return f"token:{token_id}"


def _meta_of(params: JsonObj | None) -> JsonObj:
    meta = (params or {}).get("_meta")
    return meta if isinstance(meta, dict) else {}


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


class CallRunner:
    def __init__(self, *, dispatcher: Dispatcher, registry: SessionRegistry, metrics: Metrics,
                 limiter: InflightLimiter) -> None:
        """``registry``: the live sessions' log levels, whose most verbose upstreams are set to."""
        self._dispatcher = dispatcher
        self._registry = registry
        self._metrics = metrics
        self.limiter = limiter
        self._inflight: dict[InflightKey, set[RunningCall]] = {}
        #: Upstream requests relayed to clients, waiting for their answers.
        self.asks = PendingAsks()
        #: The level upstreams were last set to (the most verbose any session asked for).
        self._upstream_log_level: str | None = None

    # --- what goes back to the client during a call ----------------------------------------------

    def relay(self, session: Session, emit: Emit, *, streaming: bool, pause: Pause | None = None) -> CallRelay:
        """A call's channel back to its client; ``streaming`` False (JSON only) refuses upstream requests."""
        audit = self._dispatcher.audit
        return CallRelay(session_key=session.id, emit=emit, asks=self.asks, streaming=streaming, pause=pause,
                         capabilities=lambda: session.client_capabilities, log_level=lambda: session.log_level,
                         on_ask=None if audit is None else partial(audit.relayed, session.identity, session.id))

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

    # --- cancelling -----------------------------------------------------------------------------

    def on_notification(self, caller: Caller, note: jsonrpc.Notification) -> None:
        if note.method != "notifications/cancelled" or not isinstance(caller, Session):
            return
        request_id = (note.params or {}).get("requestId")
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            for call in tuple(self._inflight.get((caller.id, request_id), ())):
                call.stop()

    def stop_session(self, session_id: str) -> None:
        """The session ended (DELETE): every call still running on it is cancelled."""
        for key, calls in list(self._inflight.items()):
            if key[0] == session_id:
                for call in calls:
                    call.stop()

    # --- calls ----------------------------------------------------------------------------------

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
        (or a DELETE) can stop it."""
        session = caller if isinstance(caller, Session) else None
        if session is None:
            return await self._dispatch(caller, request, on_progress)
        if request.method == "logging/setLevel":
            return await self._set_log_level(session, request)
        if request.method == "tools/list":
            session.saw_tools(self._dispatcher.tools_version)
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
        session = caller if isinstance(caller, Session) else None
        session_id = session.id if session is not None else stateless_session_id(caller.identity.token_id)
        client = None
        if self._dispatcher.guarded:  # who the client says it is costs a little, and only guards ask
            client = (ClientFacts.of(session.protocol_version, session.client_info) if session is not None else
                      ClientFacts.of(MODERN_VERSION, _meta_of(request.params).get(META_CLIENT_INFO)))
        tracer = tracing.TRACER
        if tracer is not None:
            return await traced_call(tracer, request, partial(
                self._dispatcher.handle, request, identity=caller.identity, session_id=session_id,
                on_progress=on_progress, client=client), session_id=None if session is None else session.id,
                relay=on_progress, protocol_version=session.protocol_version if session is not None else MODERN_VERSION)
        return await self._dispatcher.handle(request, identity=caller.identity, session_id=session_id,
                                             on_progress=on_progress, client=client)
