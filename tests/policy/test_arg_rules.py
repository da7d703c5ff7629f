"""Argument rules try to be broken: values outside the list, numbers that are not numbers, and URL tricks that
a text match would let through."""

from __future__ import annotations

import json
from typing import Any

import pytest

from satgate_mcp.policy.arg_rules import passes, url_passes
from satgate_mcp.policy.control_checks import check_argument
from satgate_mcp.policy.control_values import UrlSpec, parse_url_spec
from satgate_mcp.policy.controls import ArgRule, parse_controls


def rule(**kind: Any) -> ArgRule:
    return parse_controls(json.dumps({"args": [{"tools": ["t"], "field": "f", **kind}]})).args[0]


ONE_OF = rule(one_of=["acme", "globex", 7, True, None])
BOUNDS = rule(min="0.01", max="200")


@pytest.mark.parametrize(("arguments", "ok"), [
    pytest.param({"f": "acme"}, True, id="listed"),
    pytest.param({"f": 7}, True, id="listed-integer"),
    pytest.param({"f": None}, True, id="listed-null"),
    pytest.param({"f": "ACME"}, False, id="other-case"),
    pytest.param({"f": "acme "}, False, id="trailing-space"),
    pytest.param({"f": "evil"}, False, id="unlisted"),
    pytest.param({"f": "7"}, False, id="integer-as-text"),
    pytest.param({"f": 7.0}, False, id="integer-as-float"),
    pytest.param({"f": 1}, False, id="one-is-not-true"),
    pytest.param({"f": ["acme"]}, False, id="list-holding-a-listed-value"),
    pytest.param({"f": {"acme": 1}}, False, id="object"),
    pytest.param({}, False, id="missing"),
    pytest.param({"F": "acme"}, False, id="other-field"),
])
def test_one_of(arguments: dict[str, Any], ok: bool) -> None:
    assert passes(ONE_OF, arguments) is ok


@pytest.mark.parametrize(("value", "ok"), [
    pytest.param(200, True, id="at-max"),
    pytest.param("199.999999", True, id="decimal-string"),
    pytest.param(0.01, True, id="float-at-min"),
    pytest.param("200.000001", False, id="just-over-max"),
    pytest.param(0.009, False, id="under-min"),
    pytest.param(-1, False, id="negative"),
    pytest.param("abc", False, id="not-a-number"),
    pytest.param("1e2", False, id="exponent"),
    pytest.param("NaN", False, id="nan-text"),
    pytest.param(float("nan"), False, id="nan"),
    pytest.param(float("inf"), False, id="infinity"),
    pytest.param(True, False, id="boolean"),
    pytest.param(None, False, id="null"),
    pytest.param("0.0000001", False, id="seven-decimals"),
    pytest.param(10**30, False, id="huge"),
    pytest.param(" 5", False, id="leading-space"),
    pytest.param("\u0665", False, id="non-ascii-digit"),
])
def test_min_max(value: object, ok: bool) -> None:
    assert passes(BOUNDS, {"f": value}) is ok


def test_missing_number_is_refused_and_absent_means_absent() -> None:
    assert not passes(BOUNDS, {})
    absent = rule(absent=True)
    assert passes(absent, {"g": 1})
    assert not passes(absent, {"f": None})
    assert not passes(absent, {"f": ""})


SPEC = parse_url_spec({"hosts": ["api.example.com", "bücher.de"], "path_prefixes": ["/v1/", "/health"],
                       "ports": [8443]}, "t")


@pytest.mark.parametrize("url", [
    pytest.param("https://api.example.com/v1/pay", id="plain"),
    pytest.param("HTTPS://API.Example.COM/v1/pay?x=1#frag", id="case"),
    pytest.param("https://api.example.com./v1/pay", id="trailing-dot"),
    pytest.param("https://api.example.com:443/v1/x", id="default-port-spelled"),
    pytest.param("https://api.example.com:8443/v1/x", id="listed-port"),
    pytest.param("https://api.example.com/health", id="prefix-exactly"),
    pytest.param("https://api.example.com/health/deep", id="below-prefix"),
    pytest.param("https://bücher.de/v1/x", id="idn-unicode"),
    pytest.param("https://xn--bcher-kva.de/v1/x", id="idn-a-label"),
    pytest.param("https://api.example.com/v1/a%20b", id="encoded-space-in-path"),
    pytest.param("https://api.example.com/v1/x?next=https://evil.com/", id="other-host-in-query"),
])
def test_urls_that_pass(url: str) -> None:
    assert url_passes(SPEC, url)


@pytest.mark.parametrize("url", [
    pytest.param("https://evil.com/v1/x", id="other-host"),
    pytest.param("https://api.example.com.evil.com/v1/x", id="allowed-host-as-subdomain"),
    pytest.param("https://evilapi.example.com/v1/x", id="suffix-match"),
    pytest.param("https://x.api.example.com/v1/x", id="subdomain"),
    pytest.param("https://api.example.com@evil.com/v1/x", id="userinfo-allowed-host-as-user"),
    pytest.param("https://user:pw@api.example.com/v1/x", id="userinfo"),
    pytest.param("https://api.example.com:443@evil.com/v1/x", id="userinfo-with-port"),
    pytest.param("https://evil.com\\@api.example.com/v1/x", id="backslash-authority"),
    pytest.param("https://api.example.com\\evil.com/v1/x", id="backslash-host"),
    pytest.param("https://api.example.com/v1\\..\\admin", id="backslash-path"),
    pytest.param("https://api.example.com/v1/../admin", id="dot-dot"),
    pytest.param("https://api.example.com/v1/./x", id="dot"),
    pytest.param("https://api.example.com/v1/%2e%2e/admin", id="encoded-dot-dot"),
    pytest.param("https://api.example.com/v1/%2E%2E/admin", id="encoded-dot-dot-upper"),
    pytest.param("https://api.example.com/v1/.%2e/admin", id="half-encoded"),
    pytest.param("https://api.example.com/v1/%252e%252e/admin", id="double-encoded"),
    pytest.param("https://api.example.com/v1%2f..%2fadmin", id="encoded-slash"),
    pytest.param("https://api.example.com/v1/%5c..%5cadmin", id="encoded-backslash"),
    pytest.param("https://api.example.com/%76%31/x", id="encoded-prefix"),
    pytest.param("https://api.example.com/v1", id="prefix-without-slash"),
    pytest.param("https://api.example.com/health-admin", id="prefix-not-at-boundary"),
    pytest.param("https://api.example.com/admin", id="outside-prefixes"),
    pytest.param("https://api.example.com:8080/v1/x", id="unlisted-port"),
    pytest.param("https://api.example.com:80/v1/x", id="other-schemes-default-port"),
    pytest.param("https://api.example.com:+443/v1/x", id="signed-port"),
    pytest.param("https://api.example.com:٤٤٣/v1/x", id="non-ascii-port"),
    pytest.param("http://api.example.com/v1/x", id="http-not-allowed"),
    pytest.param("ftp://api.example.com/v1/x", id="ftp"),
    pytest.param("javascript:alert(1)//api.example.com/v1/", id="javascript"),
    pytest.param("//api.example.com/v1/x", id="scheme-relative"),
    pytest.param("https:///api.example.com/v1/x", id="empty-authority"),
    pytest.param("https://[::1]/v1/x", id="ipv6"),
    pytest.param("https://exаmple.com/v1/x", id="cyrillic-homograph"),  # noqa: RUF001 - the attack itself
    pytest.param("https://\uff41pi.example.com/v1/x", id="full-width-letter"),
    pytest.param("https://api\u3002example\u3002com/v1/x", id="ideographic-dots"),
    pytest.param("https://api.example.com%2eevil.com/v1/x", id="encoded-dot-in-host"),
    pytest.param("https://api.example.com/v1/\u00e9", id="non-ascii-path"),
    pytest.param(" https://api.example.com/v1/x", id="leading-space"),
    pytest.param("https://api.example.com/v1/x\n", id="newline"),
    pytest.param("https://api.example.com\t/v1/x", id="tab"),
    pytest.param("https://api.example.com/v1/" + "a" * 5000, id="too-long"),
    pytest.param(42, id="not-text"),
    pytest.param(None, id="null"),
])
def test_url_tricks_do_not_pass(url: object) -> None:
    assert not url_passes(SPEC, url)


def test_http_when_listed_and_any_path_without_prefixes() -> None:
    spec = UrlSpec(("127.0.0.1",), (), (), ("http",))
    assert url_passes(spec, "http://127.0.0.1/anything/at/all")
    assert not url_passes(spec, "http://127.0.0.2/")
    assert not url_passes(spec, "http://2130706433/")


def test_a_refusal_says_what_is_allowed_and_never_the_value() -> None:
    secret = "sk-live-0123456789"
    breach = check_argument(ONE_OF, "pay", {"f": secret})
    assert breach is not None
    assert breach.error == "argument_denied"
    assert dict(breach.data) == {"tool": "pay", "field": "f", "allowed": ["acme", "globex", 7, True, None]}
    assert secret not in breach.message + json.dumps(dict(breach.data))
    bounds = check_argument(BOUNDS, "pay", {"f": "9999"})
    assert bounds is not None
    assert bounds.data["allowed"] == {"min": "0.01", "max": "200"}
    assert check_argument(BOUNDS, "pay", {"f": "5"}) is None
