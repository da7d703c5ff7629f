"""MCP 2026-07-28 on /mcp: stateless requests beside the 2025 sessions, over a real aiohttp server.

Each rule is a table where it can be: what makes a request modern (its body), the error ladder (every
refusal a JSON-RPC error with the request's id and the revision's code), authentication, the result
shapes (``resultType``, caching hints, ``serverInfo``), ``Mcp-Param-*`` against ``x-mcp-header``,
request-scoped streams (progress, log messages by ``logLevel``, a hang-up cancels the call), a 2025
session living beside modern calls, and identical modern calls in flight sharing one upstream call.
No answer to a modern request carries an ``Mcp-Session-Id``, and none adds to the session registry.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import SERVER_NAME, jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.keys import INFLIGHT, REGISTRY
from satgate_mcp.settings import Settings
from satgate_mcp.transport.stateless_rules import (
    HEADER_MISMATCH,
    META_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_SERVER_INFO,
    META_VERSION,
    MODERN_VERSION,
    UNSUPPORTED_VERSION,
)
from satgate_mcp.upstream.base import ProgressCallback, Relay
from tests.fakes import AllowAllPolicy, FakePool, until
from tests.raw_http import raw_post

TOKEN = "modern-static-token-0123456789abcdef"
SSE_ACCEPT = "application/json, text/event-stream"
WAIT = 5.0  # bound on waiting for an event that the code under test sets
#: Removes a key from the default ``_meta`` or a default header.
DROP = object()
LOG_LEVELS = ("debug", "info", "warning", "error")


# --- requests as a modern client writes them --------------------------------------------------------


def modern(request_id: RequestId, method: str, params: JsonObj | None = None,
           meta: Mapping[str, object] | None = None) -> JsonObj:
    """A 2026-07-28 request: the per-request ``_meta`` fields, then ``meta``'s changes (``DROP`` removes one)."""
    merged: dict[str, object] = {META_VERSION: MODERN_VERSION, META_CAPABILITIES: {},
                                 META_CLIENT_INFO: {"name": "modern-test", "version": "1.0"}}
    for key, value in (meta or {}).items():
        if value is DROP:
            merged.pop(key, None)
        else:
            merged[key] = value
    return jsonrpc.request_message(request_id, method, {**(params or {}), "_meta": merged})


def tool_call(request_id: RequestId, name: str, meta: Mapping[str, object] | None = None,
              **arguments: Any) -> JsonObj:
    return modern(request_id, "tools/call", {"name": name, "arguments": arguments}, meta)


def routing_headers(body: JsonObj) -> dict[str, str]:
    """The headers a conforming client mirrors from this body."""
    params = body.get("params") or {}
    headers = {"Mcp-Method": str(body["method"])}
    version = (params.get("_meta") or {}).get(META_VERSION)
    if isinstance(version, str):
        headers["MCP-Protocol-Version"] = version
    source = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}.get(str(body["method"]))
    if source is not None and isinstance(params.get(source), str):
        headers["Mcp-Name"] = params[source]
    return headers


def b64(text: str) -> str:
    return "=?base64?" + base64.b64encode(text.encode()).decode() + "?="


# --- answers ------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: CIMultiDict[str]
    content_type: str
    #: The JSON body, or every SSE event's data in order.
    messages: list[JsonObj]

    @property
    def last(self) -> JsonObj:
        return self.messages[-1]


def sse_messages(text: str) -> list[JsonObj]:
    """The JSON of each event's ``data:`` lines (comments and keep-alives skipped)."""
    found: list[JsonObj] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
        if data and "".join(data).strip():
            found.append(json.loads("\n".join(data)))
    return found


async def read_answer(resp: ClientResponse) -> Answer:
    text = await resp.text()
    sse = resp.content_type == "text/event-stream"
    messages = sse_messages(text) if sse else [json.loads(text)] if text else []
    return Answer(resp.status, CIMultiDict(resp.headers), resp.content_type, messages)


def assert_modern_error(answer: Answer, status: int, code: int, request_id: RequestId | None) -> JsonObj:
    """What every refusal of a modern request is: a JSON-RPC error body with its id, so a dual-era client
    never mistakes it for a server that wants ``initialize``."""
    assert answer.status == status, answer
    assert answer.content_type == "application/json"
    [body] = answer.messages
    assert body["jsonrpc"] == "2.0"
    assert body["id"] == request_id
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    error: JsonObj = body["error"]
    return error


def assert_result(answer: Answer, request_id: RequestId) -> JsonObj:
    assert answer.status == 200, answer
    body = answer.last
    assert body["id"] == request_id
    assert "error" not in body, body
    result: JsonObj = body["result"]
    return result


# --- the gateway --------------------------------------------------------------------------------------


@dataclass
class Gateway:
    #: Typed for either server: one made from the app, or a DeployedServer (whose client knows no app).
    client: TestClient[web.Request, Any]
    pool: FakePool
    app: web.Application

    @property
    def sessions(self) -> int:
        return len(self.app[REGISTRY])

    async def send(self, body: object, *, headers: Mapping[str, object] | None = None,
                   extra: Iterable[tuple[str, str]] = (), token: str | None = None,
                   accept: str = SSE_ACCEPT, http_method: str = "POST") -> ClientResponse:
        """``body`` (POST unless ``http_method`` says otherwise) with the headers a conforming client mirrors
        from it, changed by ``headers`` (``DROP`` removes one), then the ``extra`` (name, value) pairs (repeats
        allowed)."""
        defaults: dict[str, object] = {"Content-Type": "application/json", "Accept": accept}
        if isinstance(body, dict) and "method" in body:
            defaults.update(routing_headers(body))
        if token is not None:
            defaults["Authorization"] = f"Bearer {token}"
        defaults.update(headers or {})
        sent: CIMultiDict[str] = CIMultiDict((k, str(v)) for k, v in defaults.items() if v is not DROP)
        for name, value in extra:
            sent.add(name, value)
        data = json.dumps(body) if body is not None else None
        return await self.client.request(http_method, "/mcp", data=data, headers=sent)

    async def post(self, body: object, **kwargs: Any) -> Answer:
        """``send``, for a request that is not part of a 2025 session: its answer never names one."""
        answer = await read_answer(await self.send(body, **kwargs))
        assert "Mcp-Session-Id" not in answer.headers, answer.headers
        return answer

    async def initialize(self, version: str = "2025-06-18", token: str | None = None) -> str:
        """A 2025 session, the way 2025 clients open one (no ``_meta``)."""
        answer = await read_answer(await self.send(init_2025(version), token=token,
                                                   headers={"Mcp-Method": DROP}))
        assert answer.status == 200, answer
        return answer.headers["Mcp-Session-Id"]

    async def rpc_2025(self, session: str, body: JsonObj, token: str | None = None) -> JsonObj:
        headers: dict[str, object] = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-06-18",
                                      "Mcp-Method": DROP, "Mcp-Name": DROP}
        answer = await read_answer(await self.send(body, headers=headers, token=token, accept="application/json"))
        assert answer.status == 200, answer
        assert answer.headers["Mcp-Session-Id"] == session
        return answer.last


def init_2025(version: str = "2025-06-18", request_id: RequestId = 1) -> JsonObj:
    return jsonrpc.request_message(request_id, "initialize", {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "legacy-test", "version": "1.0"}})


GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest.fixture
def gateway_factory(aiohttp_client: AiohttpClient) -> GatewayFactory:
    """``real_policy`` builds the CallPolicy from the settings (the duplicate guard); else everything passes."""

    async def make(*, pool: FakePool | None = None, real_policy: bool = False, **settings: Any) -> Gateway:
        pool = pool or FakePool()
        app = create_app(Settings(**{"state_dir": "memory", **settings}), pool=pool,
                         policy=None if real_policy else AllowAllPolicy())
        return Gateway(await aiohttp_client(app), pool, app)

    return make


@pytest.fixture
async def gw(gateway_factory: GatewayFactory) -> Gateway:
    return await gateway_factory()


# --- 1. the body decides the era ----------------------------------------------------------------------


async def test_initialize_carrying_a_modern_protocol_version_is_a_modern_request_and_not_found(gw: Gateway) -> None:
    body = modern("init-1", "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                           "clientInfo": {"name": "x", "version": "1"}})
    error = assert_modern_error(await gw.post(body), 404, jsonrpc.METHOD_NOT_FOUND, "init-1")
    assert error["data"]["error"] == "method_not_found"
    assert gw.sessions == 0


@pytest.mark.parametrize("header", [None, MODERN_VERSION, "2025-06-18"], ids=["no-header", "modern-header",
                                                                             "2025-header"])
async def test_initialize_without_meta_opens_a_2025_session_as_before(gw: Gateway, header: str | None) -> None:
    headers: dict[str, object] = {"MCP-Protocol-Version": DROP if header is None else header, "Mcp-Method": DROP}
    answer = await read_answer(await gw.send(init_2025(), headers=headers))
    result = assert_result(answer, 1)
    assert result["protocolVersion"] == "2025-06-18"
    assert "resultType" not in result
    assert gw.app[REGISTRY].get(answer.headers["Mcp-Session-Id"]) is not None
    assert gw.sessions == 1


@pytest.mark.parametrize("carried", ["live", "unknown", "malformed"])
async def test_a_modern_request_ignores_an_mcp_session_id_it_carries(gw: Gateway, carried: str) -> None:
    session = await gw.initialize()
    session_id = {"live": session, "unknown": "mcp-" + "0" * 32 + "-" + "1" * 32, "malformed": "not a session"}
    answer = await gw.post(modern(5, "tools/list"), headers={"Mcp-Session-Id": session_id[carried]})
    result = assert_result(answer, 5)
    assert result["resultType"] == "complete"
    assert "Mcp-Session-Id" not in answer.headers
    assert gw.sessions == 1  # only the 2025 session: the modern request neither used nor made one


async def test_modern_requests_add_no_session(gw: Gateway) -> None:
    for request_id, body in enumerate([modern(0, "server/discover"), modern(1, "tools/list"),
                                       tool_call(2, "echo", text="hi")]):
        assert_result(await gw.post(body), request_id)
    assert gw.sessions == 0


async def test_a_batch_of_modern_requests_is_a_2025_operation(gw: Gateway) -> None:
    """A batch is never modern: without a session it is the 2025 refusal; in a 2025-03-26 session it runs as
    2025 calls (no modern result shape)."""
    batch = [modern(1, "tools/list"), modern(2, "tools/list")]
    answer = await gw.post(batch, headers={"MCP-Protocol-Version": MODERN_VERSION, "Mcp-Method": "tools/list"})
    error = assert_modern_error(answer, 400, jsonrpc.INVALID_REQUEST, 1)
    assert error["data"]["error"] == "missing_session_id"

    session = await gw.initialize("2025-03-26")
    resp = await gw.send(batch, headers={"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-03-26"})
    assert resp.status == 200
    replies = await resp.json()
    assert [r["id"] for r in replies] == [1, 2]
    assert all("resultType" not in r["result"] for r in replies)


@pytest.mark.parametrize("http_method", ["GET", "DELETE"])
async def test_get_and_delete_stay_2025_operations(gw: Gateway, http_method: str) -> None:
    headers: dict[str, object] = {"MCP-Protocol-Version": MODERN_VERSION, "Mcp-Method": "tools/list",
                                  "Content-Type": DROP}
    resp = await gw.send(None, headers=headers, http_method=http_method)
    answer = await read_answer(resp)
    error = assert_modern_error(answer, 400, jsonrpc.INVALID_REQUEST, None)
    assert error["data"]["error"] == "missing_session_id"


@pytest.mark.parametrize("method", ["tools/list", "server/discover", "tools/call"])
async def test_a_modern_header_without_meta_or_session_is_told_what_is_missing(gw: Gateway, method: str) -> None:
    body = jsonrpc.request_message(3, method, {"name": "echo"} if method == "tools/call" else None)
    answer = await gw.post(body, headers={"MCP-Protocol-Version": MODERN_VERSION})
    error = assert_modern_error(answer, 400, jsonrpc.INVALID_PARAMS, 3)
    assert META_VERSION in error["message"]
    assert gw.sessions == 0


# --- 2. the error ladder ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    body: JsonObj
    headers: Mapping[str, object]
    extra: tuple[tuple[str, str], ...]
    status: int
    code: int


def case(body: JsonObj, status: int, code: int, *, headers: Mapping[str, object] | None = None,
         extra: tuple[tuple[str, str], ...] = ()) -> Case:
    return Case(body, headers or {}, extra, status, code)


BAD = 400
MISMATCH = HEADER_MISMATCH
INVALID = jsonrpc.INVALID_PARAMS
ECHO = tool_call(7, "echo", text="hi")
PROMPT = modern(7, "prompts/get", {"name": "greet"})
RESOURCE = modern(7, "resources/read", {"uri": "file:///a.txt"})

LADDER = [
    # the body's own fields: -32602
    pytest.param(case(modern(7, "tools/list", meta={META_VERSION: DROP}), BAD, INVALID,
                      headers={"MCP-Protocol-Version": MODERN_VERSION}), id="no-protocolVersion"),
    pytest.param(case(modern(7, "tools/list", meta={META_VERSION: ""}), BAD, INVALID,
                      headers={"MCP-Protocol-Version": MODERN_VERSION}), id="empty-protocolVersion"),
    pytest.param(case(modern(7, "tools/list", meta={META_VERSION: 20260728}), BAD, INVALID,
                      headers={"MCP-Protocol-Version": MODERN_VERSION}), id="protocolVersion-not-a-string"),
    pytest.param(case(modern(7, "tools/list", meta={META_CAPABILITIES: DROP}), BAD, INVALID), id="no-capabilities"),
    pytest.param(case(modern(7, "tools/list", meta={META_CAPABILITIES: []}), BAD, INVALID), id="capabilities-list"),
    pytest.param(case(modern(7, "tools/list", meta={META_CAPABILITIES: "all"}), BAD, INVALID),
                 id="capabilities-string"),
    pytest.param(case(modern(7, "tools/list", meta={META_CAPABILITIES: None}), BAD, INVALID),
                 id="capabilities-null"),
    # the routing headers against the body: -32020
    pytest.param(case(modern(7, "tools/list"), BAD, MISMATCH, headers={"MCP-Protocol-Version": DROP}),
                 id="no-version-header"),
    pytest.param(case(modern(7, "tools/list"), BAD, MISMATCH, headers={"MCP-Protocol-Version": "2025-11-25"}),
                 id="version-header-differs"),
    pytest.param(case(modern(7, "tools/list"), BAD, MISMATCH, headers={"Mcp-Method": DROP}), id="no-method-header"),
    pytest.param(case(modern(7, "tools/list"), BAD, MISMATCH, headers={"Mcp-Method": "prompts/list"}),
                 id="method-header-differs"),
    pytest.param(case(ECHO, BAD, MISMATCH, headers={"Mcp-Name": DROP}), id="tools/call-no-name-header"),
    pytest.param(case(ECHO, BAD, MISMATCH, headers={"Mcp-Name": "block"}), id="tools/call-name-differs"),
    pytest.param(case(PROMPT, BAD, MISMATCH, headers={"Mcp-Name": DROP}), id="prompts/get-no-name-header"),
    pytest.param(case(PROMPT, BAD, MISMATCH, headers={"Mcp-Name": "other"}), id="prompts/get-name-differs"),
    pytest.param(case(RESOURCE, BAD, MISMATCH, headers={"Mcp-Name": DROP}), id="resources/read-no-name-header"),
    pytest.param(case(RESOURCE, BAD, MISMATCH, headers={"Mcp-Name": "file:///b.txt"}),
                 id="resources/read-uri-differs"),
    pytest.param(case(ECHO, BAD, MISMATCH, extra=(("MCP-Protocol-Version", MODERN_VERSION),)),
                 id="version-header-twice"),
    pytest.param(case(ECHO, BAD, MISMATCH, extra=(("Mcp-Method", "tools/call"),)), id="method-header-twice"),
    pytest.param(case(ECHO, BAD, MISMATCH, extra=(("Mcp-Name", "echo"),)), id="name-header-twice"),
    pytest.param(case(ECHO, BAD, MISMATCH, headers={"Mcp-Name": b64("block")}), id="base64-name-differs"),
    pytest.param(case(ECHO, BAD, MISMATCH, headers={"Mcp-Name": "=?base64?not*base64?="}), id="base64-malformed"),
    pytest.param(case(ECHO, BAD, MISMATCH, headers={"Mcp-Name": "=?base64?/w==?="}), id="base64-not-utf8"),
    pytest.param(case(ECHO, BAD, MISMATCH, headers={"Mcp-Name": "=?base64?ZWNobw?="}), id="base64-unpadded"),
    # the version: -32022 (below)
    # the method: 404 -32601
    *[pytest.param(case(modern(7, method), 404, jsonrpc.METHOD_NOT_FOUND), id=f"404-{method}")
      for method in ("ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "no/such/method",
                     "initialize")],
    # the order: body fields, then headers, then the version, then the method
    pytest.param(case(modern(7, "ping", meta={META_CAPABILITIES: DROP}), BAD, INVALID,
                      headers={"Mcp-Method": DROP, "MCP-Protocol-Version": DROP}), id="order-body-before-headers"),
    pytest.param(case(modern(7, "ping", meta={META_VERSION: "2030-01-01"}), BAD, MISMATCH,
                      headers={"MCP-Protocol-Version": MODERN_VERSION}), id="order-version-mismatch-before-support"),
    pytest.param(case(modern(7, "ping", meta={META_VERSION: "2030-01-01"}), BAD, UNSUPPORTED_VERSION,
                      headers={"Mcp-Method": DROP}), id="order-unsupported-before-method-header"),
    pytest.param(case(modern(7, "ping"), BAD, MISMATCH, headers={"Mcp-Method": "tools/list"}),
                 id="order-method-header-before-404"),
]


@pytest.mark.parametrize("refused", LADDER)
async def test_the_error_ladder(gw: Gateway, refused: Case) -> None:
    answer = await gw.post(refused.body, headers=refused.headers, extra=refused.extra)
    assert_modern_error(answer, refused.status, refused.code, 7)
    assert gw.pool.calls == []  # nothing reached the upstream
    assert gw.sessions == 0


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"Mcp-Name": b64("echo")}, id="base64-name"),
        pytest.param({"MCP-Protocol-Version": DROP, "Mcp-Method": DROP, "Mcp-Name": DROP,
                      "mcp-protocol-version": MODERN_VERSION, "MCP-METHOD": "tools/call", "mcp-NAME": "echo"},
                     id="header-names-any-case"),
    ],
)
async def test_headers_the_ladder_lets_through(gw: Gateway, headers: Mapping[str, object]) -> None:
    result = assert_result(await gw.post(tool_call(8, "echo", text="through"), headers=headers), 8)
    assert result["content"] == [{"type": "text", "text": "through"}]


@pytest.mark.parametrize("twice", [b"Mcp-Name: echo\r\nmcp-name: echo\r\n",
                                   b"Mcp-Method: tools/call\r\nMCP-METHOD: tools/call\r\nMcp-Name: echo\r\n"],
                         ids=["name", "method"])
async def test_a_routing_header_repeated_in_another_case_is_still_twice(gw: Gateway, twice: bytes) -> None:
    """Sent as raw bytes: aiohttp's client folds a repeated header that differs only in case."""
    head = f"MCP-Protocol-Version: {MODERN_VERSION}\r\n".encode()
    if not twice.startswith(b"Mcp-Method"):
        head += b"Mcp-Method: tools/call\r\n"
    answer = await raw_post(gw.client, head + twice, json.dumps(ECHO).encode())
    assert answer.status == 400
    body = json.loads(answer.body)
    assert (body["id"], body["error"]["code"]) == (7, HEADER_MISMATCH)


def modern_note(method: str, params: JsonObj | None = None) -> JsonObj:
    return jsonrpc.notification_message(method, {**(params or {}), "_meta": {
        META_VERSION: MODERN_VERSION, META_CAPABILITIES: {}}})


async def test_a_modern_notification_is_held_to_the_same_headers(gw: Gateway) -> None:
    note = modern_note("notifications/cancelled", {"requestId": 1})
    assert_modern_error(await gw.post(note, headers={"Mcp-Method": DROP}), 400, HEADER_MISMATCH, None)
    assert_modern_error(await gw.post(note, headers={"MCP-Protocol-Version": "2025-11-25"}), 400, HEADER_MISMATCH,
                        None)


async def test_a_modern_notification_with_matching_headers_is_accepted_and_ignored(gw: Gateway) -> None:
    answer = await gw.post(modern_note("notifications/cancelled", {"requestId": 1, "reason": "user"}))
    assert answer.status == 202
    assert answer.messages == []
    assert gw.sessions == 0


async def test_an_unsupported_version_names_the_supported_ones(gw: Gateway) -> None:
    body = modern("v", "tools/list", meta={META_VERSION: "2030-01-01"})
    error = assert_modern_error(await gw.post(body), 400, UNSUPPORTED_VERSION, "v")
    assert error["data"]["supported"] == [MODERN_VERSION]
    assert error["data"]["requested"] == "2030-01-01"


# --- 3. authentication --------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef"], ids=["no-token", "wrong-token"])
async def test_a_modern_request_without_the_token_is_401_with_its_id(gateway_factory: GatewayFactory,
                                                                     token: str | None) -> None:
    gw = await gateway_factory(auth_mode="config", static_token=SecretStr(TOKEN))
    answer = await gw.post(modern("a-1", "tools/list"), token=token)
    assert answer.status == 401
    [body] = answer.messages
    assert body["id"] == "a-1"
    assert isinstance(body["error"]["code"], int)
    assert "WWW-Authenticate" in answer.headers


async def test_a_modern_request_with_the_token_works(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(auth_mode="config", static_token=SecretStr(TOKEN))
    result = assert_result(await gw.post(tool_call("a-2", "echo", text="ok"), token=TOKEN), "a-2")
    assert result["content"] == [{"type": "text", "text": "ok"}]
    assert gw.sessions == 0


# --- 4. server/discover -------------------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "scope"), [
    pytest.param({}, "public", id="auth-none"),
    pytest.param({"auth_mode": "config", "static_token": SecretStr(TOKEN)}, "private", id="auth-config"),
])
async def test_server_discover(gateway_factory: GatewayFactory, settings: dict[str, Any], scope: str) -> None:
    gw = await gateway_factory(**settings)
    token = TOKEN if settings else None
    result = assert_result(await gw.post(modern("d", "server/discover"), token=token), "d")
    assert result["supportedVersions"] == [MODERN_VERSION]
    assert result["capabilities"] == gw.pool.capabilities()
    assert result["serverInfo"]["name"] == SERVER_NAME
    assert result["_meta"][META_SERVER_INFO] == result["serverInfo"]
    assert result["resultType"] == "complete"
    assert isinstance(result["ttlMs"], int)
    assert not isinstance(result["ttlMs"], bool)
    assert result["cacheScope"] == scope
    listed = assert_result(await gw.post(modern("l", "tools/list"), token=token), "l")
    assert listed["cacheScope"] == scope


# --- 5. results ---------------------------------------------------------------------------------------


async def test_tools_list_is_a_complete_cacheable_result(gw: Gateway) -> None:
    result = assert_result(await gw.post(modern(1, "tools/list")), 1)
    assert [t["name"] for t in result["tools"]] == gw.pool.tool_names
    assert result["resultType"] == "complete"
    assert isinstance(result["ttlMs"], int)
    assert result["cacheScope"] == "public"
    assert result["_meta"][META_SERVER_INFO]["name"] == SERVER_NAME


async def test_tools_call_is_a_complete_result_without_caching_hints(gw: Gateway) -> None:
    result = assert_result(await gw.post(tool_call(2, "echo", text="hello")), 2)
    assert result["content"] == [{"type": "text", "text": "hello"}]
    assert result["resultType"] == "complete"
    assert "ttlMs" not in result
    assert "cacheScope" not in result


async def test_tools_call_to_an_unknown_tool_is_a_json_rpc_error(gw: Gateway) -> None:
    answer = await gw.post(tool_call(3, "no_such_tool"))
    [body] = answer.messages
    assert body["id"] == 3
    assert body["error"]["data"]["error"] == "unknown_tool"
    assert "result" not in body


async def test_the_upstream_never_sees_the_per_request_protocol_fields(gw: Gateway) -> None:
    body = tool_call(4, "echo", meta={META_LOG_LEVEL: "info", "progressToken": "p", "example.com/trace": "t"},
                     text="x")
    assert_result(await gw.post(body, accept="application/json"), 4)
    [(method, params)] = gw.pool.calls
    assert method == "tools/call"
    assert params is not None
    assert params["_meta"] == {"progressToken": "p", "example.com/trace": "t"}


# --- 6. Mcp-Param-* -----------------------------------------------------------------------------------


ROUTE_SCHEMA: JsonObj = {"type": "object", "properties": {
    "region": {"type": "string", "x-mcp-header": "Region"},
    "n": {"type": "integer", "x-mcp-header": "N"},
    "ratio": {"type": "number", "x-mcp-header": "Ratio"},
    "dry": {"type": "boolean", "x-mcp-header": "Dry"},
    "where": {"type": "object", "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}}},
}}


class RoutedPool(FakePool):
    """FakePool with a ``route`` tool whose arguments are mirrored into ``Mcp-Param-*`` headers."""

    def __init__(self) -> None:
        super().__init__(["echo", "route"])

    def tools(self) -> list[JsonObj]:
        return [{"name": "echo", "inputSchema": {"type": "object"}}, {"name": "route", "inputSchema": ROUTE_SCHEMA}]


@pytest.fixture
async def routed(gateway_factory: GatewayFactory) -> Gateway:
    return await gateway_factory(pool=RoutedPool())


PARAM_HEADERS = [
    # (arguments, Mcp-Param-* headers, accepted)
    pytest.param({"region": "us-west1"}, {"Mcp-Param-Region": "us-west1"}, True, id="string-matches"),
    pytest.param({"region": "us-west1"}, {}, False, id="string-header-missing"),
    pytest.param({"region": "us-west1"}, {"Mcp-Param-Region": "us-east1"}, False, id="string-differs"),
    pytest.param({"region": "us-west1"}, {"mcp-param-region": "us-west1"}, True, id="header-name-any-case"),
    pytest.param({"region": "us-west1"}, {"Mcp-Param-Region": b64("us-west1")}, True, id="string-base64"),
    pytest.param({"region": "Zürich "}, {"Mcp-Param-Region": b64("Zürich ")}, True, id="non-ascii-base64"),
    pytest.param({"region": "us-west1"}, {"Mcp-Param-Region": "=?base64?***?="}, False, id="base64-malformed"),
    pytest.param({"region": "us-west1"}, {"Mcp-Param-Region": b64("us-east1")}, False, id="base64-differs"),
    pytest.param({"n": 42}, {"Mcp-Param-N": "42"}, True, id="integer-matches"),
    pytest.param({"n": 42}, {"Mcp-Param-N": "42.0"}, True, id="integer-numerically"),
    pytest.param({"n": 42}, {"Mcp-Param-N": "43"}, False, id="integer-differs"),
    pytest.param({"n": 42}, {"Mcp-Param-N": "forty-two"}, False, id="integer-not-a-number"),
    pytest.param({"n": 42}, {}, False, id="integer-header-missing"),
    pytest.param({"dry": True}, {"Mcp-Param-Dry": "true"}, True, id="boolean-matches"),
    pytest.param({"dry": True}, {"Mcp-Param-Dry": "false"}, False, id="boolean-differs"),
    pytest.param({"where": {"zone": "b"}}, {"Mcp-Param-Zone": "b"}, True, id="nested-matches"),
    pytest.param({"where": {"zone": "b"}}, {}, False, id="nested-header-missing"),
    pytest.param({}, {}, True, id="no-argument-no-header"),
    pytest.param({"n": 42}, {"Mcp-Param-N": "42"}, True, id="only-the-given-argument"),
    pytest.param({"region": None}, {}, True, id="null-argument-no-header"),
]


@pytest.mark.parametrize(("arguments", "headers", "accepted"), PARAM_HEADERS)
async def test_mcp_param_headers_mirror_the_arguments(routed: Gateway, arguments: JsonObj,
                                                      headers: dict[str, str], accepted: bool) -> None:
    answer = await routed.post(tool_call("p", "route", **arguments), headers=headers)
    if accepted:
        assert_result(answer, "p")
        assert [m for m, _ in routed.pool.calls] == ["tools/call"]
    else:
        assert_modern_error(answer, 400, HEADER_MISMATCH, "p")
        assert routed.pool.calls == []


@pytest.mark.parametrize(("arguments", "headers"), [
    pytest.param({"n": 42.0}, {"Mcp-Param-N": "42"}, id="integer-written-42.0"),
    pytest.param({"ratio": 3.14}, {"Mcp-Param-Ratio": "3.14"}, id="number-3.14"),
])
async def test_mcp_param_numbers_compare_numerically(routed: Gateway, arguments: JsonObj,
                                                     headers: dict[str, str]) -> None:
    assert_result(await routed.post(tool_call("f", "route", **arguments), headers=headers), "f")


async def test_a_raw_non_ascii_param_header_is_refused_even_when_it_spells_the_argument(routed: Gateway) -> None:
    """Such a value must travel Base64-encoded; as raw bytes it is not a valid header value to compare."""
    body = tool_call("r", "route", region="us-wést1")
    head = "".join(f"{k}: {v}\r\n" for k, v in routing_headers(body).items()).encode()
    answer = await raw_post(routed.client, head + "Mcp-Param-Region: us-wést1\r\n".encode(),
                            json.dumps(body).encode())
    assert answer.status == 400
    assert json.loads(answer.body)["error"]["code"] == HEADER_MISMATCH
    assert routed.pool.calls == []


async def test_a_tool_without_header_properties_needs_no_param_headers(routed: Gateway) -> None:
    assert_result(await routed.post(tool_call("e", "echo", region="us-west1")), "e")


# --- 7. request-scoped streams ------------------------------------------------------------------------


async def test_progress_streams_then_the_result(gw: Gateway) -> None:
    answer = await gw.post(tool_call("s", "progress", meta={"progressToken": "tok-1"}))
    assert answer.status == 200
    assert answer.content_type == "text/event-stream"
    progress, reply = answer.messages
    assert progress == {"jsonrpc": "2.0", "method": "notifications/progress",
                        "params": {"progressToken": "tok-1", "progress": 1, "total": 2}}
    assert reply["id"] == "s"
    assert reply["result"]["resultType"] == "complete"
    assert reply["result"]["content"] == [{"type": "text", "text": "progress"}]


async def test_a_json_only_client_gets_the_result_alone(gw: Gateway) -> None:
    answer = await gw.post(tool_call("j", "progress", meta={"progressToken": "tok-1"}), accept="application/json")
    assert answer.content_type == "application/json"
    [reply] = answer.messages
    assert reply["result"]["content"] == [{"type": "text", "text": "progress"}]


class LoggingPool(FakePool):
    """FakePool whose ``log`` tool sends one notifications/message per level through the call's relay."""

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        if (params or {}).get("name") == "log" and isinstance(on_progress, Relay):
            for level in LOG_LEVELS:
                await on_progress.notify("notifications/message", {"level": level, "logger": "fake",
                                                                   "data": f"at {level}"})
        return await super().call(method, params, on_progress=on_progress)


@pytest.mark.parametrize(("level", "delivered"), [
    pytest.param(None, [], id="not-asked"),
    pytest.param("debug", list(LOG_LEVELS), id="debug"),
    pytest.param("info", ["info", "warning", "error"], id="info"),
    pytest.param("warning", ["warning", "error"], id="warning"),
    pytest.param("emergency", [], id="emergency"),
])
async def test_log_messages_reach_the_stream_only_at_or_above_the_requests_level(
        gateway_factory: GatewayFactory, level: str | None, delivered: list[str]) -> None:
    gw = await gateway_factory(pool=LoggingPool(["echo", "log"]))
    answer = await gw.post(tool_call("g", "log", meta={} if level is None else {META_LOG_LEVEL: level}))
    *notes, reply = answer.messages
    assert [n["params"]["level"] for n in notes] == delivered
    assert all(n["method"] == "notifications/message" for n in notes)
    assert reply["id"] == "g"
    assert reply["result"]["content"] == [{"type": "text", "text": "log"}]
    assert answer.content_type == ("text/event-stream" if delivered else "application/json")


class DeployedServer(TestServer):
    """aiohttp's test server as the daemon runs the app: a client hanging up does not cancel the handler
    (TestServer's own default does), so only the gateway's watch on the connection sees it."""

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        kwargs["handler_cancellation"] = False
        return await super()._make_runner(**kwargs)


async def hang_up_during_block(gw: Gateway) -> None:
    """Start a ``block`` call, wait until the upstream runs it, then go away (aiohttp closes the connection of
    a request whose task is cancelled); the upstream call must be cancelled, and its in-flight slot freed."""
    pending = asyncio.ensure_future(gw.send(tool_call("b", "block")))
    try:
        await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    finally:
        pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    await asyncio.wait_for(gw.pool.cancelled.wait(), WAIT)
    await until(lambda: gw.app[INFLIGHT].in_flight == 0)


async def test_hanging_up_cancels_the_upstream_call(aiohttp_client: AiohttpClient) -> None:
    pool = FakePool()
    app = create_app(Settings(state_dir="memory"), pool=pool, policy=AllowAllPolicy())
    await hang_up_during_block(Gateway(await aiohttp_client(DeployedServer(app)), pool, app))


async def test_hanging_up_cancels_the_upstream_call_when_aiohttp_cancels_the_handler(gw: Gateway) -> None:
    await hang_up_during_block(gw)


# --- 8. a 2025 session beside modern calls ------------------------------------------------------------


async def test_a_2025_session_keeps_working_between_modern_calls(gw: Gateway) -> None:
    session = await gw.initialize()
    assert_result(await gw.post(tool_call(1, "echo", text="modern-1")), 1)
    first = await gw.rpc_2025(session, jsonrpc.request_message(2, "tools/call", {"name": "echo",
                                                                                 "arguments": {"text": "legacy-1"}}))
    assert first["result"]["content"] == [{"type": "text", "text": "legacy-1"}]
    assert "resultType" not in first["result"]
    assert_result(await gw.post(modern(3, "tools/list")), 3)

    blocked = asyncio.ensure_future(gw.rpc_2025(session, jsonrpc.request_message(
        4, "tools/call", {"name": "block", "arguments": {}})))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    assert_result(await gw.post(tool_call(5, "echo", text="while-blocked")), 5)
    gw.pool.release.set()
    reply = await asyncio.wait_for(blocked, WAIT)
    assert reply["result"]["content"] == [{"type": "text", "text": "block"}]
    assert (await gw.rpc_2025(session, jsonrpc.request_message(6, "ping")))["result"] == {}
    assert gw.sessions == 1


# --- 9. identical modern calls share one upstream call ------------------------------------------------


async def test_identical_concurrent_modern_calls_share_one_upstream_call(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(real_policy=True)
    first = asyncio.ensure_future(gw.post(tool_call(9, "block")))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    second = asyncio.ensure_future(gw.post(tool_call(9, "block")))
    await until(lambda: gw.app[INFLIGHT].in_flight == 2)
    gw.pool.release.set()
    answers = await asyncio.wait_for(asyncio.gather(first, second), WAIT)
    assert [assert_result(a, 9)["content"] for a in answers] == [[{"type": "text", "text": "block"}]] * 2
    assert [m for m, _ in gw.pool.calls] == ["tools/call"]


async def test_modern_calls_with_other_ids_are_not_shared(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(real_policy=True)
    first = asyncio.ensure_future(gw.post(tool_call(10, "block")))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    second = asyncio.ensure_future(gw.post(tool_call(11, "block")))
    await until(lambda: len(gw.pool.calls) == 2)
    gw.pool.release.set()
    answers = await asyncio.wait_for(asyncio.gather(first, second), WAIT)
    assert [a.last["id"] for a in answers] == [10, 11]


async def test_a_log_level_that_is_not_one_is_refused_not_read_as_debug(gw: Gateway) -> None:
    body = tool_call(9, "echo", meta={"io.modelcontextprotocol/logLevel": "loud"}, text="x")
    error = assert_modern_error(await gw.post(body), 400, jsonrpc.INVALID_PARAMS, 9)
    assert "log level" in error["message"]
    assert gw.pool.calls == []
