"""Which failed calls are refunded: only those the upstream certainly never ran.

A call is refunded when its request never left the gateway, or when the answer itself proves
nothing ran (invalid request, method not found, invalid params, from the upstream or from the
gateway before forwarding). Everything else may have run the tool upstream, so it stays charged:
a timeout, a connection reset or a missing reply after sending, an HTTP status without a JSON-RPC
answer, an answer too big to read, a child that died mid-call, a cancellation.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum

from satgate_mcp.errors import GatewayError, UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, URL_ELICITATION_REQUIRED, JsonObj

#: JSON-RPC answers that prove the call never ran (-32042: it cannot proceed until the user completes a URL).
NOT_RUN_CODES = frozenset({INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, URL_ELICITATION_REQUIRED})


class FailureKind(StrEnum):
    #: A result (``isError`` too) or a JSON-RPC error other than the three below: it ran.
    ANSWERED = "answered"
    #: Answered -32600 / -32601 / -32602 (or refused so by the gateway before forwarding).
    REFUSED_UNRUN = "refused_unrun"
    #: Unavailable before the request's bytes left the gateway.
    NOT_SENT = "not_sent"
    #: Unavailable after sending: reset, no reply, HTTP status without JSON-RPC, over-size, child died.
    LOST_AFTER_SENDING = "lost_after_sending"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    #: Any other exception: a bug or a refusal of another kind; it may have run.
    OTHER = "other"


def refundable(kind: FailureKind) -> bool:
    """The rule: refund only what the upstream certainly never ran."""
    return kind in (FailureKind.NOT_SENT, FailureKind.REFUSED_UNRUN)


def failure_kind(reply: JsonObj | None, exc: BaseException | None) -> FailureKind:
    """Classify how a forwarded call ended: its reply, or the exception it raised instead."""
    if exc is not None:
        if isinstance(exc, UpstreamUnavailable):
            return FailureKind.LOST_AFTER_SENDING if exc.sent else FailureKind.NOT_SENT
        if isinstance(exc, UpstreamTimeout):
            return FailureKind.TIMEOUT
        if isinstance(exc, GatewayError) and exc.code in NOT_RUN_CODES:
            return FailureKind.REFUSED_UNRUN
        if isinstance(exc, asyncio.CancelledError):
            return FailureKind.CANCELLED
        return FailureKind.OTHER
    error = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(error, dict) and error.get("code") in NOT_RUN_CODES:
        return FailureKind.REFUSED_UNRUN
    return FailureKind.ANSWERED


def upstream_certainly_did_not_run(reply: JsonObj | None, exc: BaseException | None) -> bool:
    return refundable(failure_kind(reply, exc))
