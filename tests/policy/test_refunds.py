"""Which failed calls are refunded: only those the upstream certainly never ran (refunds.py)."""

from __future__ import annotations

import asyncio

import pytest

from satgate_mcp.errors import UnknownTarget, UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.refunds import FailureKind, failure_kind, refundable, upstream_certainly_did_not_run


@pytest.mark.parametrize(("kind", "refunded"), [
    pytest.param(FailureKind.NOT_SENT, True, id="nothing-sent"),
    pytest.param(FailureKind.REFUSED_UNRUN, True, id="answered-32600-32601-32602"),
    pytest.param(FailureKind.ANSWERED, False, id="answered"),
    pytest.param(FailureKind.LOST_AFTER_SENDING, False, id="lost-after-sending"),
    pytest.param(FailureKind.TIMEOUT, False, id="timeout"),
    pytest.param(FailureKind.CANCELLED, False, id="cancelled"),
    pytest.param(FailureKind.OTHER, False, id="other-exception"),
])
def test_refund_only_what_certainly_never_ran(kind: FailureKind, refunded: bool) -> None:
    assert refundable(kind) is refunded


@pytest.mark.parametrize(
    ("reply", "exc", "kind"),
    [
        pytest.param(None, UpstreamUnavailable("down", sent=False), FailureKind.NOT_SENT, id="unreachable"),
        pytest.param(None, UpstreamUnavailable("died"), FailureKind.LOST_AFTER_SENDING,
                     id="unavailable-is-sent-unless-said-otherwise"),
        pytest.param({"error": {"code": -32600, "message": "bad"}}, None, FailureKind.REFUSED_UNRUN,
                     id="invalid-request"),
        pytest.param({"error": {"code": -32601, "message": "no"}}, None, FailureKind.REFUSED_UNRUN,
                     id="method-not-found"),
        pytest.param({"error": {"code": -32602, "message": "no"}}, None, FailureKind.REFUSED_UNRUN,
                     id="invalid-params"),
        pytest.param(None, UnknownTarget("no such tool"), FailureKind.REFUSED_UNRUN, id="gateway-unknown-tool"),
        pytest.param(None, UpstreamTimeout("slow"), FailureKind.TIMEOUT, id="timeout"),
        pytest.param(None, asyncio.CancelledError(), FailureKind.CANCELLED, id="cancelled"),
        pytest.param(None, RuntimeError("boom"), FailureKind.OTHER, id="other-exception"),
        pytest.param({"error": {"code": -32603, "message": "x"}}, None, FailureKind.ANSWERED, id="internal-error"),
        pytest.param({"error": {"code": "-32601"}}, None, FailureKind.ANSWERED, id="malformed-code"),
        pytest.param({"result": {"isError": True}}, None, FailureKind.ANSWERED, id="tool-error-result-ran"),
        pytest.param({"result": {}}, None, FailureKind.ANSWERED, id="result"),
    ],
)
def test_failure_kind(reply: JsonObj | None, exc: BaseException | None, kind: FailureKind) -> None:
    assert failure_kind(reply, exc) is kind
    assert upstream_certainly_did_not_run(reply, exc) is refundable(kind)
