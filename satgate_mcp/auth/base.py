"""The authenticator seam: every transport hands it the ``Authorization`` header and gets an outcome.

The authenticator reads and verifies the credential; deciding which HTTP answer an outcome
becomes is the transport's job.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from satgate_mcp.patterns import allowed_by, most_specific
from satgate_mcp.policy.controls import Controls

ANONYMOUS = "anonymous"


class AuthOutcome(StrEnum):
    OK = "ok"
    MISSING = "missing"
    INVALID = "invalid"
    EXPIRED = "expired"
    REVOKED = "revoked"
    #: The token verified but the revocation store could not answer: a fault of ours, not the client's.
    UNAVAILABLE = "unavailable"


class TokenError(Exception):
    """A token that cannot be used; ``outcome`` tells the authenticator which refusal it is."""

    outcome: AuthOutcome = AuthOutcome.INVALID

    def __init__(self, reason: str, *, hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        #: For the operator's log only (what to fix), never for the client.
        self.hint = hint


class TokenInvalid(TokenError):
    """Malformed, wrong key, tampered, or carrying a caveat this gateway does not understand."""

    outcome = AuthOutcome.INVALID


class TokenExpired(TokenError):
    outcome = AuthOutcome.EXPIRED


@dataclass(frozen=True, slots=True)
class Identity:
    """What a verified credential says about its holder; immutable, rebuilt on every verification."""

    token_id: str
    budget_id: str | None = None
    tenant: str | None = None
    #: Each inner tuple is one ``tools`` caveat; a tool must match every caveat (narrowing intersects).
    tool_filters: tuple[tuple[str, ...], ...] = ()
    expires_at: float | None = None
    budget_limit: float | None = None
    parent_id: str | None = None
    depth: int = 0
    caveats: tuple[str, ...] = field(default=(), compare=False)
    #: Token ids from the root of the delegation chain down to ``parent_id``; revoking any of them revokes this.
    ancestors: tuple[str, ...] = ()
    #: Lowest ``depth <= N`` caveat: how deep tokens delegated from this one may go (None = unlimited).
    max_depth: int | None = None
    #: Each inner tuple is one ``resources`` caveat (URIs and ``prefix*``); a URI must match every one.
    resource_filters: tuple[tuple[str, ...], ...] = ()
    #: Each inner tuple is one ``prompts`` caveat (names and ``prefix*``); a name must match every one.
    prompt_filters: tuple[tuple[str, ...], ...] = ()
    #: OAuth only: the scopes the access token grants (None: scopes do not apply to this credential).
    scopes: frozenset[str] | None = None
    #: OAuth only: tool pattern -> the scope it requires (``SATGATE_OAUTH_TOOL_SCOPES``).
    tool_scopes: Mapping[str, str] | None = field(default=None, compare=False)
    #: OAuth only: the client the token was issued to (``azp`` or ``client_id``), for the record.
    client_id: str | None = None
    #: OAuth only: who the token speaks for (the ``sub`` claim; the token id may come from another claim), for policy
    #: rules, the record and upstreams told who calls.
    subject: str | None = field(default=None, compare=False)
    #: OAuth only: the verified access token's claims, as policy rules read them (``token.claims``). Not compared:
    #: two identities equal in every other field are the same caller to sessions and caches.
    claims: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: Header mode: minted with ``token mint --admin`` (in the signed identifier): may open the operator console.
    admin: bool = False
    #: Header mode only: one ``Controls`` per ``controls`` caveat (policy/controls.py); every one applies. Not
    #: compared: the caveats that carry them are, and a token's bearer text binds its sessions anyway.
    controls: tuple[Controls, ...] = field(default=(), compare=False)

    @property
    def family_id(self) -> str:
        """Whose allowance this token draws on: its delegation root's, so minting children never
        multiplies a rate, a session quota or an in-flight quota."""
        return self.ancestors[0] if self.ancestors else self.token_id

    @property
    def budget_key(self) -> str:
        """Budgets are keyed by budget id; a token without one spends from its own token id."""
        return self.budget_id or self.token_id

    def allows_tool(self, name: str) -> bool:
        return allowed_by(self.tool_filters, name)

    def missing_scope(self, tool: str) -> str | None:
        """The scope this tool needs and the token lacks; None when it may be called."""
        if self.scopes is None or not self.tool_scopes:
            return None
        scope = required_scope(self.tool_scopes, tool)
        return scope if scope is not None and scope not in self.scopes else None

    def allows_resource(self, uri: str) -> bool:
        return allowed_by(self.resource_filters, uri)

    def allows_prompt(self, name: str) -> bool:
        return allowed_by(self.prompt_filters, name)


ANONYMOUS_IDENTITY = Identity(token_id=ANONYMOUS)

#: Modes in which every client presents one identity: ``none`` (``anonymous``) and ``config`` (one shared secret).
SHARED_IDENTITY_MODES = frozenset({"none", "config"})


def per_token_quota(auth_mode: str, configured: int) -> int | None:
    """The per-token quota to enforce in this mode; None where every client shares one identity.

    A per-token quota (live sessions, DELETE tombstones, requests in flight) keeps one tenant from
    starving another. In ``none`` mode every client is ``anonymous`` and in ``config`` mode every client
    holds the one static token, so such a quota would be a second, lower, gateway-wide cap: with
    ``SATGATE_SESSIONS_PER_TOKEN=100`` the 101st client would evict the first one's session. Counting per
    client address instead would not help: in ``none`` mode on loopback (its default) and behind a reverse
    proxy every client shares one address, and an address is not a tenant anyway (NAT). ``config`` mode's
    one secret is one tenant by definition. So in those modes only the process-wide bounds apply:
    ``SATGATE_SESSION_CAP`` (sessions, and the tombstone map) and ``SATGATE_MAX_INFLIGHT``. Any other mode,
    including one this function does not know, keeps the quota (failing safe).
    """
    return None if auth_mode in SHARED_IDENTITY_MODES else configured


def required_scope(tool_scopes: Mapping[str, str], tool: str) -> str | None:
    """The scope a tool needs: the most specific pattern's (exact name, longest prefix, ``*``); None: none."""
    pattern = most_specific(tool_scopes.keys(), tool)
    return tool_scopes[pattern] if pattern is not None else None


@dataclass(frozen=True, slots=True)
class AuthResult:
    outcome: AuthOutcome
    identity: Identity | None = None
    #: The bearer exactly as presented; only ever hashed, never logged or forwarded.
    token: str = ""
    reason: str = ""
    #: What the operator can do about it (logged with the refusal, never sent to the client).
    hint: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is AuthOutcome.OK


class Authenticator(Protocol):
    mode: str

    async def authenticate(self, authorization: str | None) -> AuthResult: ...


class OwnedAuthenticator(Authenticator, Protocol):
    """An authenticator its builder closes (the app's): closing lets go of what it checks with."""

    async def aclose(self) -> None: ...


def bearer_from_header(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def is_well_formed_bearer(token: str) -> bool:
    """Visible ASCII only: the header arrives as surrogate-escaped bytes, which must never reach a hash or a
    comparison that encodes it (that raised, and became a 500)."""
    return token.isascii() and token.isprintable() and " " not in token


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class NoAuthenticator:
    """``SATGATE_AUTH_MODE=none``: everyone is the anonymous identity."""

    mode = "none"

    async def authenticate(self, authorization: str | None) -> AuthResult:
        bearer = bearer_from_header(authorization) or ""
        if bearer and not is_well_formed_bearer(bearer):
            return AuthResult(AuthOutcome.INVALID, reason="malformed bearer token")
        return AuthResult(AuthOutcome.OK, ANONYMOUS_IDENTITY, bearer)

    async def aclose(self) -> None:
        return None  # holds nothing


class StaticTokenAuthenticator:
    """``SATGATE_AUTH_MODE=config``: one shared bearer token, compared in constant time."""

    mode = "config"

    def __init__(self, token: str, token_id: str = "static") -> None:
        if not token:
            raise ValueError("the static token must not be empty")
        self._token = token.encode("utf-8")
        self._identity = Identity(token_id=token_id)

    async def authenticate(self, authorization: str | None) -> AuthResult:
        bearer = bearer_from_header(authorization)
        if bearer is None:
            return AuthResult(AuthOutcome.MISSING, reason="no bearer token")
        if not is_well_formed_bearer(bearer):
            return AuthResult(AuthOutcome.INVALID, reason="malformed bearer token")
        if not hmac.compare_digest(bearer.encode("ascii"), self._token):
            return AuthResult(AuthOutcome.INVALID, reason="token does not match")
        return AuthResult(AuthOutcome.OK, self._identity, bearer)

    async def aclose(self) -> None:
        return None  # holds nothing


