"""Whatever arrives at /mcp, the answer is a well-formed HTTP answer and the daemon keeps serving."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from pymacaroons import Macaroon
from pymacaroons.macaroon import MACAROON_V2
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.base import Authenticator, AuthOutcome, NoAuthenticator, StaticTokenAuthenticator
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.settings import Settings
from satgate_mcp.stores.memory import MemoryRevocationStore
from tests.fakes import AllowAllPolicy, FakePool
from tests.fuzz_scale import InputCpu, examples
from tests.raw_http import raw_post

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


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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


# --- credentials and headers (issue 9, hole 7) ---------------------------------------------------------------
# Random tokens, caveats, identifiers and header bytes through every authenticator and through /mcp: never an
# exception or a 5xx, and never more than a bounded cost. The bounds are CPU time (other work on the machine
# does not count) and generous: a real authentication takes about a tenth of a millisecond.

FUZZ_KEY = "fuzz-tests-root-key-0123456789abcdef-0123"
FUZZ_STATIC = "fuzz-static-token-0123456789"
#: CPU seconds one authenticate call may take, however the credential is crafted. The backtracking caveat this
#: guards against cost seconds; a garbage collection of a full test session's heap can cost a tenth of one.
AUTH_CPU_BOUND = 0.5
#: CPU seconds one whole HTTP exchange may take (client and server share the process).
REQUEST_CPU_BOUND = 0.5

utf8_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=300)
predicates = st.one_of(
    utf8_text,
    st.sampled_from(["tools", "resources", "prompts", "expires", "budget_limit", "depth"]).flatmap(
        lambda key: st.tuples(st.just(key), st.sampled_from([" = ", "=", " <= ", " =  "]), utf8_text)
    ).map("".join),
    st.integers(0, 3000).map(lambda n: "tools =" + " " * n + "\nx\ny"),
)
identifiers = st.one_of(
    st.binary(max_size=400),
    st.integers(0, 4000).map(lambda n: b"[" * n),
    st.fixed_dictionaries({"v": st.sampled_from([1, 2, "1"]), "token_id": st.one_of(utf8_text, st.integers())},
                          optional={"ancestors": json_values, "depth": json_values, "extra": json_values}).map(
        lambda body: json.dumps(body).encode()),
)


def crafted_macaroon(identifier: bytes, caveats: list[str], key: str) -> str:
    mac = Macaroon(location="x", identifier=identifier, key=key.encode(), version=MACAROON_V2)
    for predicate in caveats:
        mac.add_first_party_caveat(predicate)
    return str(mac.serialize())


def genuine_with(caveats: list[str]) -> str:
    mac = Macaroon.deserialize(mint_token(FUZZ_KEY, "tok-fuzz"))
    for predicate in caveats:
        mac.add_first_party_caveat(predicate)
    return str(mac.serialize())


def mutated(token: str, at: int, char: str) -> str:
    at %= len(token)
    return token[:at] + char + token[at + 1:]


tokens = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda raw: raw.decode("utf-8", errors="surrogateescape")),
    st.builds(crafted_macaroon, identifiers, st.lists(predicates, max_size=4),
              st.sampled_from([FUZZ_KEY, "an-attackers-key-0123456789abcdef-0123"])),
    st.builds(genuine_with, st.lists(predicates, max_size=4)),
    st.builds(mutated, st.builds(genuine_with, st.just([])), st.integers(0, 10_000), st.characters()),
)
authorization_headers = st.one_of(
    tokens.map(lambda token: f"Bearer {token}"),
    st.binary(max_size=100).map(lambda raw: raw.decode("utf-8", errors="surrogateescape")),
    st.none(),
)


def every_authenticator() -> list[Authenticator]:
    return [NoAuthenticator(), StaticTokenAuthenticator(FUZZ_STATIC),
            MacaroonAuthenticator(FUZZ_KEY, MemoryRevocationStore(), cache_seconds=0)]


@settings(max_examples=examples(300), deadline=None)
@given(header=authorization_headers)
async def test_any_credential_gets_an_outcome_at_a_bounded_cost(header: str | None) -> None:
    for authenticator in every_authenticator():
        with InputCpu() as cpu:
            result = await authenticator.authenticate(header)
        assert cpu.seconds < AUTH_CPU_BOUND, (authenticator.mode, header)
        assert isinstance(result.outcome, AuthOutcome)
        if result.ok:
            assert result.identity is not None
        elif result.identity is not None:  # only a credential that verified names its holder (revoked, expired)
            assert result.outcome in {AuthOutcome.REVOKED, AuthOutcome.EXPIRED, AuthOutcome.UNAVAILABLE}


header_values = st.binary(max_size=120).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b""))
header_lines = st.lists(st.tuples(st.sampled_from([b"Authorization", b"Origin", b"Mcp-Session-Id",
                                                   b"MCP-Protocol-Version"]), header_values),
                        max_size=3).map(lambda pairs: b"".join(name + b": " + value + b"\r\n" for name, value in pairs))
def header_bytes(token: str) -> bytes:
    """The token's bytes on the wire: raw bytes back for a surrogate-escaped token, any other lone surrogate as is."""
    try:
        return token.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return token.encode("utf-8", "surrogatepass")


bearer_lines = tokens.map(lambda token: b"Authorization: Bearer " + header_bytes(token) + b"\r\n")


@pytest.fixture(params=["none", "config", "header"])
async def any_mode_client(request: pytest.FixtureRequest, aiohttp_client: AiohttpClient
                          ) -> TestClient[web.Request, web.Application]:
    modes: dict[str, dict[str, Any]] = {"none": {}, "config": {"static_token": SecretStr(FUZZ_STATIC)},
                                        "header": {"root_key": SecretStr(FUZZ_KEY)}}
    app = create_app(Settings(auth_mode=request.param, **modes[request.param]), pool=FakePool(),
                     policy=AllowAllPolicy(), publisher=RecordingPublisher())
    return await aiohttp_client(app)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(headers=st.one_of(header_lines, bearer_lines), host=st.one_of(st.just(b"127.0.0.1"), header_values))
async def test_any_header_bytes_get_a_4xx_json_rpc_answer_or_pass_never_a_5xx(
        any_mode_client: TestClient[web.Request, web.Application], headers: bytes, host: bytes) -> None:
    with InputCpu() as cpu:
        answer = await raw_post(any_mode_client, headers, host=host)
    assert cpu.seconds < REQUEST_CPU_BOUND
    assert answer.status < 500, answer
    if answer.status >= 400 and answer.is_json:  # aiohttp's own parser refuses some bytes before the app sees them
        answer.json_rpc_error()
    assert (await any_mode_client.get("/healthz")).status == 200


# --- a lone UTF-16 surrogate (issue 31) ------------------------------------------------------------------------
# JSON may spell "\ud800", but no text can hold it: the log renderer, the duplicate key and the request digest each
# raised on it, and the client got a 500. Such a body is refused as orjson refuses it, wherever the surrogate sits.

SURROGATE = "\\ud800"
SURROGATE_BODIES = {
    "method": f'{{"jsonrpc":"2.0","id":2,"method":"{SURROGATE}"}}',
    "id": f'{{"jsonrpc":"2.0","id":"{SURROGATE}","method":"ping"}}',
    "tool-name": f'{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"{SURROGATE}"}}}}',
    "argument": f'{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"echo",'
                f'"arguments":{{"text":"{SURROGATE}"}}}}}}',
    "uri": f'{{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{{"uri":"x{SURROGATE}"}}}}',
    "meta": f'{{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{{"name":"echo","_meta":{{"{SURROGATE}":1}}}}}}',
    "low-half": '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"\\udc00"}}',
    "in-a-batch": f'[{{"jsonrpc":"2.0","id":8,"method":"ping"}},{{"jsonrpc":"2.0","id":9,"method":"{SURROGATE}"}}]',
}


@pytest.mark.parametrize("where", SURROGATE_BODIES)
async def test_attack_a_lone_surrogate_anywhere_is_a_parse_error_not_a_500(
        aiohttp_client: AiohttpClient, where: str) -> None:
    from satgate_mcp.events import LogPublisher

    app = create_app(Settings(state_dir="memory", tool_costs={"echo": 1.0}), authenticator=NoAuthenticator(),
                     pool=FakePool(), publisher=LogPublisher())
    client = await aiohttp_client(app)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Mcp-Session-Id": await open_session(client)}
    resp = await client.post("/mcp", data=SURROGATE_BODIES[where].encode(), headers=headers)
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == -32700
    ok = await client.post("/mcp", data=b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"echo",'
                                        b'"arguments":{"text":"\\ud83d\\ude00 a pair is text"}}}', headers=headers)
    assert ok.status == 200
    assert "\U0001F600" in await ok.text()


def test_a_log_line_with_a_lone_surrogate_is_written_escaped() -> None:
    from satgate_mcp.logs import _render_json

    line = _render_json(None, "info", {"event": "http_request", "path": "/mcp\ud800"})
    assert json.loads(line)["path"] == "/mcp\ud800"
