"""Domain errors. Each carries the JSON-RPC error it becomes; none knows about HTTP."""

from __future__ import annotations

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj


class GatewayError(Exception):
    """A refusal or failure that the client should see as a JSON-RPC error object."""

    code: int = jsonrpc.INTERNAL_ERROR

    def __init__(self, message: str, data: JsonObj | None = None, *, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data
        if code is not None:
            self.code = code

    def to_error(self) -> JsonObj:
        return jsonrpc.error_object(self.code, self.message, self.data)


class UpstreamUnavailable(GatewayError):
    """The upstream is down or its connection died while the call was in flight.

    Every one carries ``data.error = "upstream_unavailable"`` (-32010), whatever else its raiser adds,
    so clients can tell it from MCP's -32002 "resource not found".

    ``sent`` is False only when the request's bytes certainly never left the gateway (the
    connection was refused, or never opened); anything later may have run the call upstream.
    """

    code = jsonrpc.UPSTREAM_UNAVAILABLE

    def __init__(self, message: str, data: JsonObj | None = None, *, code: int | None = None,
                 sent: bool = True) -> None:
        super().__init__(message, {"error": "upstream_unavailable", **(data or {})}, code=code)
        self.sent = sent


class UpstreamAuthFailed(UpstreamUnavailable):
    """The upstream's authorization server refused (or could not give) the credential this call needs upstream.

    ``data.error = "upstream_auth_failed"`` with the upstream's name and the server's own ``error`` code
    (``oauth_error``), never its body or any secret. Nothing was sent upstream, so the call is refunded.
    """

    def __init__(self, upstream: str, oauth_error: str, message: str) -> None:
        super().__init__(message, {"error": "upstream_auth_failed", "upstream": upstream, "oauth_error": oauth_error},
                         sent=False)
        self.oauth_error = oauth_error


class UpstreamTimeout(GatewayError):
    """The upstream did not answer within its configured timeout."""

    code = jsonrpc.UPSTREAM_TIMEOUT


class UnknownTarget(GatewayError):
    """No upstream advertises the tool, prompt or resource the client named."""

    code = jsonrpc.INVALID_PARAMS


class ToolNotAllowed(GatewayError):
    code = jsonrpc.TOOL_NOT_ALLOWED


class ConfigError(Exception):
    """Configuration that cannot work; the message names what to fix."""


class StartFailed(Exception):
    """The daemon could not start for a reason a later try may not have (a taken port): exit 1, not 2.

    Like a ConfigError it reaches the CLI, which prints its one stderr line; systemd restarts on 1 only.
    """


#: Seconds a client refused for a store fault (SATGATE_STORE_FAIL_MODE=closed) is told to wait.
STORE_RETRY_AFTER_SECONDS = 1


def store_unavailable() -> GatewayError:
    """Closed fail mode: the transport answers this as 503 + Retry-After (never 401/403, never -32603)."""
    return GatewayError("Service unavailable: the gateway's store did not answer; retry shortly",
                        {"error": "store_unavailable", "retry_after_seconds": STORE_RETRY_AFTER_SECONDS},
                        code=jsonrpc.SERVER_ERROR)
