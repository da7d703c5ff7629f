"""The gateway as an OAuth client at an upstream's token endpoint: RFC 8693 token exchange, RFC 6749 client credentials,
and for ``oauth_user`` the authorization code (with its PKCE verifier) and refresh token grants.

One POST per grant, form-encoded, the client authenticated by HTTP Basic (``client_secret_basic``) or by a JWT
it signs (``private_key_jwt``, RFC 7523). What the server answers is read by ``read_token_response`` (pure): a
token with its lifetime, or a refusal that keeps only the server's ``error`` code. Nothing the server says in
prose, and no secret, goes further than this module: an error reaches the client as ``upstream_auth_failed``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import aiohttp
import structlog

from satgate_mcp.errors import UpstreamAuthFailed
from satgate_mcp.upstream.signing import SigningKey, client_assertion_claims
from satgate_mcp.upstream_auth_spec import ClientCredentialsSpec, OAuthUserSpec, TokenExchangeSpec

log = structlog.get_logger("satgate_mcp.upstream")

TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
JWT_BEARER_ASSERTION = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
#: A token whose server gave no ``expires_in`` is used this long before asking again.
DEFAULT_LIFETIME = 300.0
#: Largest token response read.
MAX_RESPONSE = 256 * 1024
#: RFC 6749 error codes are a small ASCII set; anything else is not echoed.
_ERROR_CODE = re.compile(r"[\x20-\x21\x23-\x5b\x5d-\x7e]{1,80}")

GrantSpec = TokenExchangeSpec | ClientCredentialsSpec | OAuthUserSpec


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """An access token and how long the server said it lasts."""

    value: str = field(repr=False)
    expires_in: float
    #: What the authorization code and refresh grants may add: the refresh token, and the scope granted.
    refresh_token: str | None = field(default=None, repr=False)
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """The server's refusal: its ``error`` code (or ours when it gave none), and the HTTP status."""

    error: str
    status: int


def read_token_response(status: int, body: bytes) -> IssuedToken | Refused:
    """RFC 6749 section 5.1 / 5.2: a bearer token with an optional lifetime, or an error code; never its prose."""
    try:
        document = json.loads(body) if body.strip() else None
    except ValueError:
        document = None
    if not isinstance(document, dict):
        return Refused("invalid_response" if status < 400 else "server_error", status)
    if status >= 400 or "error" in document:
        code = document.get("error")
        return Refused(code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else "invalid_response",
                       status)
    token, kind, expires = document.get("access_token"), document.get("token_type"), document.get("expires_in")
    if not isinstance(token, str) or not token or any(c.isspace() for c in token):
        return Refused("invalid_response", status)
    if isinstance(kind, str) and kind.lower() not in {"bearer", "n_a"}:
        return Refused("unsupported_token_type", status)
    lifetime = float(expires) if isinstance(expires, int | float) and not isinstance(expires, bool) else None
    refresh, scope = document.get("refresh_token"), document.get("scope")
    return IssuedToken(token, lifetime if lifetime is not None and lifetime > 0 else DEFAULT_LIFETIME,
                       refresh if isinstance(refresh, str) and refresh else None,
                       scope if isinstance(scope, str) and scope else None)


def grant_form(spec: GrantSpec, subject_token: str | None) -> dict[str, str]:
    """The grant's own parameters: token exchange with the caller's token, else the gateway's client credentials."""
    if subject_token is not None:
        form = {"grant_type": TOKEN_EXCHANGE_GRANT, "subject_token": subject_token,
                "subject_token_type": ACCESS_TOKEN_TYPE, "requested_token_type": ACCESS_TOKEN_TYPE}
    else:
        form = {"grant_type": "client_credentials"}
    for name in ("audience", "resource", "scope"):
        value = getattr(spec, name, None)
        if value is not None:
            form[name] = value
    return form


def code_form(code: str, verifier: str, redirect_uri: str, resource: str) -> dict[str, str]:
    """RFC 6749 section 4.1.3 with RFC 7636's verifier and RFC 8707's resource (the token's audience)."""
    return {"grant_type": "authorization_code", "code": code, "code_verifier": verifier,
            "redirect_uri": redirect_uri, "resource": resource}


def refresh_form(refresh_token: str, resource: str) -> dict[str, str]:
    """RFC 6749 section 6, for the same resource as the grant."""
    return {"grant_type": "refresh_token", "refresh_token": refresh_token, "resource": resource}


def basic_authorization(client_id: str, secret: str) -> str:
    """RFC 6749 section 2.3.1: both parts form-url-encoded before they are joined and base64'd."""
    pair = f"{quote(client_id, safe='')}:{quote(secret, safe='')}"
    return "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")


class TokenClient:
    """One upstream's token endpoint, with the client's credential read once from the variable its spec names."""

    def __init__(self, upstream: str, spec: GrantSpec, *, timeout: float,
                 session: Callable[[], aiohttp.ClientSession], clock: Callable[[], float] = time.time) -> None:
        self.upstream = upstream
        self._spec = spec
        self._timeout = timeout
        self._session = session
        self._clock = clock
        #: Where tokens are asked for; an ``oauth_user`` spec may leave it to discovery (set before the first grant).
        self.token_endpoint = spec.token_endpoint
        secret = os.environ.get(spec.secret_variable(), "")
        self._secret = secret if spec.client_auth == "client_secret_basic" else None
        self._key = SigningKey.load(secret, spec.key_id) if spec.client_auth == "private_key_jwt" else None
        #: Requests sent to the token endpoint (tests count single flight with it).
        self.requests = 0

    async def exchange(self, subject_token: str) -> IssuedToken:
        """RFC 8693: the caller's access token for one addressed to the upstream."""
        return await self._grant(grant_form(self._spec, subject_token), "token_exchange")

    async def client_credentials(self, resource: str | None = None) -> IssuedToken:
        form = grant_form(self._spec, None)
        if resource is not None:
            form["resource"] = resource
        return await self._grant(form, "client_credentials")

    async def authorization_code(self, code: str, verifier: str, redirect_uri: str, resource: str) -> IssuedToken:
        return await self._grant(code_form(code, verifier, redirect_uri, resource), "authorization_code")

    async def refresh(self, refresh_token: str, resource: str) -> IssuedToken:
        return await self._grant(refresh_form(refresh_token, resource), "refresh_token")

    def _client_auth(self, form: dict[str, str]) -> dict[str, str]:
        """Headers for ``client_secret_basic``; for ``private_key_jwt`` the assertion joins the form instead."""
        if self._key is not None:
            assert self.token_endpoint is not None
            claims = client_assertion_claims(self._spec.client_id, self.token_endpoint, self._clock())
            form.update(client_id=self._spec.client_id, client_assertion_type=JWT_BEARER_ASSERTION,
                        client_assertion=self._key.sign(claims))
            return {}
        assert self._secret is not None
        return {"Authorization": basic_authorization(self._spec.client_id, self._secret)}

    async def _grant(self, form: dict[str, str], grant: str) -> IssuedToken:
        headers = {"Accept": "application/json", **self._client_auth(form)}
        self.requests += 1
        assert self.token_endpoint is not None  # discovered first
        try:
            async with asyncio.timeout(self._timeout):
                async with self._session().post(self.token_endpoint, data=form, headers=headers) as resp:
                    body = await resp.content.read(MAX_RESPONSE + 1)
                    status = resp.status
        except TimeoutError:
            raise self._failed(grant, "temporarily_unavailable",
                               f"did not answer within {self._timeout:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise self._failed(grant, "temporarily_unavailable", f"cannot be reached ({type(exc).__name__})") from None
        answer = read_token_response(status, body[:MAX_RESPONSE])
        if isinstance(answer, Refused):
            raise self._failed(grant, answer.error, f"refused the {grant.replace('_', ' ')} (HTTP {answer.status}, "
                                                    f"error {answer.error!r})")
        return answer

    def _failed(self, grant: str, code: str, why: str) -> UpstreamAuthFailed:
        log.warning("upstream_auth_failed", upstream=self.upstream, grant=grant, oauth_error=code)
        return UpstreamAuthFailed(self.upstream, code, f"upstream {self.upstream!r}: the authorization server {why}")
