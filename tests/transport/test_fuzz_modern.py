"""Hostile input in bulk at the edges test_fuzz.py does not reach: 2026-07-28 ``_meta`` and ``requestState``,
the routing headers (``Mcp-Method``, ``Mcp-Name``, ``MCP-Protocol-Version``), resumption headers
(``Mcp-Session-Id``, ``Last-Event-ID``), and signed or forged JWTs through the OAuth verifier.

Whatever arrives: never a 5xx, a JSON-RPC error body on every refusal, an answer in bounded time, and the
daemon keeps serving. ``FUZZ_SCALE`` (tests/fuzz_scale.py) multiplies the case counts for the long form.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.base import AuthOutcome, NoAuthenticator
from satgate_mcp.auth.oauth import JwtAuthenticator, OAuthPolicy
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.settings import Settings
from satgate_mcp.stores.memory import MemoryRevocationStore
from satgate_mcp.transport.stateless_rules import (
    META_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_VERSION,
    MODERN_VERSION,
)
from tests.fakes import AllowAllPolicy, FakePool
from tests.fuzz_scale import InputCpu, examples
from tests.oauth_server import AuthServer

#: Seconds one exchange may take before it counts as hung (a real one takes milliseconds).
ANSWER_BOUND = 10.0
#: CPU seconds one JWT verification may take, however the token is crafted (a real one takes ~0.2 ms).
AUTH_CPU_BOUND = 0.5
AUDIENCE = "http://127.0.0.1:9100/mcp"

text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), text)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=10)

versions = st.one_of(st.just(MODERN_VERSION), st.sampled_from(["2025-11-25", "2026-13-99", "", "2026-07-28 "]), values)
metas = st.fixed_dictionaries(
    {META_VERSION: versions},
    optional={META_CAPABILITIES: values, META_CLIENT_INFO: values, META_LOG_LEVEL: values,
              "progressToken": values, "io.modelcontextprotocol/other": values})
#: requestState as a client might send back: garbage, base64 of garbage, or something shaped like a sealed one.
request_states = st.one_of(
    text, st.binary(max_size=120).map(lambda raw: base64.urlsafe_b64encode(raw).decode()),
    st.tuples(st.sampled_from(["v1", "v2", ""]), st.binary(max_size=80)).map(
        lambda parts: parts[0] + "." + base64.urlsafe_b64encode(parts[1]).decode().rstrip("=")),
    values)
#: Every method a stateless client may send except the listen stream (it stays open by design).
modern_methods = st.sampled_from(["tools/call", "tools/list", "server/discover", "resources/read", "prompts/get",
                                  "resources/list", "prompts/list", "completion/complete", "ping", "initialize",
                                  "logging/setLevel", "satgate/budget", "nope/nope"])
params = st.fixed_dictionaries(
    {"_meta": metas},
    optional={"name": st.one_of(st.sampled_from(["echo", "progress", "missing", ""]), values),
              "arguments": values, "uri": values, "requestState": request_states, "inputResponses": values,
              "cursor": values})
modern_bodies = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "method": modern_methods, "params": params},
    optional={"id": st.one_of(st.integers(), text)})
header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=60)
routing = st.fixed_dictionaries({}, optional={
    "Mcp-Method": st.one_of(modern_methods, header_text), "Mcp-Name": header_text,
    "MCP-Protocol-Version": st.one_of(st.just(MODERN_VERSION), header_text)})


@pytest.fixture
async def client(aiohttp_client: AiohttpClient) -> TestClient[web.Request, web.Application]:
    app = create_app(Settings(max_body_bytes=8192), authenticator=NoAuthenticator(), pool=FakePool(),
                     policy=AllowAllPolicy(), publisher=RecordingPublisher())
    return await aiohttp_client(app)


async def assert_clear_answer(resp: Any) -> None:
    assert resp.status < 500, resp.status
    body = await asyncio.wait_for(resp.read(), ANSWER_BOUND)
    if resp.status >= 400 and resp.content_type == "application/json":
        answer = json.loads(body)
        assert answer["jsonrpc"] == "2.0"
        assert isinstance(answer["error"]["code"], int)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=modern_bodies, headers=routing, accept=st.sampled_from(["application/json, text/event-stream",
                                                                    "application/json"]))
async def test_any_modern_request_gets_a_clear_answer_in_bounded_time(
        client: TestClient[web.Request, web.Application], body: dict[str, Any], headers: dict[str, str],
        accept: str) -> None:
    resp = await asyncio.wait_for(client.post("/mcp", data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Accept": accept, **headers}), ANSWER_BOUND)
    async with resp:
        await assert_clear_answer(resp)
    assert (await client.get("/healthz")).status == 200


session_ids = st.one_of(header_text, st.just("mcp-" + "0" * 32 + "-" + "0" * 32),
                        st.text(alphabet="0123456789abcdef-mcp", max_size=80))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(session_id=session_ids, last_event=st.one_of(header_text, st.integers(-5, 10**12).map(str)),
       method=st.sampled_from(["GET", "DELETE", "POST"]))
async def test_any_session_and_resume_headers_get_a_clear_answer(
        client: TestClient[web.Request, web.Application], session_id: str, last_event: str, method: str) -> None:
    headers = {"Mcp-Session-Id": session_id, "Last-Event-ID": last_event, "Accept": "application/json, "
               "text/event-stream", "Content-Type": "application/json"}
    data = b'{"jsonrpc":"2.0","id":1,"method":"ping"}' if method == "POST" else None
    resp = await asyncio.wait_for(client.request(method, "/mcp", data=data, headers=headers), ANSWER_BOUND)
    async with resp:
        assert resp.status < 500
        if resp.content_type == "application/json":
            await assert_clear_answer(resp)
    assert (await client.get("/healthz")).status == 200


# --- JWTs: forged, malformed, and genuinely signed with hostile claims -----------------------------------------


@pytest.fixture
async def verifier() -> AsyncIterator[tuple[AuthServer, JwtAuthenticator]]:
    async with AuthServer() as idp:
        idp.default_audience = AUDIENCE
        auth = JwtAuthenticator(OAuthPolicy(issuer=idp.issuer, audiences=(AUDIENCE,), budget_claim="budget"),
                                MemoryRevocationStore())
        yield idp, auth
        await auth.aclose()


def segment(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


claim_names = st.sampled_from(["sub", "scope", "scp", "aud", "exp", "nbf", "iat", "iss", "client_id", "azp",
                               "budget", "jti", "cnf", "act"])
hostile_claims = st.dictionaries(claim_names, values, max_size=5)
hostile_headers = st.dictionaries(st.sampled_from(["typ", "kid", "crit", "jku", "x5u", "cty", "b64", "zip"]),
                                  values, max_size=3)
forged = st.one_of(
    text,
    st.tuples(st.one_of(values, st.binary(max_size=40)), st.one_of(values, st.binary(max_size=60)),
              st.binary(max_size=60)).map(lambda p: f"{segment(p[0])}.{segment(p[1])}.{segment(p[2])}"),
    st.lists(st.binary(max_size=30).map(segment), min_size=1, max_size=7).map(".".join),
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(signed=st.booleans(), claims=hostile_claims, headers=hostile_headers, forgery=forged)
async def test_any_jwt_gets_an_outcome_at_a_bounded_cost(
        verifier: tuple[AuthServer, JwtAuthenticator], signed: bool, claims: dict[str, Any],
        headers: dict[str, Any], forgery: str) -> None:
    idp, auth = verifier
    if signed:
        # A genuine signature over whatever claims: what a compromised or careless authorization server issues.
        try:
            token = idp.mint("alice", extra=claims, headers={k: v for k, v in headers.items()
                                                             if k != "kid" or isinstance(v, str)})
        except (TypeError, ValueError, jwt.PyJWTError):  # PyJWT itself refuses to sign some of these
            return
    else:
        token = forgery
    with InputCpu() as cpu:
        result = await auth.authenticate(f"Bearer {token}")
    assert cpu.seconds < AUTH_CPU_BOUND
    assert isinstance(result.outcome, AuthOutcome)
    if result.ok:
        assert result.identity is not None
        assert isinstance(result.identity.token_id, str)
        assert result.identity.token_id
