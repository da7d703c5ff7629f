"""Who may open the console and which requests it answers: small pure decisions, tested from tables.

The console acts for the whole gateway (revoke a token, end any session), so the bar is an admin credential
in every auth mode, and every state-changing request must prove it comes from the console's own page: a POST
with a same-origin ``Origin`` and the CSRF token of its session cookie.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from satgate_mcp.auth.base import Identity
from satgate_mcp.transport.origins import host_of_authority, is_loopback_host

#: A console session lives at most this long, and never past its token's expiry.
MAX_COOKIE_SECONDS = 8 * 3600
COOKIE_NAME = "satgate_console"
COOKIE_PATH = "/console"
#: No inline script, nothing from another origin, never framed; fetches only to the console itself.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
#: Every console answer carries these (``same-origin``: ``no-referrer`` makes Chromium post forms with Origin null).
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
           "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin",
           "Cross-Origin-Resource-Policy": "same-origin"}


@dataclass(frozen=True, slots=True)
class Denied:
    """A refusal: the HTTP status and a short reason (never the credential)."""

    status: int
    reason: str


NOT_LOGGED_IN = Denied(401, "log in with an admin token")
NOT_ADMIN = Denied(403, "this credential may not open the console")
CROSS_SITE = Denied(403, "cross-site request refused")
BAD_CSRF = Denied(403, "missing or wrong CSRF token")


@dataclass(frozen=True, slots=True)
class Rules:
    """What decides who is an admin: the auth mode and, per mode, the scope or the console's own secret."""

    auth_mode: str
    scope: str
    console_token: str | None
    bind_host: str

    @property
    def open(self) -> bool:
        """``none`` on loopback with no console secret: the same trust as ``/mcp`` there, so no login."""
        return self.auth_mode == "none" and not self.console_token and is_loopback_host(self.bind_host)

    @property
    def uses_secret(self) -> bool:
        """``none`` and ``config``: every /mcp client holds the same credential, so the console has its own."""
        return self.auth_mode in ("none", "config")


def admits_identity(rules: Rules, identity: Identity) -> Denied | None:
    """Header mode: minted ``--admin``; oauth: the console scope. Other modes never admit an /mcp identity."""
    if rules.auth_mode == "header" and identity.admin:
        return None
    if rules.auth_mode == "oauth" and identity.scopes is not None and rules.scope in identity.scopes:
        return None
    return NOT_ADMIN


def matches_secret(rules: Rules, presented: str) -> bool:
    """The console secret of ``none``/``config`` mode, compared in constant time; never matches when unset."""
    if not rules.console_token or not presented.isascii():
        return False
    return hmac.compare_digest(presented.encode("ascii"), rules.console_token.encode("ascii"))


def cookie_expiry(now: float, token_expires_at: float | None) -> float:
    """At most eight hours, and never past the token's own expiry."""
    limit = now + MAX_COOKIE_SECONDS
    return limit if token_expires_at is None else min(limit, token_expires_at)


def same_origin(origin: str | None, host_header: str | None, scheme: str) -> bool:
    """Whether ``Origin`` names this very console (scheme, host and port of the request). ``null``, a missing
    header and any other site are not: a state-changing request must prove where it comes from."""
    if not origin or not host_header:
        return False
    given, sep, netloc = origin.strip().lower().partition("://")
    if not sep or given != scheme or not netloc or any(c in netloc for c in "/?#@\\"):
        return False
    mine = _authority(host_header.strip(), scheme)
    return mine is not None and _authority(netloc, scheme) == mine


def _authority(netloc: str, scheme: str) -> str | None:
    host = host_of_authority(netloc.lower())
    if host is None:
        return None
    _, _, port = netloc.rpartition(":") if not netloc.endswith("]") else ("", "", "")
    default = "443" if scheme == "https" else "80"
    return f"{host}:{port if port.isdigit() else default}"


def check_post(*, origin: str | None, host_header: str | None, scheme: str, fetch_site: str | None) -> Denied | None:
    """Every state-changing request: same origin by ``Origin`` (and ``Sec-Fetch-Site`` when the browser sends it)."""
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return CROSS_SITE
    if not same_origin(origin, host_header, scheme):
        return CROSS_SITE
    return None


def check_csrf(expected: str, presented: str | None) -> Denied | None:
    if not presented or not presented.isascii() or not hmac.compare_digest(presented.encode(), expected.encode()):
        return BAD_CSRF
    return None
