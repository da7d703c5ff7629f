"""OAuth mode (issue 15) over real HTTP: JWTs from a real authorization server decide who may do what.

The authorization server is tests/oauth_server.py on 127.0.0.1 (RS256/ES256 keys, JWKS, RFC 8414 and OpenID
metadata); the gateway is the real app with the real ``JwtAuthenticator`` built from settings, fetching keys
over HTTP. Only the upstream pool and the policy are in-process fakes. Each attack is a token a real attacker
could make: signed with their own key, re-labelled, confused, expired, or for another resource.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import REGISTRY
from satgate_mcp.settings import Settings
from satgate_mcp.stores.memory import MemoryRevocationStore
from tests.answers import decode_answer
from tests.fakes import AllowAllPolicy, FakeClock, FakePool
from tests.oauth_server import AuthServer

AUDIENCE = "http://127.0.0.1:9100/mcp"
METADATA_URL = "http://127.0.0.1:9100/.well-known/oauth-protected-resource/mcp"
TOOLS = ["echo", "db_read", "db_write"]
TOOL_SCOPES = {"db_write": "db:write", "db_*": "db:read"}
VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def error(self) -> str | None:
        if isinstance(self.body, dict) and "error" in self.body:
            data = self.body["error"].get("data") or {}
            return str(data.get("error"))
        return None


@dataclass
class Gateway:
    http: TestClient[web.Request, web.Application]
    pool: FakePool
    revoked: MemoryRevocationStore
    events: RecordingPublisher

    async def post(self, token: str | None, message: JsonObj, session: str | None = None) -> Answer:
        headers = {"Accept": ACCEPT, "Content-Type": "application/json", "MCP-Protocol-Version": VERSION}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if session is not None:
            headers["Mcp-Session-Id"] = session
        resp = await self.http.post("/mcp", data=json.dumps(message), headers=headers)
        text = await resp.text()
        return Answer(resp.status, dict(resp.headers), decode_answer(resp.content_type, text))

    async def initialize(self, token: str | None) -> Answer:
        return await self.post(token, jsonrpc.request_message(1, "initialize", {
            "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}))

    async def session(self, token: str) -> str:
        answer = await self.initialize(token)
        assert answer.status == 200, answer.body
        return answer.headers["Mcp-Session-Id"]

    async def call(self, token: str, session: str, tool: str, request_id: int = 5) -> Answer:
        return await self.post(token, jsonrpc.request_message(request_id, "tools/call", {
            "name": tool, "arguments": {"text": "hi"}}), session)


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def idp() -> AsyncIterator[AuthServer]:
    async with AuthServer(path="/realms/acme") as server:
        server.default_audience = AUDIENCE
        yield server


@pytest.fixture
def start(aiohttp_client: AiohttpClient, idp: AuthServer) -> StartGateway:
    async def make(real_policy: bool = False, **overrides: Any) -> Gateway:
        values: dict[str, Any] = {"auth_mode": "oauth", "oauth_issuer": idp.issuer, "oauth_audience": AUDIENCE,
                                  "oauth_tool_scopes": json.dumps(TOOL_SCOPES), "state_dir": "memory"}
        values.update(overrides)
        revoked = MemoryRevocationStore()
        settings = Settings(**values)
        auth = authenticator_from_settings(settings, revocations=revoked)
        pool, recorded = FakePool(list(TOOLS)), RecordingPublisher()
        app = create_app(settings, authenticator=auth, pool=pool, policy=None if real_policy else AllowAllPolicy(),
                         publisher=recorded, clock=FakeClock(1000.0))

        async def close_auth(app: web.Application) -> None:
            aclose = getattr(auth, "aclose", None)
            if aclose is not None:
                await aclose()

        app.on_cleanup.append(close_auth)
        return Gateway(await aiohttp_client(app), pool, revoked, recorded)

    return make


def assert_challenged(answer: Answer, *, error: str | None = "invalid_token") -> None:
    assert answer.status == 401, answer.body
    challenge = answer.headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{METADATA_URL}"' in challenge
    assert (f'error="{error}"' in challenge) if error else ("error=" not in challenge)
    assert answer.body["id"] == 1  # the request's id, even on an auth refusal


# --- what verifies -------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["RS256", "ES256", "PS256", "EdDSA"])
async def test_a_token_the_issuer_signed_for_this_resource_opens_a_session(start: StartGateway, idp: AuthServer,
                                                                          alg: str) -> None:
    gw = await start()
    token = idp.mint("alice", alg=alg, scope="db:read")
    session = await gw.session(token)
    answer = await gw.call(token, session, "db_read")
    assert answer.status == 200, answer.body
    assert "result" in answer.body


async def test_keys_are_discovered_through_openid_configuration_when_rfc_8414_has_none(
        aiohttp_client: AiohttpClient) -> None:
    async with AuthServer(rfc8414=False) as server:
        server.default_audience = AUDIENCE
        settings = Settings(auth_mode="oauth", oauth_issuer=server.issuer, oauth_audience=[AUDIENCE],
                            state_dir="memory")
        app = create_app(settings, pool=FakePool(list(TOOLS)), policy=AllowAllPolicy())
        client = await aiohttp_client(app)
        gw = Gateway(client, FakePool(), MemoryRevocationStore(), RecordingPublisher())
        assert (await gw.initialize(server.mint())).status == 200
        assert server.metadata_fetches[server.oidc_path] == 1


async def test_an_explicit_jwks_url_needs_no_discovery(start: StartGateway, idp: AuthServer) -> None:
    gw = await start(oauth_jwks_url=idp.jwks_url)
    assert (await gw.initialize(idp.mint())).status == 200
    assert sum(idp.metadata_fetches.values()) == 0


# --- attacks: tokens that must not verify ---------------------------------------------------------


async def test_attack_a_token_signed_with_the_attackers_own_key_under_the_issuers_kid(
        start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    real_kid = idp.add_key("RS256")
    assert (await gw.initialize(idp.mint(kid=real_kid))).status == 200
    async with AuthServer(path="/realms/acme") as attacker:
        forged = attacker.mint("alice", kid=attacker.add_key("RS256", kid=real_kid), issuer=idp.issuer,
                               audience=AUDIENCE)
    assert_challenged(await gw.initialize(forged))


async def test_attack_hs256_signed_with_the_issuers_public_key(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    kid = idp.add_key("RS256")
    assert (await gw.initialize(idp.mint(kid=kid))).status == 200
    assert_challenged(await gw.initialize(idp.mint_hs256_with_public_key(kid)))


async def test_attack_alg_none(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    idp.add_key("RS256")
    assert_challenged(await gw.initialize(idp.mint_unsigned()))


async def test_attack_an_es256_key_named_for_an_rs256_token(start: StartGateway, idp: AuthServer) -> None:
    """The header says RS256 but names an EC key: the key's declared algorithm decides, never the header."""
    gw = await start()
    ec_kid = idp.add_key("ES256")
    assert (await gw.initialize(idp.mint(kid=ec_kid))).status == 200
    rsa_kid = idp.add_key("RS256")
    relabelled = idp.mint(kid=rsa_kid, headers={"kid": ec_kid})
    assert_challenged(await gw.initialize(relabelled))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"ttl": -120}, id="expired"),
        pytest.param({"issuer": "http://127.0.0.1:1/realms/other"}, id="wrong-issuer"),
        pytest.param({"audience": "https://another-resource.example.com/mcp"}, id="wrong-audience"),
        pytest.param({"audience": None}, id="no-audience"),
        pytest.param({"extra": {"exp": None}}, id="no-expiry"),
        pytest.param({"extra": {"nbf": 4_000_000_000}}, id="not-yet-valid"),
        pytest.param({"extra": {"iat": 4_000_000_000}}, id="issued-in-the-future"),
        pytest.param({"typ": "id_token+jwt"}, id="not-an-access-token"),
        pytest.param({"subject": None}, id="no-subject"),
    ],
)
async def test_a_token_failing_any_claim_check_gets_the_401_challenge(start: StartGateway, idp: AuthServer,
                                                                      change: dict[str, Any]) -> None:
    gw = await start()
    assert (await gw.initialize(idp.mint())).status == 200
    assert_challenged(await gw.initialize(idp.mint(**change)))
    assert gw.http.app is not None
    assert len(gw.http.app[REGISTRY]) == 1


async def test_no_token_gets_the_challenge_without_an_error(start: StartGateway) -> None:
    gw = await start()
    assert_challenged(await gw.initialize(None), error=None)


async def test_a_token_whose_typ_is_jwt_or_absent_verifies(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    for typ in ("JWT", "at+jwt", "application/at+jwt", None):
        assert (await gw.initialize(idp.mint(typ=typ))).status == 200, typ


# --- key rotation --------------------------------------------------------------------------------


async def test_a_key_rotated_in_is_found_by_the_first_token_that_names_it(start: StartGateway,
                                                                         idp: AuthServer) -> None:
    gw = await start()
    idp.add_key("RS256", kid="old")
    assert (await gw.initialize(idp.mint(kid="old"))).status == 200
    fetched = idp.jwks_fetches
    idp.add_key("RS256", kid="new")
    idp.remove_key("old")
    assert (await gw.initialize(idp.mint(kid="new"))).status == 200
    assert idp.jwks_fetches == fetched + 1


async def test_unknown_kids_refetch_at_most_once_per_interval_and_are_not_remembered_as_absent(
        start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    idp.add_key("RS256", kid="k1")
    assert (await gw.initialize(idp.mint(kid="k1"))).status == 200
    fetched = idp.jwks_fetches
    unpublished = idp.add_key("RS256", kid="not-yet")
    idp.remove_key(unpublished)
    for _ in range(20):  # a flood of made-up kids: one refetch (the first), not twenty
        assert_challenged(await gw.initialize(idp.mint(kid=unpublished)))
    assert idp.jwks_fetches <= fetched + 1


async def test_an_issuer_outage_keeps_the_keys_already_held(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    assert (await gw.initialize(idp.mint())).status == 200
    idp.jwks_status = 500
    assert (await gw.initialize(idp.mint())).status == 200


async def test_an_issuer_that_never_answered_leaves_tokens_unverified_not_the_gateway_down(
        start: StartGateway, idp: AuthServer) -> None:
    idp.jwks_status = 503
    gw = await start()
    assert_challenged(await gw.initialize(idp.mint()))
    assert (await gw.http.get("/healthz")).status == 200


async def test_a_metadata_document_naming_another_issuer_is_not_trusted(start: StartGateway,
                                                                        idp: AuthServer) -> None:
    idp.metadata_overrides = {"issuer": "https://evil.example.com"}
    gw = await start()
    assert_challenged(await gw.initialize(idp.mint()))
    assert idp.jwks_fetches == 0


# --- scopes --------------------------------------------------------------------------------------


async def test_a_tool_the_scopes_do_not_allow_gets_403_with_a_step_up_challenge(start: StartGateway,
                                                                               idp: AuthServer) -> None:
    gw = await start()
    token = idp.mint("alice", scope="db:read")
    session = await gw.session(token)
    answer = await gw.call(token, session, "db_write", request_id=9)
    assert answer.status == 403
    assert answer.headers["WWW-Authenticate"] == (
        f'Bearer realm="satgate-mcp", error="insufficient_scope", scope="db:read db:write", '
        f'resource_metadata="{METADATA_URL}"')
    assert answer.body["id"] == 9
    assert answer.error == "insufficient_scope"
    assert gw.pool.calls == []  # never forwarded
    stepped_up = idp.mint("alice", scope="db:read db:write")
    assert (await gw.call(stepped_up, session, "db_write")).status == 200  # same subject: same session


async def test_tools_list_shows_every_tool_so_a_client_knows_what_to_step_up_for(start: StartGateway,
                                                                                idp: AuthServer) -> None:
    gw = await start()
    token = idp.mint(scope="")
    session = await gw.session(token)
    listed = await gw.post(token, jsonrpc.request_message(2, "tools/list"), session)
    assert [t["name"] for t in listed.body["result"]["tools"]] == TOOLS
    assert (await gw.call(token, session, "echo")).status == 200  # no pattern matches: no scope needed


async def test_inside_a_batch_a_missing_scope_is_that_calls_json_rpc_error(start: StartGateway,
                                                                          idp: AuthServer) -> None:
    gw = await start()
    token = idp.mint(scope="db:read")
    answer = await gw.post(token, jsonrpc.request_message(1, "initialize", {
        "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}))
    session = answer.headers["Mcp-Session-Id"]
    batch: Any = [jsonrpc.request_message(i, "tools/call", {"name": name, "arguments": {}})
                  for i, name in ((1, "db_read"), (2, "db_write"))]
    resp = await gw.http.post("/mcp", data=json.dumps(batch), headers={
        "Accept": ACCEPT, "Content-Type": "application/json", "Authorization": f"Bearer {token}",
        "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-03-26"})
    answers = {a["id"]: a for a in await resp.json()}
    assert "result" in answers[1]
    assert answers[2]["error"]["data"]["error"] == "insufficient_scope"


async def test_the_metadata_document_lists_the_scopes_and_may_be_cached(start: StartGateway,
                                                                        idp: AuthServer) -> None:
    gw = await start()
    resp = await gw.http.get("/.well-known/oauth-protected-resource/mcp")
    document = await resp.json()
    assert document["resource"] == AUDIENCE
    assert document["authorization_servers"] == [idp.issuer]
    assert document["scopes_supported"] == ["db:read", "db:write"]
    assert resp.headers["Cache-Control"] == "public, max-age=3600"


# --- identity, revocation, budgets ----------------------------------------------------------------


@pytest.mark.parametrize("by", ["jti", "sub"])
async def test_a_revoked_jti_or_subject_is_refused_on_a_live_session(start: StartGateway, idp: AuthServer,
                                                                     by: str) -> None:
    gw = await start()
    token = idp.mint("alice", extra={"jti": "token-77"})
    session = await gw.session(token)
    assert (await gw.call(token, session, "echo")).status == 200
    await gw.revoked.revoke("token-77" if by == "jti" else "alice")
    answer = await gw.call(token, session, "echo", request_id=1)
    assert_challenged(answer)


async def test_the_id_claim_names_the_token_and_the_budget_claim_whose_budget_it_spends(
        start: StartGateway, idp: AuthServer) -> None:
    gw = await start(oauth_id_claim="client_id", oauth_budget_claim="team", real_policy=True,
                     budgets='{"payments": 2}', enforcement="control", default_cost=1)
    alice, bob = idp.mint("alice", extra={"team": "payments"}), idp.mint("bob", extra={"team": "payments"})
    alice_session, bob_session = await gw.session(alice), await gw.session(bob)
    assert [(f["token_id"], f["client_id"]) for f in gw.events.named("session_connect")] == [
        ("test-client", "test-client")] * 2
    assert "result" in (await gw.call(alice, alice_session, "echo")).body
    assert "result" in (await gw.call(bob, bob_session, "echo")).body
    exhausted = await gw.call(alice, alice_session, "echo")  # two subjects, one team budget of 2
    assert exhausted.body["error"]["data"]["error"] == "budget_exhausted", exhausted.body


async def test_a_store_outage_is_503_never_a_401(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()

    async def down(token_id: str) -> bool:
        raise ConnectionError("redis down")

    gw.revoked.is_revoked = down  # type: ignore[method-assign]
    answer = await gw.initialize(idp.mint())
    assert answer.status == 503
    assert answer.headers["Retry-After"] == "1"


# --- sessions: bound to who holds the token -------------------------------------------------------


async def test_a_refreshed_token_of_the_same_subject_and_client_resumes_after_a_restart(
        start: StartGateway, idp: AuthServer) -> None:
    first = await start()
    token = idp.mint("alice")
    session = await first.session(token)
    restarted = await start()  # a new app: empty memory
    refreshed = idp.mint("alice")
    assert refreshed != token
    answer = await restarted.call(refreshed, session, "echo")
    assert answer.status == 200, answer.body
    assert answer.headers["Mcp-Session-Id"] == session


@pytest.mark.parametrize(
    "intruder",
    [
        pytest.param({"subject": "mallory"}, id="another-subject"),
        pytest.param({"subject": "alice", "extra": {"client_id": "other-app"}}, id="same-user-other-client"),
        pytest.param({"subject": "alice", "extra": {"azp": "other-app"}}, id="same-user-other-azp"),
    ],
)
async def test_attack_resume_or_use_someone_elses_session_with_a_valid_token(
        start: StartGateway, idp: AuthServer, intruder: dict[str, Any]) -> None:
    owner_gateway = await start()
    owner = idp.mint("alice")
    session = await owner_gateway.session(owner)
    other = idp.mint(**intruder)
    restarted = await start()
    resumed = await restarted.call(other, session, "echo")
    assert resumed.status == 404
    assert resumed.error == "session_not_found"
    live = await owner_gateway.call(other, session, "echo")
    assert live.status == 404  # OAuth mode answers a mismatch on a live session like an unknown id
    assert (await restarted.call(owner, session, "echo")).status == 200  # the owner is unaffected


async def test_a_token_expired_within_the_clock_skew_still_verifies(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    assert (await gw.initialize(idp.mint(ttl=-10))).status == 200  # 30 s of skew: a clock a little behind passes
    assert_challenged(await gw.initialize(idp.mint(ttl=-120)))


async def test_the_audience_may_be_a_list_and_the_token_names_any_one_of_it(start: StartGateway,
                                                                           idp: AuthServer) -> None:
    gw = await start(oauth_audience=f"api://satgate,{AUDIENCE}")
    assert (await gw.initialize(idp.mint(audience="api://satgate"))).status == 200
    assert (await gw.initialize(idp.mint(audience=["https://elsewhere.example.com", AUDIENCE]))).status == 200
    assert_challenged(await gw.initialize(idp.mint(audience="api://not-us")))
