"""How a transport writes a JSON-RPC answer over HTTP: a JSON body, a refusal with its status, an SSE event.

Every transport and the health endpoints answer through these, so a refusal looks the same wherever it is met.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.keys import REFUSAL_REASON
from satgate_mcp.transport import rules
from satgate_mcp.transport.rules import Refusal


def json_answer(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=jsonrpc.dumps(body), content_type="application/json", headers=headers)


def refusal_answer(refusal: Refusal, request_id: RequestId | None = None) -> web.Response:
    answer = json_answer(refusal.body(request_id), refusal.status, dict(refusal.headers))
    answer[REFUSAL_REASON] = refusal.error
    return answer


def rejected_answer(rejected: rules.Rejected) -> web.Response:
    return refusal_answer(rejected.refusal, rejected.request_id)


def sse_event(message: JsonObj) -> bytes:
    return b"event: message\ndata: " + jsonrpc.dumps(message) + b"\n\n"
