"""A small but real OAuth 2.1 authorization server that tests run in-process on 127.0.0.1.

It exists so the gateway's JWT bearer verification is tested against real HTTP discovery (RFC 8414 and
OpenID Connect Discovery), a real JWKS endpoint and tokens signed with real keys, instead of mocks.
Tests control it directly: add, rotate and remove signing keys; mint valid, expired, mis-addressed or
deliberately malicious tokens (alg confusion, ``alg: none``); make the JWKS endpoint fail or slow down;
and count how often the gateway fetched metadata and keys.

Usage::

    async with AuthServer(path="/realms/acme") as idp:
        token = idp.mint("alice", scope="tools:read")
        ...  # point the gateway at idp.issuer and send "Authorization: Bearer <token>"
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import math
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from types import EllipsisType, TracebackType
from typing import Any

import jwt
from aiohttp import web
from aiohttp.typedefs import Handler
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from tests.oauth_authorize_endpoint import AuthorizeEndpoint
from tests.oauth_token_endpoint import TokenEndpoint

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey

#: Algorithms add_key can make a key for.
SUPPORTED_ALGS = ("RS256", "PS256", "ES256", "ES384", "EdDSA")
#: What ``client_id`` every minted token carries.
CLIENT_ID = "test-client"
DEFAULT_AUDIENCE = "http://127.0.0.1/mcp"
RFC8414_WELL_KNOWN = "/.well-known/oauth-authorization-server"
OIDC_WELL_KNOWN = "/.well-known/openid-configuration"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _json_segment(obj: dict[str, Any]) -> str:
    return _b64url(json.dumps(obj, separators=(",", ":")).encode("utf-8"))


def _generate(alg: str) -> PrivateKey:
    if alg in ("RS256", "PS256"):
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if alg == "ES256":
        return ec.generate_private_key(ec.SECP256R1())
    if alg == "ES384":
        return ec.generate_private_key(ec.SECP384R1())
    if alg == "EdDSA":
        return ed25519.Ed25519PrivateKey.generate()
    raise ValueError(f"unsupported alg {alg!r}; supported: {', '.join(SUPPORTED_ALGS)}")


def _public_jwk(public: PublicKey) -> dict[str, Any]:
    if isinstance(public, rsa.RSAPublicKey):
        return dict(RSAAlgorithm.to_jwk(public, as_dict=True))
    if isinstance(public, ec.EllipticCurvePublicKey):
        return dict(ECAlgorithm.to_jwk(public, as_dict=True))
    return dict(OKPAlgorithm.to_jwk(public, as_dict=True))


@dataclass
class _Key:
    kid: str
    alg: str
    private: PrivateKey
    published: bool = True

    @property
    def public(self) -> PublicKey:
        return self.private.public_key()

    def jwk(self) -> dict[str, Any]:
        """The public JWK as served: only public parameters, plus kid/use/alg."""
        return {**_public_jwk(self.public), "kid": self.kid, "use": "sig", "alg": self.alg}


class AuthServer:
    """Signs RS256 / ES256 (and PS256, ES384, EdDSA) access tokens and serves discovery metadata and JWKS on
    127.0.0.1.

    Attributes tests may set at any time: ``default_audience`` (the ``aud`` of minted tokens),
    ``jwks_status`` (a non-200 value makes ``/jwks`` answer that status: an IdP outage), ``jwks_delay``
    (seconds ``/jwks`` waits before answering: a slow IdP), ``jwks_headers`` (extra response headers on
    ``/jwks``, e.g. ``Cache-Control``) and ``metadata_overrides`` (fields merged into both discovery
    documents; ``None`` removes a field, e.g. a wrong ``issuer`` for mix-up tests).

    Counters: ``jwks_fetches`` counts every request to ``/jwks`` (failed and delayed ones included, so
    retries during an outage are visible); ``metadata_fetches`` counts served discovery documents per
    request path (a ``Counter``: a path never fetched reads 0). ``requests`` lists every request path.
    """

    def __init__(self, *, path: str = "", rfc8414: bool = True, oidc: bool = True) -> None:
        path = path.strip()
        if path and not path.startswith("/"):
            path = "/" + path
        self.path = path.rstrip("/")
        self.rfc8414 = rfc8414
        self.oidc = oidc
        self.port = 0
        self.issuer = ""
        self.jwks_url = ""
        self.default_audience = DEFAULT_AUDIENCE
        self.jwks_status = 200
        self.jwks_delay = 0.0
        self.jwks_headers: dict[str, str] = {}
        self.metadata_overrides: dict[str, object] = {}
        self.jwks_fetches = 0
        self.metadata_fetches: dict[str, int] = Counter()
        self.requests: list[str] = []
        self._keys: dict[str, _Key] = {}
        self._current: dict[str, str] = {}
        #: The token endpoint (token exchange, client credentials): register clients on it, make it refuse.
        self.tokens = TokenEndpoint(self)
        #: The authorization code flow (auto-approving authorize endpoint, code and refresh grants).
        self.authorizations = AuthorizeEndpoint(self)
        self._runner: web.AppRunner | None = None

    # ----------------------------------------------------------------------------------------- lifecycle

    @property
    def rfc8414_path(self) -> str:
        """RFC 8414 §3: the well-known suffix goes between the host and the issuer's path."""
        return RFC8414_WELL_KNOWN + self.path

    @property
    def oidc_path(self) -> str:
        """OpenID Connect Discovery §4: the well-known suffix is appended to the issuer."""
        return self.path + OIDC_WELL_KNOWN

    @property
    def rfc8414_url(self) -> str:
        return self._origin + self.rfc8414_path

    @property
    def oidc_url(self) -> str:
        return self._origin + self.oidc_path

    @property
    def _origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._log_request])
        if self.rfc8414:
            app.router.add_get(self.rfc8414_path, self._metadata)
        if self.oidc:
            app.router.add_get(self.oidc_path, self._metadata)
        app.router.add_get("/jwks", self._jwks)
        app.router.add_get(self.path + "/authorize", self.authorizations.authorize)
        app.router.add_post(self.path + "/token", self.tokens.handle)
        return app

    async def start(self) -> None:
        """Bind 127.0.0.1: a free port the first time, the same port again after ``stop()`` so the issuer
        stays the same (a restarted IdP)."""
        if self._runner is not None:
            return
        # A delayed /jwks must not hold stop() up: cancel handlers whose client left, and bound the graceful wait.
        runner = web.AppRunner(self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        self.issuer = self._origin + self.path
        self.jwks_url = self._origin + "/jwks"

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> AuthServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ----------------------------------------------------------------------------------------- endpoints

    @web.middleware
    async def _log_request(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.requests.append(request.path)
        return await handler(request)

    def metadata(self) -> dict[str, Any]:
        """The discovery document both well-known paths serve (before ``metadata_overrides``)."""
        return {
            "issuer": self.issuer,
            "jwks_uri": self.jwks_url,
            "authorization_endpoint": self.issuer + "/authorize",
            "token_endpoint": self.issuer + "/token",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials",
                                      "urn:ietf:params:oauth:grant-type:token-exchange"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_basic", "private_key_jwt"],
            "scopes_supported": ["openid", "tools:read", "tools:call", "admin"],
            "id_token_signing_alg_values_supported": list(SUPPORTED_ALGS),
            "subject_types_supported": ["public"],
        }

    async def _metadata(self, request: web.Request) -> web.Response:
        self.metadata_fetches[request.path] += 1
        doc = self.metadata()
        for name, value in self.metadata_overrides.items():
            if value is None:
                doc.pop(name, None)
            else:
                doc[name] = value
        return web.json_response(doc)

    def jwks(self) -> dict[str, list[dict[str, Any]]]:
        """The JWK Set as served: every published key, public parameters only."""
        return {"keys": [key.jwk() for key in self._keys.values() if key.published]}

    async def _jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        if self.jwks_delay > 0:
            await asyncio.sleep(self.jwks_delay)
        if self.jwks_status != 200:
            return web.json_response(
                {"error": "simulated_outage"}, status=self.jwks_status, headers=self.jwks_headers
            )
        return web.json_response(self.jwks(), headers=self.jwks_headers)

    # ----------------------------------------------------------------------------------------- keys

    def add_key(self, alg: str = "RS256", kid: str | None = None) -> str:
        """Generate a key for ``alg``, publish it and make it the current signing key for ``alg``.

        An existing ``kid`` is replaced with fresh key material (a "same kid, different key" test)."""
        private = _generate(alg)
        kid = kid if kid is not None else secrets.token_hex(8)
        self._keys[kid] = _Key(kid=kid, alg=alg, private=private)
        self._current[alg] = kid
        return kid

    def remove_key(self, kid: str) -> None:
        """Stop publishing ``kid`` (rotation). It can still sign via ``mint(kid=...)``: a token whose key
        the IdP no longer publishes. If it was current for its alg, the newest key still published takes
        over; with none left, the next ``mint`` for that alg makes a new key."""
        key = self._keys[kid]
        key.published = False
        if self._current.get(key.alg) == kid:
            del self._current[key.alg]
            for other in reversed(self._keys.values()):
                if other.alg == key.alg and other.published:
                    self._current[key.alg] = other.kid
                    break

    def keys(self) -> list[str]:
        """Kids of the published keys, oldest first."""
        return [key.kid for key in self._keys.values() if key.published]

    def current_kid(self, alg: str = "RS256") -> str:
        """The kid ``mint(alg=alg)`` signs with, making a key first if ``alg`` has none."""
        kid = self._current.get(alg)
        return kid if kid is not None else self.add_key(alg)

    def public_pem(self, kid: str) -> bytes:
        """The public key as SubjectPublicKeyInfo PEM: what a confused verifier would use as an HMAC secret."""
        return self._keys[kid].public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def public_jwk(self, kid: str) -> dict[str, Any]:
        """The JWK of ``kid`` as ``/jwks`` serves it (also for unpublished keys)."""
        return self._keys[kid].jwk()

    # ----------------------------------------------------------------------------------------- tokens

    def claims(
        self,
        subject: str | None = "alice",
        *,
        audience: str | list[str] | EllipsisType | None = ...,
        scope: str | list[str] | None = None,
        ttl: float = 300,
        issuer: str | None = None,
        now: float | None = None,
        extra: dict[str, object] | None = None,
    ) -> dict[str, Any]:
        """The payload ``mint`` signs. ``audience=None`` / ``subject=None`` leave the claim out; a ``None``
        value in ``extra`` removes that claim, any other value sets it."""
        issued = time.time() if now is None else now
        payload: dict[str, Any] = {"iss": self.issuer if issuer is None else issuer}
        if subject is not None:
            payload["sub"] = subject
        aud = self.default_audience if isinstance(audience, EllipsisType) else audience
        if aud is not None:
            payload["aud"] = aud
        payload["exp"] = math.floor(issued + ttl)
        payload["iat"] = math.floor(issued)
        payload["nbf"] = math.floor(issued)
        payload["jti"] = secrets.token_hex(16)
        if scope is not None:
            payload["scope"] = scope if isinstance(scope, str) else " ".join(scope)
        payload["client_id"] = CLIENT_ID
        for name, value in (extra or {}).items():
            if value is None:
                payload.pop(name, None)
            else:
                payload[name] = value
        return payload

    @staticmethod
    def _header(base: dict[str, Any], headers: dict[str, object] | None) -> dict[str, Any]:
        header = dict(base)
        for name, value in (headers or {}).items():
            if value is None:
                header.pop(name, None)
            else:
                header[name] = value
        return header

    def mint(
        self,
        subject: str | None = "alice",
        *,
        audience: str | list[str] | EllipsisType | None = ...,
        scope: str | list[str] | None = None,
        ttl: float = 300,
        alg: str | None = None,
        kid: str | None = None,
        typ: str | None = "at+jwt",
        issuer: str | None = None,
        now: float | None = None,
        extra: dict[str, object] | None = None,
        headers: dict[str, object] | None = None,
    ) -> str:
        """A signed access token (RFC 9068 shape by default).

        Signs with ``kid`` when given (published or not), else with the current key for ``alg`` (a key is
        made if there is none). ``alg`` defaults to the key's own alg (RS256 without ``kid``); giving it
        explicitly with ``kid`` signs with that alg, e.g. ``alg="PS256"`` with an RS256 key. ``headers``
        overrides header fields (``None`` removes one); as in PyJWT, a ``headers["alg"]`` is also the
        algorithm the token is really signed with, and ``kid`` there must be a string."""
        if kid is None:
            kid = self.current_kid(alg or "RS256")
        key = self._keys[kid]
        payload = self.claims(
            subject, audience=audience, scope=scope, ttl=ttl, issuer=issuer, now=now, extra=extra
        )
        header = self._header({"kid": kid, "typ": typ}, headers)
        header.setdefault("typ", None)  # PyJWT drops a falsy typ instead of writing its default "JWT"
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        return jwt.api_jws.encode(body, key.private, algorithm=alg or key.alg, headers=header)

    def mint_hs256_with_public_key(
        self,
        kid: str,
        subject: str | None = "alice",
        *,
        audience: str | list[str] | EllipsisType | None = ...,
        scope: str | list[str] | None = None,
        ttl: float = 300,
        typ: str | None = "at+jwt",
        issuer: str | None = None,
        now: float | None = None,
        extra: dict[str, object] | None = None,
        headers: dict[str, object] | None = None,
    ) -> str:
        """The classic alg-confusion token: header ``alg: HS256`` naming an asymmetric ``kid``, HMAC-SHA256
        keyed by that key's public PEM. A verifier that trusts the header's alg and feeds the public key to
        HMAC accepts it. Built by hand: PyJWT refuses to HMAC with a PEM key."""
        payload = self.claims(
            subject, audience=audience, scope=scope, ttl=ttl, issuer=issuer, now=now, extra=extra
        )
        header = self._header({"alg": "HS256", "kid": kid, "typ": typ}, headers)
        header = {name: value for name, value in header.items() if value is not None}
        signing_input = f"{_json_segment(header)}.{_json_segment(payload)}"
        mac = hmac.new(self.public_pem(kid), signing_input.encode("ascii"), hashlib.sha256).digest()
        return f"{signing_input}.{_b64url(mac)}"

    def mint_unsigned(
        self,
        subject: str | None = "alice",
        *,
        audience: str | list[str] | EllipsisType | None = ...,
        scope: str | list[str] | None = None,
        ttl: float = 300,
        alg: str | None = None,
        kid: str | None = None,
        typ: str | None = "at+jwt",
        issuer: str | None = None,
        now: float | None = None,
        extra: dict[str, object] | None = None,
        headers: dict[str, object] | None = None,
    ) -> str:
        """An ``alg: none`` token with an empty signature (``header.payload.``). It names a real kid (the
        current one for ``alg``, default RS256, unless ``kid`` is given) so only the alg check can stop it."""
        if kid is None:
            kid = self.current_kid(alg or "RS256")
        payload = self.claims(
            subject, audience=audience, scope=scope, ttl=ttl, issuer=issuer, now=now, extra=extra
        )
        header = self._header({"alg": "none", "kid": kid, "typ": typ}, headers)
        header = {name: value for name, value in header.items() if value is not None}
        return f"{_json_segment(header)}.{_json_segment(payload)}."
