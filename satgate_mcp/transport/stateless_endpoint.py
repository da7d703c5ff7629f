"""2026-07-28 on the same ``/mcp``: stateless requests, each carrying its version and capabilities.

The same ``checks`` (Host/Origin, body limit, principal, scopes) and ``call_runner`` (in-flight bounds)
as a session, and the same limits, budgets and duplicate guard behind the dispatcher, but no session
gate: no session is looked up or minted (an ``Mcp-Session-Id`` a modern request carries is ignored).
The ladder: the revision's own rules (``stateless_rules``), the principal, the scopes, then the call;
the answer is JSON, or an SSE stream scoped to this one request (its progress, and log messages when
its ``_meta`` asks for a level). Closing that stream cancels the call.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import token_hash
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.inflight import too_many_in_flight
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import RPC_METHOD
from satgate_mcp.task_ids import undeclared_modern_client
from satgate_mcp.transport import listen, mrtr, rules, stateless_rules
from satgate_mcp.transport.answers import json_answer, refusal_answer, sse_event
from satgate_mcp.transport.call_answer import SSE_HEADERS, CallStream
from satgate_mcp.transport.call_runner import CallRunner, stateless_session_id
from satgate_mcp.transport.checks import Principal, RequestChecks
from satgate_mcp.transport.listen import Listeners
from satgate_mcp.transport.relay import Emit
from satgate_mcp.transport.rules import Refusal
from satgate_mcp.transport.session_stream import SHUTTING_DOWN
from satgate_mcp.transport.stateless_rules import META_LOG_LEVEL, meta_of
from satgate_mcp.upstream.base import Resume
from satgate_mcp.upstream.wire import without_input_fields

#: How often a running call looks whether its client hung up (aiohttp offers no awaitable for it).
DISCONNECT_POLL_SECONDS = 0.25
KEEPALIVE_SECONDS = 15.0
#: How long shutdown waits for the given-up flows' calls to end (an upstream told to cancel usually answers at once).
CLOSE_WAIT_SECONDS = 5.0


class StatelessEndpoint:
    def __init__(self, checks: RequestChecks, runner: CallRunner, dispatcher: Dispatcher, *,
                 keepalive_seconds: float = KEEPALIVE_SECONDS, listeners: Listeners | None = None,
                 flows: mrtr.Flows | None = None) -> None:
        self._checks = checks
        self._runner = runner
        self._dispatcher = dispatcher
        self._keepalive = keepalive_seconds
        self.listeners = listeners if listeners is not None else Listeners()
        self._flows = flows if flows is not None else mrtr.Flows([])

    async def aclose(self) -> None:
        """At shutdown: calls still waiting for a client's input are given up, and have ended (each settles its
        charge in the state store, which closes after this) when this returns."""
        calls = self._flows.close()
        if calls:
            await asyncio.wait(calls, timeout=CLOSE_WAIT_SECONDS)

    async def _listen(self, request: web.Request, principal: Principal, message: jsonrpc.Request) -> web.StreamResponse:
        """Acknowledge what will be sent, then send only that until the client leaves or the process stops."""
        asked = listen.requested_filter(message.params)
        if isinstance(asked, str):
            return json_answer(jsonrpc.error_response(message.id, jsonrpc.INVALID_PARAMS, asked,
                                                      {"error": "invalid_params"}), 400)
        if self.listeners.closing:
            return refusal_answer(SHUTTING_DOWN, message.id)
        limiter, subscriptions, tasks = self._runner.limiter, self._dispatcher.subscriptions, self._dispatcher.tasks
        # An open stream holds an in-flight slot like a call: one token cannot hold connections without bound.
        if not limiter.try_acquire(principal.quota_key):
            return json_answer(too_many_in_flight(message.id))
        capabilities = self._dispatcher.capabilities()
        lists = listen.honoured_lists(asked.flags, capabilities)
        listener = self.listeners.open(message.id, listen.ListenFilter(lists), principal.identity)
        try:
            subscribable = isinstance(capabilities.get("resources"), dict) and bool(
                capabilities["resources"].get("subscribe"))
            readable = [u for u in asked.uris if subscribable and principal.identity.allows_resource(u)]
            subscribed = [u for u in readable if await listen.subscribe_uri(subscriptions, listener.key, u)]
            # The caller's own tasks, when it declared the extension: any other id is not honoured, as unknown.
            followed = {} if undeclared_modern_client("2026", meta_of(message.params)) else tasks.listened(
                asked.task_ids, token_id=principal.identity.token_id,
                session_id=stateless_session_id(principal.identity.token_id))
            listener.task_refs = followed
            listener.filter = listen.ListenFilter(lists, frozenset(subscribed), frozenset(followed.values()))
            await tasks.watch(listener.key, frozenset(followed))
            await self._dispatcher.listening(listen.SETTLE_SECONDS)
            return await self._serve_listen(request, listener)
        finally:
            self.listeners.release(listener)
            subscriptions.end_session(listener.key)
            limiter.release(principal.quota_key)
            await tasks.watch(listener.key, frozenset())  # last: the stream's own state is released whatever it does

    async def _serve_listen(self, request: web.Request, listener: listen.Listener) -> web.StreamResponse:
        response = web.StreamResponse(headers=dict(SSE_HEADERS))
        watcher = asyncio.ensure_future(_hung_up(request))
        try:
            await response.prepare(request)
            await response.write(sse_event(listen.acknowledgement(listener.filter, listener.subscription_id)))
            while True:
                getter = asyncio.ensure_future(listener.queue.get())
                done, _ = await asyncio.wait({getter, watcher}, timeout=self._keepalive,
                                             return_when=asyncio.FIRST_COMPLETED)
                if watcher in done:
                    getter.cancel()
                    return response
                if getter not in done:
                    getter.cancel()
                    await response.write(b": keepalive\n\n")
                    continue
                item = getter.result()
                if item is None:
                    await response.write(sse_event(listen.ended(listener.subscription_id)))
                    await response.write_eof()
                    return response
                await response.write(sse_event(item))
        except ConnectionError:
            return response
        finally:
            watcher.cancel()

    async def post(self, request: web.Request, message: jsonrpc.Request | jsonrpc.Notification) -> web.StreamResponse:
        request_id = message.id if isinstance(message, jsonrpc.Request) else None
        refusal = stateless_rules.modern_refusal(message, request.headers)
        if refusal:
            return refusal_answer(refusal, request_id)
        checks = self._checks
        principal = await checks.principal(request)
        if isinstance(principal, Refusal):
            return refusal_answer(principal, request_id)
        if not isinstance(message, jsonrpc.Request):
            return web.Response(status=202)  # no client notification is defined on HTTP: accepted, ignored
        request[RPC_METHOD] = message.method
        refusal = checks.scope_refusal(principal, [message]) or self._param_headers(request, message)
        if refusal:
            return refusal_answer(refusal, message.id)
        if message.method == "server/discover":
            self._dispatcher.expect_modern(listen.SETTLE_SECONDS)
            return json_answer(jsonrpc.result_response(message.id, self._complete(
                message.method, self._dispatcher.discover_result(list(stateless_rules.ADVERTISED_VERSIONS)))))
        if message.method == "subscriptions/listen":
            return await self._listen(request, principal, message)
        return await self._run(request, principal, message, meta_of(message.params) or {})

    def _param_headers(self, request: web.Request, message: jsonrpc.Request) -> Refusal | None:
        if message.method != "tools/call":
            return None
        params = message.params or {}
        name = params.get("name")
        schema = self._dispatcher.tool_schema(name) if isinstance(name, str) else None
        return stateless_rules.param_header_refusal(schema, params.get("arguments"), request.headers)

    def _complete(self, method: str, result: JsonObj) -> JsonObj:
        return stateless_rules.complete_result(method, result, cache_scope=self._checks.cache_scope,
                                               server_info=self._dispatcher.server_info)

    def _shaped(self, method: str, reply: JsonObj) -> tuple[JsonObj, int]:
        """The reply in the revision's shape, and its HTTP status (an unknown method is 404)."""
        result = reply.get("result")
        if isinstance(result, dict):
            return {**reply, "result": self._complete(method, result)}, 200
        error = reply.get("error")
        if isinstance(error, dict) and error.get("code") == jsonrpc.METHOD_NOT_FOUND:
            return reply, 404
        return reply, rules.reply_status(reply)[0]

    async def _run(self, request: web.Request, principal: Principal, message: jsonrpc.Request,
                   meta: dict[str, object]) -> web.StreamResponse:
        """One round of the call: a new call, or the retry of one waiting for its client's input (MRTR).

        A retry whose state carries a modern upstream's runs the call anew there; one naming a flow answers it.
        ``inputResponses`` without a ``requestState`` continue nothing: the call is a new one, and the answers go
        to a modern upstream as given (it may use those it recognises and ask again for the rest); a 2025
        upstream's question takes the one that fits it (offered.py) instead of being asked.
        """
        streams = rules.accepts(request.headers.get("Accept"), "text/event-stream")
        stream = CallStream(request, {}, event_ids=False)

        async def emit(note: JsonObj) -> bool:
            return await stream.emit(note) if streams else False

        holder = token_hash(principal.token)
        digest = mrtr.request_digest(message.method, message.params)
        params = message.params or {}
        if "requestState" in params or "inputResponses" in params:
            if message.method not in mrtr.MRTR_METHODS and message.method != "tasks/update":  # a task's answers
                return refusal_answer(_state_refused(f"{message.method} takes no inputResponses or requestState"),
                                      message.id)
            if "inputResponses" in params and not isinstance(params["inputResponses"], dict):
                return refusal_answer(_state_refused("inputResponses must be an object of answers by key"),
                                      message.id)
        if "requestState" in params:
            try:
                resume = self._flows.carried(params.get("requestState"), params.get("inputResponses"),
                                             holder=holder, digest=digest)
                waiting = None if resume is not None else self._flows.resume(
                    params.get("requestState"), holder=holder, digest=digest)
            except mrtr.StateRefused as exc:
                return refusal_answer(_state_refused(str(exc)), message.id)
            if waiting is None:  # a modern upstream's call: it goes on there, from the sealed state alone
                flow = self._start(principal, message, meta, emit, streams, resume, holder=holder, digest=digest)
            else:
                flow = waiting
                flow.emit, flow.streaming = emit, streams
                if flow.answer(params.get("inputResponses")):  # something asked is still unanswered: ask again
                    return await self._ask(flow, stream, streams, message)
        else:
            copy_key = (holder, digest, json.dumps(message.id))
            parked = self._flows.parked(copy_key)
            if parked is not None and parked.pending:  # sent again while it waits for its client: ask again
                parked.emit, parked.streaming = emit, streams
                return await self._ask(parked, stream, streams, message)
            flow = self._start(principal, message, meta, emit, streams, None, holder=holder, digest=digest)
            flow.copy_key = copy_key
        return await self._round(request, flow, stream, streams, message)

    def _start(self, principal: Principal, message: jsonrpc.Request, meta: dict[str, object], emit: Emit,
               streams: bool, resume: Resume | None, *, holder: str, digest: str) -> mrtr.Flow:
        """Run the call (a new one, or the retry of a modern upstream's) as this round's flow."""
        level = meta.get(META_LOG_LEVEL)
        declared = meta.get(stateless_rules.META_CAPABILITIES)
        flow = mrtr.Flow(holder, digest, dict(declared) if isinstance(declared, dict) else {},
                         level if isinstance(level, str) else None, emit)
        flow.streaming, flow.client_meta = streams, stateless_rules.client_meta(meta)
        given = (message.params or {}).get("inputResponses")
        if resume is None and isinstance(given, dict):  # answers sent with a new call: a 2025 upstream's fitting ones
            flow.offered = dict(given)
        relay = mrtr.ModernRelay(flow, f"stateless:{principal.identity.token_id}", resume)
        params = stateless_rules.without_protocol_meta(message.params)
        if resume is not None:
            params = without_input_fields(params)
        call = jsonrpc.Request(message.id, message.method, params)
        flow.start(asyncio.ensure_future(self._runner.run(principal, call, relay)))
        return flow

    async def _ask(self, flow: mrtr.Flow, stream: CallStream, streams: bool,
                   message: jsonrpc.Request) -> web.StreamResponse:
        """``input_required`` with every question still open, and a fresh sealed state for the retry."""
        try:
            state = self._flows.state_for(flow)
        except mrtr.StateRefused as exc:
            flow.cancel(str(exc))
            return refusal_answer(_state_refused(str(exc)), message.id)
        reply = jsonrpc.result_response(message.id, self._complete(
            message.method, mrtr.input_required(list(flow.pending.values()), state)))
        return await stream.finish(reply) if streams else json_answer(reply)

    def _carried(self, flow: mrtr.Flow, reply: JsonObj) -> JsonObj:
        """A modern upstream's ``input_required`` with its state sealed into the gateway's; other replies as they are.

        Its ``inputRequests`` go to the client as written: the upstream was told what the client declared and
        decided what to ask; the gateway does not refuse in its place.
        """
        result = reply.get("result")
        if flow.carried_from is None or not isinstance(result, dict) or result.get("resultType") != "input_required":
            return reply
        state = self._flows.seal_carried(flow, flow.carried_from, result.get("requestState"))
        return {**reply, "result": mrtr.carried_result(result, state)}

    async def _round(self, request: web.Request, flow: mrtr.Flow, stream: CallStream, streams: bool,
                     message: jsonrpc.Request) -> web.StreamResponse:
        """Until the call ends or asks for input; a client that hangs up meanwhile cancels it."""
        stop_keeping_alive = stream.keep_alive_later(flow.admitted, self._keepalive) if streams else None
        watcher = asyncio.ensure_future(_hung_up(request))
        try:
            while True:
                getter = asyncio.ensure_future(flow.next_outcome())
                await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    self._flows.done(flow)
                    flow.cancel("the client closed its stream")  # that is the cancellation; nothing more is sent
                    return web.Response(status=499)
                outcome = getter.result()
                if outcome.asks and not any(a.key in flow.pending for a in outcome.asks):
                    continue  # already put to the client in an earlier round
                break
        except asyncio.CancelledError:  # the handler itself was cancelled (a hang-up aiohttp reported, a cut)
            self._flows.done(flow)
            flow.cancel("the request was cancelled")
            raise
        finally:
            watcher.cancel()
            if stop_keeping_alive is not None:
                stop_keeping_alive()
        if outcome.asks:
            return await self._ask(flow, stream, streams, message)
        self._flows.done(flow)
        assert outcome.reply is not None
        carried = self._carried(flow, outcome.reply)
        reply, status = self._shaped(message.method, jsonrpc.with_id(carried, message.id))
        if not streams or status != 200:
            return json_answer(reply, status, headers=rules.reply_status(reply)[1])
        return await stream.finish(reply)


def _state_refused(why: str) -> Refusal:
    return stateless_rules.modern_error(400, jsonrpc.INVALID_PARAMS, "request_state_refused", f"Invalid params: {why}")


async def _hung_up(request: web.Request) -> None:
    """Returns once the client's connection is closed. aiohttp signals that only by cancelling handlers
    (which would also cancel 2025 calls on a disconnect, against that revision) or to a reader of the body
    (read already): so its transport is looked at, every ``DISCONNECT_POLL_SECONDS``."""
    while (transport := request.transport) is not None and not transport.is_closing():  # noqa: ASYNC110
        await asyncio.sleep(DISCONNECT_POLL_SECONDS)

