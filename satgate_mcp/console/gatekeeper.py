"""Who is asking: an admin by bearer header (scripts), by session cookie (the page), or anyone (the open mode).

Each request checks the credential again through the gateway's own authenticator, cookie or not: revocation,
expiry and signature are judged exactly as on ``/mcp``, so a revoked admin token loses the console at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from satgate_mcp.auth.base import Authenticator, Identity, bearer_from_header
from satgate_mcp.console import access
from satgate_mcp.console.access import Denied, Rules
from satgate_mcp.console.cookies import Sealed, new_csrf, open_cookie, seal

#: Who the console secret of ``none``/``config`` mode and the open mode act as, in logs and the audit trail.
CONSOLE_OPERATOR = "console-operator"
LOOPBACK_OPERATOR = "loopback-operator"


@dataclass(frozen=True, slots=True)
class Admin:
    """An admitted operator: who (a token id, or the names above), how, and the CSRF token their page must send
    (None for a bearer header: no ambient credential, nothing to forge)."""

    who: str
    via: str
    csrf: str | None
    expires: float | None = None
    #: A token's delegation root (``Identity.family_id``): a held call of the same family is the admin's own.
    family: str | None = None


class Gatekeeper:
    def __init__(self, rules: Rules, authenticator: Authenticator, keys: Sequence[bytes], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.rules = rules
        self._authenticator = authenticator
        self._keys = list(keys)
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    async def check(self, presented: str) -> Admin | Denied:
        """A credential pasted into the login form or sent as a bearer header."""
        if self.rules.uses_secret:
            if access.matches_secret(self.rules, presented):
                return Admin(CONSOLE_OPERATOR, "secret", None)
            return access.NOT_ADMIN if presented else access.NOT_LOGGED_IN
        result = await self._authenticator.authenticate(f"Bearer {presented}")
        if not result.ok or result.identity is None:
            return access.NOT_LOGGED_IN if result.outcome.value in ("missing", "invalid") else \
                Denied(401, f"the token is {result.outcome.value}")
        refused = access.admits_identity(self.rules, result.identity)
        if refused is not None:
            return refused
        return Admin(result.identity.token_id, "token", None, result.identity.expires_at, result.identity.family_id)

    async def identity_of(self, token: str) -> Identity | str:
        """Any token, verified as ``/mcp`` would (for the policy explain form); why not, when it is refused."""
        result = await self._authenticator.authenticate(f"Bearer {token}")
        if not result.ok or result.identity is None:
            return f"the token is refused ({result.outcome.value})"
        return result.identity

    def cookie_for(self, presented: str, admin: Admin) -> tuple[str, float]:
        """The sealed cookie a login sets, and its expiry (at most 8 h, never past the token's)."""
        now = self._clock()
        expires = access.cookie_expiry(now, admin.expires)
        return seal(self._keys, Sealed(presented, new_csrf(), expires)), expires

    def open_cookie(self) -> tuple[str, float]:
        """The open mode's cookie: no credential, only the CSRF token its page sends with every POST."""
        expires = self._clock() + access.MAX_COOKIE_SECONDS
        return seal(self._keys, Sealed("", new_csrf(), expires)), expires

    async def admin_of(self, request: web.Request) -> Admin | Denied:
        """The bearer header wins (scripts); else the cookie, whose credential is checked again now."""
        header = request.headers.get("Authorization")
        if header is not None:
            bearer = bearer_from_header(header)
            return await self.check(bearer) if bearer else access.NOT_LOGGED_IN
        sealed = open_cookie(self._keys, request.cookies.get(access.COOKIE_NAME), now=self._clock())
        if sealed is None:  # the open mode reads without a cookie; it acts only with one (its CSRF token)
            return Admin(LOOPBACK_OPERATOR, "open", None) if self.rules.open else access.NOT_LOGGED_IN
        if not sealed.credential:
            return Admin(LOOPBACK_OPERATOR, "open", sealed.csrf, sealed.expires) if self.rules.open \
                else access.NOT_LOGGED_IN
        found = await self.check(sealed.credential)
        if isinstance(found, Denied):
            return found
        return Admin(found.who, "cookie", sealed.csrf, sealed.expires, found.family)
