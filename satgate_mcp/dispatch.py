"""What the gateway does with one JSON-RPC request from an authenticated session.

Shared by every transport: it knows identities, policy and the upstream pool, never HTTP.

A token's ``tools``, ``resources`` and ``prompts`` caveats decide what it may name and what it is
shown; then the configured guards (guards.py) have their say, and every request forwarded upstream
passes the policy's rate limit last.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

import structlog

from satgate_mcp import SERVER_NAME, __version__, events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import Operation, Policy, Pool, method_not_found
from satgate_mcp.errors import GatewayError, ToolNotAllowed, UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.guards import REMOTE_ADDR, Asked, ClientFacts, Guards, Target
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.paging import LIST_PAGE_SIZE, decode_cursor, page
from satgate_mcp.policy.audit import AUDITED_METHODS
from satgate_mcp.policy.audit_trail import Auditor
from satgate_mcp.subscriptions import Subscriptions
from satgate_mcp.task_ids import TASK_METHODS
from satgate_mcp.task_owners import TaskOwnerStore
from satgate_mcp.task_relay import TaskRelay
from satgate_mcp.upstream.base import CALLER, Caller, ProgressCallback, is_relay
from satgate_mcp.upstream.catalog import LISTINGS, Kind
from satgate_mcp.visibility import allows, named_target, visible_listing

log = structlog.get_logger("satgate_mcp.dispatch")

#: The forwarded requests the guards judge (besides ``tools/call``): each names one resource or prompt.
GUARDED_METHODS = frozenset({"resources/read", "prompts/get"})


@dataclass(frozen=True, slots=True)
class Call:
    """One request as a handler sees it: what was asked, by whom, in which session."""

    request: jsonrpc.Request
    identity: Identity
    session_id: str
    on_progress: ProgressCallback | None
    #: The session's protocol and the client's name and version, where the transport knows them.
    client: ClientFacts | None = None

    @property
    def params(self) -> JsonObj | None:
        return self.request.params

    def asked(self, target: Target, name: str, upstream: str | None = None, definition: JsonObj | None = None
              ) -> Asked:
        """This request as the guards see it."""
        return Asked(self.request.method, self.identity, self.session_id, target, name, self.params or {},
                     upstream, definition, self.client, REMOTE_ADDR.get(), self.on_progress, self.request.id)


#: A method's handler: the reply message (any id; the dispatcher puts the client's on it).
Handler = Callable[[Call], Awaitable[JsonObj]]


def _admitted(call: Call) -> None:
    """Tell the call's relay that nothing can refuse it any more: its answer may now be prepared as a stream."""
    if is_relay(call.on_progress):
        call.on_progress.admit()


def merged_instructions(found: list[tuple[str, str]]) -> str | None:
    """Every upstream's instructions, each under its upstream's name; None when none gave any."""
    if not found:
        return None
    return "\n\n".join(f"## {name}\n{text}" for name, text in found)


async def _empty_result(call: Call) -> JsonObj:
    return jsonrpc.result_response(None, {})


async def _already_initialized(call: Call) -> JsonObj:
    raise GatewayError("Session already initialized", {"error": "already_initialized"}, code=jsonrpc.INVALID_REQUEST)


class Dispatcher:
    def __init__(self, pool: Pool, *, publisher: Publisher, metrics: Metrics, policy: Policy,
                 clock: Callable[[], float] = time.monotonic, subscriptions: Subscriptions | None = None,
                 list_page_size: int = LIST_PAGE_SIZE, guards: Guards | None = None,
                 audit: Auditor | None = None, task_keys: Sequence[bytes] = (),
                 task_owners: TaskOwnerStore | None = None) -> None:
        self._pool = pool
        self._tasks = TaskRelay(pool, policy, task_keys, task_owners)
        self._audit = audit
        self._guards = guards or Guards()
        self.subscriptions = subscriptions or Subscriptions(pool.subscribe, pool.unsubscribe, pool.subscription_scope)
        self._list_page_size = list_page_size
        self._policy = policy
        self._publisher = publisher
        self._metrics = metrics
        self._clock = clock
        forward = self._forwarder
        #: method -> handler; anything else is method-not-found.
        self._routes: dict[str, Handler] = {
            "ping": _empty_result,
            "logging/setLevel": _empty_result,
            "initialize": _already_initialized,
            "tools/list": self._list_tools,
            "tools/call": self._call_tool,
            "resources/list": self._paged(forward(self._lister("resources")), "resources"),
            "resources/templates/list": self._paged(forward(self._lister("templates")), "templates"),
            "prompts/list": self._paged(forward(self._lister("prompts")), "prompts"),
            "resources/read": forward(pool.read_resource),
            "resources/subscribe": self._per_session(self.subscriptions.subscribe),
            "resources/unsubscribe": self._per_session(self.subscriptions.unsubscribe),
            "prompts/get": forward(pool.get_prompt),
            "completion/complete": forward(pool.complete),
            "satgate/budget": self._budget,
            "satgate/delegate": self._delegate,
            **dict.fromkeys(TASK_METHODS, self._task),
            "tasks/list": self._task_list,
        }

    @property
    def tasks(self) -> TaskRelay:
        """The task relay: who created which task, for the status notifications the transports deliver."""
        return self._tasks

    @property
    def tools_version(self) -> int:
        """The tool list's version as a session sees it: the pool's, plus each change of what guards hide."""
        return self._pool.tools_version + self._guards.version

    def guards_changed(self, kinds: list[str]) -> None:
        """What the guards hide changed for these list kinds: sessions without a stream are owed a tools list."""
        if "tools" in kinds:
            self._guards.tools_changed()

    async def set_upstream_log_level(self, level: str) -> None:
        """The most verbose level any session asked for, to every upstream that logs (the call runner decides it)."""
        await self._pool.set_log_level(level)

    async def set_session_log_level(self, token_id: str, session_id: str, level: str) -> None:
        """A session's own level, for the upstream children that are its (or its token's) alone."""
        await self._pool.set_caller_log_level(Caller(token_id, session_id), level)

    def initialize_result(self, protocol_version: str) -> JsonObj:
        result: JsonObj = {
            "protocolVersion": protocol_version,
            "capabilities": self.capabilities(),
            "serverInfo": self.server_info,
        }
        instructions = merged_instructions(self._pool.instructions())
        if instructions is not None:
            result["instructions"] = instructions
        return result

    def capabilities(self) -> JsonObj:
        """What the gateway offers: the union of what its upstreams offer."""
        return self._pool.capabilities()

    async def listening(self, timeout: float) -> None:
        """Every upstream's change streams in force (bounded): what a listen stream's acknowledgement promises."""
        await self._pool.listening(timeout)

    def expect_modern(self, timeout: float) -> None:
        """A 2026-07-28 client came (``server/discover``): the upstreams' 2026-07-28 sides are looked for now."""
        self._pool.expect_modern(timeout)

    @property
    def server_info(self) -> JsonObj:
        return {"name": SERVER_NAME, "version": __version__}

    def discover_result(self, supported_versions: list[str]) -> JsonObj:
        """``server/discover`` (2026-07-28): what ``initialize`` says, without a session."""
        about = self.initialize_result(supported_versions[0])
        del about["protocolVersion"]
        about["capabilities"].pop("tasks", None)  # 2025-11-25's; the extension (``extensions``) stands for it
        return {"supportedVersions": supported_versions, **about}

    def tool_schema(self, name: str) -> object:
        """The merged ``inputSchema`` of a tool, or None when there is no such tool."""
        return next((t.get("inputSchema") for t in self._pool.tools() if t.get("name") == name), None)

    @property
    def audit(self) -> Auditor | None:
        """The audit trail's recorder, when ``SATGATE_AUDIT_FILE`` is set (the transports record relayed requests)."""
        return self._audit

    @property
    def guarded(self) -> bool:
        """Whether any guard (or the audit trail) is configured: the transports then tell who the client is."""
        return bool(self._guards) or self._audit is not None

    async def handle(self, request: jsonrpc.Request, *, identity: Identity, session_id: str,
                     on_progress: ProgressCallback | None = None, client: ClientFacts | None = None) -> JsonObj:
        """The reply message for one request, always with the client's id; never raises GatewayError. An audited
        call (``SATGATE_AUDIT_FILE``) is recorded whatever becomes of it."""
        answer = partial(self._answer, request, identity=identity, session_id=session_id, on_progress=on_progress,
                         client=client)
        if self._audit is not None and request.method in AUDITED_METHODS:
            return await self._audit.around(request, identity, session_id, client, self._upstream_of, answer)
        return await answer()

    def _upstream_of(self, method: str, name: str) -> str | None:
        return self._pool.owner_of_tool(name) if method == "tools/call" else None

    async def _answer(self, request: jsonrpc.Request, *, identity: Identity, session_id: str,
                      on_progress: ProgressCallback | None, client: ClientFacts | None) -> JsonObj:
        caller = CALLER.set(Caller(identity.token_id, session_id))  # whose child an isolated upstream uses
        try:
            handler = self._routes.get(request.method)
            if handler is None:
                raise method_not_found(request.method)
            reply = await handler(Call(request, identity, session_id, on_progress, client))
        except GatewayError as exc:
            return jsonrpc.error_response(request.id, exc.code, exc.message, exc.data)
        except Exception:
            # A bug or an unexpected upstream failure still gets a JSON-RPC answer, never a dropped connection.
            log.exception("request_failed", method=request.method)
            return jsonrpc.error_response(request.id, jsonrpc.INTERNAL_ERROR, "Internal error",
                                          {"error": "internal_error"})
        finally:
            CALLER.reset(caller)
        return jsonrpc.with_id(reply, request.id)

    async def _list_tools(self, call: Call) -> JsonObj:
        """Answered here, from the pool's merged tools, in our own pages."""
        visible = self._guards.visible(call.identity, "tools", [
            t for t in self._pool.tools() if call.identity.allows_tool(str(t.get("name", "")))], call.client)
        items, next_cursor = page(visible, (call.params or {}).get("cursor"))
        result: JsonObj = {"tools": items}
        if next_cursor:
            result["nextCursor"] = next_cursor
        return jsonrpc.result_response(None, result)

    def _lister(self, kind: Kind) -> Operation:
        """A merged listing as an operation: the whole union (``_paged`` cuts it into our pages)."""

        async def listing(params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
            return jsonrpc.result_response(None, await self._pool.listing(kind))

        return listing

    def _paged(self, handler: Handler, kind: Kind) -> Handler:
        """A listing the token may see, in our own pages; a cursor we never gave fails before any upstream work."""
        key = LISTINGS[kind].key

        async def paged(call: Call) -> JsonObj:
            cursor = (call.params or {}).get("cursor")
            decode_cursor(cursor)
            reply = await handler(call)
            result = reply.get("result")
            if not isinstance(result, dict) or not isinstance(result.get(key), list):
                return reply
            items, next_cursor = page(self._guards.visible(call.identity, kind, result[key], call.client), cursor,
                                      self._list_page_size)
            paged_result: JsonObj = {**result, key: items}
            if next_cursor:
                paged_result["nextCursor"] = next_cursor
            return {**reply, "result": paged_result}

        return paged

    def _per_session(self, operation: Callable[..., Awaitable[JsonObj]]) -> Handler:
        """A forwarded operation that also needs to know the session (subscriptions are kept per session)."""

        async def handler(call: Call) -> JsonObj:
            async def bound(params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
                return await operation(call.session_id, params, on_progress=on_progress)

            return await self._forwarder(bound)(call)

        return handler

    def _forwarder(self, operation: Operation) -> Handler:
        """Resources, prompts and completions: caveats first, then the rate limit, then the upstream."""

        async def forward(call: Call) -> JsonObj:
            method, params = call.request.method, call.params
            target = named_target(method, params)
            if target is not None and not allows(call.identity, *target):
                kind, name = target
                self._metrics.refusals.labels(reason=f"{kind}_not_allowed").inc()
                self._publisher.publish(events.NOT_ALLOWED, token_id=call.identity.token_id,
                                        session_id=call.session_id, method=method, kind=kind, name=name[:200])
                raise GatewayError(f"{kind.capitalize()} {name[:200]!r} is not allowed for this token",
                                   {"error": f"{kind}_not_allowed", kind: name[:200]},
                                   code=jsonrpc.TOOL_NOT_ALLOWED)
            if target is not None and self._guards and method in GUARDED_METHODS:
                asked = call.asked("prompt" if target[0] == "prompt" else "resource", target[1])
                return await self._guards.run(asked, partial(self._forward, call, operation))
            return await self._forward(call, operation)

        return forward

    async def _forward(self, call: Call, operation: Operation) -> JsonObj:
        method, params = call.request.method, call.params
        admission = await self._policy.admit(call.identity, method=method, tool=None, session_id=call.session_id,
                                             request_id=call.request.id, params=params)
        _admitted(call)
        try:
            reply = await operation(params, on_progress=call.on_progress)
        finally:
            await self._policy.settle(admission, ran=True)
        return visible_listing(call.identity, method, reply)

    async def _admit_and_settle(self, call: Call) -> None:
        """Budget methods count against the rate limit like anything else the policy answers."""
        admission = await self._policy.admit(call.identity, method=call.request.method, tool=None,
                                             session_id=call.session_id, request_id=call.request.id,
                                             params=call.params)
        await self._policy.settle(admission, ran=True)

    async def _budget(self, call: Call) -> JsonObj:
        await self._admit_and_settle(call)
        return jsonrpc.result_response(None, await self._policy.budget_status(call.identity))

    async def _delegate(self, call: Call) -> JsonObj:
        await self._admit_and_settle(call)
        return jsonrpc.result_response(None, await self._policy.delegate(call.identity, call.params))

    async def _task(self, call: Call) -> JsonObj:
        """``tasks/*``: to the upstream the sealed task id names (task_relay.py)."""
        return await self._tasks.relay(call.request.method, call.params, identity=call.identity,
                                       session_id=call.session_id, request_id=call.request.id,
                                       on_progress=call.on_progress, admitted=partial(_admitted, call))

    async def _task_list(self, call: Call) -> JsonObj:
        """2025-11-25's ``tasks/list``: the caller's own tasks (task_relay.py)."""
        return await self._tasks.list_tasks(call.params, identity=call.identity, session_id=call.session_id,
                                            request_id=call.request.id, on_progress=call.on_progress,
                                            admitted=partial(_admitted, call))

    async def _call_tool(self, call: Call) -> JsonObj:
        params = call.params or {}
        identity, session_id = call.identity, call.session_id
        name = params.get("name")
        if not isinstance(name, str) or not name:
            raise GatewayError("tools/call needs a tool name", {"error": "invalid_params"},
                               code=jsonrpc.INVALID_PARAMS)
        if not identity.allows_tool(name):
            self._metrics.refusals.labels(reason="tool_not_allowed").inc()
            self._publisher.publish(events.NOT_ALLOWED, token_id=identity.token_id, session_id=session_id,
                                    method="tools/call", kind="tool", name=name[:200])
            raise ToolNotAllowed(f"Tool {name!r} is not allowed for this token",
                                 {"error": "tool_not_allowed", "tool": name})
        scope = identity.missing_scope(name)
        if scope is not None:  # a single call over HTTP got a 403 challenge before this; a batch gets this
            self._metrics.refusals.labels(reason="insufficient_scope").inc()
            self._publisher.publish(events.NOT_ALLOWED, token_id=identity.token_id, session_id=session_id,
                                    method="tools/call", kind="scope", name=name[:200], scope=scope)
            raise ToolNotAllowed(f"Tool {name!r} needs the scope {scope!r}, which this token was not granted",
                                 {"error": "insufficient_scope", "tool": name, "scope": scope})
        upstream = self._pool.owner_of_tool(name)
        if upstream is None:
            raise self._pool.unknown_tool(name)
        if self._guards:
            definition = self._pool.tool(name)
            return await self._guards.run(call.asked("tool", name, upstream, definition),
                                          partial(self._run_tool, call, name, upstream))
        return await self._run_tool(call, name, upstream)

    async def _run_tool(self, call: Call, name: str, upstream: str) -> JsonObj:
        """An allowed call, through the policy (rate, duplicates, charge) to its upstream, measured."""
        params = call.params or {}
        identity, session_id, on_progress = call.identity, call.session_id, call.on_progress
        admission = await self._policy.admit(identity, method="tools/call", tool=name, session_id=session_id,
                                             request_id=call.request.id, params=params)
        _admitted(call)
        started = self._clock()
        outcome = "error"
        try:
            reply = await self._tasks.sealed(
                await self._policy.run(admission, lambda: self._pool.call_tool(params, on_progress=on_progress)),
                upstream, token_id=identity.token_id, session_id=session_id)
            outcome = "error" if "error" in reply else ("tool_error" if reply.get("result", {}).get("isError")
                                                        else "ok")
            return reply
        except UpstreamTimeout:
            outcome = "timeout"
            raise
        except UpstreamUnavailable:
            outcome = "unavailable"
            raise
        except BaseException:
            outcome = "cancelled"
            raise
        finally:
            elapsed = self._clock() - started
            self._metrics.tool_call_outcomes(upstream, outcome).inc()
            self._metrics.upstream_latencies(upstream, "tools/call").observe(elapsed)
            self._publisher.publish(events.TOOL_CALL, token_id=identity.token_id, session_id=session_id,
                                    tool=name, upstream=upstream, outcome=outcome, duration_ms=round(elapsed * 1000, 1))
