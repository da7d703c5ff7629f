"""The status decisions of /mcp, as tables: each row is one rule a client can rely on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import AuthOutcome
from satgate_mcp.sessions import RegistryFull, TokenSessionsBusy
from satgate_mcp.transport import origins, rules
from satgate_mcp.transport.rules import Post, Refusal, Rejected

METADATA_URL = "https://gw.example/.well-known/oauth-protected-resource"
LOOPBACK_BIND = "127.0.0.1"


def assert_refused(refusal: Refusal | None, status: int, error: str) -> Refusal:
    assert refusal is not None, f"expected {status} {error}, got a pass"
    assert (refusal.status, refusal.error) == (status, error)
    return refusal


@pytest.mark.parametrize(
    ("host", "allowed", "bind", "refused"),
    [
        pytest.param("127.0.0.1:9100", [], LOOPBACK_BIND, False, id="ipv4-loopback"),
        pytest.param("127.0.0.2", [], LOOPBACK_BIND, False, id="ipv4-loopback-range"),
        pytest.param("localhost:9100", [], LOOPBACK_BIND, False, id="localhost"),
        pytest.param("LOCALHOST", [], LOOPBACK_BIND, False, id="localhost-upper-case"),
        pytest.param("[::1]:9100", [], LOOPBACK_BIND, False, id="ipv6-loopback"),
        pytest.param("app.localhost:9100", [], LOOPBACK_BIND, False, id="dot-localhost"),
        pytest.param("localhost", [], "0.0.0.0", False, id="loopback-on-public-bind"),
        pytest.param("evil.example", [], LOOPBACK_BIND, True, id="foreign-on-loopback-bind"),
        pytest.param("127.0.0.1.nip.io:9100", [], LOOPBACK_BIND, True, id="rebinding-name"),
        pytest.param("localhost.evil.example", [], LOOPBACK_BIND, True, id="localhost-prefix"),
        pytest.param("10.0.0.5:9100", [], LOOPBACK_BIND, True, id="lan-ip-on-loopback-bind"),
        pytest.param(None, [], LOOPBACK_BIND, True, id="no-host-header"),
        pytest.param("evil.example", [], "::1", True, id="foreign-on-ipv6-loopback-bind"),
        pytest.param("gw.internal:9100", ["gw.internal"], LOOPBACK_BIND, False, id="listed-name"),
        pytest.param("gw.internal:9100", ["gw.internal:9100"], LOOPBACK_BIND, False, id="listed-name-and-port"),
        pytest.param("GW.Internal", ["gw.internal"], LOOPBACK_BIND, False, id="listed-name-any-case"),
        pytest.param("other.example", ["gw.internal"], LOOPBACK_BIND, True, id="unlisted-name"),
        pytest.param("other.example", ["gw.internal"], "0.0.0.0", True, id="unlisted-on-public-bind"),
        pytest.param("any.example", [], "0.0.0.0", False, id="public-bind-without-list"),
        pytest.param("any.example", ["*"], LOOPBACK_BIND, False, id="wildcard"),
    ],
)
def test_host(host: str | None, allowed: list[str], bind: str, refused: bool) -> None:
    refusal = origins.check_host(host, allowed, bind)
    if refused:
        assert_refused(refusal, 421, "host_not_allowed")
    else:
        assert refusal is None


@pytest.mark.parametrize(
    ("origin", "allowed", "refused"),
    [
        pytest.param(None, [], False, id="no-origin-not-a-browser"),
        pytest.param("http://localhost:3000", [], False, id="localhost"),
        pytest.param("http://127.0.0.1:8080", [], False, id="ipv4-loopback"),
        pytest.param("https://[::1]", [], False, id="ipv6-loopback"),
        pytest.param("https://app.example", ["https://app.example"], False, id="listed"),
        pytest.param("https://APP.example/", ["https://app.example"], False, id="listed-normalized"),
        pytest.param("https://app.example", ["https://app.example/"], False, id="listed-with-slash"),
        pytest.param("https://anything.example", ["*"], False, id="wildcard"),
        pytest.param("https://evil.example", [], True, id="foreign"),
        pytest.param("https://evil.example", ["https://app.example"], True, id="unlisted"),
        pytest.param("http://localhost.evil.example", [], True, id="localhost-prefix"),
        pytest.param("null", [], True, id="opaque-null"),
        pytest.param("file://localhost", [], True, id="non-http-scheme"),
    ],
)
def test_origin(origin: str | None, allowed: list[str], refused: bool) -> None:
    refusal = origins.check_origin(origin, allowed)
    if refused:
        assert_refused(refusal, 403, "origin_not_allowed")
    else:
        assert refusal is None


@pytest.mark.parametrize(
    ("accept", "refused"),
    [
        pytest.param("application/json, text/event-stream", False, id="both"),
        pytest.param("application/json", False, id="json-only"),
        pytest.param("application/json;q=0.9, text/event-stream", False, id="with-parameters"),
        pytest.param("*/*", False, id="any"),
        pytest.param("application/*", False, id="application-any"),
        pytest.param(None, False, id="absent"),
        pytest.param("text/event-stream", True, id="sse-only"),
        pytest.param("text/html", True, id="html"),
        pytest.param("", True, id="empty"),
        pytest.param("application/json;q=0, text/event-stream", True, id="json-marked-unacceptable"),
        pytest.param("*/*;q=0", True, id="nothing-acceptable"),
    ],
)
def test_accept(accept: str | None, refused: bool) -> None:
    refusal = rules.check_accept(accept)
    if refused:
        assert_refused(refusal, 406, "not_acceptable")
    else:
        assert refusal is None


@pytest.mark.parametrize(
    ("content_type", "refused"),
    [
        pytest.param("application/json", False, id="json"),
        pytest.param("application/json; charset=utf-8", False, id="json-charset"),
        pytest.param("Application/JSON", False, id="json-any-case"),
        pytest.param(None, True, id="absent"),
        pytest.param("text/plain", True, id="text"),
        pytest.param("application/x-www-form-urlencoded", True, id="form"),
        pytest.param("application/jsonx", True, id="json-lookalike"),
    ],
)
def test_content_type(content_type: str | None, refused: bool) -> None:
    refusal = rules.check_content_type(content_type)
    if refused:
        assert_refused(refusal, 415, "unsupported_media_type")
    else:
        assert refusal is None


@pytest.mark.parametrize(
    ("header", "refused"),
    [
        pytest.param(None, False, id="absent"),
        pytest.param("2025-03-26", False, id="2025-03-26"),
        pytest.param("2025-06-18", False, id="2025-06-18"),
        pytest.param("2025-11-25", False, id="2025-11-25"),
        pytest.param("2024-11-05", True, id="older-than-streamable"),
        pytest.param("2026-07-28", True, id="future"),
        pytest.param("", True, id="empty"),
        pytest.param("garbage", True, id="garbage"),
    ],
)
def test_protocol_header(header: str | None, refused: bool) -> None:
    refusal = rules.check_protocol_header(header)
    if refused:
        refusal = assert_refused(refusal, 400, "unsupported_protocol_version")
        assert refusal.body(None)["error"]["data"]["supported"] == list(rules.STREAMABLE_VERSIONS)
    else:
        assert refusal is None


@pytest.mark.parametrize(
    ("requested", "negotiated"),
    [
        pytest.param("2025-03-26", "2025-03-26", id="2025-03-26"),
        pytest.param("2025-06-18", "2025-06-18", id="2025-06-18"),
        pytest.param("2025-11-25", "2025-11-25", id="2025-11-25"),
        pytest.param("2024-11-05", "2025-11-25", id="older-gets-newest"),
        pytest.param("2099-01-01", "2025-11-25", id="newer-gets-newest"),
        pytest.param(None, "2025-11-25", id="missing"),
        pytest.param(20250618, "2025-11-25", id="not-a-string"),
    ],
)
def test_negotiate_version(requested: object, negotiated: str) -> None:
    assert rules.negotiate_version(requested) == negotiated


@pytest.mark.parametrize(
    ("outcome", "oauth", "status", "error", "challenge"),
    [
        pytest.param(AuthOutcome.MISSING, False, 401, "unauthorized", 'Bearer realm="satgate-mcp"', id="missing"),
        pytest.param(AuthOutcome.INVALID, False, 401, "invalid_token", 'error="invalid_token"', id="invalid"),
        pytest.param(AuthOutcome.EXPIRED, False, 401, "token_expired", 'error="invalid_token"', id="expired"),
        pytest.param(AuthOutcome.REVOKED, False, 403, "token_revoked", None, id="revoked"),
        pytest.param(AuthOutcome.MISSING, True, 401, "unauthorized", f'resource_metadata="{METADATA_URL}"',
                     id="oauth-missing"),
        pytest.param(AuthOutcome.INVALID, True, 401, "invalid_token", f'resource_metadata="{METADATA_URL}"',
                     id="oauth-invalid"),
        pytest.param(AuthOutcome.EXPIRED, True, 401, "token_expired", f'resource_metadata="{METADATA_URL}"',
                     id="oauth-expired"),
        pytest.param(AuthOutcome.REVOKED, True, 401, "token_revoked", f'resource_metadata="{METADATA_URL}"',
                     id="oauth-revoked-asks-for-a-new-token"),
    ],
)
def test_auth_refusal(outcome: AuthOutcome, oauth: bool, status: int, error: str, challenge: str | None) -> None:
    refusal = assert_refused(rules.auth_refusal(outcome, METADATA_URL if oauth else None), status, error)
    header = refusal.headers.get("WWW-Authenticate")
    if challenge is None:
        assert header is None
    else:
        assert header is not None
        assert header.startswith("Bearer ")
        assert challenge in header
        assert ("resource_metadata" in header) is oauth
    body = refusal.body(3)
    assert body["id"] == 3
    assert body["error"]["data"]["error"] == error


def test_a_revoked_token_without_oauth_gets_the_machine_readable_403() -> None:
    body = rules.auth_refusal(AuthOutcome.REVOKED, None).body(None)
    assert body["error"]["data"] == {"error": "token_revoked", "code": "TOKEN_REVOKED"}


@pytest.mark.parametrize(
    ("oauth", "status", "error"),
    [
        pytest.param(False, 403, "session_token_mismatch", id="plain"),
        pytest.param(True, 404, "session_not_found", id="oauth-reinitializes"),
    ],
)
def test_token_mismatch(oauth: bool, status: int, error: str) -> None:
    assert_refused(rules.token_mismatch(METADATA_URL if oauth else None), status, error)


@pytest.mark.parametrize(
    ("refusal", "status", "error", "headers"),
    [
        pytest.param(rules.PARSE_ERROR, 400, "parse_error", {}, id="parse-error"),
        pytest.param(rules.MISSING_SESSION, 400, "missing_session_id", {}, id="missing-session"),
        pytest.param(rules.INVALID_SESSION, 400, "invalid_session_id", {}, id="invalid-session"),
        pytest.param(rules.SESSION_NOT_FOUND, 404, "session_not_found", {}, id="unknown-session"),
        pytest.param(rules.BATCH_NOT_ALLOWED, 400, "batch_not_supported", {}, id="batch"),
        pytest.param(rules.body_too_large(1024), 413, "body_too_large", {}, id="too-large"),
        pytest.param(rules.GET_NOT_ALLOWED, 405, "method_not_allowed", {"Allow": "POST, DELETE"}, id="get"),
        pytest.param(rules.session_cap_reached(12), 503, "session_cap_reached", {"Retry-After": "12"}, id="cap"),
        pytest.param(rules.registry_full(RegistryFull(7)), 503, "session_cap_reached", {"Retry-After": "7"},
                     id="registry-full-is-the-cap"),
        pytest.param(rules.registry_full(TokenSessionsBusy(1)), 503, "session_quota_reached", {"Retry-After": "1"},
                     id="token-sessions-all-busy"),
    ],
)
def test_fixed_refusals(refusal: Refusal, status: int, error: str, headers: dict[str, str]) -> None:
    assert (refusal.status, refusal.error, refusal.headers) == (status, error, headers)
    body = refusal.body("req-1")
    assert body["jsonrpc"] == "2.0"
    assert body["id"] == "req-1"
    assert isinstance(body["error"]["code"], int)
    assert body["error"]["message"]
    assert body["error"]["data"]["error"] == error


def test_parse_error_uses_the_json_rpc_parse_error_code() -> None:
    assert rules.PARSE_ERROR.body(None) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": jsonrpc.PARSE_ERROR, "message": rules.PARSE_ERROR.message, "data": {"error": "parse_error"}},
    }


# --- Host and Origin parsing: str methods only, a malformed value is no host (issue 9, hole 7) -------------


@pytest.mark.parametrize(
    ("authority", "host"),
    [
        pytest.param("localhost", "localhost", id="name"),
        pytest.param("LocalHost:9100", "localhost", id="name-port-lowered"),
        pytest.param("[::1]", "::1", id="v6"),
        pytest.param("[::1]:9100", "::1", id="v6-port"),
        pytest.param("::1", "::1", id="bare-v6"),
        pytest.param("[::1", None, id="unclosed-v6"),
        pytest.param("[::1]x", None, id="junk-after-v6"),
        pytest.param("[not-an-ip]", None, id="bracketed-name"),
        pytest.param("localhost:", None, id="empty-port"),
        pytest.param("localhost:99999", None, id="port-out-of-range"),
        pytest.param("localhost:9\u0661", None, id="non-ascii-port-digit"),
        pytest.param(":9100", None, id="no-host"),
    ],
)
def test_host_of_authority(authority: str, host: str | None) -> None:
    assert origins.host_of_authority(authority) == host


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        pytest.param("http://127.0.0.1:9100", "127.0.0.1", id="http"),
        pytest.param("https://[::1]", "::1", id="https-v6"),
        pytest.param("http://[::1", None, id="unclosed-v6"),
        pytest.param("null", None, id="null"),
        pytest.param("file://", None, id="other-scheme"),
        pytest.param("http://localhost@evil.example", None, id="userinfo"),
        pytest.param("http://localhost/path", None, id="path"),
        pytest.param("http://", None, id="no-host"),
    ],
)
def test_origin_host(origin: str, host: str | None) -> None:
    assert origins.origin_host(origin) == host


@pytest.mark.parametrize("origin", ["http://[::1", "http://[::1]:99999", "http://\udcff\udcfe", "http://[zz]"])
def test_a_malformed_origin_is_refused_not_raised(origin: str) -> None:
    refusal = origins.check_origin(origin, [])
    assert refusal is not None
    assert refusal.status == 403


@pytest.mark.parametrize(
    ("header", "error"),
    [
        pytest.param(None, "missing_session_id", id="missing"),
        pytest.param("", "invalid_session_id", id="empty"),
        pytest.param("mcp-abc def", "invalid_session_id", id="space"),
        pytest.param("x" * 257, "invalid_session_id", id="too-long"),
        pytest.param("mcp-unknown-but-visible-ascii", None, id="well-formed-even-if-unknown"),
    ],
)
def test_session_header(header: str | None, error: str | None) -> None:
    refusal = rules.check_session_header(header)
    if error is None:
        assert refusal is None
    else:
        assert_refused(refusal, 400, error)


@pytest.mark.parametrize(
    ("is_batch", "version", "refused"),
    [
        pytest.param(False, "2025-06-18", False, id="single"),
        pytest.param(True, "2025-03-26", False, id="batch-on-2025-03-26"),
        pytest.param(True, "2025-06-18", True, id="batch-on-2025-06-18"),
        pytest.param(True, "2025-11-25", True, id="batch-on-2025-11-25"),
    ],
)
def test_batch(is_batch: bool, version: str, refused: bool) -> None:
    refusal = rules.check_batch(is_batch, version)
    if refused:
        assert_refused(refusal, 400, "batch_not_supported")
    else:
        assert refusal is None


@pytest.mark.parametrize(
    ("method", "seen", "current", "owed"),
    [
        pytest.param("tools/call", 1, 2, True, id="changed-since-last-listed"),
        pytest.param("tools/call", 2, 2, False, id="unchanged"),
        pytest.param("tools/list", 1, 2, False, id="listing-now"),
        pytest.param("ping", 0, 5, True, id="any-other-method"),
    ],
)
def test_owes_tools_changed(method: str, seen: int, current: int, owed: bool) -> None:
    assert rules.owes_tools_changed(method, seen, current) is owed


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


PING = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
NOTE = {"jsonrpc": "2.0", "method": "notifications/initialized"}
ANSWER = {"jsonrpc": "2.0", "id": 3, "result": {}}


@pytest.mark.parametrize(
    ("raw", "error", "request_id"),
    [
        pytest.param(b"{not json", "parse_error", None, id="not-json"),
        pytest.param(b"\xff\xfe", "parse_error", None, id="not-utf8"),
        pytest.param(b"[" * 100_000, "parse_error", None, id="too-deep"),
        pytest.param(_json([]), "invalid_request", None, id="empty-batch"),
        pytest.param(_json(42), "invalid_request", None, id="not-an-object"),
        pytest.param(_json([PING, {"jsonrpc": "1.0", "id": 9, "method": "x"}]), "invalid_request", 9,
                     id="bad-item-names-its-id"),
        pytest.param(_json([PING, INIT]), "invalid_request", 1, id="initialize-in-batch"),
    ],
)
def test_classify_refuses(raw: bytes, error: str, request_id: object) -> None:
    rejected = rules.classify(raw)
    assert isinstance(rejected, Rejected)
    assert rejected.refusal.error == error
    assert rejected.request_id == request_id


@pytest.mark.parametrize(
    ("raw", "is_batch", "method", "first_id", "initializes"),
    [
        pytest.param(_json(PING), False, "ping", 7, False, id="single-request"),
        pytest.param(_json(INIT), False, "initialize", 1, True, id="initialize"),
        pytest.param(_json(NOTE), False, "notifications/initialized", None, False, id="notification"),
        pytest.param(_json(ANSWER), False, "response", None, False, id="response-only"),
        pytest.param(_json([NOTE, PING]), True, "notifications/initialized", 7, False, id="batch"),
    ],
)
def test_classify(raw: bytes, is_batch: bool, method: str, first_id: object, initializes: bool) -> None:
    post = rules.classify(raw)
    assert isinstance(post, Post)
    assert (post.is_batch, post.method, post.first_id, post.initialize is not None) == (
        is_batch, method, first_id, initializes)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        pytest.param(b"{not json", "parse_error", id="not-json"),
        pytest.param(_json([PING]), "invalid_request", id="no-batches-on-legacy"),
        pytest.param(_json({"id": 1, "method": "ping"}), "invalid_request", id="not-json-rpc"),
    ],
)
def test_parse_single_refuses(raw: bytes, error: str) -> None:
    rejected = rules.parse_single(raw)
    assert isinstance(rejected, Rejected)
    assert rejected.refusal.error == error


def test_parse_single_takes_one_message() -> None:
    assert rules.parse_single(_json(PING)) == jsonrpc.Request(7, "ping", None)


@pytest.mark.parametrize("raw", [b'{"n": 123456789012345678901234567890}', b'{"n": NaN}', '{"é": "ü"}'.encode()])
def test_the_fast_json_path_accepts_exactly_what_the_standard_library_did(raw: bytes) -> None:
    assert rules.decode_json(raw) == json.loads(raw)
    assert json.loads(jsonrpc.dumps(json.loads(raw))) == json.loads(raw) or raw == b'{"n": NaN}'


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(alphabet="0123456789 -é"),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=12))
def test_json_reads_exactly_as_the_standard_library_reads_it(value: Any) -> None:
    raw = json.dumps(value).encode()
    read = jsonrpc.loads(raw)
    assert read == json.loads(raw)
    assert repr(read) == repr(json.loads(raw))  # no integer became a float on the way
