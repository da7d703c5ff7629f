"""Upstreams see who is calling (issue 28, sections 1 and 2), with real parts only.

The authorization server is tests/oauth_server.py with its token endpoint (token exchange, client credentials,
client authentication checked); the upstream is tests/identity_upstream.py, an official-SDK MCP server in its own
process that verifies every bearer token against that server's keys and answers ``whoami`` with the subject it
saw; the gateway is the real app, its real pool and its real OAuth (or macaroon) authenticator.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import INFLIGHT, POOL
from satgate_mcp.settings import Settings
from satgate_mcp.stores.memory import MemoryRevocationStore
from satgate_mcp.upstream.authorized import AuthorizedIsolated
from satgate_mcp.upstream.pool import UpstreamPool
from tests.answers import decode_answer
from tests.conftest import HttpUpstreamProcess
from tests.fakes import AllowAllPolicy
from tests.oauth_server import AuthServer
from tests.oauth_token_endpoint import SECRET_DESCRIPTION, TOKEN_EXCHANGE

pytestmark = pytest.mark.process

AUDIENCE = "http://127.0.0.1:9100/mcp"
UPSTREAM_AUDIENCE = "https://files.example.com/mcp"
SECRET_VARIABLE = "TEST_GATEWAY_CLIENT_SECRET"
CLIENT_SECRET = "gw-client-secret-do-not-leak"
VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"
ROOT_KEY = "k" * 40
IDENTITY_SERVER = Path(__file__).resolve().parents[1] / "identity_upstream.py"


class IdentityUpstream(HttpUpstreamProcess):
    """tests/identity_upstream.py in its own process, trusting ``idp``'s keys."""

    def __init__(self, idp: AuthServer) -> None:
        super().__init__()
        self.args = ["--jwks-url", idp.jwks_url, "--issuer", idp.issuer, "--audience", UPSTREAM_AUDIENCE]

    def start(self) -> IdentityUpstream:
        self.proc = subprocess.Popen([sys.executable, str(IDENTITY_SERVER), *self.args], stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        self.url = self._read_ready_line(self.proc).split()[1]
        return self


@dataclass
class Gateway:
    http: TestClient[web.Request, web.Application]
    revoked: MemoryRevocationStore

    async def post(self, token: str, message: JsonObj, session: str | None = None) -> tuple[int, Any, dict[str, str]]:
        headers = {"Accept": ACCEPT, "Content-Type": "application/json", "MCP-Protocol-Version": VERSION,
                   "Authorization": f"Bearer {token}"}
        if session is not None:
            headers["Mcp-Session-Id"] = session
        resp = await self.http.post("/mcp", data=json.dumps(message), headers=headers)
        return resp.status, decode_answer(resp.content_type, await resp.text()), dict(resp.headers)

    async def session(self, token: str) -> str:
        status, body, headers = await self.post(token, jsonrpc.request_message(1, "initialize", {
            "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}))
        assert status == 200, body
        return headers["Mcp-Session-Id"]

    async def call(self, token: str, session: str, tool: str, request_id: int = 5) -> tuple[int, JsonObj]:
        status, body, _ = await self.post(token, jsonrpc.request_message(request_id, "tools/call", {
            "name": tool, "arguments": {}}), session)
        return status, body

    async def text(self, token: str, session: str, tool: str, request_id: int = 5) -> str:
        status, body = await self.call(token, session, tool, request_id)
        assert status == 200, body
        assert "result" in body, body
        return str(body["result"]["content"][0]["text"])


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def idp(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AuthServer]:
    monkeypatch.setenv(SECRET_VARIABLE, CLIENT_SECRET)
    async with AuthServer(path="/realms/acme") as server:
        server.default_audience = AUDIENCE
        server.tokens.register("gateway", CLIENT_SECRET)
        server.current_kid("ES256")  # callers' tokens: ES256; what the token endpoint issues: RS256
        yield server


@pytest.fixture
def upstream(idp: AuthServer) -> Iterator[IdentityUpstream]:
    server = IdentityUpstream(idp).start()
    yield server
    server.stop()


def auth_spec(idp: AuthServer, kind: str = "token_exchange", **extra: Any) -> JsonObj:
    spec = {"type": kind, "token_endpoint": idp.tokens.url, "client_id": "gateway",
            "client_secret_env": SECRET_VARIABLE, "audience": UPSTREAM_AUDIENCE, **extra}
    return {k: v for k, v in spec.items() if v is not None}


@pytest.fixture
def start(aiohttp_client: AiohttpClient, idp: AuthServer, upstream: IdentityUpstream) -> StartGateway:
    async def make(auth: JsonObj | None = None, timeout: float = 5.0, **overrides: Any) -> Gateway:
        spec = {"transport": "http", "url": upstream.url, "timeout": timeout, "auth": auth or auth_spec(idp)}
        values: dict[str, Any] = {"auth_mode": "oauth", "oauth_issuer": idp.issuer, "oauth_audience": AUDIENCE,
                                  "state_dir": "memory", "upstreams": json.dumps({"files": spec})}
        values.update(overrides)
        settings = Settings(**values)
        revoked = MemoryRevocationStore()
        authenticator = authenticator_from_settings(settings, revocations=revoked)
        app = create_app(settings, authenticator=authenticator, policy=AllowAllPolicy(), publisher=RecordingPublisher())

        async def close_auth(app: web.Application) -> None:
            aclose = getattr(authenticator, "aclose", None)
            if aclose is not None:
                await aclose()

        app.on_cleanup.append(close_auth)
        return Gateway(await aiohttp_client(app), revoked)

    return make


def user_token(idp: AuthServer, subject: str, **extra: Any) -> str:
    return idp.mint(subject, alg="ES256", ttl=600, **extra)


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Until ``condition`` holds (bounded): for what only polling can see, such as calls piling up."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_alices_exchanged_token_never_reaches_bobs_call(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    alice, bob = user_token(idp, "alice"), user_token(idp, "bob")
    sessions = {alice: await gw.session(alice), bob: await gw.session(bob)}
    callers = [alice, bob] * 50
    answers = await asyncio.gather(*(gw.text(token, sessions[token], "whoami", i) for i, token in enumerate(callers)))
    assert answers == ["alice", "bob"] * 50
    assert sorted(idp.tokens.exchanged_for) == ["alice", "bob"]  # one exchange each, then cached
    seen = json.loads(await gw.text(alice, sessions[alice], "sessions"))
    owners = [subjects for subjects in seen["sessions"].values() if subjects != ["gateway"]]
    assert sorted(owners) == [["alice"], ["bob"]]  # an upstream session per identity, never shared


async def test_a_hundred_concurrent_calls_make_one_exchange(start: StartGateway, idp: AuthServer) -> None:
    gw = await start(max_inflight_per_token=200)
    alice = user_token(idp, "alice")
    session = await gw.session(alice)
    idp.tokens.hold = asyncio.Event()
    calls = [asyncio.ensure_future(gw.text(alice, session, "whoami", i)) for i in range(100)]
    await until(lambda: gw.http.app[INFLIGHT].in_flight == 100 and idp.tokens.grants[TOKEN_EXCHANGE] >= 1,
                "100 calls in flight and an exchange at the server")
    idp.tokens.hold.set()
    assert await asyncio.gather(*calls) == ["alice"] * 100
    assert idp.tokens.grants[TOKEN_EXCHANGE] == 1


async def test_a_revoked_tokens_upstream_token_is_not_used_again(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    first = user_token(idp, "alice", extra={"jti": "alice-laptop"})
    session = await gw.session(first)
    assert await gw.text(first, session, "whoami") == "alice"
    await gw.revoked.revoke("alice-laptop")
    status, _ = await gw.call(first, session, "whoami")
    assert status == 401
    second = user_token(idp, "alice", extra={"jti": "alice-phone"})
    assert await gw.text(second, await gw.session(second), "whoami") == "alice"
    assert idp.tokens.exchanged_for == ["alice", "alice"]  # the revoked token's exchange was not reused


async def test_revoking_a_caller_drops_its_cached_upstream_tokens_at_the_next_sweep(start: StartGateway,
                                                                                    idp: AuthServer) -> None:
    gw = await start()
    alice = user_token(idp, "alice")
    assert await gw.text(alice, await gw.session(alice), "whoami") == "alice"
    pool = gw.http.app[POOL]
    assert isinstance(pool, UpstreamPool)
    files = pool.isolated("files")
    assert isinstance(files, AuthorizedIsolated)
    assert files.auth.cache.expires_at(("alice", "files", "")) is not None
    await gw.revoked.revoke("alice")
    files.sweep()
    await files.revocations_swept()
    assert files.auth.cache.expires_at(("alice", "files", "")) is None
    assert files.auth.cache.expires_at(("", "files", "")) is not None  # the gateway's own token stays


async def test_an_upstream_401_drops_the_cached_token_and_retries_once(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    alice = user_token(idp, "alice")
    session = await gw.session(alice)
    assert await gw.text(alice, session, "reject_my_token") == "rejected"  # the upstream revokes the cached token
    assert await gw.text(alice, session, "whoami", 6) == "alice"
    assert idp.tokens.exchanged_for == ["alice", "alice"]
    # The call's POST was refused once (the listen stream's GET may also meet the refused token, in the background).
    assert json.loads(await gw.text(alice, session, "sessions", 7))["refused_posts"] == 1


async def test_a_second_401_fails_the_call_after_one_retry(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    alice, bob = user_token(idp, "alice"), user_token(idp, "bob")
    session = await gw.session(alice)
    assert await gw.text(alice, session, "reject_me") == "rejected"  # every token of alice's, fresh ones too
    status, body = await gw.call(alice, session, "whoami", 6)
    assert status == 200
    assert body["error"]["data"]["status"] == 401
    assert idp.tokens.exchanged_for == ["alice", "alice"]  # the cached token, then one fresh one: no loop
    assert await gw.text(bob, await gw.session(bob), "whoami", 7) == "bob"


async def test_an_as_refusal_is_that_calls_error_and_leaks_nothing(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    alice, bob = user_token(idp, "alice"), user_token(idp, "bob")
    bob_session = await gw.session(bob)
    assert await gw.text(bob, bob_session, "whoami") == "bob"
    idp.tokens.refuse = "invalid_grant"
    alice_session = await gw.session(alice)
    status, body = await gw.call(alice, alice_session, "whoami")
    assert status == 200
    assert body["error"]["data"] == {"error": "upstream_auth_failed", "upstream": "files",
                                     "oauth_error": "invalid_grant"}
    text = json.dumps(body)
    for secret in (SECRET_DESCRIPTION, CLIENT_SECRET, alice):
        assert secret not in text
    assert await gw.text(bob, bob_session, "whoami", 6) == "bob"  # another caller's cached token still serves


async def test_a_silent_authorization_server_is_bounded_by_the_upstream_timeout(start: StartGateway,
                                                                                idp: AuthServer) -> None:
    gw = await start(timeout=1.0)
    alice = user_token(idp, "alice")
    session = await gw.session(alice)
    idp.tokens.hold = asyncio.Event()  # never set: the server takes the request and never answers
    began = time.monotonic()
    _, body = await gw.call(alice, session, "whoami")
    assert time.monotonic() - began < 5
    assert body["error"]["data"]["error"] == "upstream_auth_failed"
    assert body["error"]["data"]["oauth_error"] == "temporarily_unavailable"
    idp.tokens.hold.set()


def _ed25519_pem(key: ed25519.Ed25519PrivateKey | None = None) -> str:
    key = key or ed25519.Ed25519PrivateKey.generate()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


async def test_forwarded_identity_verifies_against_the_gateways_jwks(start: StartGateway, idp: AuthServer,
                                                                     upstream: IdentityUpstream) -> None:
    """Header mode (macaroons) with the gateway's own client credentials: the upstream sees the gateway's token,
    and who calls in a JWT any library verifies with /.well-known/jwks.json."""
    gw = await start(auth=auth_spec(idp, "client_credentials", forward_identity=True), auth_mode="header",
                     root_key=ROOT_KEY, identity_key=_ed25519_pem())
    token = mint_token(ROOT_KEY, "alice-ci", tenant="acme")
    session = await gw.session(token)
    assert await gw.text(token, session, "whoami") == "gateway"
    signed = await gw.text(token, session, "identity", 6)
    resp = await gw.http.get("/.well-known/jwks.json")
    keys = jwt.PyJWKSet.from_dict(await resp.json())
    kid = jwt.get_unverified_header(signed)["kid"]
    key = next(k for k in keys.keys if k.key_id == kid)
    claims = jwt.decode(signed, key.key, algorithms=["EdDSA"], audience=UPSTREAM_AUDIENCE)
    assert (claims["sub"], claims["tenant"], claims["token_id"]) == ("alice-ci", "acme", "alice-ci")
    assert claims["exp"] - claims["iat"] == 60
    with pytest.raises(jwt.InvalidAudienceError):
        jwt.decode(signed, key.key, algorithms=["EdDSA"], audience="https://another-upstream.example.com/mcp")
    assert idp.tokens.grants == {"client_credentials": 1}  # the gateway's token, cached for every caller


async def test_private_key_jwt_authenticates_the_gateway_without_a_shared_secret(
        start: StartGateway, idp: AuthServer, monkeypatch: pytest.MonkeyPatch) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    idp.tokens.register_key("gateway-pk", key.public_key())
    monkeypatch.setenv("TEST_GATEWAY_PRIVATE_KEY", _ed25519_pem(key))
    gw = await start(auth=auth_spec(idp, client_id="gateway-pk", client_auth="private_key_jwt",
                                    client_secret_env=None, private_key_env="TEST_GATEWAY_PRIVATE_KEY"))
    alice = user_token(idp, "alice")
    assert await gw.text(alice, await gw.session(alice), "whoami") == "alice"
    assert set(idp.tokens.clients) == {"gateway-pk"}


async def test_stateless_callers_each_reach_the_upstream_as_themselves(start: StartGateway, idp: AuthServer) -> None:
    """2026-07-28 clients (no session) through the same per-caller connections: each whoami answers its caller."""
    gw = await start()
    alice, bob = user_token(idp, "alice"), user_token(idp, "bob")
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}

    async def whoami(token: str, request_id: int) -> str:
        resp = await gw.http.post("/mcp", data=json.dumps(jsonrpc.request_message(request_id, "tools/call", {
            "name": "whoami", "arguments": {}, "_meta": meta})), headers={
            "Accept": ACCEPT, "Content-Type": "application/json", "Authorization": f"Bearer {token}",
            "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "whoami"})
        body = decode_answer(resp.content_type, await resp.text())
        assert "result" in body, body
        return str(body["result"]["content"][0]["text"])

    answers = await asyncio.gather(*(whoami(token, i) for i, token in enumerate([alice, bob] * 10)))
    assert answers == ["alice", "bob"] * 10
