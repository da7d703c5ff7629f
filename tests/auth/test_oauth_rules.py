"""The pure rules of OAuth mode: settings, discovery locations, scopes, token ids, the session binding."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from satgate_mcp.addresses import secure_url_problem
from satgate_mcp.auth.base import Identity, required_scope
from satgate_mcp.auth.oauth import scope_set, session_binding, token_id_for
from satgate_mcp.auth.oauth_keys import discovery_urls
from satgate_mcp.settings import Settings, resource_metadata_url_for
from satgate_mcp.transport import rules

ISSUER = "https://idp.example.com/realms/acme"
AUDIENCE = "https://mcp.example.com/mcp"


def oauth(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"auth_mode": "oauth", "oauth_issuer": ISSUER, "oauth_audience": AUDIENCE}
    values.update(overrides)
    return Settings(**values)


def test_the_metadata_url_and_the_authorization_server_follow_from_the_audience_and_the_issuer() -> None:
    settings = oauth()
    assert settings.oauth_audience == [AUDIENCE]
    assert settings.oauth_resource_metadata_url == "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
    assert settings.oauth_authorization_servers == [ISSUER]


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        pytest.param({"oauth_issuer": None}, "SATGATE_OAUTH_ISSUER is required", id="no-issuer"),
        pytest.param({"oauth_audience": ""}, "SATGATE_OAUTH_AUDIENCE is required", id="no-audience"),
        pytest.param({"oauth_issuer": "http://idp.example.com"}, "https://", id="plain-http-issuer"),
        pytest.param({"oauth_jwks_url": "http://10.0.0.1/jwks"}, "https://", id="plain-http-keys-off-loopback"),
        pytest.param({"oauth_issuer": "https://idp.example.com/?x=1"}, "query", id="issuer-with-query"),
        pytest.param({"oauth_audience": "api://gw"}, "RESOURCE_METADATA_URL is required", id="no-url-audience"),
        pytest.param({"oauth_tool_scopes": '{"db_*": "has space"}'}, "scope token", id="scope-with-space"),
        pytest.param({"oauth_tool_scopes": '{"db_*": "quo\\"te"}'}, "scope token", id="scope-with-quote"),
        pytest.param({"oauth_tool_scopes": '{"d*b": "read"}'}, "invalid tool pattern", id="bad-pattern"),
        pytest.param({"oauth_id_claim": "a b"}, "claim name", id="bad-claim"),
    ],
)
def test_oauth_mode_refuses_to_start_on_settings_it_cannot_honour(overrides: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        oauth(**overrides)


def test_an_explicit_metadata_url_and_loopback_http_are_accepted() -> None:
    settings = oauth(oauth_issuer="http://127.0.0.1:8080", oauth_audience="api://gw,http://127.0.0.1:9100/mcp",
                     oauth_resource_metadata_url="https://gw.example.com/.well-known/oauth-protected-resource")
    assert settings.oauth_resource_metadata_url == "https://gw.example.com/.well-known/oauth-protected-resource"
    assert settings.oauth_audience == ["api://gw", "http://127.0.0.1:9100/mcp"]


@pytest.mark.parametrize(
    ("url", "secure"),
    [
        ("https://idp.example.com", True),
        ("http://127.0.0.1:8080/realms/x", True),
        ("http://[::1]:8080", True),
        ("http://localhost:8080", True),
        ("http://idp.example.com", False),
        ("http://127.0.0.1.evil.example", False),
        ("ftp://idp.example.com", False),
        ("https://", False),
    ],
)
def test_keys_come_over_https_or_from_this_machine_only(url: str, secure: bool) -> None:
    assert (secure_url_problem(url) is None) is secure


@pytest.mark.parametrize(
    ("issuer", "urls"),
    [
        ("https://idp.example.com", ["https://idp.example.com/.well-known/oauth-authorization-server",
                                     "https://idp.example.com/.well-known/openid-configuration"]),
        ("https://idp.example.com/realms/acme/", [
            "https://idp.example.com/.well-known/oauth-authorization-server/realms/acme",
            "https://idp.example.com/realms/acme/.well-known/openid-configuration"]),
    ],
)
def test_discovery_tries_rfc_8414_then_openid_connect(issuer: str, urls: list[str]) -> None:
    assert discovery_urls(issuer) == urls


SCOPES = {"db_write": "db:admin", "db_*": "db:read", "db_write_*": "db:write", "*": "mcp"}


@pytest.mark.parametrize(
    ("tool", "scope"),
    [
        ("db_write", "db:admin"),  # the exact name beats every prefix
        ("db_write_rows", "db:write"),  # the longest prefix wins
        ("db_query", "db:read"),
        ("echo", "mcp"),  # only '*' matches
    ],
)
def test_the_most_specific_pattern_names_the_scope(tool: str, scope: str) -> None:
    assert required_scope(SCOPES, tool) == scope


def test_a_tool_no_pattern_matches_needs_no_scope() -> None:
    identity = Identity(token_id="alice", scopes=frozenset(), tool_scopes={"db_*": "db:read"})
    assert identity.missing_scope("echo") is None
    assert identity.missing_scope("db_query") == "db:read"
    assert Identity(token_id="macaroon").missing_scope("db_query") is None  # scopes do not apply outside OAuth


@pytest.mark.parametrize(
    ("claims", "scopes"),
    [
        ({"scope": "a b  c"}, {"a", "b", "c"}),
        ({"scp": ["a", "b", 3]}, {"a", "b"}),
        ({"scp": "a b"}, {"a", "b"}),
        ({"scope": 7}, set()),
        ({}, set()),
    ],
)
def test_scopes_are_read_from_scope_and_scp(claims: dict[str, Any], scopes: set[str]) -> None:
    assert scope_set(claims) == scopes


def test_a_subject_outside_the_token_id_alphabet_becomes_a_stable_digest() -> None:
    assert token_id_for("auth0|5f7c8ec7c33c6c004bbafe82") == "auth0|5f7c8ec7c33c6c004bbafe82"
    odd = token_id_for("user with spaces\n")
    assert odd.startswith("sub-")
    assert odd == token_id_for("user with spaces\n")
    assert len(odd) == 44


def test_the_session_binding_separates_issuers_subjects_and_clients() -> None:
    bindings = {session_binding(i, s, c) for i in ("https://a", "https://b") for s in ("alice", "bob")
                for c in ("", "cli")}
    assert len(bindings) == 8
    # no field can run into the next: a subject containing the separator text does not collide
    assert session_binding("https://a", "alice\x00cli", "") != session_binding("https://a", "alice", "cli\x00")


def test_insufficient_scope_is_a_403_challenge_naming_what_to_ask_for() -> None:
    refusal = rules.insufficient_scope("db:write", frozenset({"mcp", "db:read"}),
                                       "https://gw.example.com/.well-known/oauth-protected-resource/mcp")
    assert refusal.status == 403
    assert refusal.headers["WWW-Authenticate"] == (
        'Bearer realm="satgate-mcp", error="insufficient_scope", scope="db:read db:write mcp", '
        'resource_metadata="https://gw.example.com/.well-known/oauth-protected-resource/mcp"')
    assert refusal.body(7)["error"]["data"] == {"error": "insufficient_scope", "scope": "db:write"}


def test_resource_metadata_url_uses_the_first_url_audience() -> None:
    assert resource_metadata_url_for(["api://x", "https://gw.example.com/mcp/"]) == (
        "https://gw.example.com/.well-known/oauth-protected-resource/mcp")
    assert resource_metadata_url_for(["api://x"]) is None
