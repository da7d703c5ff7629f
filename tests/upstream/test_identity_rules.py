"""The pure rules of an upstream's ``"auth"``: which grant, whether a cached token is good, what an answer means."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from satgate_mcp.upstream.authorized import merged_headers
from satgate_mcp.upstream.identity import (
    CachedToken,
    TokenCache,
    grant_for,
    is_fresh,
    refresh_in,
    sends_identity,
    usable,
)
from satgate_mcp.upstream.token_client import (
    ACCESS_TOKEN_TYPE,
    TOKEN_EXCHANGE_GRANT,
    IssuedToken,
    Refused,
    basic_authorization,
    grant_form,
    read_token_response,
)
from satgate_mcp.upstream_auth_spec import ClientCredentialsSpec, TokenExchangeSpec, per_caller


@pytest.mark.parametrize(("auth_type", "has_caller", "grant"), [
    pytest.param("token_exchange", True, "token_exchange", id="exchange-for-a-caller"),
    pytest.param("token_exchange", False, "client_credentials", id="gateway-lists-as-itself"),
    pytest.param("client_credentials", True, "client_credentials", id="cc-with-a-caller"),
    pytest.param("client_credentials", False, "client_credentials", id="cc-without-a-caller"),
])
def test_which_grant(auth_type: str, has_caller: bool, grant: str) -> None:
    assert grant_for(auth_type, has_caller) == grant


@pytest.mark.parametrize(("expires_at", "now", "fresh"), [
    pytest.param(1000.0, 900.0, True, id="well-before"),
    pytest.param(1000.0, 969.9, True, id="just-outside-the-margin"),
    pytest.param(1000.0, 970.0, False, id="thirty-seconds-before-is-refreshed"),
    pytest.param(1000.0, 1000.0, False, id="expired"),
    pytest.param(1000.0, 2000.0, False, id="long-expired"),
])
def test_a_token_is_fresh_until_thirty_seconds_before_expiry(expires_at: float, now: float, fresh: bool) -> None:
    assert is_fresh(expires_at, now) is fresh


@pytest.mark.parametrize(("expires_at", "now", "wait"), [
    pytest.param(1000.0, 0.0, 970.0, id="as-it-enters-the-margin"),
    pytest.param(1000.0, 980.0, 1.0, id="already-in-the-margin-soon-not-at-once"),
    pytest.param(None, 0.0, 30.0, id="none-cached-retry"),
])
def test_when_the_gateways_own_token_is_fetched_again(expires_at: float | None, now: float, wait: float) -> None:
    assert refresh_in(expires_at, now, retry=30.0) == wait


ALICE, BOB = b"a" * 32, b"b" * 32


@pytest.mark.parametrize(("entry", "origin", "ok"), [
    pytest.param(None, ALICE, False, id="nothing-cached"),
    pytest.param(CachedToken("t", 1000.0, ALICE), ALICE, True, id="same-caller-token"),
    pytest.param(CachedToken("t", 1000.0, ALICE), BOB, False, id="another-caller-token-never"),
    pytest.param(CachedToken("t", 1000.0, None), ALICE, False, id="gateway-token-is-not-a-callers"),
    pytest.param(CachedToken("t", 1000.0, None), None, True, id="gateway-token"),
    pytest.param(CachedToken("t", 910.0, ALICE), ALICE, False, id="ageing"),
])
def test_a_cached_token_serves_only_the_token_it_was_obtained_for(entry: CachedToken | None, origin: bytes | None,
                                                                  ok: bool) -> None:
    assert usable(entry, origin, 900.0) is ok


@pytest.mark.parametrize(("forward", "has_caller", "sent"), [
    pytest.param(True, True, True, id="forwarded-for-a-caller"),
    pytest.param(True, False, False, id="gateway-requests-name-nobody"),
    pytest.param(False, True, False, id="not-forwarded"),
])
def test_when_the_identity_header_goes(forward: bool, has_caller: bool, sent: bool) -> None:
    assert sends_identity(forward, has_caller) is sent


def _body(document: object) -> bytes:
    return json.dumps(document).encode()


@pytest.mark.parametrize(("status", "body", "answer"), [
    pytest.param(200, _body({"access_token": "abc", "token_type": "Bearer", "expires_in": 60}), IssuedToken("abc", 60),
                 id="bearer"),
    pytest.param(200, _body({"access_token": "abc", "token_type": "N_A", "expires_in": 60}), IssuedToken("abc", 60),
                 id="rfc8693-n_a"),
    pytest.param(200, _body({"access_token": "abc", "token_type": "bearer"}), IssuedToken("abc", 300),
                 id="no-lifetime-default"),
    pytest.param(200, _body({"access_token": "abc", "token_type": "DPoP"}), Refused("unsupported_token_type", 200),
                 id="not-bearer"),
    pytest.param(200, _body({"access_token": "a b"}), Refused("invalid_response", 200), id="token-with-space"),
    pytest.param(200, b"<html>", Refused("invalid_response", 200), id="not-json"),
    pytest.param(400, _body({"error": "invalid_grant", "error_description": "secret stuff"}),
                 Refused("invalid_grant", 400), id="refusal-keeps-only-the-code"),
    pytest.param(401, _body({"error": "bad\ncode"}), Refused("invalid_response", 401), id="a-code-with-controls"),
    pytest.param(503, b"", Refused("server_error", 503), id="empty-error"),
    pytest.param(200, _body({"error": "access_denied"}), Refused("access_denied", 200), id="error-in-a-200"),
])
def test_token_responses(status: int, body: bytes, answer: IssuedToken | Refused) -> None:
    assert read_token_response(status, body) == answer


BASE: dict[str, Any] = {"token_endpoint": "https://idp.example.com/token", "client_id": "gw",
                        "client_secret_env": "HOME"}


def test_a_token_exchange_form_names_the_callers_token_and_the_upstream() -> None:
    spec = TokenExchangeSpec(type="token_exchange", audience="files", resource="https://files/mcp", scope="read",
                             **BASE)
    assert grant_form(spec, "caller-token") == {
        "grant_type": TOKEN_EXCHANGE_GRANT, "subject_token": "caller-token", "subject_token_type": ACCESS_TOKEN_TYPE,
        "requested_token_type": ACCESS_TOKEN_TYPE, "audience": "files", "resource": "https://files/mcp",
        "scope": "read"}
    assert grant_form(spec, None) == {"grant_type": "client_credentials", "audience": "files",
                                      "resource": "https://files/mcp", "scope": "read"}


def test_basic_authorization_form_encodes_both_parts() -> None:
    header = basic_authorization("gw:1", "p@ss word")
    assert base64.b64decode(header.removeprefix("Basic ")).decode() == "gw%3A1:p%40ss%20word"


@pytest.mark.parametrize(("configured", "credential", "sent"), [
    pytest.param({"X-A": "1"}, {"Authorization": "Bearer t"}, {"X-A": "1", "Authorization": "Bearer t"},
                 id="added"),
    pytest.param({"authorization": "Bearer static"}, {"Authorization": "Bearer t"}, {"Authorization": "Bearer t"},
                 id="a-static-one-never-beside-it"),
    pytest.param({"X-Satgate-Identity": "forged"}, {}, {}, id="no-identity-header-but-the-gateways"),
])
def test_the_credential_replaces_configured_headers(configured: dict[str, str], credential: dict[str, str],
                                                    sent: dict[str, str]) -> None:
    assert merged_headers(configured, credential) == sent


def test_per_caller_modes() -> None:
    exchange = TokenExchangeSpec(type="token_exchange", **BASE)
    assert per_caller(exchange)
    assert per_caller(ClientCredentialsSpec(type="client_credentials", forward_identity=True, **BASE))
    assert not per_caller(ClientCredentialsSpec(type="client_credentials", **BASE))
    assert not per_caller(None)


async def test_single_flight_one_fetch_for_a_hundred_callers() -> None:
    now = [0.0]
    cache = TokenCache(clock=lambda: now[0])
    release = asyncio.Event()
    fetches = 0

    async def fetch() -> IssuedToken:
        nonlocal fetches
        fetches += 1
        await release.wait()
        return IssuedToken(f"t{fetches}", 100.0)

    waiting = [asyncio.ensure_future(cache.get(("s", "u", ""), None, fetch)) for _ in range(100)]
    await asyncio.sleep(0)
    release.set()
    assert set(await asyncio.gather(*waiting)) == {"t1"}
    now[0] = 69.0  # 31 s before expiry: still fresh
    assert await cache.get(("s", "u", ""), None, fetch) == "t1"
    now[0] = 71.0  # within the margin: refreshed ahead of expiry, once
    again = await asyncio.gather(*(cache.get(("s", "u", ""), None, fetch) for _ in range(100)))
    assert set(again) == {"t2"}
    assert fetches == 2


async def test_a_refused_fetch_reaches_every_waiter_and_is_not_cached() -> None:
    cache = TokenCache(clock=lambda: 0.0)
    calls = 0

    async def refuse() -> IssuedToken:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        raise RuntimeError("refused")

    results = await asyncio.gather(*(cache.get(("s", "u", ""), None, refuse) for _ in range(10)),
                                   return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert calls == 1
    assert len(cache) == 0


def test_drop_only_forgets_the_token_that_was_refused() -> None:
    cache = TokenCache(clock=lambda: 0.0)
    cache._entries[("s", "u", "")] = CachedToken("new", 100.0, None)
    assert not cache.drop(("s", "u", ""), "old")
    assert cache.drop(("s", "u", ""), "new")
    assert len(cache) == 0


async def test_a_revoked_callers_tokens_are_dropped_and_no_one_elses() -> None:
    cache = TokenCache(clock=lambda: 0.0)
    cache._entries[("alice", "u", "")] = CachedToken("ta", 100.0, ALICE, ("alice",))
    cache._entries[("bob", "u", "")] = CachedToken("tb", 100.0, BOB, ("bob",))
    cache._entries[("", "u", "")] = CachedToken("gw", 100.0, None)

    async def revoked(token_id: str) -> bool:
        return token_id == "alice"

    assert await cache.drop_revoked(revoked) == 1
    assert cache.expires_at(("alice", "u", "")) is None
    assert cache.expires_at(("bob", "u", "")) == 100.0
    assert cache.expires_at(("", "u", "")) == 100.0
