"""The 2026-07-28 revision's decisions, as pure functions: which request is modern, and its error ladder.

A modern request carries its protocol version, capabilities and identity in ``params._meta`` and
needs no session. The body decides the era (the headers are a cross-check, so a proxy that routes on
them cannot be lied to): a request whose ``_meta`` names a protocol version is modern, even on
``initialize``. Every refusal is a JSON-RPC error with the spec's code: dual-era clients fall back to
``initialize`` on a bare 400, so a modern error must always say it is one.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.transport.relay import is_log_level
from satgate_mcp.transport.rules import Refusal

MODERN_VERSION = "2026-07-28"
SUPPORTED_MODERN = (MODERN_VERSION,)
#: What a modern client is told it may use: 2025 revisions are reached through ``initialize``.
ADVERTISED_VERSIONS = [MODERN_VERSION]

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
#: Per-request protocol fields: the gateway's to read, never forwarded to a 2025 upstream.
PER_REQUEST_META = frozenset({META_VERSION, META_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL})

HEADER_MISMATCH = -32020
MISSING_CLIENT_CAPABILITY = jsonrpc.MISSING_CLIENT_CAPABILITY
UNSUPPORTED_VERSION = -32022

METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
VERSION_HEADER = "MCP-Protocol-Version"
PARAM_HEADER_PREFIX = "mcp-param-"
ROUTING_HEADERS = (VERSION_HEADER, METHOD_HEADER, NAME_HEADER)
BASE64_PREFIX, BASE64_SUFFIX = "=?base64?", "?="

#: Where ``Mcp-Name`` comes from, for the methods that require it.
NAME_SOURCE = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
               "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
#: What a modern client may ask of the gateway.
MODERN_METHODS = frozenset({
    "server/discover", "tools/list", "tools/call", "prompts/list", "prompts/get", "resources/list",
    "resources/templates/list", "resources/read", "completion/complete", "subscriptions/listen",
    "tasks/get", "tasks/update", "tasks/cancel",  # the tasks extension (task_relay.py); tasks/result, list: v1 only
})
#: Methods the revision removed; they are 404 -32601 like any unknown one, and named as removed.
REMOVED_METHODS = frozenset({"initialize", "ping", "logging/setLevel", "resources/subscribe",
                             "resources/unsubscribe", "notifications/initialized"})
#: Results that carry caching hints.
CACHEABLE = frozenset({"server/discover", "tools/list", "prompts/list", "resources/list",
                       "resources/templates/list", "resources/read"})


def meta_of(params: JsonObj | None) -> dict[str, Any] | None:
    meta = (params or {}).get("_meta")
    return meta if isinstance(meta, dict) else None


def is_modern(message: jsonrpc.Message, header_version: str | None, legacy_versions: Sequence[str], *,
              has_session: bool = False) -> bool:
    """The body decides: ``_meta`` names a protocol version. A request without a session whose header
    names the modern revision is treated as modern too, so it is told what is missing instead of
    being asked for a session it will never have."""
    if isinstance(message, jsonrpc.Response):
        return False
    meta = meta_of(message.params)
    if meta is not None and META_VERSION in meta:
        return True
    if message.method == "initialize" or has_session:
        return False
    return header_version is not None and header_version not in legacy_versions and header_version >= MODERN_VERSION


def decode_header_value(value: str) -> str | None:
    """A header value as the body would hold it: the Base64 sentinel decoded; None when it cannot be."""
    if value.startswith(BASE64_PREFIX) and value.endswith(BASE64_SUFFIX) and len(value) >= len(BASE64_PREFIX) + 2:
        encoded = value[len(BASE64_PREFIX):-len(BASE64_SUFFIX)]
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    if any(not (c == "\t" or " " <= c <= "~") for c in value):
        return None
    return value


def modern_error(status: int, code: int, error: str, message: str, data: JsonObj | None = None) -> Refusal:
    return Refusal(status, error, message, code=code, extra=data or {})


def header_mismatch(what: str) -> Refusal:
    return modern_error(400, HEADER_MISMATCH, "header_mismatch", f"Header mismatch: {what}")


def method_not_found(method: str) -> Refusal:
    if method == "initialize":
        why = (f"initialize is not a {MODERN_VERSION} method: send requests with per-request _meta, or "
               "initialize without _meta for a 2025 revision (2025-11-25, 2025-06-18, 2025-03-26)")
    elif method in REMOVED_METHODS:
        why = f"Method not found: {method} was removed in {MODERN_VERSION}"
    else:
        why = f"Method not found: {method[:100]}"
    return modern_error(404, jsonrpc.METHOD_NOT_FOUND, "method_not_found", why)


def header_values(headers: Mapping[str, str] | Any, name: str) -> list[str]:
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return list(getall(name, []))
    value = headers.get(name)
    return [] if value is None else [value]


def modern_refusal(request: jsonrpc.Request | jsonrpc.Notification, headers: Any) -> Refusal | None:
    """The first rule a modern request breaks, or None. ``headers`` is case-insensitive (a CIMultiDict).

    Order: the body's own fields (-32602), the routing headers against the body (-32020), the version
    (-32022), the method (404 -32601).
    """
    meta = meta_of(request.params)
    if meta is None or not isinstance(meta.get(META_VERSION), str) or not meta[META_VERSION]:
        return modern_error(400, jsonrpc.INVALID_PARAMS, "missing_meta",
                            f"Invalid params: _meta[{META_VERSION!r}] is required on every request")
    if not isinstance(meta.get(META_CAPABILITIES), dict):
        return modern_error(400, jsonrpc.INVALID_PARAMS, "missing_meta",
                            f"Invalid params: _meta[{META_CAPABILITIES!r}] (an object) is required on every request")
    version = meta[META_VERSION]
    for name in ROUTING_HEADERS:
        if len(header_values(headers, name)) > 1:
            return header_mismatch(f"{name} is given more than once")
    header_version = headers.get(VERSION_HEADER)
    if header_version is None:
        return header_mismatch(f"{VERSION_HEADER} header is required")
    if header_version != version:
        return header_mismatch(f"{VERSION_HEADER} header {header_version[:40]!r} does not match the body's "
                               f"{version[:40]!r}")
    if version not in SUPPORTED_MODERN:
        return modern_error(400, UNSUPPORTED_VERSION, "unsupported_protocol_version", "Unsupported protocol version",
                            {"supported": list(ADVERTISED_VERSIONS), "requested": version[:100]})
    method_header = headers.get(METHOD_HEADER)
    if method_header is None:
        return header_mismatch(f"{METHOD_HEADER} header is required")
    if method_header != request.method:
        return header_mismatch(f"{METHOD_HEADER} header {method_header[:100]!r} does not match the body's "
                               f"{request.method[:100]!r}")
    source = NAME_SOURCE.get(request.method)
    if source is not None:
        body_name = (request.params or {}).get(source)
        raw = headers.get(NAME_HEADER)
        if raw is None:
            return header_mismatch(f"{NAME_HEADER} header is required for {request.method}")
        decoded = decode_header_value(raw)
        if decoded is None or decoded != body_name:
            return header_mismatch(f"{NAME_HEADER} header does not match the body's params.{source}")
    if not isinstance(request, jsonrpc.Request):
        return None  # a notification is accepted and ignored: none is defined for clients on HTTP
    if request.method not in MODERN_METHODS and not request.method.startswith("satgate/"):
        return method_not_found(request.method)
    level = meta.get(META_LOG_LEVEL)
    if level is not None and not is_log_level(level):
        return modern_error(400, jsonrpc.INVALID_PARAMS, "invalid_log_level",
                            f"Invalid params: _meta[{META_LOG_LEVEL!r}] must be a log level (debug ... emergency)")
    return None


def header_properties(schema: object, path: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """(header name, property path) for every ``x-mcp-header`` reachable from the root by ``properties``."""
    found: list[tuple[str, tuple[str, ...]]] = []
    if not isinstance(schema, dict):
        return found
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return found
    for key, sub in properties.items():
        if not isinstance(sub, dict):
            continue
        name = sub.get("x-mcp-header")
        if isinstance(name, str) and name:
            found.append((name, (*path, str(key))))
        found.extend(header_properties(sub, (*path, str(key))))
    return found


def _value_at(arguments: object, path: tuple[str, ...]) -> object:
    value = arguments
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _same(header: str, value: object) -> bool:
    """Booleans as ``true``/``false``; numbers compared numerically (``42`` matches ``42.0``); strings exactly."""
    if isinstance(value, bool):
        return header == ("true" if value else "false")
    if isinstance(value, int | float):
        try:
            return float(header) == float(value)
        except (ValueError, OverflowError):
            return False
    return isinstance(value, str) and header == value


def param_header_refusal(schema: object, arguments: object, headers: Any) -> Refusal | None:
    """``Mcp-Param-*`` against the tool's ``x-mcp-header`` properties: present exactly when the value is."""
    for name, path in header_properties(schema):
        value = _value_at(arguments, path)
        raw = headers.get(f"Mcp-Param-{name}")
        if value is None:
            continue
        if raw is None:
            return header_mismatch(f"Mcp-Param-{name} header is required (the call sets {'.'.join(path)})")
        decoded = decode_header_value(raw)
        if decoded is None or not _same(decoded, value):
            return header_mismatch(f"Mcp-Param-{name} header does not match arguments.{'.'.join(path)}")
    return None


def without_protocol_meta(params: JsonObj | None) -> JsonObj | None:
    """The params an upstream sees: the per-request protocol fields are the gateway's, not the upstream's."""
    meta = meta_of(params)
    if params is None or meta is None:
        return params
    kept = {k: v for k, v in meta.items() if k not in PER_REQUEST_META}
    trimmed = {k: v for k, v in params.items() if k != "_meta"}
    if kept:
        trimmed["_meta"] = kept
    return trimmed


def client_meta(meta: Mapping[str, object]) -> JsonObj:
    """What the client declared of itself (capabilities, clientInfo): what an upstream asked in 2026-07-28 gets."""
    return {k: meta[k] for k in (META_CAPABILITIES, META_CLIENT_INFO) if isinstance(meta.get(k), dict)}


def complete_result(method: str, result: JsonObj, *, cache_scope: str, server_info: JsonObj) -> JsonObj:
    """A 2025-shaped result as a modern one: ``resultType``, caching hints where required, ``serverInfo``."""
    shaped = dict(result)
    shaped.setdefault("resultType", "complete")
    if method in CACHEABLE and shaped["resultType"] == "complete":
        shaped.setdefault("ttlMs", 0)
        shaped["cacheScope"] = cache_scope if shaped.get("cacheScope") != "private" else "private"
    meta = shaped.get("_meta")
    shaped["_meta"] = {**(meta if isinstance(meta, dict) else {}), META_SERVER_INFO: server_info}
    return shaped
