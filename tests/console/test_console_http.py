"""The console over HTTP (``create_app`` in this process, no browser): who gets in, what the cookie is, which
requests are refused. Every rule here is tried as an attack: an anonymous visitor, an ordinary token, a forged
cookie, a cross-site POST, a POST without its CSRF token, a revoked admin, a Host the gateway does not serve."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.base import AuthOutcome, AuthResult, Identity, token_hash
from satgate_mcp.auth.macaroons import add_caveats, mint_token, verify_token
from satgate_mcp.console.access import COOKIE_NAME, MAX_COOKIE_SECONDS
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.keys import CONSOLE, REGISTRY
from satgate_mcp.settings import Settings
from tests.fakes import FakePool

KEY = "console-test-root-key-0123456789-abcdefghij"
ADMIN = mint_token(KEY, "ops-admin", admin=True, ttl=3600)
AGENT = mint_token(KEY, "agent-1")
Client = TestClient[Any, Any]
Start = Callable[..., Awaitable[Client]]
SAME = {"Origin": "http://127.0.0.1"}


@pytest.fixture
def start(aiohttp_client: AiohttpClient, tmp_path: Path) -> Start:
    async def go(**values: Any) -> Client:
        settings = Settings(**{"auth_mode": "header", "root_key": KEY, "state_dir": "memory", **values})
        return await aiohttp_client(create_app(settings, pool=FakePool(), publisher=RecordingPublisher()),
                                    headers={"Host": "127.0.0.1"})

    return go


async def login(client: Client, token: str, origin: str = "http://127.0.0.1") -> Any:
    return await client.post("/console/login", data={"token": token}, headers={"Origin": origin},
                             allow_redirects=False)


async def csrf(client: Client) -> str:
    answer = await client.get("/console/api/me")
    assert answer.status == 200
    return str((await answer.json())["csrf"])


async def test_an_admin_token_logs_in_with_a_strict_cookie_that_never_outlives_it(start: Start) -> None:
    client = await start()
    answer = await login(client, ADMIN)
    assert answer.status == 303
    assert answer.headers["Location"] == "/console"
    cookie = answer.cookies[COOKIE_NAME]
    assert cookie["httponly"]
    assert cookie["samesite"] == "Strict"
    assert cookie["path"] == "/console"
    assert 0 < int(cookie["max-age"]) <= 3600 < MAX_COOKIE_SECONDS
    assert ADMIN not in cookie.value
    assert ADMIN not in answer.headers.get("Location", "")
    me = await (await client.get("/console/api/me")).json()
    assert me["who"] == "ops-admin"
    assert me["via"] == "cookie"


@pytest.mark.parametrize(("token", "status"), [
    pytest.param(AGENT, 403, id="ordinary-token"),
    pytest.param(add_caveats(AGENT, tools=["echo"]), 403, id="narrowed-ordinary-token"),
    pytest.param("not-a-token", 401, id="garbage"),
    pytest.param(mint_token("another-root-key-0123456789-abcdefghijk", "x", admin=True), 401, id="foreign-key"),
    pytest.param("", 401, id="empty"),
])
async def test_only_an_admin_credential_gets_a_cookie(start: Start, token: str, status: int) -> None:
    client = await start()
    answer = await login(client, token)
    assert answer.status == status
    assert COOKIE_NAME not in answer.cookies
    text = await answer.text()
    assert (token not in text) if token else True
    assert (await client.get("/console/api/overview")).status == 401


async def test_an_ordinary_token_never_reads_the_api(start: Start) -> None:
    client = await start()
    answer = await client.get("/console/api/sessions", headers={"Authorization": f"Bearer {AGENT}"})
    assert answer.status == 403


async def test_an_anonymous_visitor_gets_the_login_form_and_nothing_else(start: Start) -> None:
    client = await start()
    page = await client.get("/console")
    assert page.status == 200
    assert 'action="/console/login"' in await page.text()
    for path in ("me", "overview", "sessions", "upstreams", "tokens", "approvals", "policy"):
        assert (await client.get(f"/console/api/{path}")).status == 401


@pytest.mark.parametrize("origin", [
    pytest.param("http://evil.example", id="another-site"),
    pytest.param("null", id="null-origin"),
    pytest.param("https://127.0.0.1", id="another-scheme"),
    pytest.param("http://127.0.0.1:1", id="another-port"),
])
async def test_a_cross_site_post_is_refused_even_with_the_cookie_and_csrf(start: Start, origin: str) -> None:
    client = await start()
    await login(client, ADMIN)
    token = await csrf(client)
    answer = await client.post("/console/api/tokens/revoke", json={"token_id": "agent-1"},
                               headers={"Origin": origin, "X-CSRF-Token": token})
    assert answer.status == 403
    assert (await login(client, ADMIN, origin)).status == 403


async def test_a_post_without_its_csrf_token_is_refused(start: Start) -> None:
    client = await start()
    await login(client, ADMIN)
    for headers in (SAME, {**SAME, "X-CSRF-Token": "guessed"}, {}):
        answer = await client.post("/console/api/tokens/revoke", json={"token_id": "agent-1"}, headers=headers)
        assert answer.status == 403


async def test_a_forged_cookie_is_no_login(start: Start) -> None:
    client = await start()
    client.session.cookie_jar.update_cookies({COOKIE_NAME: "A" * 200})
    assert (await client.get("/console/api/me")).status == 401


async def test_revoking_an_admin_ends_its_console_session_at_once(start: Start) -> None:
    client = await start()
    await login(client, ADMIN)
    token = await csrf(client)
    answer = await client.post("/console/api/tokens/revoke", json={"token_id": "ops-admin"},
                               headers={**SAME, "X-CSRF-Token": token})
    assert answer.status == 200
    assert (await client.get("/console/api/me")).status == 401


async def test_a_script_reads_and_acts_with_a_bearer_header(start: Start) -> None:
    client = await start()
    bearer = {"Authorization": f"Bearer {ADMIN}"}
    assert (await client.get("/console/api/overview", headers=bearer)).status == 200
    answer = await client.post("/console/api/tokens/revoke", json={"token_id": "agent-1"}, headers=bearer)
    assert answer.status == 200
    assert (await answer.json()) == {"revoked": "agent-1"}
    assert await client.app[CONSOLE].stores.revocations.is_revoked("agent-1")


async def test_every_answer_carries_the_security_headers(start: Start) -> None:
    client = await start()
    for path in ("/console", "/console/static/console.js", "/console/api/me"):
        headers = (await client.get(path)).headers
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert "unsafe-inline" not in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Cache-Control"] == "no-store"
        assert headers["Referrer-Policy"] == "same-origin"


async def test_a_host_the_gateway_does_not_serve_is_refused(start: Start) -> None:
    """DNS rebinding: a page on evil.example that resolves to 127.0.0.1 must not read the console."""
    client = await start(auth_mode="none", root_key=None)
    answer = await client.get("/console/api/sessions", headers={"Host": "evil.example:9100"})
    assert answer.status == 421


async def test_the_open_mode_reads_without_login_but_acts_only_from_its_page(start: Start) -> None:
    client = await start(auth_mode="none", root_key=None)
    page = await client.get("/console")
    assert "Open console" in await page.text()
    assert (await client.get("/console/api/overview")).status == 200
    answer = await client.post("/console/api/sessions/end", json={"id": "x"}, headers=SAME)
    assert answer.status == 403  # no CSRF token: the open mode's cookie carries it
    token = await csrf(client)
    answer = await client.post("/console/api/sessions/end", json={"id": "x"}, headers={**SAME, "X-CSRF-Token": token})
    assert answer.status == 404


async def test_the_console_secret_of_config_mode_logs_in_and_the_shared_token_does_not(start: Start) -> None:
    secret = "console-secret-0123456789-0123456789"
    client = await start(auth_mode="config", root_key=None, static_token="shared-static-token-0123456789",
                         console_token=secret)
    assert (await login(client, "shared-static-token-0123456789")).status == 403
    assert (await login(client, secret)).status == 303


async def test_off_serves_nothing(start: Start) -> None:
    client = await start(console="off")
    assert (await client.get("/console")).status == 404
    assert (await client.get("/console/api/me", headers={"Authorization": f"Bearer {ADMIN}"})).status == 404


async def test_ten_thousand_sessions_come_one_bounded_page_at_a_time(start: Start) -> None:
    client = await start(session_cap=20_000, sessions_per_token=20_000)
    registry = client.app[REGISTRY]
    agent = verify_token(KEY, AGENT, now=0)
    for _ in range(10_000):
        registry.open(AGENT, agent, "2025-11-25")
    bearer = {"Authorization": f"Bearer {ADMIN}"}
    answer = await client.get("/console/api/sessions?limit=100&offset=9950", headers=bearer)
    body = await answer.json()
    assert body["total"] == 10_000
    assert body["matched"] == 10_000
    assert len(body["items"]) == 50
    assert len(await answer.read()) < 64 * 1024
    assert token_hash(AGENT) not in await answer.text()
    assert AGENT not in await answer.text()
    assert (await client.get("/console/api/sessions?limit=10000", headers=bearer)).status == 400
    found = await (await client.get(f"/console/api/sessions?q={body['items'][0]['id']}", headers=bearer)).json()
    assert found["matched"] == 1


def test_the_console_adds_nothing_to_a_request_for_mcp() -> None:
    """No middleware, no response hook: the console's checks run in its own handlers only."""
    values: list[dict[str, Any]] = [{"auth_mode": "header", "root_key": KEY, "state_dir": "memory", "console": mode}
                                    for mode in ("on", "off")]
    apps = [create_app(Settings(**v), pool=FakePool(), publisher=RecordingPublisher()) for v in values]
    on, off = ([getattr(m, "__qualname__", repr(m)) for m in app.middlewares] for app in apps)
    assert on == off
    assert len(apps[0].on_response_prepare) == len(apps[1].on_response_prepare)
    mcp_routes = [[r.handler for r in app.router.routes() if r.resource is not None
                   and r.resource.canonical == "/mcp"] for app in apps]
    assert len(mcp_routes[0]) == len(mcp_routes[1])


async def test_a_login_on_one_process_holds_on_another_with_the_same_root_key(start: Start) -> None:
    first, second = await start(), await start()
    await login(first, ADMIN)
    cookie = first.session.cookie_jar.filter_cookies(first.make_url("/console"))[COOKIE_NAME].value
    second.session.cookie_jar.update_cookies({COOKIE_NAME: cookie})
    assert (await second.get("/console/api/me")).status == 200


async def test_the_first_page_load_is_small(start: Start) -> None:
    client = await start()
    await login(client, ADMIN)
    sizes = [len(await (await client.get(path)).read())
             for path in ("/console", "/console/static/console.css", "/console/static/console.js",
                          "/console/api/me", "/console/api/overview")]
    assert sum(sizes) < 150 * 1024


async def test_explain_walks_the_rules_in_force_for_a_verified_token(start: Start, tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"rules": [{"name": "no-secrets", "tools": ["secret_tool"], "effect": "deny",
                                             "when": "token.id == 'agent-1'", "reason": "not for agents"}]}))
    client = await start(policy_file=str(policy))
    bearer = {"Authorization": f"Bearer {ADMIN}"}
    answer = await client.post("/console/api/policy/explain", headers=bearer,
                               json={"token": AGENT, "tool": "secret_tool", "args": {}})
    body = await answer.json()
    assert answer.status == 200, body
    assert body["decision"]["rule"] == "no-secrets"
    assert body["report"][-1] == "decision: deny by no-secrets: not for agents"
    forged = await client.post("/console/api/policy/explain", headers=bearer,
                               json={"token": AGENT + "x", "tool": "secret_tool"})
    assert forged.status == 400
    assert AGENT not in await forged.text()
    assert (await client.get("/console/api/policy", headers=bearer)).status == 200


class ScopedTokens:
    """An OAuth authenticator's outcomes without an IdP: ``scoped`` holds the console scope, ``plain`` does not."""

    mode = "oauth"

    async def authenticate(self, authorization: str | None) -> AuthResult:
        token = (authorization or "").removeprefix("Bearer ")
        scopes = {"scoped": frozenset({"mcp", "satgate:admin"}), "plain": frozenset({"mcp"})}.get(token)
        if scopes is None:
            return AuthResult(AuthOutcome.INVALID, reason="unknown")
        return AuthResult(AuthOutcome.OK, Identity(f"user-{token}", scopes=scopes), token)

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize(("token", "status"), [
    pytest.param("scoped", 303, id="the-console-scope"),
    pytest.param("plain", 403, id="without-it"),
])
async def test_oauth_mode_needs_the_console_scope(aiohttp_client: AiohttpClient, token: str, status: int) -> None:
    values: dict[str, Any] = {"auth_mode": "oauth", "oauth_issuer": "https://idp.example.com",
                              "oauth_audience": "https://gw.example.com/mcp", "state_dir": "memory"}
    app = create_app(Settings(**values), authenticator=ScopedTokens(), pool=FakePool(), publisher=RecordingPublisher())
    client = await aiohttp_client(app, headers={"Host": "127.0.0.1"})
    assert (await login(client, token)).status == status


async def test_logout_needs_the_consoles_own_post_and_ends_the_cookie(start: Start) -> None:
    client = await start()
    await login(client, ADMIN)
    token = await csrf(client)
    crossed = await client.post("/console/logout", headers={"Origin": "http://evil.example", "X-CSRF-Token": token},
                                allow_redirects=False)
    assert crossed.status == 403
    assert (await client.get("/console/api/me")).status == 200
    answer = await client.post("/console/logout", headers={**SAME, "X-CSRF-Token": token}, allow_redirects=False)
    assert answer.status == 303
    assert (await client.get("/console/api/me")).status == 401
