"""Streamable HTTP at /mcp (revisions 2025-03-26, 2025-06-18, 2025-11-25).

Each verb walks a fixed ladder: checks, body, classify, principal, session, run. The decisions are
pure functions in ``rules``; the steps that meet the outside are shared with the other transports:
``checks`` (Host/Origin, body, principal), the ``session_gate`` (sessions found, or rebuilt from the
verified token: resume) and the ``call_runner``. The first refusal is the answer.
"""

from __future__ import annotations

from functools import partial

from aiohttp import web

from satgate_mcp import jsonrpc
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import RPC_METHOD, SESSION_ID
from satgate_mcp.sessions import Session
from satgate_mcp.transport import rules, stateless_rules
from satgate_mcp.transport.answers import json_answer, refusal_answer, rejected_answer
from satgate_mcp.transport.call_answer import CallStream
from satgate_mcp.transport.call_runner import CallRunner
from satgate_mcp.transport.checks import RequestChecks
from satgate_mcp.transport.replay import ReplayBook
from satgate_mcp.transport.rules import SESSION_HEADER, VERSION_HEADER, Post, Refusal, Rejected
from satgate_mcp.transport.session_gate import SessionGate
from satgate_mcp.transport.session_stream import StandaloneStream
from satgate_mcp.transport.stateless_endpoint import StatelessEndpoint

#: A call that streams nothing for this long gets a comment, so proxies and clients keep the stream open.
KEEPALIVE_SECONDS = 15.0
#: Revisions a request without per-request ``_meta`` may name in its header: the session-based ones.
LEGACY_VERSIONS = (*rules.STREAMABLE_VERSIONS, "2024-11-05")
#: Revisions whose streams open with a priming event and carry an id on every event.
EVENT_ID_VERSIONS = frozenset({"2025-11-25"})


class SessionEndpoint:
    def __init__(self, checks: RequestChecks, gate: SessionGate, runner: CallRunner, dispatcher: Dispatcher,
                 standalone: StandaloneStream | None = None, *, keepalive_seconds: float | None = None,
                 modern: StatelessEndpoint | None = None, replay: ReplayBook | None = None,
                 poll_seconds: float = 0.0) -> None:
        """``replay``: where 2025-11-25 answer streams are kept so a client can resume one (None: not resumable);
        ``poll_seconds``: how long such a stream may stay quiet before it is closed for the client to resume."""
        self._checks = checks
        self._gate = gate
        self._runner = runner
        self._dispatcher = dispatcher
        self._poll = poll_seconds
        self._standalone = standalone
        self._replay = replay
        self._keepalive = KEEPALIVE_SECONDS if keepalive_seconds is None else keepalive_seconds
        self._modern = modern or StatelessEndpoint(checks, runner, dispatcher, keepalive_seconds=self._keepalive)

    def add_routes(self, app: web.Application, path: str = "/mcp") -> None:
        app.router.add_post(path, self.post)
        app.router.add_delete(path, self.delete)
        app.router.add_get(path, self.get)
        app.router.add_route("*", path, self.other)
        if self._standalone is not None:
            app.on_shutdown.append(self._standalone.end_streams)

    async def get(self, request: web.Request) -> web.StreamResponse:
        """The session's server-to-client stream; without one (405) nothing is created."""
        if self._standalone is not None:
            return await self._standalone.get(request)
        return refusal_answer(self._checks.check_host_origin(request) or rules.GET_NOT_ALLOWED)

    async def other(self, request: web.Request) -> web.StreamResponse:
        """PUT, PATCH, ...: still a JSON-RPC body, so a client shows the reason."""
        return refusal_answer(rules.METHOD_NOT_ALLOWED)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        refusal = self._checks.check_host_origin(request)
        if refusal:
            return refusal_answer(refusal)
        gate = self._gate
        session = await gate.named_session(request, may_resume=False)
        if isinstance(session, Refusal):
            return refusal_answer(session)
        await gate.delete_session(session)
        return web.Response(status=200, headers={SESSION_HEADER: session.id})

    async def post(self, request: web.Request) -> web.StreamResponse:
        checks = self._checks
        # checks
        refusal = (checks.check_host_origin(request)
                   or rules.check_content_type(request.headers.get("Content-Type"))
                   or rules.check_accept(request.headers.get("Accept")))
        if refusal:
            return refusal_answer(refusal)
        # body
        raw = await checks.read_body(request)
        if isinstance(raw, Refusal):
            return refusal_answer(raw)
        # classify
        post = rules.classify(raw)
        if isinstance(post, Rejected):
            return rejected_answer(post)
        request[RPC_METHOD] = post.method
        if not post.is_batch and stateless_rules.is_modern(
                post.messages[0], request.headers.get(VERSION_HEADER), LEGACY_VERSIONS,
                has_session=SESSION_HEADER in request.headers):
            message = post.messages[0]
            assert not isinstance(message, jsonrpc.Response)
            return await self._modern.post(request, message)
        if post.initialize is not None:
            return await self._initialize(request, post.initialize)
        session_id = request.headers.get(SESSION_HEADER)
        refusal = rules.check_session_header(session_id)
        if refusal:
            return refusal_answer(refusal, post.first_id)
        assert session_id is not None
        request[SESSION_ID] = session_id
        refusal = rules.check_protocol_header(request.headers.get(VERSION_HEADER))
        if refusal:
            return refusal_answer(refusal, post.first_id)
        # principal
        principal = await checks.principal(request)
        if isinstance(principal, Refusal):
            return refusal_answer(principal, post.first_id)
        # session
        session = await self._gate.find_session(request, principal, session_id, may_resume=True)
        if isinstance(session, Refusal):
            return refusal_answer(session, post.first_id)
        refusal = (rules.check_batch(post.is_batch, session.protocol_version)
                   or checks.scope_refusal(principal, post.requests))
        if refusal:
            return refusal_answer(refusal, post.first_id)
        # run
        return await self._run(request, session, post)

    async def _initialize(self, request: web.Request, init: jsonrpc.Request) -> web.StreamResponse:
        principal = await self._checks.principal(request)
        if isinstance(principal, Refusal):
            return refusal_answer(principal, init.id)
        version = rules.negotiate_version((init.params or {}).get("protocolVersion"))
        session = self._gate.open_session(principal, version, init.params)
        if isinstance(session, Refusal):
            return refusal_answer(session, init.id)
        request[SESSION_ID] = session.id
        body = jsonrpc.result_response(init.id, self._dispatcher.initialize_result(version))
        return json_answer(body, headers={SESSION_HEADER: session.id, VERSION_HEADER: version})

    async def _run(self, request: web.Request, session: Session, post: Post) -> web.StreamResponse:
        """Notifications and answers to relayed requests take effect, then the requests run.

        A batch answers as one JSON array (no stream: requests to the client are refused for it); a
        single call answers on its own stream when the client reads one, else as JSON.
        """
        runner = self._runner
        for message in post.messages:
            if isinstance(message, jsonrpc.Notification):
                runner.on_notification(session, message)
            elif isinstance(message, jsonrpc.Response):
                runner.on_response(session, message)
        requests = post.requests
        headers = {SESSION_HEADER: session.id}
        if not requests:
            return web.Response(status=202, headers=headers)
        if post.is_batch:
            return json_answer(await runner.run_batch(session, requests), headers=headers)
        single = requests[0]
        if not rules.accepts(request.headers.get("Accept"), "text/event-stream"):
            relay = runner.relay(session, _nowhere, streaming=False)
            reply = await runner.run(session, single, relay)
            status, extra = rules.reply_status(reply)
            return json_answer(reply, status, headers={**headers, **extra})
        return await self._stream(request, session, single, headers)

    async def _stream(self, request: web.Request, session: Session, call: jsonrpc.Request,
                      headers: dict[str, str]) -> web.StreamResponse:
        """What the upstream says during the call, then its answer: one stream, prepared only once admitted."""
        gate, runner = self._gate, self._runner
        stream = CallStream(request, headers, event_ids=session.protocol_version in EVENT_ID_VERSIONS,
                            stream_quiet=True, replay=self._replay, session_id=session.id, poll=self._poll,
                            owed=partial(gate.owed, session, call), owes=partial(gate.owes, session, call))
        relay = runner.relay(session, stream.emit, streaming=True, pause=stream.pause)
        stop_keeping_alive = stream.keep_alive_later(relay.admitted, self._keepalive)
        try:
            reply = await runner.run(session, call, relay)
        except BaseException:
            stream.end()
            raise
        finally:
            stop_keeping_alive()
            relay.close()
        return await stream.finish(reply, admitted=relay.admitted.is_set())


async def _nowhere(message: JsonObj) -> bool:
    """A JSON-only client has no stream: nothing can be written to it before its answer."""
    return False
