"""Each user authorizes once (issue 28, section 3), with real parts only.

The authorization server is tests/oauth_server.py with its auto-approving authorize endpoint and its code and refresh
grants; the upstream is tests/identity_upstream.py (official SDK, every request's bearer token verified, its RFC 9728
metadata naming the server and its resource); the gateway is the real app in header mode (macaroons), its grants in
the memory store sealed with a real key. The "browser" is an HTTP client that follows the authorization URL's
redirects to the gateway's callback, as a user's browser does after signing in.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import POOL, STORES, USER_GRANTS
from satgate_mcp.settings import Settings
from satgate_mcp.stores.memory import MemoryRevocationStore
from satgate_mcp.upstream.authorized import AuthorizedIsolated
from satgate_mcp.upstream.pool import UpstreamPool
from satgate_mcp.upstream.user_grants import UserGrants
from tests.answers import decode_answer
from tests.fakes import AllowAllPolicy
from tests.integration.test_upstream_identity import (
    CLIENT_SECRET,
    SECRET_VARIABLE,
    UPSTREAM_AUDIENCE,
    IdentityUpstream,
    idp,
)
from tests.oauth_server import AuthServer

pytestmark = pytest.mark.process
__all__ = ["idp"]  # the authorization server fixture, shared with the token exchange tests

ROOT_KEY = "u" * 40
CREDENTIAL_KEY = "5e" * 32
VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


@dataclass
class Gateway:
    http: TestClient[web.Request, web.Application]
    revoked: MemoryRevocationStore
    published: RecordingPublisher

    def grants(self, upstream: str = "files") -> UserGrants:
        return self.http.app[USER_GRANTS][upstream]

    async def post(self, token: str, message: JsonObj, session: str | None = None) -> tuple[int, Any]:
        headers = {"Accept": ACCEPT, "Content-Type": "application/json", "MCP-Protocol-Version": VERSION,
                   "Authorization": f"Bearer {token}"}
        if session is not None:
            headers["Mcp-Session-Id"] = session
        resp = await self.http.post("/mcp", data=json.dumps(message), headers=headers)
        if session is None and resp.status == 200:
            self._last_session = resp.headers.get("Mcp-Session-Id")
        return resp.status, decode_answer(resp.content_type, await resp.text())

    async def session(self, token: str) -> str:
        status, body = await self.post(token, jsonrpc.request_message(1, "initialize", {
            "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}))
        assert status == 200, body
        assert self._last_session is not None
        return self._last_session

    async def call(self, token: str, session: str, tool: str = "whoami", request_id: int = 5) -> JsonObj:
        status, body = await self.post(token, jsonrpc.request_message(request_id, "tools/call", {
            "name": tool, "arguments": {}}), session)
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    async def text(self, token: str, session: str, tool: str = "whoami", request_id: int = 5) -> str:
        body = await self.call(token, session, tool, request_id)
        assert "result" in body, body
        return str(body["result"]["content"][0]["text"])

    async def authorization_url(self, token: str, session: str) -> str:
        """Call without a grant: the -32042 the client gets names the URL to open."""
        body = await self.call(token, session)
        assert body["error"]["code"] == -32042, body
        elicitation = body["error"]["data"]["elicitations"][0]
        assert elicitation["mode"] == "url"
        return str(elicitation["url"])


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
def upstream(idp: AuthServer) -> Iterator[IdentityUpstream]:
    server = IdentityUpstream(idp).start()
    yield server
    server.stop()


def user_spec(**extra: Any) -> JsonObj:
    return {"type": "oauth_user", "client_id": "gateway", "client_secret_env": SECRET_VARIABLE, "scope": "files:read",
            **extra}


@pytest.fixture
def start(aiohttp_client: AiohttpClient, idp: AuthServer, upstream: IdentityUpstream) -> StartGateway:
    async def make(**overrides: Any) -> Gateway:
        upstreams = {name: {"transport": "http", "url": upstream.url, "timeout": 5, "auth": user_spec(),
                            "tool_prefix": prefix} for name, prefix in (("files", ""), ("tickets", "t_"))}
        values: dict[str, Any] = {"auth_mode": "header", "root_key": ROOT_KEY, "credential_key": CREDENTIAL_KEY,
                                  "state_dir": "memory", "upstreams": json.dumps(upstreams)}
        values.update(overrides)
        settings = Settings(**values)
        revoked = MemoryRevocationStore()
        authenticator = authenticator_from_settings(settings, revocations=revoked)
        published = RecordingPublisher()
        app = create_app(settings, authenticator=authenticator, policy=AllowAllPolicy(), publisher=published)
        gateway = Gateway(await aiohttp_client(app), revoked, published)
        gateway._last_session = None
        return gateway

    return make


async def browse(url: str) -> tuple[int, str]:
    """The user's browser: open the URL, sign in (the server approves at once), land on the gateway's page."""
    async with aiohttp.ClientSession() as browser, browser.get(url, allow_redirects=True) as resp:
        return resp.status, await resp.text()


def state_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["state"][0]


async def callback(gw: Gateway, upstream: str, **query: str) -> tuple[int, str]:
    resp = await gw.http.get(f"/oauth/callback/{upstream}", params=query, allow_redirects=False)
    return resp.status, await resp.text()


async def test_without_url_elicitation_the_call_gets_32042_and_after_authorizing_the_retry_succeeds(
        start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    alice = mint_token(ROOT_KEY, "alice")
    session = await gw.session(alice)
    url = await gw.authorization_url(alice, session)
    asked = parse_qs(urlsplit(url).query)
    assert url.startswith(idp.issuer + "/authorize?")  # found from the upstream's RFC 9728 metadata
    assert asked["code_challenge_method"] == ["S256"]
    assert asked["resource"] == [UPSTREAM_AUDIENCE]
    assert asked["scope"] == ["files:read"]
    assert asked["redirect_uri"][0].startswith(str(gw.http.make_url("/oauth/callback/files")))
    idp.authorizations.user = "alice@files"
    status, page = await browse(url)
    assert status == 200
    assert "return to your agent" in page
    assert await gw.text(alice, session, request_id=6) == "alice@files"
    assert await gw.text(alice, session, request_id=7) == "alice@files"
    assert idp.authorizations.grants == {"authorization_code": 1}  # the access token from the code, cached
    listed = await gw.http.app[STORES].grants.listing()
    assert [(g.owner, g.upstream, g.scope) for g in listed] == [("alice", "files", "files:read")]
    assert CLIENT_SECRET not in listed[0].sealed
    assert not any(token in listed[0].sealed for token in idp.authorizations.refresh_tokens)


async def test_a_replayed_callback_state_is_refused(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    alice = mint_token(ROOT_KEY, "alice")
    session = await gw.session(alice)
    url = await gw.authorization_url(alice, session)
    async with aiohttp.ClientSession() as browser, browser.get(url, allow_redirects=False) as resp:
        landing = resp.headers["Location"]
    assert (await browse(landing))[0] == 200
    status, page = await browse(landing)  # the same code and state again (a replay)
    assert status == 400
    assert "already used" in page
    assert idp.authorizations.grants == {"authorization_code": 1}  # the replay reached nothing
    said = [(e["outcome"], e["subject"], e.get("reason")) for e in gw.published.named("upstream_authorization")]
    assert said == [("started", "alice", None), ("granted", "alice", None), ("refused", "alice", "unknown")]
    assert state_of(url) not in json.dumps(gw.published.events)


async def test_a_foreign_or_forged_state_is_refused_and_grants_nothing(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    alice, bob = mint_token(ROOT_KEY, "alice"), mint_token(ROOT_KEY, "bob")
    alice_url = await gw.authorization_url(alice, await gw.session(alice))
    status, page = await callback(gw, "tickets", state=state_of(alice_url), code="stolen")  # files' state
    assert (status, "another upstream" in page) == (400, True)
    assert (await callback(gw, "files", state="forged-" + "x" * 40, code="c"))[0] == 400
    assert (await callback(gw, "nowhere", state=state_of(alice_url), code="c"))[0] == 404
    assert await gw.http.app[STORES].grants.listing() == []
    bob_session = await gw.session(bob)
    assert (await gw.call(bob, bob_session))["error"]["code"] == -32042  # bob is still asked for his own


async def test_an_expired_state_is_refused(start: StartGateway, idp: AuthServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    gw = await start()
    alice = mint_token(ROOT_KEY, "alice")
    url = await gw.authorization_url(alice, await gw.session(alice))
    monkeypatch.setattr(gw.grants(), "_clock", lambda: time.time() + 601)  # ten minutes and a second later
    status, page = await browse(url)
    assert status == 400
    assert "expired" in page
    assert idp.authorizations.grants == {}


async def test_alices_grant_never_serves_bobs_call(start: StartGateway, idp: AuthServer) -> None:
    gw = await start(max_inflight_per_token=200)
    alice, bob = mint_token(ROOT_KEY, "alice"), mint_token(ROOT_KEY, "bob")
    sessions = {alice: await gw.session(alice), bob: await gw.session(bob)}
    idp.authorizations.user = "alice@files"
    assert (await browse(await gw.authorization_url(alice, sessions[alice])))[0] == 200
    assert (await gw.call(bob, sessions[bob]))["error"]["code"] == -32042
    idp.authorizations.user = "bob@files"
    assert (await browse(await gw.authorization_url(bob, sessions[bob])))[0] == 200
    callers = [alice, bob] * 50
    answers = await asyncio.gather(*(gw.text(t, sessions[t], request_id=i) for i, t in enumerate(callers, 10)))
    assert answers == ["alice@files", "bob@files"] * 50


async def test_a_tampered_or_moved_ciphertext_is_refused_and_the_user_asked_again(start: StartGateway,
                                                                                  idp: AuthServer) -> None:
    gw = await start()
    store = gw.http.app[STORES].grants
    alice, bob = mint_token(ROOT_KEY, "alice"), mint_token(ROOT_KEY, "bob")
    for token, user in ((alice, "alice@files"), (bob, "bob@files")):
        idp.authorizations.user = user
        assert (await browse(await gw.authorization_url(token, await gw.session(token))))[0] == 200
    grants = {g.owner: g for g in await store.listing()}
    flipped = grants["alice"].sealed[:-3] + ("A" if grants["alice"].sealed[-3] != "A" else "B") + \
        grants["alice"].sealed[-2:]
    await store.put(replace(grants["alice"], sealed=flipped))
    await store.put(replace(grants["bob"], sealed=grants["alice"].sealed))  # alice's token on bob's row
    fresh = await start()  # another process on the same store: nothing cached, each grant must be opened
    for other in fresh.http.app[USER_GRANTS].values():
        other.store = store
    for token in (alice, bob):
        assert (await fresh.call(token, await fresh.session(token)))["error"]["code"] == -32042
    assert idp.authorizations.grants["refresh_token"] == 0  # neither sealed token left the gateway
    assert await store.listing() == []  # both unreadable grants were forgotten


async def test_an_ageing_access_token_is_refreshed_and_the_rotated_refresh_token_kept(start: StartGateway,
                                                                                      idp: AuthServer) -> None:
    gw = await start()
    store = gw.http.app[STORES].grants
    idp.tokens.ttl = 1  # every access token is within the refresh margin at once: each call refreshes
    alice = mint_token(ROOT_KEY, "alice")
    session = await gw.session(alice)
    idp.authorizations.user = "alice@files"
    assert (await browse(await gw.authorization_url(alice, session)))[0] == 200
    first = (await store.listing())[0]
    assert await gw.text(alice, session, request_id=6) == "alice@files"
    second = (await store.listing())[0]
    assert second.grant_id == first.grant_id
    assert second.sealed != first.sealed  # the rotated refresh token, sealed anew
    assert await gw.text(alice, session, request_id=7) == "alice@files"  # the rotated one works; the old is dead
    assert idp.authorizations.grants["refresh_token"] >= 2  # each one with the refresh token the last one gave
    assert len(idp.authorizations.refresh_tokens) == 1  # rotated: only the newest is alive at the server


async def test_a_grant_the_server_revoked_is_forgotten_and_the_user_asked_again(start: StartGateway,
                                                                               idp: AuthServer) -> None:
    gw = await start()
    idp.tokens.ttl = 1
    alice = mint_token(ROOT_KEY, "alice")
    session = await gw.session(alice)
    idp.authorizations.user = "alice@files"
    assert (await browse(await gw.authorization_url(alice, session)))[0] == 200
    idp.authorizations.revoke("alice@files")  # the user revoked the gateway's access at the upstream's server
    again = await gw.call(alice, session, request_id=6)
    assert again["error"]["code"] == -32042
    assert "refresh" not in json.dumps(again)
    assert await gw.http.app[STORES].grants.listing() == []


async def test_a_revoked_gateway_tokens_grant_is_not_used_again(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    alice = mint_token(ROOT_KEY, "alice")
    session = await gw.session(alice)
    idp.authorizations.user = "alice@files"
    assert (await browse(await gw.authorization_url(alice, session)))[0] == 200
    assert await gw.text(alice, session, request_id=6) == "alice@files"
    await gw.revoked.revoke("alice")
    status, _ = await gw.post(alice, jsonrpc.request_message(7, "tools/call", {"name": "whoami", "arguments": {}}),
                              session)
    assert status in (401, 403)  # a revoked macaroon is refused before anything else (header mode says 403)
    assert await gw.http.app[STORES].grants.revoke("alice") == 1  # what `token revoke alice` does to the store
    files = gw.http.app[POOL]
    assert isinstance(files, UpstreamPool)
    isolated = files.isolated("files")
    assert isinstance(isolated, AuthorizedIsolated)
    isolated.sweep()
    await isolated.revocations_swept()
    assert len(isolated.auth.cache) == 1  # only the gateway's own token: alice's access token is gone too
    assert idp.authorizations.grants == {"authorization_code": 1}
