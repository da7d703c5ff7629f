"""What a span is called and what it records, by the OpenTelemetry conventions for MCP, JSON-RPC and HTTP.

Pure functions of what the gateway already has (the request, the reply, the upstream's spec), so the
choices can be checked as tables. Never a token, a header's value, a secret or a tool's arguments:
a span names the method, the tool or prompt, ids and outcomes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from satgate_mcp.jsonrpc import JsonObj, RequestId

Attributes = dict[str, str | int | float | bool]

#: Which kind of refusal each ``data.error`` reason is: what an operator filters traces by.
REFUSAL_KINDS: dict[str, str] = {
    "unauthorized": "auth", "invalid_token": "auth", "token_expired": "auth", "token_revoked": "auth",
    "session_token_mismatch": "auth",
    "tool_not_allowed": "caveat", "resource_not_allowed": "caveat", "prompt_not_allowed": "caveat",
    "insufficient_scope": "scope",
    "rate_limited": "rate",
    "budget_exhausted": "budget",
    "too_many_in_flight": "policy", "session_cap_reached": "policy", "too_many_subscriptions": "policy",
    "store_unavailable": "policy", "host_not_allowed": "policy", "origin_not_allowed": "policy",
    "body_too_large": "policy", "delegation_failed": "policy",
}

#: The ``params`` field that names a method's low-cardinality target, and the attribute it goes in.
_TARGETS: dict[str, tuple[str, str]] = {
    "tools/call": ("name", "gen_ai.tool.name"),
    "prompts/get": ("name", "gen_ai.prompt.name"),
}


def target(method: str, params: JsonObj | None) -> str | None:
    """The tool or prompt a request names (a resource URI is not: too many distinct span names)."""
    field = _TARGETS.get(method)
    value = params.get(field[0]) if field is not None and params else None
    return value[:200] if isinstance(value, str) and value else None


def span_name(method: str, params: JsonObj | None) -> str:
    """``{mcp.method.name} {target}``, or the method alone when it names no tool or prompt."""
    named = target(method, params)
    return f"{method} {named}" if named is not None else method


def request_id_text(request_id: RequestId | None) -> str | None:
    return None if request_id is None else str(request_id)


def request_attributes(method: str, params: JsonObj | None, request_id: RequestId | None, *,
                       session_id: str | None, protocol_version: str | None) -> Attributes:
    """A JSON-RPC request's server span: method, ids, revision, the tool (``execute_tool``) or prompt."""
    attributes: Attributes = {"mcp.method.name": method, "network.transport": "tcp", "network.protocol.name": "http"}
    rid = request_id_text(request_id)
    if rid is not None:
        attributes["jsonrpc.request.id"] = rid
    if session_id is not None:
        attributes["mcp.session.id"] = session_id
    if protocol_version is not None:
        attributes["mcp.protocol.version"] = protocol_version
    named = target(method, params)
    if named is not None:
        attributes[_TARGETS[method][1]] = named
    if method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
    uri = params.get("uri") if params and method.startswith("resources/") else None
    if isinstance(uri, str) and uri:
        attributes["mcp.resource.uri"] = uri[:500]
    return attributes


@dataclass(frozen=True, slots=True)
class Failure:
    """How a request failed, as a span records it."""

    #: ``error.type``: the refusal's reason when the gateway gave one, else the JSON-RPC code, or ``tool_error``.
    error_type: str
    #: The JSON-RPC error code as text (``rpc.response.status_code``); None for a tool's own error result.
    status_code: str | None
    #: The span status description: the error's message.
    description: str | None
    #: ``data.error`` of a gateway refusal and its kind (auth, caveat, scope, rate, budget, policy).
    reason: str | None = None
    kind: str | None = None

    def attributes(self) -> Attributes:
        found: Attributes = {"error.type": self.error_type}
        if self.status_code is not None:
            found["rpc.response.status_code"] = self.status_code
        if self.reason is not None:
            found["satgate.refusal.reason"] = self.reason
        if self.kind is not None:
            found["satgate.refusal.kind"] = self.kind
        return found


def reply_failure(reply: JsonObj) -> Failure | None:
    """The failure a reply message reports (a JSON-RPC error, or a tool result with ``isError``); None if it
    succeeded."""
    error = reply.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message")
        data = error.get("data")
        reason = data.get("error") if isinstance(data, dict) else None
        reason = reason[:100] if isinstance(reason, str) and reason else None
        code_text = str(code) if isinstance(code, int) else "unknown"
        return Failure(reason or code_text, code_text, message[:300] if isinstance(message, str) else None,
                       reason, REFUSAL_KINDS.get(reason) if reason is not None else None)
    result = reply.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return Failure("tool_error", None, None)
    return None


def upstream_attributes(upstream: str, transport: str, url: str | None) -> Attributes:
    """What every client span to one upstream shares: its name, the transport, the server's address for HTTP."""
    attributes: Attributes = {"satgate.upstream.name": upstream,
                              "network.transport": "pipe" if transport == "stdio" else "tcp"}
    if url is None:
        return attributes
    attributes["network.protocol.name"] = "http"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return attributes
    if parts.hostname:
        attributes["server.address"] = parts.hostname
        attributes["server.port"] = port if port is not None else (443 if parts.scheme == "https" else 80)
    return attributes


def http_server_attributes(method: str, path: str, scheme: str, client: str | None) -> Attributes:
    """An HTTP request's server span, before its answer (``http.response.status_code`` comes after)."""
    attributes: Attributes = {"http.request.method": method, "url.path": path, "url.scheme": scheme,
                              "network.protocol.name": "http"}
    if client:
        attributes["client.address"] = client
    return attributes


def http_span_name(method: str, route: str | None) -> str:
    """``{method} {route}`` (the route the app matched, never a raw path: bounded names)."""
    return f"{method} {route}" if route else method


def progress_event(params: JsonObj) -> tuple[str, Attributes]:
    """A progress notification relayed to the client, as an event on its call's span (its message is not kept)."""
    attributes: Attributes = {"mcp.method.name": "notifications/progress"}
    for key, name in (("progress", "satgate.progress"), ("total", "satgate.progress.total")):
        value = params.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[name] = value
    return "notifications/progress", attributes


def relay_event(method: str, answer: JsonObj, waited: float) -> tuple[str, Attributes]:
    """An upstream's request (elicitation, sampling, roots) put to the client, as an event once it is answered:
    how (answered, error, not_relayed) and after how long; never what was asked or answered."""
    error = answer.get("error")
    outcome = "answered"
    if isinstance(error, dict):
        data = error.get("data")
        outcome = "not_relayed" if isinstance(data, dict) and data.get("error") == "not_relayed" else "error"
    return method, {"mcp.method.name": method, "satgate.relay.outcome": outcome,
                    "satgate.relay.wait_ms": round(waited * 1000, 1)}
