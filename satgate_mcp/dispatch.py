"""What the gateway does with one JSON-RPC request from an authenticated session.

Shared by every transport: it knows identities, policy and the upstream pool, never HTTP.

A token's ``tools``, ``resources`` and ``prompts`` caveats decide what it may name and what it is
shown; every request forwarded upstream passes the policy's rate limit first.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from satgate_mcp import SERVER_NAME, __version__, events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError, ToolNotAllowed, UnknownTarget, UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.upstream.base import ProgressCallback

TOOLS_PAGE_SIZE = 500
#: Methods forwarded to the pool as they are.
FORWARDED = frozenset({
    "resources/list", "resources/templates/list", "resources/read", "resources/subscribe",
    "resources/unsubscribe", "prompts/list", "prompts/get", "completion/complete",
})
#: Upstream listings filtered by the token's caveats: method -> (result key, item key naming it, kind).
FILTERED_LISTS: dict[str, tuple[str, str, str]] = {
    "resources/list": ("resources", "uri", "resource"),
    "resources/templates/list": ("resourceTemplates", "uriTemplate", "resource"),
    "prompts/list": ("prompts", "name", "prompt"),
}
RESOURCE_METHODS = frozenset({"resources/read", "resources/subscribe", "resources/unsubscribe"})

log = structlog.get_logger("satgate_mcp.dispatch")


class Pool(Protocol):
    def readiness(self) -> dict[str, bool]: ...
    def capabilities(self) -> JsonObj: ...
    def tools(self) -> list[JsonObj]: ...
    @property
    def tools_version(self) -> int: ...
    def owner_of_tool(self, name: str) -> str | None: ...
    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj: ...




class Policy(Protocol):
    async def admit(self, identity: Identity, *, method: str, tool: str | None, session_id: str,
                    request_id: RequestId, params: JsonObj | None) -> Any: ...
    async def settle(self, admission: Any, *, ran: bool) -> None: ...
    async def run(self, admission: Any, call: Callable[[], Awaitable[JsonObj]]) -> JsonObj:
        """Forward an admitted ``tools/call`` (identical copies in flight share one run) and settle it."""
        ...
    async def budget_status(self, identity: Identity) -> JsonObj: ...
    async def delegate(self, identity: Identity, params: JsonObj | None) -> JsonObj: ...


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode()


def decode_cursor(cursor: object) -> int:
    """Our own opaque cursors only; anything else is invalid params."""
    if cursor is None:
        return 0
    try:
        text = base64.urlsafe_b64decode(str(cursor).encode()).decode()
        if text.startswith("o:") and int(text[2:]) >= 0:
            return int(text[2:])
    except (ValueError, binascii.Error, UnicodeDecodeError):
        pass
    raise GatewayError("Invalid cursor", {"error": "invalid_cursor"}, code=jsonrpc.INVALID_PARAMS)


def page(items: list[JsonObj], cursor: object, size: int = TOOLS_PAGE_SIZE) -> tuple[list[JsonObj], str | None]:
    start = decode_cursor(cursor)
    end = start + size
    return items[start:end], (encode_cursor(end) if end < len(items) else None)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def named_target(method: str, params: JsonObj | None) -> tuple[str, str] | None:
    """What a forwarded request names, as the pool routes it: ``("resource", uri)`` or ``("prompt", name)``.

    A completion's ref names a prompt (``ref/prompt``) or else a resource (template) URI. None for lists.
    """
    params = params if isinstance(params, dict) else {}
    if method in RESOURCE_METHODS:
        return "resource", _text(params.get("uri"))
    if method == "prompts/get":
        return "prompt", _text(params.get("name"))
    if method == "completion/complete":
        ref = params.get("ref")
        ref = ref if isinstance(ref, dict) else {}
        if ref.get("type") == "ref/prompt":
            return "prompt", _text(ref.get("name"))
        return "resource", _text(ref.get("uri"))
    return None


def allows(identity: Identity, kind: str, name: str) -> bool:
    return identity.allows_prompt(name) if kind == "prompt" else identity.allows_resource(name)


def visible_listing(identity: Identity, method: str, reply: JsonObj) -> JsonObj:
    """An upstream listing without the items the token may not name (unnamed items count as not allowed)."""
    spec = FILTERED_LISTS.get(method)
    if spec is None:
        return reply
    key, item_key, kind = spec
    if not (identity.prompt_filters if kind == "prompt" else identity.resource_filters):
        return reply
    result = reply.get("result")
    if not isinstance(result, dict) or not isinstance(result.get(key), list):
        return reply
    items = [item for item in result[key]
             if isinstance(item, dict) and allows(identity, kind, _text(item.get(item_key)))]
    return {**reply, "result": {**result, key: items}}


class Dispatcher:
    def __init__(self, pool: Pool, *, publisher: Publisher, metrics: Metrics, policy: Policy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self._policy = policy
        self._publisher = publisher
        self._metrics = metrics
        self._clock = clock

    @property
    def tools_version(self) -> int:
        return self._pool.tools_version

    def initialize_result(self, protocol_version: str) -> JsonObj:
        return {
            "protocolVersion": protocol_version,
            "capabilities": self._pool.capabilities(),
            "serverInfo": {"name": SERVER_NAME, "version": __version__},
            "instructions": "Tools from the upstream MCP servers behind this satgate-mcp gateway.",
        }

    async def handle(self, request: jsonrpc.Request, *, identity: Identity, session_id: str,
                     on_progress: ProgressCallback | None = None) -> JsonObj:
        """The reply message for one request, always with the client's id; never raises GatewayError."""
        try:
            reply = await self._route(request, identity, session_id, on_progress)
        except GatewayError as exc:
            return jsonrpc.error_response(request.id, exc.code, exc.message, exc.data)
        except Exception:
            # A bug or an unexpected upstream failure still gets a JSON-RPC answer, never a dropped connection.
            log.exception("request_failed", method=request.method)
            return jsonrpc.error_response(request.id, jsonrpc.INTERNAL_ERROR, "Internal error",
                                          {"error": "internal_error"})
        return jsonrpc.with_id(reply, request.id)

    async def _route(self, request: jsonrpc.Request, identity: Identity, session_id: str,
                     on_progress: ProgressCallback | None) -> JsonObj:
        method, params = request.method, request.params
        if method == "ping":
            return jsonrpc.result_response(request.id, {})
        if method == "initialize":
            raise GatewayError("Session already initialized", {"error": "already_initialized"},
                               code=jsonrpc.INVALID_REQUEST)
        if method == "tools/list":
            visible = [t for t in self._pool.tools() if identity.allows_tool(str(t.get("name", "")))]
            items, next_cursor = page(visible, (params or {}).get("cursor"))
            result: JsonObj = {"tools": items}
            if next_cursor:
                result["nextCursor"] = next_cursor
            return jsonrpc.result_response(request.id, result)
        if method == "tools/call":
            return await self._call_tool(request, identity, session_id, on_progress)
        if method == "logging/setLevel":
            return jsonrpc.result_response(request.id, {})
        if method in FORWARDED:
            return await self._forward(request, identity, session_id, on_progress)
        if method in ("satgate/budget", "satgate/delegate"):
            return await self._satgate_method(request, identity, session_id)
        raise GatewayError(f"Method not found: {method}", {"error": "method_not_found", "method": method[:100]},
                           code=jsonrpc.METHOD_NOT_FOUND)

    async def _forward(self, request: jsonrpc.Request, identity: Identity, session_id: str,
                       on_progress: ProgressCallback | None) -> JsonObj:
        """Resources, prompts and completions: caveats first, then the rate limit, then the upstream."""
        method, params = request.method, request.params
        target = named_target(method, params)
        if target is not None and not allows(identity, *target):
            kind, name = target
            self._metrics.refusals.labels(reason=f"{kind}_not_allowed").inc()
            raise GatewayError(f"{kind.capitalize()} {name[:200]!r} is not allowed for this token",
                               {"error": f"{kind}_not_allowed", kind: name[:200]}, code=jsonrpc.TOOL_NOT_ALLOWED)
        admission = None
        if self._policy is not None:
            admission = await self._policy.admit(identity, method=method, tool=None, session_id=session_id,
                                                 request_id=request.id, params=params)
        try:
            reply = await self._pool.call(method, params, on_progress=on_progress)
        finally:
            if self._policy is not None and admission is not None:
                await self._policy.settle(admission, ran=True)
        return visible_listing(identity, method, reply)

    async def _satgate_method(self, request: jsonrpc.Request, identity: Identity, session_id: str) -> JsonObj:
        if self._policy is None:
            raise GatewayError(f"Method not found: {request.method}", {"error": "method_not_found"},
                               code=jsonrpc.METHOD_NOT_FOUND)
        admission = await self._policy.admit(identity, method=request.method, tool=None, session_id=session_id,
                                             request_id=request.id, params=request.params)
        await self._policy.settle(admission, ran=True)
        if request.method == "satgate/budget":
            return jsonrpc.result_response(request.id, await self._policy.budget_status(identity))
        return jsonrpc.result_response(request.id, await self._policy.delegate(identity, request.params))

    async def _call_tool(self, request: jsonrpc.Request, identity: Identity, session_id: str,
                         on_progress: ProgressCallback | None) -> JsonObj:
        params = request.params or {}
        name = params.get("name")
        if not isinstance(name, str) or not name:
            raise GatewayError("tools/call needs a tool name", {"error": "invalid_params"},
                               code=jsonrpc.INVALID_PARAMS)
        if not identity.allows_tool(name):
            self._metrics.refusals.labels(reason="tool_not_allowed").inc()
            raise ToolNotAllowed(f"Tool {name!r} is not allowed for this token",
                                 {"error": "tool_not_allowed", "tool": name})
        upstream = self._pool.owner_of_tool(name)
        if upstream is None:
            raise UnknownTarget(f"Unknown tool: {name}", {"error": "unknown_tool", "tool": name})
        admission = None
        if self._policy is not None:
            admission = await self._policy.admit(identity, method="tools/call", tool=name, session_id=session_id,
                                                 request_id=request.id, params=params)
        started = self._clock()
        outcome = "error"
        try:
            if self._policy is not None and admission is not None:
                reply = await self._policy.run(
                    admission, lambda: self._pool.call("tools/call", params, on_progress=on_progress))
            else:
                reply = await self._pool.call("tools/call", params, on_progress=on_progress)
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
            self._metrics.tool_calls.labels(upstream=upstream, outcome=outcome).inc()
            self._metrics.upstream_latency.labels(upstream=upstream, method="tools/call").observe(elapsed)
            self._publisher.publish(events.TOOL_CALL, token_id=identity.token_id, session_id=session_id,
                                    tool=name, upstream=upstream, outcome=outcome, duration_ms=round(elapsed * 1000, 1))


