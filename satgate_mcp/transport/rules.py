"""Which HTTP answer a request gets: small pure functions, driven from tables in tests.

Every refusal on /mcp becomes a JSON-RPC error body, because the official clients only show
the server's message when the body parses as JSON-RPC.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import AuthOutcome, Identity
from satgate_mcp.errors import STORE_RETRY_AFTER_SECONDS
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.session_ids import is_valid_session_id_syntax
from satgate_mcp.sessions import RegistryFull, TokenSessionsBusy

#: Revisions served by the Streamable HTTP transport at /mcp, oldest first.
STREAMABLE_VERSIONS: tuple[str, ...] = ("2025-03-26", "2025-06-18", "2025-11-25")
#: The version assumed when a request carries no MCP-Protocol-Version header (spec, 2025-06-18).
DEFAULT_VERSION_WITHOUT_HEADER = "2025-03-26"
LATEST_VERSION = STREAMABLE_VERSIONS[-1]
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    error: str
    message: str
    code: int = jsonrpc.INVALID_REQUEST
    headers: dict[str, str] = field(default_factory=dict)
    extra: JsonObj = field(default_factory=dict)

    def body(self, request_id: RequestId | None) -> JsonObj:
        return jsonrpc.error_response(request_id, self.code, self.message, {"error": self.error, **self.extra})


def negotiate_version(requested: object) -> str:
    """The client's revision when we speak it, else our newest (the client decides whether to go on)."""
    return requested if isinstance(requested, str) and requested in STREAMABLE_VERSIONS else LATEST_VERSION


def _quality(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value.strip())
            except ValueError:
                return 1.0
    return 1.0


def _media_types(header: str | None) -> tuple[str, ...]:
    """The media types listed, without those the client marked unacceptable with ``q=0``.

    A client sends the same few header values on every request: short ones are parsed once (bounded cache)."""
    if header is None:
        return ()
    if len(header) <= _CACHED_HEADER_LENGTH:
        return _parsed_media_types(header)
    return _parse_media_types(header)


def _parse_media_types(header: str) -> tuple[str, ...]:
    kinds = []
    for part in header.split(","):
        kind, *params = part.split(";")
        if kind.strip() and _quality(params) > 0:
            kinds.append(kind.strip().lower())
    return tuple(kinds)


_CACHED_HEADER_LENGTH = 200
_parsed_media_types = functools.lru_cache(maxsize=256)(_parse_media_types)


def accepts(header: str | None, media_type: str) -> bool:
    kinds = _media_types(header)
    major = media_type.split("/", 1)[0]
    return media_type in kinds or "*/*" in kinds or f"{major}/*" in kinds


def check_accept(header: str | None) -> Refusal | None:
    """JSON must be acceptable; SSE is used only when the client also accepts it."""
    if header is None or accepts(header, "application/json"):
        return None
    return Refusal(406, "not_acceptable", "Accept must include application/json and text/event-stream")


def check_content_type(header: str | None) -> Refusal | None:
    if _media_types(header)[:1] == ("application/json",):
        return None
    return Refusal(415, "unsupported_media_type", "Content-Type must be application/json")


def body_too_large(limit: int) -> Refusal:
    return Refusal(413, "body_too_large", f"request body is larger than {limit} bytes")


def read_timeout(seconds: float) -> Refusal:
    return Refusal(408, "read_timeout", f"the request body did not arrive within {seconds:g} seconds")


PARSE_ERROR = Refusal(400, "parse_error", "Parse error: the body is not valid JSON", code=jsonrpc.PARSE_ERROR)
MISSING_SESSION = Refusal(400, "missing_session_id", "Bad Request: Mcp-Session-Id header is required")
INVALID_SESSION = Refusal(400, "invalid_session_id", "Bad Request: Mcp-Session-Id header is malformed")
SESSION_NOT_FOUND = Refusal(404, "session_not_found", "Session not found: initialize a new session",
                            code=jsonrpc.SERVER_ERROR)
BATCH_NOT_ALLOWED = Refusal(400, "batch_not_supported",
                            "JSON-RPC batches are only supported by protocol revision 2025-03-26")
INITIALIZE_IN_BATCH = Refusal(400, "invalid_request", "initialize must not be part of a batch")
EMPTY_BATCH = Refusal(400, "invalid_request", "an empty JSON array is not a valid JSON-RPC batch")
METHOD_NOT_ALLOWED = Refusal(405, "method_not_allowed", "Use POST (or DELETE to end a session)",
                             headers={"Allow": "POST, DELETE"})
GET_NOT_ALLOWED = Refusal(405, "method_not_allowed", "This server does not offer a server-initiated SSE stream",
                          headers={"Allow": "POST, DELETE"})


def invalid_message(reason: str) -> Refusal:
    return Refusal(400, "invalid_request", f"Invalid Request: {reason}")


def check_protocol_header(value: str | None) -> Refusal | None:
    if value is None or value in STREAMABLE_VERSIONS:
        return None
    return Refusal(400, "unsupported_protocol_version",
                   f"Unsupported MCP-Protocol-Version {value!r}; supported: {', '.join(STREAMABLE_VERSIONS)}",
                   extra={"supported": list(STREAMABLE_VERSIONS)})


def session_cap_reached(retry_after: int) -> Refusal:
    return Refusal(503, "session_cap_reached", "Too many sessions; retry later",
                   code=jsonrpc.SERVER_ERROR, headers={"Retry-After": str(retry_after)})


def registry_full(full: RegistryFull) -> Refusal:
    """The process cap (as ever), or this token's quota with every one of its sessions busy."""
    if isinstance(full, TokenSessionsBusy):
        return Refusal(503, full.reason, "Too many sessions for this token, all of them busy; retry later",
                       code=jsonrpc.SERVER_ERROR, headers={"Retry-After": str(full.retry_after)})
    return session_cap_reached(full.retry_after)


def check_session_header(value: str | None) -> Refusal | None:
    """Every request but initialize names its session; a malformed name is a 400, not an unknown id."""
    if value is None:
        return MISSING_SESSION
    return None if is_valid_session_id_syntax(value) else INVALID_SESSION


def check_batch(is_batch: bool, protocol_version: str) -> Refusal | None:
    return BATCH_NOT_ALLOWED if is_batch and protocol_version != "2025-03-26" else None


def bearer_challenge(resource_metadata_url: str | None, error: str | None = None, scope: str | None = None) -> str:
    parts = ['Bearer realm="satgate-mcp"']
    if error:
        parts.append(f'error="{error}"')
    if scope:
        parts.append(f'scope="{scope}"')
    if resource_metadata_url:
        parts.append(f'resource_metadata="{resource_metadata_url}"')
    return ", ".join(parts)


STORE_UNAVAILABLE = Refusal(503, "store_unavailable",
                            "Service unavailable: the gateway's token store did not answer; retry shortly",
                            code=jsonrpc.SERVER_ERROR, headers={"Retry-After": str(STORE_RETRY_AFTER_SECONDS)},
                            extra={"retry_after_seconds": STORE_RETRY_AFTER_SECONDS})


def reply_status(reply: JsonObj) -> tuple[int, dict[str, str]]:
    """The HTTP status a single answer travels with: 200, except a store fault (503 + Retry-After), so a
    balancer or client backs off instead of reading the refusal as the call's own error."""
    error = reply.get("error")
    data = error.get("data") if isinstance(error, dict) else None
    if isinstance(data, dict) and data.get("error") in ("store_unavailable", "audit_unavailable"):
        return 503, {"Retry-After": str(data.get("retry_after_seconds", STORE_RETRY_AFTER_SECONDS))}
    return 200, {}


def auth_refusal(outcome: AuthOutcome, resource_metadata_url: str | None) -> Refusal:
    """The answer to a credential that did not pass. OAuth mode turns a revocation into a 401 challenge,
    so OAuth clients fetch a new token instead of giving up."""
    if outcome is AuthOutcome.UNAVAILABLE:
        return STORE_UNAVAILABLE
    if outcome is AuthOutcome.REVOKED and not resource_metadata_url:
        return Refusal(403, "token_revoked", "Forbidden: the token has been revoked", code=jsonrpc.SERVER_ERROR,
                       extra={"code": "TOKEN_REVOKED"})
    messages = {
        AuthOutcome.MISSING: "Unauthorized: a bearer token is required (Authorization: Bearer <token>)",
        AuthOutcome.INVALID: "Unauthorized: the bearer token is not valid",
        AuthOutcome.EXPIRED: "Unauthorized: the bearer token has expired",
        AuthOutcome.REVOKED: "Unauthorized: the bearer token has been revoked",
    }
    error = {AuthOutcome.MISSING: "unauthorized", AuthOutcome.INVALID: "invalid_token",
             AuthOutcome.EXPIRED: "token_expired", AuthOutcome.REVOKED: "token_revoked"}[outcome]
    extra: JsonObj = {"code": "TOKEN_REVOKED"} if outcome is AuthOutcome.REVOKED else {}
    challenge_error = None if outcome is AuthOutcome.MISSING else "invalid_token"
    return Refusal(401, error, messages.get(outcome, "Unauthorized"), code=jsonrpc.SERVER_ERROR,
                   headers={"WWW-Authenticate": bearer_challenge(resource_metadata_url, challenge_error)},
                   extra=extra)


def insufficient_scope(required: str, granted: frozenset[str], resource_metadata_url: str | None) -> Refusal:
    """RFC 6750 section 3.1 step-up: 403 naming the scopes to ask for (those held plus the one missing),
    so the client's new authorization does not drop what the token already had."""
    wanted = " ".join(sorted(granted | {required}))
    return Refusal(403, "insufficient_scope", f"Forbidden: this call needs the scope {required!r}",
                   code=jsonrpc.TOOL_NOT_ALLOWED,
                   headers={"WWW-Authenticate": bearer_challenge(resource_metadata_url, "insufficient_scope", wanted)},
                   extra={"scope": required})


def scope_refusal(identity: Identity, requests: Sequence[jsonrpc.Request],
                  resource_metadata_url: str | None) -> Refusal | None:
    """A single ``tools/call`` whose tool needs a scope the token lacks: the HTTP challenge, before it runs."""
    if len(requests) != 1 or requests[0].method != "tools/call" or identity.scopes is None:
        return None
    name = (requests[0].params or {}).get("name")
    scope = identity.missing_scope(name) if isinstance(name, str) else None
    return insufficient_scope(scope, identity.scopes, resource_metadata_url) if scope is not None else None


def token_mismatch(resource_metadata_url: str | None) -> Refusal:
    """Another token presenting a live session: 403, or in OAuth mode the unknown-id 404 so the client
    re-initializes with the token it now holds."""
    if resource_metadata_url:
        return SESSION_NOT_FOUND
    return Refusal(403, "session_token_mismatch", "Forbidden: this session belongs to another token",
                   code=jsonrpc.SERVER_ERROR)


def owes_tools_changed(method: str, tools_seen: int, tools_version: int) -> bool:
    """The tool list changed since this client last listed it, and it is not listing it now."""
    return method != "tools/list" and tools_seen < tools_version


# --- what a body says ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rejected:
    """A body refused as a whole; its answer carries the id of the request it names, when known."""

    refusal: Refusal
    request_id: RequestId | None = None


@dataclass(frozen=True, slots=True)
class Post:
    """A POST body that parsed: its messages, and whether they came as a batch."""

    messages: tuple[jsonrpc.Message, ...]
    is_batch: bool

    @property
    def requests(self) -> list[jsonrpc.Request]:
        return [m for m in self.messages if isinstance(m, jsonrpc.Request)]

    @property
    def notifications(self) -> list[jsonrpc.Notification]:
        return [m for m in self.messages if isinstance(m, jsonrpc.Notification)]

    @property
    def first_id(self) -> RequestId | None:
        """The id a refusal of the whole POST answers with."""
        return next((m.id for m in self.requests), None)

    @property
    def method(self) -> str:
        """What the request log line names: the first method in the body, or ``response``."""
        return next((m.method for m in self.messages if not isinstance(m, jsonrpc.Response)), "response")

    @property
    def initialize(self) -> jsonrpc.Request | None:
        return next((m for m in self.requests if m.method == "initialize"), None)


def decode_json(raw: bytes) -> object:
    """The decoded body, or PARSE_ERROR (a Refusal) for bytes that are not JSON."""
    try:
        return jsonrpc.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return PARSE_ERROR


def parse_one(value: object) -> jsonrpc.Message | Rejected:
    try:
        return jsonrpc.parse_message(value)
    except jsonrpc.InvalidMessage as exc:
        return Rejected(invalid_message(str(exc)), exc.request_id)


def classify(raw: bytes) -> Post | Rejected:
    """A /mcp body as messages; the first item that is not a JSON-RPC message refuses the whole POST."""
    decoded = decode_json(raw)
    if isinstance(decoded, Refusal):
        return Rejected(decoded)
    is_batch = isinstance(decoded, list)
    items = decoded if isinstance(decoded, list) else [decoded]
    if is_batch and not items:
        return Rejected(EMPTY_BATCH)
    messages: list[jsonrpc.Message] = []
    for item in items:
        message = parse_one(item)
        if isinstance(message, Rejected):
            return message
        messages.append(message)
    post = Post(tuple(messages), is_batch)
    initialize = post.initialize
    if is_batch and initialize is not None:
        return Rejected(INITIALIZE_IN_BATCH, initialize.id)
    return post


def parse_single(raw: bytes) -> jsonrpc.Message | Rejected:
    """A legacy /message body: exactly one message, no batches."""
    decoded = decode_json(raw)
    return Rejected(decoded) if isinstance(decoded, Refusal) else parse_one(decoded)
