"""An in-process gateway in header mode in front of the fake pool, for tool-control tests: mint, call, read."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.controls import Controls, parse_controls
from tests.answers import read_answer
from tests.fakes import FakePool

KEY = "controls-root-key-0123456789abcdef-xyz"
ACCEPT = "application/json, text/event-stream"
TOOLS = ["pay", "pay_later", "fetch", "echo", "delete_file", "deploy", "block"]


def token(controls: object | None = None, *, token_id: str = "agent", **kwargs: Any) -> str:
    parsed: Controls | None = None if controls is None else parse_controls(json.dumps(controls))
    return mint_token(KEY, token_id, controls=parsed, **kwargs)


@dataclass
class ControlGateway:
    client: TestClient[web.Request, web.Application]
    pool: FakePool
    publisher: RecordingPublisher
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def post(self, bearer: str, body: object, session: str | None = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT, "Authorization": f"Bearer {bearer}"}
        if session:
            headers["Mcp-Session-Id"] = session
        resp = await self.client.post("/mcp", data=json.dumps(body), headers=headers)
        if resp.status != 200:
            return resp.status, await resp.text()
        return 200, await read_answer(resp)

    async def session(self, bearer: str) -> str:
        resp = await self.client.post("/mcp", headers={"Content-Type": "application/json", "Accept": ACCEPT,
                                                       "Authorization": f"Bearer {bearer}"},
                                      data=json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                                          "protocolVersion": "2025-06-18", "capabilities": {},
                                          "clientInfo": {"name": "t", "version": "1"}}}))
        assert resp.status == 200, await resp.text()
        return resp.headers["Mcp-Session-Id"]

    async def call(self, bearer: str, session: str, tool: str, arguments: object,
                   request_id: int | None = None) -> JsonObj:
        rid = next(self.ids) if request_id is None else request_id
        status, answer = await self.post(bearer, {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                                  "params": {"name": tool, "arguments": arguments}}, session)
        assert status == 200, answer
        assert isinstance(answer, dict)
        return answer

    def forwarded(self, tool: str) -> int:
        return sum(1 for method, params in self.pool.calls if method == "tools/call" and (params or {}).get("name")
                   == tool)


def refusal(answer: JsonObj) -> dict[str, Any]:
    """The -32001 refusal's data (the call must have been refused)."""
    assert "error" in answer, answer
    assert answer["error"]["code"] == -32001, answer
    data: dict[str, Any] = answer["error"]["data"]
    return data
