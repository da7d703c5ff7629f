"""The pure rules of talking to an HTTP upstream: the headers a request carries, what a bare status means.

Apart from the connection (http.py) and its exchanges (http_channel.py) so both share one answer and it can be
checked without a server.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Headers the gateway sets itself; configured headers cannot replace them.
PROTOCOL_HEADERS = frozenset({"accept", "content-type", "mcp-session-id", "mcp-protocol-version", "last-event-id",
                              "mcp-method", "mcp-name"})
JSON_AND_SSE = "application/json, text/event-stream"


def request_headers(
    configured: Mapping[str, str],
    *,
    accept: str,
    session_id: str | None,
    protocol_version: str | None,
    json_body: bool,
) -> dict[str, str]:
    """The operator's headers (the upstream's own credentials) plus the protocol's, which win."""
    headers = {k: v for k, v in configured.items() if k.lower() not in PROTOCOL_HEADERS}
    headers["Accept"] = accept
    if json_body:
        headers["Content-Type"] = "application/json"
    if session_id:
        headers["Mcp-Session-Id"] = session_id
    if protocol_version:
        headers["MCP-Protocol-Version"] = protocol_version
    return headers


def status_problem(status: int, *, had_session: bool) -> str:
    """Why an HTTP status without a JSON-RPC reply means the upstream cannot serve the call."""
    if status == 200:
        return "closed its answer before replying"
    if status == 202:
        return "accepted the request without replying"
    if status in (401, 403):
        return f"refused the gateway's credentials (HTTP {status}); check this upstream's headers"
    if status == 404:
        return "forgot the session again right after it was renewed" if had_session else "has no MCP endpoint here"
    return f"answered HTTP {status}"
