"""The one place the no-token-passthrough rule is kept: the encoding of every message to an upstream."""

from __future__ import annotations

import json

import pytest

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.outgoing import encode_message

BEARER = "client-bearer-secret"


@pytest.mark.parametrize(
    ("message", "sent"),
    [
        pytest.param({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "x", "_meta": {"token": BEARER}}},
                     {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x"}},
                     id="request-token-alone-drops-meta"),
        pytest.param({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
                      "params": {"uri": "m://a", "_meta": {"token": BEARER, "progressToken": "gw-1"}}},
                     {"jsonrpc": "2.0", "id": 2, "method": "resources/read",
                      "params": {"uri": "m://a", "_meta": {"progressToken": "gw-1"}}},
                     id="request-keeps-the-rest-of-meta"),
        pytest.param({"jsonrpc": "2.0", "method": "notifications/cancelled",
                      "params": {"requestId": 3, "_meta": {"token": BEARER}}},
                     {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}},
                     id="notification"),
        pytest.param({"jsonrpc": "2.0", "id": 4, "method": "ping"}, {"jsonrpc": "2.0", "id": 4, "method": "ping"},
                     id="no-params"),
        pytest.param({"jsonrpc": "2.0", "id": 5, "method": "m", "params": {"token": "an-argument"}},
                     {"jsonrpc": "2.0", "id": 5, "method": "m", "params": {"token": "an-argument"}},
                     id="only-meta-token-is-the-credential"),
        pytest.param({"jsonrpc": "2.0", "id": 6, "method": "m", "params": {"_meta": "odd"}},
                     {"jsonrpc": "2.0", "id": 6, "method": "m", "params": {"_meta": "odd"}},
                     id="meta-not-an-object"),
    ],
)
def test_attack_client_bearer_in_meta_never_reaches_an_upstream(message: JsonObj, sent: JsonObj) -> None:
    before = json.dumps(message)
    assert json.loads(encode_message(message)) == sent
    assert json.dumps(message) == before, "the caller's message is left as it was"
