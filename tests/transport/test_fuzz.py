"""Whatever arrives at /mcp, the answer is a well-formed HTTP answer and the daemon keeps serving."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.base import NoAuthenticator
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.settings import Settings
from tests.fakes import AllowAllPolicy, FakePool

EXPECTED_STATUSES = {200, 202, 400, 404, 405, 406, 413, 415}

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
methods = st.sampled_from(["initialize", "ping", "tools/list", "tools/call", "prompts/get", "resources/read",
                           "notifications/cancelled", "notifications/initialized", "satgate/budget", "nope"])
messages = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", 2]), "method": methods},
    optional={"id": st.one_of(st.integers(), st.text(max_size=8), st.none(), st.booleans()),
              "params": st.one_of(json_values, st.fixed_dictionaries(
                  {"name": st.sampled_from(["echo", "progress", "missing", ""]),
                   "arguments": json_values, "_meta": json_values, "cursor": json_values}))})
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    messages.map(lambda m: json.dumps(m).encode()),
    st.lists(messages, max_size=3).map(lambda ms: json.dumps(ms).encode()),
)


@pytest.fixture
async def client(aiohttp_client: AiohttpClient) -> TestClient[web.Request, web.Application]:
    app = create_app(Settings(max_body_bytes=4096), authenticator=NoAuthenticator(), pool=FakePool(),
                     policy=AllowAllPolicy(), publisher=RecordingPublisher())
    return await aiohttp_client(app)


async def open_session(client: TestClient[web.Request, web.Application]) -> str:
    resp = await client.post("/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                           "params": {"protocolVersion": "2025-03-26"}},
                             headers={"Accept": "application/json, text/event-stream"})
    assert resp.status == 200
    return resp.headers["Mcp-Session-Id"]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, with_session=st.booleans(),
       content_type=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain"]),
       accept=st.sampled_from(["application/json, text/event-stream", "application/json", "*/*", "text/html"]))
async def test_any_body_gets_a_clear_answer_and_the_daemon_keeps_serving(
        client: TestClient[web.Request, web.Application], body: bytes, with_session: bool, content_type: str,
        accept: str) -> None:
    headers = {"Content-Type": content_type, "Accept": accept}
    if with_session:
        headers["Mcp-Session-Id"] = await open_session(client)
    resp = await client.post("/mcp", data=body, headers=headers)
    assert resp.status in EXPECTED_STATUSES
    text = await resp.text()
    if resp.status >= 400:
        answer: Any = json.loads(text)
        assert answer["jsonrpc"] == "2.0"
        assert isinstance(answer["error"]["data"]["error"], str)
    assert (await client.get("/healthz")).status == 200
