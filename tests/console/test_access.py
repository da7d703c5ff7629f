"""Who may open the console and which requests it answers: the pure decisions, from tables."""

from __future__ import annotations

import pytest

from satgate_mcp.auth.base import Identity
from satgate_mcp.console import access
from satgate_mcp.console.access import Rules

HEADER = Rules("header", "satgate:admin", None, "127.0.0.1")
OAUTH = Rules("oauth", "satgate:admin", None, "0.0.0.0")


@pytest.mark.parametrize(("rules", "identity", "admitted"), [
    pytest.param(HEADER, Identity("ops", admin=True), True, id="header-admin"),
    pytest.param(HEADER, Identity("agent"), False, id="header-ordinary"),
    pytest.param(HEADER, Identity("x", scopes=frozenset({"satgate:admin"})), False, id="header-ignores-scopes"),
    pytest.param(OAUTH, Identity("u", scopes=frozenset({"mcp", "satgate:admin"})), True, id="oauth-scope"),
    pytest.param(OAUTH, Identity("u", scopes=frozenset({"mcp"})), False, id="oauth-without-the-scope"),
    pytest.param(OAUTH, Identity("u", scopes=None), False, id="oauth-no-scopes"),
    pytest.param(OAUTH, Identity("u", admin=True), False, id="oauth-ignores-the-admin-flag"),
    pytest.param(Rules("config", "s", "x" * 32, "127.0.0.1"), Identity("static"), False, id="config-identity"),
    pytest.param(Rules("none", "s", None, "127.0.0.1"), Identity("anonymous"), False, id="none-identity"),
])
def test_who_is_an_admin(rules: Rules, identity: Identity, admitted: bool) -> None:
    assert (access.admits_identity(rules, identity) is None) is admitted


@pytest.mark.parametrize(("rules", "is_open"), [
    pytest.param(Rules("none", "s", None, "127.0.0.1"), True, id="none-on-loopback"),
    pytest.param(Rules("none", "s", None, "::1"), True, id="none-on-loopback-v6"),
    pytest.param(Rules("none", "s", None, "0.0.0.0"), False, id="none-on-every-address"),
    pytest.param(Rules("none", "s", "x" * 32, "127.0.0.1"), False, id="none-with-a-console-secret"),
    pytest.param(Rules("config", "s", None, "127.0.0.1"), False, id="config"),
    pytest.param(HEADER, False, id="header"),
])
def test_only_none_on_loopback_without_a_secret_is_open(rules: Rules, is_open: bool) -> None:
    assert rules.open is is_open


@pytest.mark.parametrize(("presented", "matches"), [
    pytest.param("s" * 32, True, id="the-secret"),
    pytest.param("s" * 31, False, id="a-prefix"),
    pytest.param("s" * 33, False, id="longer"),
    pytest.param("", False, id="empty"),
    pytest.param("é" * 32, False, id="not-ascii"),
])
def test_the_console_secret_is_compared_exactly(presented: str, matches: bool) -> None:
    assert access.matches_secret(Rules("config", "s", "s" * 32, "127.0.0.1"), presented) is matches
    assert not access.matches_secret(Rules("config", "s", None, "127.0.0.1"), presented)


@pytest.mark.parametrize(("origin", "host", "scheme", "same"), [
    pytest.param("http://127.0.0.1:9100", "127.0.0.1:9100", "http", True, id="same"),
    pytest.param("http://127.0.0.1:9100/", "127.0.0.1:9100", "http", False, id="no-browser-sends-a-slash"),
    pytest.param("https://gw.example.com", "gw.example.com", "https", True, id="default-port"),
    pytest.param("https://gw.example.com:443", "gw.example.com", "https", True, id="explicit-default-port"),
    pytest.param("http://[::1]:9100", "[::1]:9100", "http", True, id="ipv6"),
    pytest.param("http://evil.example:9100", "127.0.0.1:9100", "http", False, id="another-host"),
    pytest.param("http://127.0.0.1:9101", "127.0.0.1:9100", "http", False, id="another-port"),
    pytest.param("https://127.0.0.1:9100", "127.0.0.1:9100", "http", False, id="another-scheme"),
    pytest.param("null", "127.0.0.1:9100", "http", False, id="null"),
    pytest.param(None, "127.0.0.1:9100", "http", False, id="missing"),
    pytest.param("http://127.0.0.1:9100@evil.example", "127.0.0.1:9100", "http", False, id="userinfo-trick"),
    pytest.param("http://127.0.0.1:9100/path", "127.0.0.1:9100", "http", False, id="a-path"),
    pytest.param("http://[::1", "[::1]:9100", "http", False, id="unclosed-ipv6"),
    pytest.param("http://127.0.0.1:9100", None, "http", False, id="no-host-header"),
])
def test_same_origin(origin: str | None, host: str | None, scheme: str, same: bool) -> None:
    assert access.same_origin(origin, host, scheme) is same


@pytest.mark.parametrize(("fetch_site", "refused"), [
    pytest.param(None, False, id="older-browser"),
    pytest.param("same-origin", False, id="same-origin"),
    pytest.param("same-site", True, id="same-site-is-not-enough"),
    pytest.param("cross-site", True, id="cross-site"),
])
def test_a_post_must_come_from_the_console_itself(fetch_site: str | None, refused: bool) -> None:
    found = access.check_post(origin="http://127.0.0.1:9100", host_header="127.0.0.1:9100", scheme="http",
                              fetch_site=fetch_site)
    assert (found is not None) is refused


@pytest.mark.parametrize(("now", "token_expiry", "expected"), [
    pytest.param(1000.0, None, 1000.0 + 8 * 3600, id="eight-hours"),
    pytest.param(1000.0, 1600.0, 1600.0, id="never-past-the-token"),
    pytest.param(1000.0, 1e12, 1000.0 + 8 * 3600, id="a-long-token-still-eight-hours"),
])
def test_a_cookie_lives_at_most_eight_hours_and_never_past_its_token(now: float, token_expiry: float | None,
                                                                     expected: float) -> None:
    assert access.cookie_expiry(now, token_expiry) == expected


@pytest.mark.parametrize(("presented", "refused"), [
    pytest.param("abc", False, id="the-token"),
    pytest.param("abd", True, id="another"),
    pytest.param(None, True, id="missing"),
    pytest.param("", True, id="empty"),
    pytest.param("ab\u00e9", True, id="not-ascii"),
])
def test_csrf(presented: str | None, refused: bool) -> None:
    assert (access.check_csrf("abc", presented) is not None) is refused
