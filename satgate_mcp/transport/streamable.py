"""Streamable HTTP at /mcp (revisions 2025-03-26, 2025-06-18, 2025-11-25).

Each verb walks a fixed ladder: checks, body, classify, principal, session, run. The decisions are
pure functions in ``rules``, the steps that meet the outside are the shared ``Edge``; the first
refusal is the answer. Sessions are found, or rebuilt from the verified token (resume), by the edge.
"""

from __future__ import annotations

import contextlib

from aiohttp import web

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import RPC_METHOD, SESSION_ID
from satgate_mcp.sessions import Session
from satgate_mcp.transport import rules
from satgate_mcp.transport.edge import Edge, json_answer, refusal_answer, rejected_answer, sse_event
from satgate_mcp.transport.rules import SESSION_HEADER, VERSION_HEADER, Post, Refusal, Rejected
from satgate_mcp.transport.stream import StandaloneStream


def _progress_token(request: jsonrpc.Request) -> object:
    meta = (request.params or {}).get("_meta")
    return meta.get("progressToken") if isinstance(meta, dict) else None


class StreamableHttpTransport:
    def __init__(self, edge: Edge, standalone: StandaloneStream | None = None) -> None:
        self._edge = edge
        self._standalone = standalone

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
        return refusal_answer(self._edge.check_host_origin(request) or rules.GET_NOT_ALLOWED)

    async def other(self, request: web.Request) -> web.StreamResponse:
        """PUT, PATCH, ...: still a JSON-RPC body, so a client shows the reason."""
        return refusal_answer(rules.METHOD_NOT_ALLOWED)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        edge = self._edge
        session_id = request.headers.get(SESSION_HEADER)
        refusal = edge.check_host_origin(request) or rules.check_session_header(session_id)
        if refusal:
            return refusal_answer(refusal)
        assert session_id is not None
        request[SESSION_ID] = session_id
        principal = await edge.principal(request)
        if isinstance(principal, Refusal):
            return refusal_answer(principal)
        session = edge.session(request, principal, session_id, may_resume=False)
        if isinstance(session, Refusal):
            return refusal_answer(session)
        edge.end_session(session)
        return web.Response(status=200, headers={SESSION_HEADER: session_id})

    async def post(self, request: web.Request) -> web.StreamResponse:
        edge = self._edge
        # checks
        refusal = (edge.check_host_origin(request)
                   or rules.check_content_type(request.headers.get("Content-Type"))
                   or rules.check_accept(request.headers.get("Accept")))
        if refusal:
            return refusal_answer(refusal)
        # body
        raw = await edge.read_body(request)
        if isinstance(raw, Refusal):
            return refusal_answer(raw)
        # classify
        post = rules.classify(raw)
        if isinstance(post, Rejected):
            return rejected_answer(post)
        request[RPC_METHOD] = post.method
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
        principal = await edge.principal(request)
        if isinstance(principal, Refusal):
            return refusal_answer(principal, post.first_id)
        # session
        session = edge.session(request, principal, session_id, may_resume=True)
        if isinstance(session, Refusal):
            return refusal_answer(session, post.first_id)
        refusal = rules.check_batch(post.is_batch, session.protocol_version)
        if refusal:
            return refusal_answer(refusal, post.first_id)
        # run
        return await self._run(request, session, post)

    async def _initialize(self, request: web.Request, init: jsonrpc.Request) -> web.StreamResponse:
        principal = await self._edge.principal(request)
        if isinstance(principal, Refusal):
            return refusal_answer(principal, init.id)
        version = rules.negotiate_version((init.params or {}).get("protocolVersion"))
        session = self._edge.open_session(principal, version)
        if isinstance(session, Refusal):
            return refusal_answer(session, init.id)
        request[SESSION_ID] = session.id
        body = jsonrpc.result_response(init.id, self._edge.initialize_result(version))
        return json_answer(body, headers={SESSION_HEADER: session.id, VERSION_HEADER: version})

    async def _run(self, request: web.Request, session: Session, post: Post) -> web.StreamResponse:
        """Notifications take effect, then the requests run: one JSON answer, or an SSE stream for one call."""
        for note in post.notifications:
            self._edge.on_notification(session, note)
        requests = post.requests
        headers = {SESSION_HEADER: session.id}
        if not requests:
            return web.Response(status=202, headers=headers)
        if post.is_batch:
            return json_answer(await self._edge.run_batch(session, requests), headers=headers)
        single = requests[0]
        if rules.accepts(request.headers.get("Accept"), "text/event-stream") and (
                _progress_token(single) is not None or self._edge.owes(session, single)):
            return await self._stream(request, session, single, headers)
        return json_answer(await self._edge.run(session, single), headers=headers)

    async def _stream(self, request: web.Request, session: Session, call: jsonrpc.Request,
                      headers: dict[str, str]) -> web.StreamResponse:
        """What the session is owed, progress notifications for this request, then its response, as one stream."""
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache, no-transform"})
        await response.prepare(request)
        for note in self._edge.owed(session, call):
            await response.write(sse_event(note))

        async def on_progress(params: JsonObj) -> None:
            # The client may have left; the call itself still completes and is settled.
            with contextlib.suppress(ConnectionError):
                await response.write(sse_event(jsonrpc.notification_message("notifications/progress", params)))

        reply = await self._edge.run(session, call, on_progress)
        await response.write(sse_event(reply))
        await response.write_eof()
        return response
