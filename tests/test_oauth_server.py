"""The test authorization server (tests/oauth_server.py) itself: the gateway's JWT tests rely on its discovery
documents, JWKS and tokens being right, so they are checked here against PyJWT, over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest

from tests.oauth_server import AuthServer


def _segment(token: str, index: int) -> dict[str, Any]:
    part = token.split(".")[index]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        body = await response.json(content_type=None) if response.status != 404 else None
        return response.status, body


def _verify(idp: AuthServer, token: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """Verify as a strict resource server would: the key picked by kid from the fetched JWKS."""
    kid = jwt.get_unverified_header(token)["kid"]
    jwk = next(k for k in jwks["keys"] if k["kid"] == kid)
    claims: dict[str, Any] = jwt.decode(
        token, jwt.PyJWK(jwk).key, algorithms=[jwk["alg"]], audience=idp.default_audience, issuer=idp.issuer,
        options={"require": ["exp", "iat", "iss", "sub", "aud"]},
    )
    return claims


@pytest.fixture
async def idp() -> AsyncIterator[AuthServer]:
    async with AuthServer() as server:
        yield server


async def test_discovery_documents_at_root_issuer(idp: AuthServer) -> None:
    assert idp.issuer == f"http://127.0.0.1:{idp.port}"
    assert idp.jwks_url == idp.issuer + "/jwks"
    for path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
        status, doc = await _get(idp.issuer + path)
        assert status == 200
        assert doc["issuer"] == idp.issuer
        assert doc["jwks_uri"] == idp.jwks_url
        assert doc["token_endpoint"] == idp.issuer + "/token"
        assert doc["code_challenge_methods_supported"] == ["S256"]
        assert doc["response_types_supported"] == ["code"]
        assert idp.metadata_fetches[path] == 1


async def test_discovery_with_issuer_path() -> None:
    async with AuthServer(path="/realms/acme") as idp:
        origin = f"http://127.0.0.1:{idp.port}"
        assert idp.issuer == origin + "/realms/acme"
        assert idp.jwks_url == origin + "/jwks"
        rfc8414 = origin + "/.well-known/oauth-authorization-server/realms/acme"
        oidc = origin + "/realms/acme/.well-known/openid-configuration"
        assert (idp.rfc8414_url, idp.oidc_url) == (rfc8414, oidc)
        for url in (rfc8414, oidc):
            status, doc = await _get(url)
            assert status == 200
            assert doc["issuer"] == idp.issuer
            assert doc["jwks_uri"] == idp.jwks_url
            assert doc["authorization_endpoint"] == idp.issuer + "/authorize"
        # The other placements are not discovery documents for this issuer.
        assert (await _get(origin + "/.well-known/oauth-authorization-server"))[0] == 404
        assert (await _get(origin + "/.well-known/openid-configuration"))[0] == 404
        assert dict(idp.metadata_fetches) == {
            "/.well-known/oauth-authorization-server/realms/acme": 1,
            "/realms/acme/.well-known/openid-configuration": 1,
        }


@pytest.mark.parametrize(("rfc8414", "oidc"), [(False, True), (True, False)])
async def test_disabled_discovery_document_is_404(rfc8414: bool, oidc: bool) -> None:
    async with AuthServer(path="/t", rfc8414=rfc8414, oidc=oidc) as idp:
        assert (await _get(idp.rfc8414_url))[0] == (200 if rfc8414 else 404)
        assert (await _get(idp.oidc_url))[0] == (200 if oidc else 404)


async def test_metadata_overrides(idp: AuthServer) -> None:
    idp.metadata_overrides = {"issuer": "https://evil.example", "jwks_uri": None}
    _, doc = await _get(idp.rfc8414_url)
    assert doc["issuer"] == "https://evil.example"
    assert "jwks_uri" not in doc


@pytest.mark.parametrize("alg", ["RS256", "ES256", "PS256", "ES384", "EdDSA"])
async def test_minted_tokens_verify_with_published_jwks(idp: AuthServer, alg: str) -> None:
    kid = idp.add_key(alg)
    token = idp.mint("bob", alg=alg, scope="tools:read tools:call")
    status, jwks = await _get(idp.jwks_url)
    assert status == 200
    assert idp.jwks_fetches == 1
    (jwk,) = jwks["keys"]
    assert (jwk["kid"], jwk["alg"], jwk["use"]) == (kid, alg, "sig")
    assert not {"d", "p", "q", "dp", "dq", "qi"} & set(jwk), "private parameters must never be published"
    header = jwt.get_unverified_header(token)
    assert header == {"alg": alg, "kid": kid, "typ": "at+jwt"}
    claims = _verify(idp, token, jwks)
    assert claims["sub"] == "bob"
    assert claims["scope"] == "tools:read tools:call"
    assert claims["client_id"] == "test-client"
    assert claims["exp"] - claims["iat"] == 300
    assert claims["nbf"] == claims["iat"]
    assert len(claims["jti"]) == 32


async def test_claim_and_header_overrides(idp: AuthServer) -> None:
    token = idp.mint(
        audience=["a", "b"], typ=None, now=1000.0, ttl=60, issuer="https://other",
        extra={"jti": None, "tenant": "acme"}, headers={"x-test": 1},
    )
    header, claims = _segment(token, 0), _segment(token, 1)
    assert "typ" not in header
    assert header["x-test"] == 1
    assert claims["aud"] == ["a", "b"]
    assert (claims["iat"], claims["exp"], claims["iss"]) == (1000, 1060, "https://other")
    assert "jti" not in claims
    assert claims["tenant"] == "acme"
    assert "aud" not in _segment(idp.mint(audience=None), 1)


async def test_rotation_and_remove_key(idp: AuthServer) -> None:
    old = idp.add_key("RS256")
    new = idp.add_key("RS256")
    assert idp.current_kid("RS256") == new
    _, jwks = await _get(idp.jwks_url)
    assert [k["kid"] for k in jwks["keys"]] == [old, new]
    idp.remove_key(new)
    assert idp.current_kid("RS256") == old
    _, jwks = await _get(idp.jwks_url)
    assert [k["kid"] for k in jwks["keys"]] == [old]
    assert idp.jwks_fetches == 2
    # A removed key still signs: the token names a kid the IdP no longer publishes.
    stale = idp.mint(kid=new)
    assert jwt.get_unverified_header(stale)["kid"] == new
    with pytest.raises(StopIteration):
        _verify(idp, stale, jwks)


async def test_alg_confusion_token(idp: AuthServer) -> None:
    kid = idp.add_key("RS256")
    token = idp.mint_hs256_with_public_key(kid, scope="admin")
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "HS256"
    assert header["kid"] == kid
    signing_input, _, signature = token.rpartition(".")
    expected = hmac.new(idp.public_pem(kid), signing_input.encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)) == expected
    assert idp.public_pem(kid).startswith(b"-----BEGIN PUBLIC KEY-----")
    with pytest.raises(jwt.InvalidKeyError):  # PyJWT itself refuses a PEM as an HMAC secret
        jwt.decode(token, idp.public_pem(kid), algorithms=["HS256"], audience=idp.default_audience)


async def test_unsigned_token(idp: AuthServer) -> None:
    token = idp.mint_unsigned(scope="admin")
    assert token.endswith(".")
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "none"
    assert header["kid"] == idp.current_kid()


async def test_jwks_outage_and_delay(idp: AuthServer) -> None:
    idp.jwks_status = 503
    assert (await _get(idp.jwks_url))[0] == 503
    idp.jwks_status, idp.jwks_delay = 200, 0.2
    started = time.monotonic()
    assert (await _get(idp.jwks_url))[0] == 200
    assert time.monotonic() - started >= 0.2
    assert idp.jwks_fetches == 2


async def test_restart_keeps_port_and_keys() -> None:
    idp = AuthServer()
    await idp.start()
    kid = idp.add_key("ES256")
    issuer = idp.issuer
    await idp.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        await _get(idp.jwks_url)
    await idp.start()
    try:
        assert idp.issuer == issuer
        _, jwks = await _get(idp.jwks_url)
        assert [k["kid"] for k in jwks["keys"]] == [kid]
    finally:
        await idp.stop()


async def test_stop_does_not_wait_for_a_delayed_jwks(idp: AuthServer) -> None:
    idp.jwks_delay = 30
    with pytest.raises(TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as http:
            await http.get(idp.jwks_url)
    started = time.monotonic()
    await idp.stop()
    assert time.monotonic() - started < 5
