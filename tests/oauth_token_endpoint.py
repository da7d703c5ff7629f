"""The test authorization server's token endpoint: RFC 8693 token exchange and RFC 6749 client credentials.

Real enough to test the gateway as an OAuth client: clients are registered with a secret (``client_secret_basic``)
or a public key (``private_key_jwt``, RFC 7523) and authenticated on every request; an exchange verifies the
``subject_token`` (this server's own signature, not expired) and issues a JWT with that token's subject and
``aud`` = the requested audience (else the resource). Tests make it refuse (``refuse``, with an
``error_description`` that must never reach a client), hold answers (``hold``) and count what it was asked.
"""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import jwt
from aiohttp import web

if TYPE_CHECKING:
    from tests.oauth_server import AuthServer, PublicKey

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
#: What a refusal says beside its code: a client of the gateway must never see it.
SECRET_DESCRIPTION = "internal detail: db=prod-7 secret=do-not-leak"


def _refusal(error: str, status: int = 400) -> web.Response:
    return web.json_response({"error": error, "error_description": SECRET_DESCRIPTION}, status=status)


class TokenEndpoint:
    """Registered clients, the grants it answers, and what tests control and read."""

    def __init__(self, server: AuthServer) -> None:
        self._server = server
        self.secrets: dict[str, str] = {}
        self.keys: dict[str, PublicKey] = {}
        #: Seconds each issued token lasts (its ``expires_in``).
        self.ttl = 300
        #: An ``error`` code every grant is refused with, while set.
        self.refuse: str | None = None
        #: Grant types answered ``unsupported_grant_type`` (a code host's server has no client credentials grant).
        self.unsupported: set[str] = set()
        #: While set and not yet set-to-go, answers wait for it (a slow server, or one held to pile calls up).
        self.hold: asyncio.Event | None = None
        #: Requests by grant type (refused ones included) and the subjects each exchange was for.
        self.grants: Counter[str] = Counter()
        self.exchanged_for: list[str] = []
        #: Client ids each request authenticated as.
        self.clients: list[str] = []

    def register(self, client_id: str, secret: str) -> None:
        self.secrets[client_id] = secret

    def register_key(self, client_id: str, public: PublicKey) -> None:
        self.keys[client_id] = public

    @property
    def url(self) -> str:
        return self._server.issuer + "/token"

    async def handle(self, request: web.Request) -> web.Response:
        form = await request.post()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        grant = fields.get("grant_type", "")
        self.grants[grant] += 1
        if self.hold is not None:
            await self.hold.wait()
        client = self._client(request, fields)
        if client is None:
            return _refusal("invalid_client", 401)
        self.clients.append(client)
        if self.refuse is not None:
            return _refusal(self.refuse)
        if grant in self.unsupported:
            return _refusal("unsupported_grant_type")
        if grant == "client_credentials":
            return self._issue(client, fields, client)
        if grant == TOKEN_EXCHANGE:
            return self._exchange(client, fields)
        if grant == "authorization_code":
            return self._server.authorizations.code_grant(client, fields)
        if grant == "refresh_token":
            return self._server.authorizations.refresh_grant(client, fields)
        return _refusal("unsupported_grant_type")

    @staticmethod
    def refusal(error: str) -> web.Response:
        return _refusal(error)

    def _client(self, request: web.Request, fields: dict[str, str]) -> str | None:
        """The authenticated client id: HTTP Basic with the registered secret, or a signed assertion."""
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            try:
                pair = base64.b64decode(header.removeprefix("Basic ")).decode()
            except ValueError:
                return None
            client_id, _, secret = pair.partition(":")
            client_id, secret = unquote(client_id), unquote(secret)
            return client_id if self.secrets.get(client_id) == secret and secret else None
        if fields.get("client_assertion_type") == JWT_BEARER:
            client_id = fields.get("client_id", "")
            key = self.keys.get(client_id)
            if key is None:
                return None
            try:
                claims = jwt.decode(fields.get("client_assertion", ""), key, algorithms=["EdDSA", "RS256"],
                                    audience=self.url, options={"require": ["exp", "iss", "sub", "aud", "jti"]})
            except jwt.PyJWTError:
                return None
            return client_id if claims["iss"] == claims["sub"] == client_id else None
        return None

    def _exchange(self, client: str, fields: dict[str, str]) -> web.Response:
        if fields.get("subject_token_type") != ACCESS_TOKEN_TYPE:
            return _refusal("invalid_request")
        server = self._server
        try:
            kid = jwt.get_unverified_header(fields.get("subject_token", "")).get("kid")
            public = server._keys[str(kid)].public
            claims = jwt.decode(fields.get("subject_token", ""), public, algorithms=["RS256", "ES256", "EdDSA"],
                                issuer=server.issuer, options={"verify_aud": False})
        except (jwt.PyJWTError, KeyError):
            return _refusal("invalid_grant")
        subject = str(claims["sub"])
        self.exchanged_for.append(subject)
        return self._issue(subject, fields, client)

    def _issue(self, subject: str, fields: dict[str, str], client: str) -> web.Response:
        audience = fields.get("audience") or fields.get("resource") or self._server.default_audience
        extra: dict[str, Any] = {"client_id": client}
        token = self._server.mint(subject, audience=audience, scope=fields.get("scope"), ttl=self.ttl, extra=extra)
        return web.json_response({"access_token": token, "token_type": "Bearer", "expires_in": self.ttl,
                                  "issued_token_type": ACCESS_TOKEN_TYPE})
