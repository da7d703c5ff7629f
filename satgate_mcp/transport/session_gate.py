"""Where a request meets the session registry: open, find (or resume), end, and what a session is owed.

The 2025 revisions (and the legacy /sse of 2024-11-05) run calls in a session; 2026-07-28 requests
never come here. A session is opened by ``open_session`` and found by ``session`` only, so the token
check, the resume rules and their refusals live in one place. Ending a session also stops its calls
in flight: the gate is handed that step (``stop_calls``) and knows nothing else of the call runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import structlog
from aiohttp import web

from satgate_mcp import events, jsonrpc
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import SESSION_ID
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import CloseReason, RegistryFull, ResumeRefusal, Session, SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.transport import rules
from satgate_mcp.transport.checks import Principal, RequestChecks
from satgate_mcp.transport.rules import SESSION_HEADER, Refusal

log = structlog.get_logger("satgate_mcp.transport")


class SharedTombstones(Protocol):
    """DELETEs every process sees (``satgate_mcp.shared_tombstones``); absent without Redis."""

    async def mark(self, session_id: str, ttl: float) -> bool: ...

    async def is_marked(self, session_id: str) -> bool: ...


class SessionGate:
    def __init__(self, *, settings: Settings, registry: SessionRegistry, checks: RequestChecks,
                 dispatcher: Dispatcher, publisher: Publisher, metrics: Metrics,
                 stop_calls: Callable[[str], None], tombstones: SharedTombstones | None = None) -> None:
        """``stop_calls``: cancels every call in flight on a session id (``CallRunner.stop_session``)."""
        self._settings = settings
        self._registry = registry
        self._checks = checks
        self._dispatcher = dispatcher
        self._publisher = publisher
        self._metrics = metrics
        self._stop_calls = stop_calls
        self._tombstones = tombstones
        #: Whether a session answers only to the token that opened it: not where every client is anonymous.
        self._token_bound = checks.auth_mode != "none"
        #: Only header and OAuth modes verify a token by themselves, so only they may serve an id this process
        #: never made (a static token is one shared secret: it says nothing about whose session it is).
        self.resumes_sessions = checks.auth_mode in ("header", "oauth")

    def open_session(self, principal: Principal, protocol_version: str,
                     init_params: JsonObj | None = None) -> Session | Refusal:
        """A new session; ``init_params`` (the client's initialize) say which client features it offers."""
        try:
            session = self._registry.open(principal.token, principal.identity, protocol_version)
        except RegistryFull as full:
            return self._registry_full(full)
        session.declare(init_params)
        session.saw_tools(self._dispatcher.tools_version)
        self._metrics.sessions_opened.inc()
        return session

    def session(self, request: web.Request, principal: Principal, session_id: str, *,
                may_resume: bool) -> Session | Refusal:
        """The live session for this id and principal, or (header mode) one rebuilt from the verified token."""
        session = self._registry.get(session_id)
        if session is not None:
            if self._token_bound and not session.answers_to(principal.token):
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
            outcome.session.saw_tools(self._dispatcher.tools_version)
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
        principal = await self._checks.principal(request)
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
        self._stop_calls(session.id)

    def close_session(self, session: Session, reason: CloseReason) -> None:
        """Forget a session that can never be resumed (a legacy stream that ended): no tombstone."""
        self._registry.close(session.id, reason)

    def _registry_full(self, full: RegistryFull) -> Refusal:
        self._metrics.refusals.labels(reason=full.reason).inc()
        return rules.registry_full(full)

    # --- what a session is owed before its answer ----------------------------------------------

    def owes(self, session: Session, request: jsonrpc.Request) -> bool:
        return rules.owes_tools_changed(request.method, session.tools_seen, self._dispatcher.tools_version)

    def owed(self, session: Session, request: jsonrpc.Request) -> list[JsonObj]:
        """Notifications to deliver ahead of this answer, once: there is no GET stream to carry them."""
        if not self.owes(session, request):
            return []
        session.saw_tools(self._dispatcher.tools_version)
        return [jsonrpc.notification_message("notifications/tools/list_changed")]
