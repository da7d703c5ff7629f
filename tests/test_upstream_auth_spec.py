"""An HTTP upstream's ``"auth"`` at start-up: a spec the gateway cannot serve stops it with one line saying why."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from pydantic import SecretStr, ValidationError

from satgate_mcp.config_problems import format_errors
from satgate_mcp.settings import Settings
from satgate_mcp.upstream.signing import SigningKey

SECRET = "TEST_UPSTREAM_CLIENT_SECRET"
BASE: dict[str, Any] = {"token_endpoint": "https://idp.example.com/token", "client_id": "gw",
                        "client_secret_env": SECRET}
OAUTH: dict[str, Any] = {"auth_mode": "oauth", "oauth_issuer": "https://idp.example.com",
                         "oauth_audience": "https://gw.example.com/mcp"}
HEADER: dict[str, Any] = {"auth_mode": "header", "root_key": "r" * 40}
CREDENTIAL_KEY = "0f" * 32
USER: dict[str, Any] = {"type": "oauth_user", "client_id": "gw", "client_secret_env": SECRET}
KEYED: dict[str, Any] = {**HEADER, "credential_key": CREDENTIAL_KEY}


def _pem(key: ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def settings_with(auth: dict[str, Any], **values: Any) -> Settings:
    spec = {"transport": "http", "url": "https://files.example.com/mcp", "auth": auth}
    values["upstreams"] = json.dumps({"files": spec})
    return Settings(state_dir="memory", **values)


def problem(auth: dict[str, Any], **values: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        settings_with(auth, **values)
    lines = format_errors(caught.value).splitlines()
    assert len(lines) == 1
    return lines[0]


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET, "s3cret-value")


@pytest.mark.parametrize(("auth", "values", "says"), [
    pytest.param({"type": "client_credentials", **BASE, "client_secret": "s3cret-value"}, {},
                 '"client_secret" may not be written in SATGATE_UPSTREAMS', id="inline-secret"),
    pytest.param({"type": "client_credentials", **BASE, "client_secret_env": "NOT_SET_ANYWHERE"}, {},
                 "names NOT_SET_ANYWHERE, which is not set", id="unset-variable"),
    pytest.param({"type": "client_credentials", **BASE, "client_secret_env": "SATGATE_" + "FILES_SECRET"}, {},
                 "SATGATE_* names are the gateway's settings", id="satgate-variable"),
    pytest.param({"type": "client_credentials", **{**BASE, "client_secret_env": None}}, {},
                 'needs "client_secret_env"', id="no-variable"),
    pytest.param({"type": "token_exchange", **BASE}, HEADER, "needs SATGATE_AUTH_MODE=oauth", id="exchange-in-header"),
    pytest.param({"type": "token_exchange", **BASE}, {}, "needs SATGATE_AUTH_MODE=oauth", id="exchange-in-none"),
    pytest.param({"type": "client_credentials", "forward_identity": True, **BASE}, HEADER,
                 "needs SATGATE_IDENTITY_KEY", id="forward-without-key"),
    pytest.param({"type": "client_credentials", **{**BASE, "token_endpoint": "http://idp.example.com/token"}}, {},
                 '"auth.token_endpoint": must be an https:// URL', id="plain-http-off-loopback"),
    pytest.param({"type": "device_code", **BASE}, {}, '"auth" must be a JSON object with "type"', id="unknown-type"),
    pytest.param(USER, {"credential_key": CREDENTIAL_KEY}, "needs SATGATE_AUTH_MODE=header or oauth",
                 id="user-in-none"),
    pytest.param(USER, HEADER, "needs SATGATE_CREDENTIAL_KEY", id="user-without-credential-key"),
    pytest.param(USER, {**HEADER, "credential_key": CREDENTIAL_KEY, "host": "0.0.0.0"}, "needs SATGATE_PUBLIC_URL",
                 id="user-off-loopback-without-public-url"),
    pytest.param({**USER, "token_endpoint": "https://idp.example.com/token"}, KEYED,
                 '"authorization_endpoint" and "token_endpoint" go together', id="user-half-endpoints"),
    pytest.param({**USER, "authorization_server": "http://idp.example.com"}, KEYED,
                 '"auth.authorization_server": must be an https:// URL', id="user-plain-http-issuer"),
])
def test_refused_at_start_in_one_line(auth: dict[str, Any], values: dict[str, Any], says: str) -> None:
    line = problem(auth, **values)
    assert says in line
    assert "s3cret-value" not in line


def test_a_mode_problem_names_the_upstream_and_offers_no_unrelated_example() -> None:
    line = problem({"type": "token_exchange", **BASE}, **HEADER)
    assert line.startswith('invalid SATGATE_UPSTREAMS: upstream "files": "auth": {"type": "token_exchange"} needs '
                           "SATGATE_AUTH_MODE=oauth")
    assert "e.g." not in line


def test_a_secret_written_inline_is_never_echoed() -> None:
    line = problem({"type": "client_credentials", **BASE, "client_secret": "hunter2-inline"})
    assert "hunter2-inline" not in line


@pytest.mark.parametrize(("auth", "values"), [
    pytest.param({"type": "token_exchange", **BASE}, OAUTH, id="exchange-in-oauth"),
    pytest.param({"type": "client_credentials", **BASE}, HEADER, id="cc-in-header"),
    pytest.param({"type": "client_credentials", **BASE}, {}, id="cc-in-none"),
    pytest.param({"type": "client_credentials", "forward_identity": True, **BASE},
                 {**HEADER, "identity_key": _pem(ed25519.Ed25519PrivateKey.generate())}, id="forward-with-key"),
    pytest.param(USER, {**HEADER, "credential_key": CREDENTIAL_KEY}, id="user-in-header-on-loopback"),
    pytest.param(USER, {**OAUTH, "credential_key": CREDENTIAL_KEY, "host": "0.0.0.0"}, id="user-in-oauth-audience"),
    pytest.param({**USER, "authorization_server": "https://idp.example.com", "scope": "repo read:user"},
                 {**HEADER, "credential_key": CREDENTIAL_KEY, "host": "0.0.0.0",
                  "public_url": "https://gw.example.com/"}, id="user-with-public-url"),
])
def test_accepted(auth: dict[str, Any], values: dict[str, Any]) -> None:
    spec = settings_with(auth, **values).upstreams["files"]
    assert getattr(spec, "auth", None) is not None


@pytest.mark.parametrize(("key", "algorithm"), [
    pytest.param(ed25519.Ed25519PrivateKey.generate(), "EdDSA", id="ed25519"),
    pytest.param(rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256", id="rsa"),
])
def test_identity_keys_inline_or_as_a_path(key: ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey, algorithm: str,
                                           tmp_path: Any) -> None:
    path = tmp_path / "identity.pem"
    path.write_text(_pem(key))
    inline, from_file = SigningKey.load(_pem(key)), SigningKey.load(str(path))
    assert inline.algorithm == from_file.algorithm == algorithm
    assert inline.kid == from_file.kid
    assert "d" not in inline.public_jwk()  # the public half only


@pytest.mark.parametrize(("value", "says"), [
    pytest.param("/nowhere/identity.pem", "neither a PEM private key nor a readable file", id="missing-file"),
    pytest.param(_pem(ec.generate_private_key(ec.SECP256R1())), "use Ed25519 or RSA", id="ec-key"),
    pytest.param(_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)), "at least 2048", id="rsa-1024"),
    pytest.param("-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----", "not an unencrypted PEM",
                 id="garbage"),
])
def test_a_bad_identity_key_stops_the_start(value: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(identity_key=SecretStr(value), state_dir="memory")
    line = format_errors(caught.value)
    assert line.startswith("invalid SATGATE_IDENTITY_KEY")
    assert says in line
    assert "PRIVATE KEY" not in line


@pytest.mark.parametrize(("value", "says"), [
    pytest.param("0f" * 31, "entry 1 is not 32 bytes as 64 hex characters", id="short"),
    pytest.param("0f" * 32 + ",zz" + "0" * 62, "entry 2 is not 32 bytes", id="second-not-hex"),
])
def test_a_bad_credential_key_stops_the_start_without_echoing_it(value: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(credential_key=SecretStr(value), state_dir="memory")
    line = format_errors(caught.value)
    assert line.startswith("invalid SATGATE_CREDENTIAL_KEY")
    assert says in line
    assert "0f0f0f" not in line


def test_credential_keys_rotate_and_the_public_url_defaults() -> None:
    settings = Settings(credential_key=SecretStr(f"{'01' * 32}, {'02' * 32}"), state_dir="memory", **OAUTH)
    assert settings.credential_key_list == [bytes([1]) * 32, bytes([2]) * 32]
    assert settings.public_base("oauth", settings.oauth_audience) == "https://gw.example.com"
    assert settings.public_base("header", []) is None
    assert Settings(public_url="https://gw.example.com/satgate/", state_dir="memory").public_url == \
        "https://gw.example.com/satgate"
