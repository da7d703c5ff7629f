"""The pure rules of ``oauth_user``: the authorization URL, PKCE, the sealing of grants, what a client's answer and
the authorization server's metadata mean, and which callbacks may complete."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from satgate_mcp.oauth_grants import PendingAuthorization, callback_refusal, taken
from satgate_mcp.upstream.as_discovery import (
    DiscoveryProblem,
    Endpoints,
    read_resource_metadata,
    read_server_metadata,
    server_metadata_urls,
)
from satgate_mcp.upstream.authorize_call import action_of, authorization_required, elicitation_params
from satgate_mcp.upstream.credential_box import CredentialBox, Unreadable
from satgate_mcp.upstream.identity import grant_for
from satgate_mcp.upstream.token_client import code_form, read_token_response, refresh_form
from satgate_mcp.upstream.user_grants import (
    Started,
    authorize_url,
    callback_url,
    elicitation_id,
    pkce_pair,
)
from satgate_mcp.upstream_auth_spec import OAuthUserSpec, per_caller

KEY_A, KEY_B = bytes(range(32)), bytes(range(1, 33))
ENDPOINTS = Endpoints("https://as.example.com/authorize", "https://as.example.com/token",
                      "https://files.example.com/mcp")
ISSUER = "https://as.example.com/tenant"


@pytest.fixture
def spec(monkeypatch: pytest.MonkeyPatch) -> OAuthUserSpec:
    monkeypatch.setenv("TEST_USER_CLIENT_SECRET", "s")
    return OAuthUserSpec(type="oauth_user", client_id="gw", client_secret_env="TEST_USER_CLIENT_SECRET",
                         scope="repo read:user")


def test_an_oauth_user_upstream_is_per_caller_and_lists_as_the_gateway(spec: OAuthUserSpec) -> None:
    assert per_caller(spec)
    assert grant_for("oauth_user", True) == "oauth_user"
    assert grant_for("oauth_user", False) == "client_credentials"


def test_pkce_is_s256_of_a_fresh_256_bit_verifier() -> None:
    verifier, challenge = pkce_pair()
    assert len(verifier) >= 43
    assert challenge == base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    assert pkce_pair()[0] != verifier


def test_the_authorization_url_asks_for_a_code_with_pkce_and_the_resource(spec: OAuthUserSpec) -> None:
    url = authorize_url(ENDPOINTS, spec, redirect_uri=callback_url("https://gw.example.com/", "files"),
                        state="st", challenge="ch")
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == ENDPOINTS.authorization_endpoint
    assert {k: v[0] for k, v in parse_qs(parts.query).items()} == {
        "response_type": "code", "client_id": "gw", "redirect_uri": "https://gw.example.com/oauth/callback/files",
        "state": "st", "code_challenge": "ch", "code_challenge_method": "S256",
        "resource": "https://files.example.com/mcp", "scope": "repo read:user"}
    kept = replace(ENDPOINTS, authorization_endpoint="https://as.example.com/authorize?tenant=t")
    assert "/authorize?tenant=t&response_type=code" in authorize_url(kept, spec, redirect_uri="r", state="s",
                                                                     challenge="c")


def test_the_elicitation_id_is_not_the_state() -> None:
    assert elicitation_id("state-1") != "state-1"
    assert elicitation_id("state-1") == elicitation_id("state-1") != elicitation_id("state-2")


def test_the_code_and_refresh_grants_name_the_resource() -> None:
    assert code_form("c", "v", "https://gw/cb", "https://files") == {
        "grant_type": "authorization_code", "code": "c", "code_verifier": "v", "redirect_uri": "https://gw/cb",
        "resource": "https://files"}
    assert refresh_form("r", "https://files") == {"grant_type": "refresh_token", "refresh_token": "r",
                                                  "resource": "https://files"}


def test_a_token_response_keeps_the_refresh_token_out_of_its_repr() -> None:
    issued = read_token_response(200, json.dumps({"access_token": "at", "token_type": "Bearer", "expires_in": 60,
                                                  "refresh_token": "rt-secret", "scope": "repo"}).encode())
    assert getattr(issued, "refresh_token", None) == "rt-secret"
    assert getattr(issued, "scope", None) == "repo"
    assert "rt-secret" not in repr(issued)


# --- sealing -------------------------------------------------------------------------------------------------


def test_a_sealed_grant_opens_only_for_its_owner_upstream_and_purpose() -> None:
    box = CredentialBox([KEY_A])
    sealed = box.seal("refresh-alice", purpose="refresh_token", owner="alice", upstream="files")
    assert "refresh-alice" not in sealed
    assert box.open(sealed, purpose="refresh_token", owner="alice", upstream="files") == "refresh-alice"
    for where in ({"owner": "bob", "upstream": "files"}, {"owner": "alice", "upstream": "tickets"}):
        with pytest.raises(Unreadable):
            box.open(sealed, purpose="refresh_token", **where)
    with pytest.raises(Unreadable):
        box.open(sealed, purpose="pkce_verifier", owner="alice", upstream="files")


@pytest.mark.parametrize("position", [-1, -10, 20, 12])
def test_a_ciphertext_changed_anywhere_does_not_open(position: int) -> None:
    box = CredentialBox([KEY_A])
    sealed = box.seal("refresh-alice", purpose="refresh_token", owner="alice", upstream="files")
    head, encoded = sealed.rsplit(".", 1)
    raw = bytearray(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    raw[position] ^= 0x01  # one bit of one byte (a changed text character may touch only base64's unused bits)
    changed = f"{head}.{base64.urlsafe_b64encode(bytes(raw)).decode('ascii').rstrip('=')}"
    assert changed != sealed
    with pytest.raises(Unreadable):
        box.open(changed, purpose="refresh_token", owner="alice", upstream="files")


def test_keys_rotate_the_first_seals_every_one_opens() -> None:
    old = CredentialBox([KEY_A]).seal("rt", purpose="refresh_token", owner="a", upstream="u")
    rotated = CredentialBox([KEY_B, KEY_A])
    assert rotated.open(old, purpose="refresh_token", owner="a", upstream="u") == "rt"
    new = rotated.seal("rt2", purpose="refresh_token", owner="a", upstream="u")
    assert CredentialBox([KEY_B]).open(new, purpose="refresh_token", owner="a", upstream="u") == "rt2"
    with pytest.raises(Unreadable, match="no longer lists"):
        CredentialBox([KEY_B]).open(old, purpose="refresh_token", owner="a", upstream="u")
    with pytest.raises(ValueError, match="32 bytes"):
        CredentialBox([os.urandom(16)])


# --- the client's answer ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "action"), [
    pytest.param({"result": {"action": "accept"}}, "accept", id="accept"),
    pytest.param({"result": {"action": "decline"}}, "decline", id="decline"),
    pytest.param({"result": {"action": "cancel"}}, "cancel", id="cancel"),
    pytest.param({"result": {"action": "yes please"}}, "cancel", id="unknown-action"),
    pytest.param({"error": {"code": -32600, "data": {"cannot_ask": True}}}, "unavailable", id="cannot-be-asked"),
    pytest.param({"error": {"code": -32603}}, "cancel", id="client-error"),
])
def test_what_the_clients_answer_means(answer: dict[str, Any], action: str) -> None:
    assert action_of(answer) == action


def test_the_32042_error_carries_the_elicitation_as_the_spec_shapes_it() -> None:
    params = elicitation_params("files", Started("https://as.example.com/authorize?x=1", "eid"))
    error = authorization_required("files", params, "this client cannot be asked by URL").to_error()
    assert error["code"] == -32042
    assert error["data"]["elicitations"] == [{"mode": "url", "url": "https://as.example.com/authorize?x=1",
                                              "elicitationId": "eid", "message": params["message"]}]


# --- callbacks ----------------------------------------------------------------------------------------------

PENDING = PendingAuthorization("st", "alice", "files", "sealed", "https://gw/cb", 1000.0, 1600.0)


@pytest.mark.parametrize(("pending", "upstream", "now", "refusal"), [
    pytest.param(PENDING, "files", 1001.0, None, id="fresh"),
    pytest.param(None, "files", 1001.0, "unknown", id="unknown"),
    pytest.param(replace(PENDING, used=True), "files", 1001.0, "unknown", id="replayed"),
    pytest.param(PENDING, "tickets", 1001.0, "other_upstream", id="another-upstreams"),
    pytest.param(PENDING, "files", 1600.0, "expired", id="expired"),
])
def test_which_callbacks_may_complete(pending: PendingAuthorization | None, upstream: str, now: float,
                                      refusal: str | None) -> None:
    assert callback_refusal(pending, upstream, now) == refusal


def test_taking_a_state_returns_it_once_unused_and_keeps_it_marked() -> None:
    assert taken(PENDING, 1001.0) == (PENDING, replace(PENDING, used=True))
    assert taken(replace(PENDING, used=True), 1001.0) == (replace(PENDING, used=True), None)
    assert taken(PENDING, 1600.0 + 3600.0) == (None, None)  # past its grace: gone


# --- discovery ----------------------------------------------------------------------------------------------


def test_metadata_urls_insert_or_append_the_well_known_segment() -> None:
    assert server_metadata_urls(ISSUER) == ["https://as.example.com/.well-known/oauth-authorization-server/tenant",
                                            "https://as.example.com/tenant/.well-known/openid-configuration"]


@pytest.mark.parametrize(("document", "says"), [
    pytest.param({"resource": "r"}, "lists no authorization_servers", id="no-servers"),
    pytest.param({"authorization_servers": ["http://as.example.com"]}, "must be an https", id="plain-http"),
    pytest.param([], "not a JSON object", id="not-an-object"),
])
def test_bad_resource_metadata_is_refused(document: Any, says: str) -> None:
    with pytest.raises(DiscoveryProblem, match=says):
        read_resource_metadata(document)


def test_resource_metadata_names_the_server_and_the_resource() -> None:
    assert read_resource_metadata({"authorization_servers": [ISSUER], "resource": "https://files"}) == (
        ISSUER, "https://files")


GOOD = {"issuer": ISSUER, "authorization_endpoint": "https://as.example.com/a", "token_endpoint":
        "https://as.example.com/t", "code_challenge_methods_supported": ["S256"]}


@pytest.mark.parametrize(("document", "says"), [
    pytest.param({**GOOD, "issuer": "https://evil.example.com"}, "names issuer", id="mix-up"),
    pytest.param({**GOOD, "code_challenge_methods_supported": ["plain"]}, "S256", id="no-s256"),
    pytest.param({k: v for k, v in GOOD.items() if k != "token_endpoint"}, "no token_endpoint", id="no-token"),
    pytest.param({**GOOD, "authorization_endpoint": "http://as.example.com/a"}, "must be an https",
                 id="plain-http-endpoint"),
])
def test_bad_server_metadata_is_refused(document: dict[str, Any], says: str) -> None:
    with pytest.raises(DiscoveryProblem, match=says):
        read_server_metadata(document, ISSUER)


def test_server_metadata_gives_both_endpoints() -> None:
    assert read_server_metadata(GOOD, ISSUER) == ("https://as.example.com/a", "https://as.example.com/t")
