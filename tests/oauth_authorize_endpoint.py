"""The test authorization server's authorization code flow: an authorize endpoint that approves at once, and the
``authorization_code`` and ``refresh_token`` grants its token endpoint answers with it.

The user "signed in" at the server is ``user`` (a test sets it before the browser comes); the endpoint checks what
a real one would (a known client, PKCE with S256, a resource) and redirects to the client's ``redirect_uri`` with
a code (single use, one minute) and the client's ``state``, or ``error=access_denied`` while ``deny`` is set.
Codes are bound to the client, the redirect URI, the PKCE challenge and the resource; refresh tokens to the
client and the resource, and they rotate on use (the old one stops working) unless ``rotate`` is off. Tests
revoke a subject's refresh tokens (``revoke``) and read what was issued.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from aiohttp import web

if TYPE_CHECKING:
    from tests.oauth_server import AuthServer

CODE_TTL = 60.0


@dataclass
class Issued:
    subject: str
    client: str
    resource: str
    scope: str | None
    redirect_uri: str = ""
    challenge: str = ""
    expires: float = 0.0


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).decode("ascii").rstrip("=")


class AuthorizeEndpoint:
    """Codes and refresh tokens, and what tests set and read."""

    def __init__(self, server: AuthServer) -> None:
        self._server = server
        #: Who is signed in at the server when a browser arrives.
        self.user = "alice"
        #: While set, the user "clicks deny".
        self.deny = False
        #: Whether a refresh hands out a new refresh token (and retires the old one).
        self.rotate = True
        self.codes: dict[str, Issued] = {}
        self.refresh_tokens: dict[str, Issued] = {}
        #: Every authorize request's query, as it came.
        self.requests: list[dict[str, str]] = []
        self.grants: Counter[str] = Counter()

    async def authorize(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.requests.append(query)
        redirect = query.get("redirect_uri", "")
        if query.get("client_id") not in self._server.tokens.secrets or not redirect.startswith("http"):
            return web.json_response({"error": "invalid_request"}, status=400)  # never redirect to the unknown
        answer: dict[str, str] = {"state": query.get("state", "")}
        if query.get("response_type") != "code" or query.get("code_challenge_method") != "S256" \
                or not query.get("code_challenge") or not query.get("resource"):
            answer["error"] = "invalid_request"
        elif self.deny:
            answer["error"] = "access_denied"
        else:
            code = secrets.token_urlsafe(24)
            self.codes[code] = Issued(self.user, query["client_id"], query["resource"], query.get("scope"), redirect,
                                      query["code_challenge"], time.time() + CODE_TTL)
            answer["code"] = code
        raise web.HTTPFound(redirect + ("&" if "?" in redirect else "?") + urlencode(answer))

    def revoke(self, subject: str) -> None:
        for token in [t for t, issued in self.refresh_tokens.items() if issued.subject == subject]:
            del self.refresh_tokens[token]

    def code_grant(self, client: str, fields: dict[str, str]) -> web.Response:
        self.grants["authorization_code"] += 1
        issued = self.codes.pop(fields.get("code", ""), None)  # single use, even when refused below
        if issued is None or issued.client != client or issued.expires < time.time() \
                or issued.redirect_uri != fields.get("redirect_uri") \
                or issued.challenge != _s256(fields.get("code_verifier", "")) \
                or fields.get("resource", issued.resource) != issued.resource:
            return self._server.tokens.refusal("invalid_grant")
        return self._tokens(issued)

    def refresh_grant(self, client: str, fields: dict[str, str]) -> web.Response:
        self.grants["refresh_token"] += 1
        token = fields.get("refresh_token", "")
        issued = self.refresh_tokens.get(token)
        if issued is None or issued.client != client or fields.get("resource", issued.resource) != issued.resource:
            return self._server.tokens.refusal("invalid_grant")
        if self.rotate:
            del self.refresh_tokens[token]
            return self._tokens(issued)
        return self._tokens(issued, refresh=token)

    def _tokens(self, issued: Issued, refresh: str | None = None) -> web.Response:
        tokens = self._server.tokens
        access = self._server.mint(issued.subject, audience=issued.resource, scope=issued.scope, ttl=tokens.ttl,
                                   extra={"client_id": issued.client})
        if refresh is None:
            refresh = secrets.token_urlsafe(32)
            self.refresh_tokens[refresh] = issued
        body: dict[str, object] = {"access_token": access, "token_type": "Bearer", "expires_in": tokens.ttl,
                                   "refresh_token": refresh}
        if issued.scope:
            body["scope"] = issued.scope
        return web.json_response(body)
