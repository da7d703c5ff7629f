"""Streamable HTTP at /mcp over a real aiohttp server, with an in-process pool and a fake clock.

Every refusal is checked for the same shape (JSON-RPC error body, the request's id or null,
``data.error``), and every answer for the session-header rule: an ``Mcp-Session-Id`` header is
only ever the request's own id, or a new session's id on a successful initialize.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from satgate_mcp import SERVER_NAME, events, jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.base import (
    Authenticator,
    AuthOutcome,
    AuthResult,
    Identity,
    NoAuthenticator,
    StaticTokenAuthenticator,
    bearer_from_header,
)
from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.inflight import InflightLimiter
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.keys import INFLIGHT, REGISTRY
from satgate_mcp.session_ids import make_session_id
from satgate_mcp.sessions import SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.upstream.base import ProgressCallback
from tests.answers import read_answer
from tests.fakes import AllowAllPolicy, FakeClock, FakePool, until

TTL = 1800.0
SSE_ACCEPT = "application/json, text/event-stream"
OAUTH_METADATA = "https://gw.example/.well-known/oauth-protected-resource"
ID_FORMAT = re.compile(r"^mcp-[0-9a-f]{32}-[0-9a-f]{32}$")
WAIT = 5.0  # bound on waiting for an event that the code under test sets


class TokenNameAuthenticator:
    """Stand-in for header mode (sessions resume): any ``tok-<name>`` bearer is identity ``<name>``."""

    mode = "header"

    async def authenticate(self, authorization: str | None) -> AuthResult:
        token = bearer_from_header(authorization)
        if token is None:
            return AuthResult(AuthOutcome.MISSING, reason="no bearer token")
        if not token.startswith("tok-"):
            return AuthResult(AuthOutcome.INVALID, reason="not a tok- token")
        return AuthResult(AuthOutcome.OK, Identity(token_id=token[4:]), token)


class NotReadyPool(FakePool):
    def readiness(self) -> dict[str, bool]:
        return {"fake": True, "slow": False}

    def failures(self) -> dict[str, dict[str, str]]:
        return {}


class ErrorReplyPool(FakePool):
    """An upstream that answers every call with its own JSON-RPC error."""

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        return jsonrpc.error_response(4242, -32050, "upstream says no", {"detail": [1, 2]})


class BrokenPool(FakePool):
    """An upstream layer with a bug: it raises something that is not a GatewayError."""

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        raise RuntimeError("bug in the upstream layer")


def request(request_id: RequestId, method: str, params: JsonObj | None = None) -> JsonObj:
    return jsonrpc.request_message(request_id, method, params)


def init_request(version: str = "2025-06-18", request_id: RequestId = 1) -> JsonObj:
    return request(request_id, "initialize", {"protocolVersion": version, "capabilities": {},
                                              "clientInfo": {"name": "test-client", "version": "1.0"}})


def call_tool(request_id: RequestId, name: str, *, progress_token: str | None = None, **arguments: Any) -> JsonObj:
    params: JsonObj = {"name": name, "arguments": arguments}
    if progress_token is not None:
        params["_meta"] = {"progressToken": progress_token}
    return request(request_id, "tools/call", params)


def _is_initialize(body: object, data: object) -> bool:
    if isinstance(data, bytes):
        try:
            body = json.loads(data)
        except ValueError:
            return False
    return isinstance(body, dict) and body.get("method") == "initialize"


@dataclass
class Gateway:
    client: TestClient[web.Request, web.Application]
    pool: FakePool
    policy: AllowAllPolicy
    publisher: RecordingPublisher
    clock: FakeClock

    @property
    def registry(self) -> SessionRegistry:
        app = self.client.app
        assert app is not None
        return app[REGISTRY]

    async def post(self, body: object = None, *, session: str | None = None, token: str | None = None,
                   headers: dict[str, str] | None = None, data: Any = None) -> ClientResponse:
        sent = {"Content-Type": "application/json", "Accept": SSE_ACCEPT}
        if session is not None:
            sent["Mcp-Session-Id"] = session
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        sent.update(headers or {})
        resp = await self.client.post("/mcp", data=json.dumps(body) if data is None else data, headers=sent)
        got = resp.headers.get("Mcp-Session-Id")
        if got is not None and got != session:
            assert _is_initialize(body, data), f"foreign Mcp-Session-Id {got!r} on a non-initialize answer"
            assert resp.status == 200, f"Mcp-Session-Id {got!r} on a refused initialize ({resp.status})"
        return resp

    async def initialize(self, version: str = "2025-06-18", token: str | None = None) -> str:
        resp = await self.post(init_request(version), token=token)
        assert resp.status == 200, await resp.text()
        return resp.headers["Mcp-Session-Id"]

    async def rpc(self, session: str, message: JsonObj, token: str | None = None) -> JsonObj:
        resp = await self.post(message, session=session, token=token)
        assert resp.status == 200, await resp.text()
        body: JsonObj = await read_answer(resp)
        return body


GatewayFactory = Callable[..., Awaitable[Gateway]]


async def assert_refusal(resp: ClientResponse, status: int, error: str, request_id: RequestId | None = None
                         ) -> JsonObj:
    """The shape every non-2xx answer on /mcp has, so clients can show the server's message."""
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    body: JsonObj = await read_answer(resp)
    assert body["jsonrpc"] == "2.0"
    assert body["id"] == request_id
    assert isinstance(body["error"]["code"], int)
    assert body["error"]["message"]
    assert body["error"]["data"]["error"] == error
    return body


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def gateway_factory(aiohttp_client: AiohttpClient, clock: FakeClock) -> GatewayFactory:
    async def make(*, authenticator: Authenticator | None = None, pool: FakePool | None = None,
                   **settings: Any) -> Gateway:
        pool = pool or FakePool()
        policy, publisher = AllowAllPolicy(), RecordingPublisher()
        app = create_app(Settings(**settings), authenticator=authenticator or NoAuthenticator(), pool=pool,
                         policy=policy, publisher=publisher, clock=clock)
        return Gateway(await aiohttp_client(app), pool, policy, publisher, clock)

    return make


@pytest.fixture
async def gw(gateway_factory: GatewayFactory) -> Gateway:
    return await gateway_factory()


@pytest.fixture
async def session(gw: Gateway) -> str:
    return await gw.initialize()


# --- initialize -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "negotiated"),
    [
        pytest.param("2025-03-26", "2025-03-26", id="2025-03-26"),
        pytest.param("2025-06-18", "2025-06-18", id="2025-06-18"),
        pytest.param("2025-11-25", "2025-11-25", id="2025-11-25"),
        pytest.param("2024-11-05", "2025-11-25", id="unsupported-gets-newest"),
        pytest.param("2026-07-28", "2025-11-25", id="future-gets-newest"),
    ],
)
async def test_initialize_negotiates_the_version_and_returns_both_headers(
    gw: Gateway, requested: str, negotiated: str
) -> None:
    resp = await gw.post(init_request(requested, request_id="init-1"))
    assert resp.status == 200
    body = await read_answer(resp)
    assert body["id"] == "init-1"
    result = body["result"]
    assert result["protocolVersion"] == negotiated
    assert result["serverInfo"]["name"] == SERVER_NAME
    assert result["capabilities"] == gw.pool.capabilities()
    assert resp.headers["MCP-Protocol-Version"] == negotiated
    session_id = resp.headers["Mcp-Session-Id"]
    assert ID_FORMAT.match(session_id)
    assert gw.registry.get(session_id) is not None
    [connect] = gw.publisher.named(events.SESSION_CONNECT)
    assert (connect["session_id"], connect["protocol_version"]) == (session_id, negotiated)


async def test_ping_and_initialized_notification_after_initialize(gw: Gateway, session: str) -> None:
    resp = await gw.post(jsonrpc.notification_message("notifications/initialized"), session=session)
    assert resp.status == 202
    assert await gw.rpc(session, request(2, "ping")) == {"jsonrpc": "2.0", "id": 2, "result": {}}


# --- refusals before the body is read --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [
        pytest.param({"Origin": "https://evil.example"}, 403, "origin_not_allowed", id="403-bad-origin"),
        pytest.param({"Accept": "text/html"}, 406, "not_acceptable", id="406-bad-accept"),
        pytest.param({"Content-Type": "text/plain"}, 415, "unsupported_media_type", id="415-bad-content-type"),
        pytest.param({"Host": "evil.example"}, 421, "host_not_allowed", id="421-bad-host"),
    ],
)
async def test_refused_before_the_body_is_read(gw: Gateway, headers: dict[str, str], status: int, error: str) -> None:
    await assert_refusal(await gw.post(init_request(), headers=headers), status, error)
    assert len(gw.registry) == 0


async def test_a_listed_host_is_accepted(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(allowed_hosts=["gw.internal"])
    resp = await gw.post(init_request(), headers={"Host": "gw.internal:9100"})
    assert resp.status == 200


async def test_a_listed_origin_is_accepted(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(allowed_origins=["https://app.example"])
    resp = await gw.post(init_request(), headers={"Origin": "https://app.example"})
    assert resp.status == 200


async def test_421_and_403_apply_to_get_and_delete_too(gw: Gateway, session: str) -> None:
    await assert_refusal(await gw.client.get("/mcp", headers={"Host": "evil.example"}), 421, "host_not_allowed")
    resp = await gw.client.delete("/mcp", headers={"Mcp-Session-Id": session, "Origin": "https://evil.example"})
    await assert_refusal(resp, 403, "origin_not_allowed")
    assert gw.registry.get(session) is not None


# --- 413 ------------------------------------------------------------------------------------------------


async def test_413_when_content_length_is_over_the_limit(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(max_body_bytes=1024)
    body = init_request()
    body["params"]["padding"] = "x" * 2000
    await assert_refusal(await gw.post(body), 413, "body_too_large")
    assert len(gw.registry) == 0
    assert (await gw.post(init_request())).status == 200  # the server and the client's connection carry on


async def test_413_when_a_chunked_body_passes_the_limit(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(max_body_bytes=1024)
    head = json.dumps(init_request())[:-1].encode() + b', "padding": "'

    async def chunks() -> AsyncIterator[bytes]:
        yield head
        for _ in range(4):
            yield b"x" * 1024
        yield b'"}'

    await assert_refusal(await gw.post(data=chunks()), 413, "body_too_large")
    assert len(gw.registry) == 0
    assert (await gw.post(init_request())).status == 200


async def test_a_body_exactly_at_the_limit_is_accepted(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(max_body_bytes=1024)
    text = json.dumps(init_request())
    resp = await gw.post(data=(text + " " * (1024 - len(text))).encode())
    assert resp.status == 200


# --- 400 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b'{"jsonrpc": "2.0", "id": 1, "method": ', id="truncated"),
        pytest.param(b"not json at all", id="text"),
        pytest.param(b"\xff\xfe\x00", id="invalid-utf8"),
        pytest.param(b"", id="empty"),
    ],
)
async def test_400_parse_error_for_invalid_json(gw: Gateway, session: str, data: bytes) -> None:
    body = await assert_refusal(await gw.post(data=data, session=session), 400, "parse_error")
    assert body["error"]["code"] == jsonrpc.PARSE_ERROR


async def test_400_parse_error_for_pathologically_nested_json(gw: Gateway, session: str) -> None:
    data = b"[" * 100_000 + b"]" * 100_000
    await assert_refusal(await gw.post(data=data, session=session), 400, "parse_error")


@pytest.mark.parametrize(
    ("body", "request_id"),
    [
        pytest.param({"id": 7, "method": "ping"}, 7, id="no-jsonrpc-member"),
        pytest.param({"jsonrpc": "1.0", "id": 7, "method": "ping"}, 7, id="wrong-jsonrpc-version"),
        pytest.param({"jsonrpc": "2.0", "id": 8, "method": "ping", "params": [1]}, 8, id="params-not-object"),
        pytest.param({"jsonrpc": "2.0", "id": 9, "method": ""}, 9, id="empty-method"),
        pytest.param({"jsonrpc": "2.0", "id": True, "method": "ping"}, None, id="boolean-id"),
        pytest.param({"jsonrpc": "2.0", "id": 3}, 3, id="neither-method-nor-result"),
        pytest.param("hello", None, id="json-string"),
        pytest.param(42, None, id="json-number"),
        pytest.param([], None, id="empty-batch"),
        pytest.param([1, 2], None, id="batch-of-non-objects"),
    ],
)
async def test_400_for_json_that_is_not_json_rpc(gw: Gateway, session: str, body: object,
                                                 request_id: RequestId | None) -> None:
    await assert_refusal(await gw.post(body, session=session), 400, "invalid_request", request_id)


async def test_400_for_a_batch_on_a_session_newer_than_2025_03_26(gw: Gateway) -> None:
    session = await gw.initialize("2025-06-18")
    batch = [request(1, "ping"), request(2, "tools/list")]
    await assert_refusal(await gw.post(batch, session=session), 400, "batch_not_supported", 1)


async def test_a_batch_on_a_2025_03_26_session_returns_an_array(gw: Gateway) -> None:
    session = await gw.initialize("2025-03-26")
    batch = [request(1, "ping"), jsonrpc.notification_message("notifications/initialized"), request("b", "tools/list")]
    resp = await gw.post(batch, session=session)
    assert resp.status == 200
    replies = await read_answer(resp)
    assert isinstance(replies, list)
    assert [r["id"] for r in replies] == [1, "b"]
    assert replies[0]["result"] == {}
    assert [t["name"] for t in replies[1]["result"]["tools"]] == gw.pool.tool_names


async def test_400_for_initialize_inside_a_batch(gw: Gateway) -> None:
    await assert_refusal(await gw.post([init_request(request_id=5)]), 400, "invalid_request", 5)
    assert len(gw.registry) == 0


async def test_400_for_a_request_without_a_session_id(gw: Gateway, session: str) -> None:
    await assert_refusal(await gw.post(request(4, "tools/list")), 400, "missing_session_id", 4)


async def test_400_for_a_notification_without_a_session_id(gw: Gateway) -> None:
    resp = await gw.post(jsonrpc.notification_message("notifications/initialized"))
    await assert_refusal(resp, 400, "missing_session_id", None)


@pytest.mark.parametrize(
    "session_id",
    [pytest.param("has space", id="space"), pytest.param("x" * 300, id="too-long")],
)
async def test_400_for_a_malformed_session_id(gw: Gateway, session_id: str) -> None:
    await assert_refusal(await gw.post(request(4, "ping"), session=session_id), 400, "invalid_session_id", 4)


async def test_400_for_an_unsupported_protocol_version_header(gw: Gateway, session: str) -> None:
    resp = await gw.post(request(6, "ping"), session=session, headers={"MCP-Protocol-Version": "2024-11-05"})
    body = await assert_refusal(resp, 400, "unsupported_protocol_version", 6)
    assert body["error"]["data"]["supported"] == ["2025-03-26", "2025-06-18", "2025-11-25"]


async def test_a_supported_protocol_version_header_is_accepted(gw: Gateway, session: str) -> None:
    resp = await gw.post(request(6, "ping"), session=session, headers={"MCP-Protocol-Version": "2025-06-18"})
    assert resp.status == 200


# --- 404 and the idle TTL -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "session_id",
    [
        pytest.param(make_session_id("tok-someone"), id="gateway-shaped"),
        pytest.param("3f1c2d9e-6b1a-4c55-9d0e-0a1b2c3d4e5f", id="foreign-shaped"),
    ],
)
async def test_404_for_an_unknown_session(gw: Gateway, session_id: str) -> None:
    await assert_refusal(await gw.post(request(5, "ping"), session=session_id), 404, "session_not_found", 5)
    assert len(gw.registry) == 0


async def test_404_once_the_session_has_been_idle_for_the_ttl(gw: Gateway, session: str) -> None:
    gw.clock.advance(TTL)
    await assert_refusal(await gw.post(request(5, "ping"), session=session), 404, "session_not_found", 5)
    assert gw.publisher.named(events.SESSION_CLOSE) == [
        {"session_id": session, "token_id": "anonymous", "reason": "idle_timeout"}
    ]


async def test_every_accepted_request_refreshes_the_idle_ttl(gw: Gateway, session: str) -> None:
    for request_id in range(3):
        gw.clock.advance(TTL - 1)
        assert (await gw.rpc(session, request(request_id, "ping")))["result"] == {}


# --- 202, 405, DELETE ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(jsonrpc.notification_message("notifications/initialized"), id="notification"),
        pytest.param(jsonrpc.result_response(5, {}), id="client-result"),
        pytest.param(jsonrpc.error_response(6, -32601, "no such method"), id="client-error"),
    ],
)
async def test_202_for_notifications_and_client_responses(gw: Gateway, session: str, message: JsonObj) -> None:
    resp = await gw.post(message, session=session)
    assert resp.status == 202
    assert await resp.read() == b""


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
async def test_405_json_rpc_body_for_other_http_methods(gw: Gateway, session: str, method: str) -> None:
    resp = await gw.client.request(method, "/mcp", headers={"Mcp-Session-Id": session}, data=b"{}")
    await assert_refusal(resp, 405, "method_not_allowed")
    assert set(resp.headers["Allow"].replace(" ", "").split(",")) == {"POST", "DELETE"}


async def test_delete_ends_the_session_then_404(gw: Gateway, session: str) -> None:
    resp = await gw.client.delete("/mcp", headers={"Mcp-Session-Id": session})
    assert resp.status == 200
    assert resp.headers.get("Mcp-Session-Id") == session
    assert gw.publisher.named(events.SESSION_CLOSE)[-1]["reason"] == "deleted"
    again = await gw.client.delete("/mcp", headers={"Mcp-Session-Id": session})
    await assert_refusal(again, 404, "session_not_found")
    assert "Mcp-Session-Id" not in again.headers
    await assert_refusal(await gw.post(request(8, "ping"), session=session), 404, "session_not_found", 8)


async def test_delete_cancels_the_sessions_calls_in_flight(gw: Gateway, session: str) -> None:
    call = asyncio.create_task(gw.post(call_tool(41, "block"), session=session))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    assert (await gw.client.delete("/mcp", headers={"Mcp-Session-Id": session})).status == 200
    await asyncio.wait_for(gw.pool.cancelled.wait(), WAIT)
    body = await read_answer(await asyncio.wait_for(call, WAIT))
    assert body["id"] == 41
    assert body["error"]["code"] == jsonrpc.REQUEST_CANCELLED


async def test_delete_of_an_unknown_id_is_404(gw: Gateway) -> None:
    resp = await gw.client.delete("/mcp", headers={"Mcp-Session-Id": make_session_id("tok-x")})
    await assert_refusal(resp, 404, "session_not_found")


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        pytest.param({}, "missing_session_id", id="missing"),
        pytest.param({"Mcp-Session-Id": "has space"}, "invalid_session_id", id="malformed"),
    ],
)
async def test_delete_needs_a_well_formed_session_id(gw: Gateway, headers: dict[str, str], error: str) -> None:
    await assert_refusal(await gw.client.delete("/mcp", headers=headers), 400, error)


# --- methods ------------------------------------------------------------------------------------------


async def test_an_unknown_method_is_a_json_rpc_error_and_the_connection_stays(gw: Gateway, session: str) -> None:
    body = await gw.rpc(session, request(11, "server/discover"))
    assert body["id"] == 11
    assert body["error"]["code"] == jsonrpc.METHOD_NOT_FOUND
    assert body["error"]["data"]["error"] == "method_not_found"
    assert (await gw.rpc(session, request(12, "ping")))["result"] == {}


async def test_a_2026_probe_without_its_meta_is_told_what_is_missing_and_initialize_still_works(
        gw: Gateway) -> None:
    """A header naming 2026-07-28 without a session is a modern request: a JSON-RPC error naming the missing
    ``_meta`` field (never a request for a session it will never have), and 2025 clients are unaffected."""
    resp = await gw.post(request(1, "server/discover"), headers={"MCP-Protocol-Version": "2026-07-28"})
    await assert_refusal(resp, 400, "missing_meta", 1)
    assert (await read_answer(resp))["error"]["code"] == jsonrpc.INVALID_PARAMS
    assert (await gw.post(init_request())).status == 200


async def test_initialize_carrying_a_session_id_opens_a_new_session(gw: Gateway, session: str) -> None:
    resp = await gw.post(init_request(request_id=3), session=session)
    assert resp.status == 200
    assert resp.headers["Mcp-Session-Id"] != session
    assert gw.registry.get(session) is not None
    assert len(gw.registry) == 2


async def test_tools_list_pages_with_a_cursor(gateway_factory: GatewayFactory) -> None:
    names = [f"tool_{i:04d}" for i in range(1201)]
    gw = await gateway_factory(pool=FakePool(names))
    session = await gw.initialize()
    seen: list[str] = []
    page_sizes: list[int] = []
    params: JsonObj = {}
    for request_id in range(10):
        result = (await gw.rpc(session, request(request_id, "tools/list", params)))["result"]
        page_sizes.append(len(result["tools"]))
        seen += [t["name"] for t in result["tools"]]
        if "nextCursor" not in result:
            break
        params = {"cursor": result["nextCursor"]}
    assert page_sizes == [500, 500, 201]
    assert seen == names


@pytest.mark.parametrize(
    "cursor",
    [
        pytest.param("not-a-cursor", id="garbage"),
        pytest.param("", id="empty"),
        pytest.param("bzotMQ==", id="negative-offset"),
        pytest.param(17, id="not-a-string"),
    ],
)
async def test_an_invalid_cursor_is_invalid_params(gw: Gateway, session: str, cursor: object) -> None:
    body = await gw.rpc(session, request(3, "tools/list", {"cursor": cursor}))
    assert body["id"] == 3
    assert body["error"]["code"] == jsonrpc.INVALID_PARAMS
    assert body["error"]["data"]["error"] == "invalid_cursor"


async def test_tools_call_returns_the_tool_result_with_the_clients_id(gw: Gateway, session: str) -> None:
    body = await gw.rpc(session, call_tool("call-1", "echo", text="hello"))
    assert body == {"jsonrpc": "2.0", "id": "call-1",
                    "result": {"content": [{"type": "text", "text": "hello"}], "isError": False}}
    assert gw.policy.settled == [True]


async def test_an_upstream_json_rpc_error_passes_through_with_the_clients_id(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(pool=ErrorReplyPool())
    session = await gw.initialize()
    body = await gw.rpc(session, call_tool(77, "echo"))
    assert body == {"jsonrpc": "2.0", "id": 77,
                    "error": {"code": -32050, "message": "upstream says no", "data": {"detail": [1, 2]}}}


async def test_an_unexpected_upstream_failure_is_still_a_json_rpc_answer(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(pool=BrokenPool())
    session = await gw.initialize()
    resp = await gw.post(call_tool(78, "echo"), session=session)
    body = await read_answer(resp)
    assert body["id"] == 78
    assert body["error"]["code"] == jsonrpc.INTERNAL_ERROR


def sse_messages(text: str) -> list[JsonObj]:
    messages = []
    for event in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[len("data:"):].strip() for line in event.split("\n") if line.startswith("data:")]
        if data:
            messages.append(json.loads("\n".join(data)))
    return messages


async def test_progress_streams_as_sse_then_the_response(gw: Gateway, session: str) -> None:
    resp = await gw.post(call_tool(21, "progress", progress_token="p-1"), session=session)
    assert resp.status == 200
    assert resp.content_type == "text/event-stream"
    assert resp.headers["Mcp-Session-Id"] == session
    progress, reply = sse_messages(await resp.text())
    assert progress["method"] == "notifications/progress"
    assert progress["params"] == {"progressToken": "p-1", "progress": 1, "total": 2}
    assert "id" not in progress
    assert reply["id"] == 21
    assert reply["result"]["isError"] is False


@pytest.mark.parametrize(
    ("accept", "progress_token"),
    [
        pytest.param("application/json", "p-2", id="json-only-accept"),
        pytest.param("application/json", None, id="json-only-accept-no-token"),
    ],
)
async def test_without_sse_accept_the_answer_is_one_json_object(
    gw: Gateway, session: str, accept: str, progress_token: str | None
) -> None:
    resp = await gw.post(call_tool(22, "progress", progress_token=progress_token), session=session,
                         headers={"Accept": accept})
    assert resp.status == 200
    assert resp.content_type == "application/json"
    body = await read_answer(resp)
    assert body["id"] == 22
    assert body["result"]["isError"] is False


async def test_a_cancel_reaches_every_call_sharing_a_reused_id(gw: Gateway, session: str) -> None:
    first = asyncio.create_task(gw.post(call_tool(41, "block"), session=session))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    gw.pool.started.clear()
    second = asyncio.create_task(gw.post(call_tool(41, "block"), session=session))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    cancel = jsonrpc.notification_message("notifications/cancelled", {"requestId": 41})
    assert (await gw.post(cancel, session=session)).status == 202
    for call in (first, second):
        body = await read_answer(await asyncio.wait_for(call, WAIT))
        assert body["error"]["data"]["error"] == "cancelled"


async def test_a_changed_tool_list_is_announced_once_ahead_of_the_next_sse_answer(gw: Gateway, session: str) -> None:
    gw.pool.tools_version += 1
    resp = await gw.post(call_tool(23, "echo"), session=session)
    assert resp.content_type == "text/event-stream"
    notice, reply = sse_messages(await resp.text())
    assert notice == jsonrpc.notification_message("notifications/tools/list_changed")
    assert reply["id"] == 23
    again = await gw.post(call_tool(24, "echo"), session=session)
    assert [m["id"] for m in sse_messages(await again.text())] == [24]  # told once


async def test_a_client_without_sse_keeps_json_and_listing_tools_clears_the_notice(gw: Gateway, session: str) -> None:
    gw.pool.tools_version += 1
    resp = await gw.post(call_tool(25, "echo"), session=session, headers={"Accept": "application/json"})
    assert resp.content_type == "application/json"
    listed = await gw.post(jsonrpc.request_message(26, "tools/list"), session=session)
    assert [m["id"] for m in sse_messages(await listed.text())] == [26]
    after = await gw.post(call_tool(27, "echo"), session=session)
    assert [m["id"] for m in sse_messages(await after.text())] == [27]  # no notice left to carry


async def test_client_cancellation_stops_the_call_in_flight(gw: Gateway, session: str) -> None:
    call = asyncio.create_task(gw.post(call_tool(31, "block"), session=session))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    cancel = jsonrpc.notification_message("notifications/cancelled", {"requestId": 31, "reason": "user"})
    assert (await gw.post(cancel, session=session)).status == 202
    await asyncio.wait_for(gw.pool.cancelled.wait(), WAIT)
    resp = await asyncio.wait_for(call, WAIT)
    body = await read_answer(resp)
    assert body["id"] == 31
    assert body["error"]["code"] == jsonrpc.REQUEST_CANCELLED
    assert (await gw.rpc(session, request(32, "ping")))["result"] == {}


async def test_cancelling_another_sessions_request_does_nothing(gw: Gateway, session: str) -> None:
    other = await gw.initialize()
    call = asyncio.create_task(gw.post(call_tool(31, "block"), session=session))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    cancel = jsonrpc.notification_message("notifications/cancelled", {"requestId": 31})
    assert (await gw.post(cancel, session=other)).status == 202
    assert not gw.pool.cancelled.is_set()
    gw.pool.release.set()
    body = await read_answer(await asyncio.wait_for(call, WAIT))
    assert body["result"]["isError"] is False


# --- config auth mode -----------------------------------------------------------------------------------

STATIC = "s3cret-static-token"


@pytest.fixture
async def config_gw(gateway_factory: GatewayFactory) -> Gateway:
    return await gateway_factory(authenticator=StaticTokenAuthenticator(STATIC))


@pytest.mark.parametrize(
    ("token", "error", "outcome"),
    [
        pytest.param(None, "unauthorized", "missing", id="missing"),
        pytest.param("wrong-token", "invalid_token", "invalid", id="wrong"),
    ],
)
async def test_config_mode_initialize_without_the_token_is_401_and_creates_nothing(
    config_gw: Gateway, token: str | None, error: str, outcome: str
) -> None:
    resp = await config_gw.post(init_request(request_id=1), token=token)
    await assert_refusal(resp, 401, error, 1)
    assert resp.headers["WWW-Authenticate"].startswith("Bearer ")
    assert len(config_gw.registry) == 0
    assert config_gw.publisher.named(events.SESSION_CONNECT) == []
    assert [e["outcome"] for e in config_gw.publisher.named(events.AUTH_FAILURE)] == [outcome]


@pytest.mark.parametrize("token", [pytest.param(None, id="missing"), pytest.param("wrong-token", id="wrong")])
async def test_config_mode_a_live_session_answers_only_to_its_token(config_gw: Gateway, token: str | None) -> None:
    session = await config_gw.initialize(token=STATIC)
    await assert_refusal(await config_gw.post(request(2, "ping"), session=session, token=token), 401,
                         "unauthorized" if token is None else "invalid_token", 2)
    resp = await config_gw.client.delete("/mcp", headers={"Mcp-Session-Id": session})
    await assert_refusal(resp, 401, "unauthorized")
    assert (await config_gw.rpc(session, request(3, "ping"), token=STATIC))["result"] == {}


async def test_oauth_mode_401_points_at_the_resource_metadata(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(authenticator=StaticTokenAuthenticator(STATIC),
                               oauth_resource_metadata_url=OAUTH_METADATA)
    resp = await gw.post(init_request())
    await assert_refusal(resp, 401, "unauthorized", 1)
    assert f'resource_metadata="{OAUTH_METADATA}"' in resp.headers["WWW-Authenticate"]
    meta = await gw.client.get("/.well-known/oauth-protected-resource")
    assert meta.status == 200
    assert (await meta.json())["resource"] == "https://gw.example/mcp"


# --- header mode: sessions bound to their token, resumed on any process ------------------------------------


@pytest.fixture
async def header_gw(gateway_factory: GatewayFactory) -> Gateway:
    return await gateway_factory(authenticator=TokenNameAuthenticator())


async def test_another_token_on_a_live_session_is_refused(header_gw: Gateway) -> None:
    session = await header_gw.initialize(token="tok-alice")
    resp = await header_gw.post(request(2, "ping"), session=session, token="tok-bob")
    await assert_refusal(resp, 403, "session_token_mismatch", 2)
    assert (await header_gw.rpc(session, request(3, "ping"), token="tok-alice"))["result"] == {}


async def test_another_token_on_a_live_session_in_oauth_mode_is_told_to_reinitialize(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(authenticator=TokenNameAuthenticator(), oauth_resource_metadata_url=OAUTH_METADATA)
    session = await gw.initialize(token="tok-alice")
    resp = await gw.post(request(2, "ping"), session=session, token="tok-bob")
    await assert_refusal(resp, 404, "session_not_found", 2)


async def test_concurrent_requests_resuming_one_id_make_one_session(header_gw: Gateway) -> None:
    session = make_session_id("tok-alice")
    answers = await asyncio.gather(*(header_gw.post(request(i, "ping"), session=session, token="tok-alice")
                                     for i in range(5)))
    assert [a.status for a in answers] == [200] * 5
    assert len(header_gw.registry) == 1
    [connect] = header_gw.publisher.named(events.SESSION_CONNECT)
    assert (connect["session_id"], connect["resumed"]) == (session, True)


async def test_a_foreign_token_cannot_resume_an_id(header_gw: Gateway) -> None:
    resp = await header_gw.post(request(2, "ping"), session=make_session_id("tok-alice"), token="tok-bob")
    await assert_refusal(resp, 404, "session_not_found", 2)
    assert len(header_gw.registry) == 0


async def test_a_deleted_id_is_not_resumed(header_gw: Gateway) -> None:
    session = await header_gw.initialize(token="tok-alice")
    resp = await header_gw.client.delete("/mcp", headers={"Mcp-Session-Id": session,
                                                          "Authorization": "Bearer tok-alice"})
    assert resp.status == 200
    resp = await header_gw.post(request(2, "ping"), session=session, token="tok-alice")
    await assert_refusal(resp, 404, "session_not_found", 2)
    assert len(header_gw.registry) == 0


# --- capacity -----------------------------------------------------------------------------------------


async def test_503_with_retry_after_when_the_session_cap_is_reached(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(session_cap=1)
    await gw.initialize()
    gw.clock.advance(100)
    resp = await gw.post(init_request(request_id="second"))
    await assert_refusal(resp, 503, "session_cap_reached", "second")
    assert int(resp.headers["Retry-After"]) == int(TTL) - 100 + 1
    assert len(gw.registry) == 1
    gw.clock.advance(TTL)
    assert (await gw.post(init_request())).status == 200


# --- health, readiness, metrics -----------------------------------------------------------------------


async def test_healthz(gw: Gateway) -> None:
    resp = await gw.client.get("/healthz")
    assert resp.status == 200
    assert (await read_answer(resp))["status"] == "ok"


async def test_readyz_when_every_upstream_is_ready(gw: Gateway) -> None:
    resp = await gw.client.get("/readyz")
    assert resp.status == 200
    assert (await read_answer(resp))["upstreams"] == {"fake": True}


async def test_readyz_is_503_while_an_upstream_is_not_ready(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(pool=NotReadyPool())
    resp = await gw.client.get("/readyz")
    assert resp.status == 503
    assert (await read_answer(resp))["upstreams"] == {"fake": True, "slow": False}


async def test_metrics_in_prometheus_text_format(gw: Gateway, session: str) -> None:
    await gw.rpc(session, call_tool(1, "echo"))
    resp = await gw.client.get("/metrics")
    assert resp.status == 200
    assert resp.content_type == "text/plain"
    text = await resp.text()
    assert "# TYPE satgate_requests_total counter" in text
    assert 'satgate_requests_total{method="tools/call",status="200"} 1.0' in text
    assert 'satgate_tool_calls_total{outcome="ok",upstream="fake"} 1.0' in text
    assert "satgate_active_sessions 1.0" in text


@pytest.mark.parametrize("path", ["/readyz", "/metrics"])
@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [
        pytest.param({"Host": "attacker.example"}, 421, "host_not_allowed", id="rebound-host"),
        pytest.param({"Origin": "http://attacker.example"}, 403, "origin_not_allowed", id="foreign-origin"),
    ],
)
async def test_attack_dns_rebinding_reads_neither_readyz_nor_metrics(
        gw: Gateway, path: str, headers: dict[str, str], status: int, error: str) -> None:
    await assert_refusal(await gw.client.get(path, headers=headers), status, error)


async def test_readyz_and_metrics_accept_a_listed_host(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(allowed_hosts=["gw.example"])
    for path in ("/readyz", "/metrics"):
        assert (await gw.client.get(path, headers={"Host": "gw.example"})).status == 200


async def test_healthz_stays_open_for_liveness_probes(gw: Gateway) -> None:
    """It says only "ok"; a probe may use any Host, so no rule can refuse it."""
    resp = await gw.client.get("/healthz", headers={"Host": "10.0.0.7:9100"})
    assert resp.status == 200


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        pytest.param(None, 401, id="missing"),
        pytest.param("Bearer wrong", 401, id="wrong-token"),
        pytest.param("Basic c2NyYXBlLXNlY3JldA==", 401, id="other-scheme"),
        pytest.param("Bearer scrape-secret-extra", 401, id="longer-token"),
        pytest.param("Bearer scrape-secret", 200, id="right-token"),
        pytest.param("bearer scrape-secret", 200, id="scheme-is-case-insensitive"),
    ],
)
async def test_metrics_token_is_required_when_set(gateway_factory: GatewayFactory, authorization: str | None,
                                                  status: int) -> None:
    gw = await gateway_factory(metrics_token="scrape-secret")
    resp = await gw.client.get("/metrics", headers={"Authorization": authorization} if authorization else {})
    if status == 200:
        assert resp.status == 200
        assert "satgate_requests_total" in await resp.text()
    else:
        body = await assert_refusal(resp, 401, "unauthorized")
        assert "SATGATE_METRICS_TOKEN" in body["error"]["message"]
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await gw.client.get("/readyz")).status == 200  # the token guards /metrics only


class DownPool(FakePool):
    """An upstream that cannot be reached; like several raisers, it says nothing more than that."""

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        raise UpstreamUnavailable("upstream 'fake' is not running")


async def test_upstream_unavailable_is_32010_never_mcps_resource_not_found(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(pool=DownPool())
    session = await gw.initialize()
    reply = await gw.rpc(session, call_tool(1, "echo"))
    assert reply["error"]["code"] == -32010
    assert reply["error"]["code"] != -32002  # MCP: resource not found
    assert reply["error"]["data"]["error"] == "upstream_unavailable"


# --- requests in flight (issue 9, hole 11) --------------------------------------------------------------


def assert_too_many_in_flight(reply: JsonObj, request_id: RequestId) -> None:
    assert reply["id"] == request_id
    assert reply["error"]["code"] == jsonrpc.RATE_LIMITED
    assert reply["error"]["data"] == {"error": "rate_limited", "retry_after_seconds": 1}


async def test_attack_a_batch_larger_than_the_per_token_bound_gets_rate_limited_for_the_excess(
        gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(authenticator=TokenNameAuthenticator(), max_inflight_per_token=3)
    attacker = await gw.initialize("2025-03-26", token="tok-mallory")
    batch = [call_tool(n, "block") for n in range(10)]
    flood = asyncio.create_task(gw.post(batch, session=attacker, token="tok-mallory"))
    await until(lambda: len(gw.pool.calls) == 3)

    # the same token is refused at once while its three calls run; another token is served
    assert_too_many_in_flight(await gw.rpc(attacker, call_tool(99, "echo"), token="tok-mallory"), 99)
    other = await gw.initialize(token="tok-alice")
    assert (await gw.rpc(other, call_tool(1, "echo", text="served"), token="tok-alice"))["result"]["content"][0][
        "text"] == "served"

    gw.pool.release.set()
    replies = await read_answer(await asyncio.wait_for(flood, WAIT))
    assert [r["id"] for r in replies] == list(range(10))
    assert [r for r in replies if "result" in r] == replies[:3]
    for reply in replies[3:]:
        assert_too_many_in_flight(reply, reply["id"])
    assert [params["name"] for _, params in gw.pool.calls if params] == ["block"] * 3 + ["echo"]
    assert gw.client.app is not None
    assert gw.client.app[INFLIGHT].in_flight == 0


async def test_the_process_bound_applies_across_tokens(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(authenticator=TokenNameAuthenticator(), max_inflight=2)
    first = await gw.initialize("2025-03-26", token="tok-alice")
    flood = asyncio.create_task(gw.post([call_tool(1, "block"), call_tool(2, "block")], session=first,
                                        token="tok-alice"))
    await until(lambda: len(gw.pool.calls) == 2)
    other = await gw.initialize(token="tok-bob")
    assert_too_many_in_flight(await gw.rpc(other, call_tool(7, "echo"), token="tok-bob"), 7)
    gw.pool.release.set()
    assert (await asyncio.wait_for(flood, WAIT)).status == 200
    assert "result" in await gw.rpc(other, call_tool(8, "echo"), token="tok-bob")


async def test_a_cancelled_call_gives_its_slot_back(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(authenticator=TokenNameAuthenticator(), max_inflight_per_token=1)
    session = await gw.initialize(token="tok-alice")
    blocked = asyncio.create_task(gw.post(call_tool(1, "block"), session=session, token="tok-alice"))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    await gw.post(jsonrpc.notification_message("notifications/cancelled", {"requestId": 1}), session=session,
                  token="tok-alice")
    assert (await read_answer(await asyncio.wait_for(blocked, WAIT)))["error"]["code"] == jsonrpc.REQUEST_CANCELLED
    assert "result" in await gw.rpc(session, call_tool(2, "echo"), token="tok-alice")


@pytest.mark.parametrize(
    ("per_token", "total", "acquires"),
    [
        pytest.param(2, 10, [("a", True), ("a", True), ("a", False), ("b", True)], id="per-token-bound"),
        pytest.param(5, 2, [("a", True), ("b", True), ("c", False), ("a", False)], id="process-bound"),
        pytest.param(1, 1, [("a", True), ("a", False), ("b", False)], id="both-bounds-one"),
    ],
)
def test_inflight_limiter_bounds(per_token: int, total: int, acquires: list[tuple[str, bool]]) -> None:
    limiter = InflightLimiter(per_token=per_token, total=total)
    for token_id, admitted in acquires:
        assert limiter.try_acquire(token_id) is admitted
    for token_id, admitted in acquires:
        if admitted:
            limiter.release(token_id)
    assert limiter.in_flight == 0
    assert limiter.held_by("a") == 0
    limiter.release("a")  # an unmatched release never goes negative
    assert limiter.in_flight == 0
    assert limiter.room("a") == min(per_token, total)


async def test_a_long_call_streams_keep_alive_comments_once_admitted(
        gateway_factory: GatewayFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    from satgate_mcp.transport import session_endpoint

    monkeypatch.setattr(session_endpoint, "KEEPALIVE_SECONDS", 0.01)
    gw = await gateway_factory()
    session = await gw.initialize("2025-11-25")
    resp = await gw.post(call_tool(7, "block"), session=session)  # headers come with the first keep-alive
    assert resp.status == 200
    assert resp.content_type == "text/event-stream"
    assert resp.headers["X-Accel-Buffering"] == "no"
    assert (await resp.content.readline()).startswith(b"id: ")  # the priming event
    while (line := await resp.content.readline()) != b": keepalive\n":
        assert line in (b"data: \n", b"\n") or line.startswith(b"retry: "), line
    gw.pool.release.set()
    rest = (await resp.content.read()).decode()
    assert '"id":7' in rest
    assert '"result"' in rest
