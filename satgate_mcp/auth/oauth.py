"""``SATGATE_AUTH_MODE=oauth``: access tokens (JWTs) from the operator's authorization server.

The gateway is an OAuth 2.1 resource server: it never issues tokens, it verifies what the issuer
signed against the issuer's published keys (JWKS). JOSE is PyJWT's job; what is ours is the policy
around it: which algorithms, which issuer and audience, how keys are found and refreshed, and what
a verified token means here (token id, budget, scopes, the session binding).

The issuer's keys (discovery, fetching, rotation) are oauth_keys.py's. A verified token is remembered
for ``VERIFIED_SECONDS`` (bounded, by its hash), as macaroons are: expiry and revocation are still
checked on every request, so the cache can neither outlive ``exp`` nor hide a revocation.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
import structlog

from satgate_mcp.auth.base import (
    AuthOutcome,
    AuthResult,
    Identity,
    bearer_from_header,
    is_well_formed_bearer,
)
from satgate_mcp.auth.oauth_keys import ALLOWED_ALGORITHMS, KeySource
from satgate_mcp.auth.revocation import RevocationStore, is_valid_token_id

#: ``typ`` values accepted (RFC 9068 ``at+jwt``, and the ``JWT`` most identity providers write); absent is accepted.
ALLOWED_TYPES = frozenset({"jwt", "at+jwt", "application/jwt", "application/at+jwt"})
CLOCK_SKEW_SECONDS = 30
MAX_TOKEN_CHARS = 16 * 1024
#: How long a verified token's claims are reused without verifying its signature again (as macaroons are).
VERIFIED_SECONDS = 1.0
#: Verified tokens remembered at most (least recently used first out).
MAX_VERIFIED = 10_000

_log = structlog.get_logger(__name__)


def scope_set(claims: Mapping[str, Any]) -> frozenset[str]:
    """``scope`` (RFC 9068: space separated) or ``scp`` (a list, as Entra and Okta write it)."""
    found: set[str] = set()
    scope = claims.get("scope")
    if isinstance(scope, str):
        found.update(scope.split())
    scp = claims.get("scp")
    if isinstance(scp, str):
        found.update(scp.split())
    elif isinstance(scp, list):
        found.update(s for s in scp if isinstance(s, str))
    return frozenset(found)


def token_id_for(value: str) -> str:
    """The claim itself when it can name a token everywhere (revocation file, events); else a stable digest."""
    if is_valid_token_id(value):
        return value
    return "sub-" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:40]


def session_binding(issuer: str, subject: str, client: str) -> str:
    """What a session's tag is keyed by in OAuth mode: who (issuer + subject) through which client.

    A refreshed access token keeps all three, so its session resumes; another subject, or the same
    subject through another client, can never produce the tag. The bearer itself is not used: it
    changes at every refresh, and the client would lose its session each time.
    """
    return json.dumps(["oauth", issuer, subject, client])  # JSON: no field can run into the next


@dataclass(frozen=True, slots=True)
class OAuthPolicy:
    """What the settings say about tokens; immutable, shared by every verification."""

    issuer: str
    audiences: tuple[str, ...]
    jwks_url: str | None = None
    id_claim: str = "sub"
    budget_claim: str | None = None
    tool_scopes: Mapping[str, str] | None = None


class JwtAuthenticator:
    """Bearer JWTs signed by ``policy.issuer``'s keys, for this resource's audience."""

    mode = "oauth"

    def __init__(self, policy: OAuthPolicy, revocations: RevocationStore, *, keys: KeySource | None = None,
                 fail_open: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.revocations = revocations
        self._keys = keys or KeySource(policy.issuer, policy.jwks_url)
        self._fail_open = fail_open
        self._clock = clock
        #: sha256(token) -> (its verified claims, until when they are reused).
        self._verified: OrderedDict[bytes, tuple[dict[str, Any], float]] = OrderedDict()

    async def authenticate(self, authorization: str | None) -> AuthResult:
        token = bearer_from_header(authorization)
        if token is None:
            return AuthResult(AuthOutcome.MISSING, reason="no bearer token")
        if len(token) > MAX_TOKEN_CHARS or not is_well_formed_bearer(token):
            return AuthResult(AuthOutcome.INVALID, reason="malformed bearer token")
        try:
            claims = await self._claims(token)
        except jwt.ExpiredSignatureError:
            return AuthResult(AuthOutcome.EXPIRED, reason="token expired")
        except jwt.PyJWTError as exc:
            return AuthResult(AuthOutcome.INVALID, reason=_reason(exc))
        identity, binding = self._identity(claims)
        if identity is None:
            return AuthResult(AuthOutcome.INVALID, reason=binding)
        ids = [identity.token_id, *(str(claims[c]) for c in ("jti", "sub") if isinstance(claims.get(c), str))]
        try:
            revoked = await self._revoked_id(ids)
        except Exception as exc:  # a store outage must neither crash nor read as the client's fault
            _log.warning("revocation_check_failed", token_id=identity.token_id, error=type(exc).__name__,
                         fail_mode="open" if self._fail_open else "closed")
            if not self._fail_open:
                return AuthResult(AuthOutcome.UNAVAILABLE, identity, binding, "revocation store unavailable")
            revoked = None
        if revoked is not None:
            return AuthResult(AuthOutcome.REVOKED, identity, binding, "token revoked")
        return AuthResult(AuthOutcome.OK, identity, binding)

    async def _revoked_id(self, ids: Sequence[str]) -> str | None:
        """Revoking the id claim, the ``jti`` or the subject revokes the token."""
        for token_id in dict.fromkeys(ids):
            if await self.revocations.is_revoked(token_id):
                return token_id
        return None

    async def _claims(self, token: str) -> dict[str, Any]:
        """The token's claims, verified now or within ``VERIFIED_SECONDS``; its expiry is checked either way."""
        key, now = hashlib.sha256(token.encode("ascii")).digest(), self._clock()
        cached = self._verified.get(key)
        if cached is None or cached[1] <= now:
            claims = await self._verified_claims(token)
            self._verified[key] = (claims, now + VERIFIED_SECONDS)
            while len(self._verified) > MAX_VERIFIED:
                self._verified.popitem(last=False)
            return claims
        self._verified.move_to_end(key)
        claims = cached[0]
        if now >= float(claims["exp"]) + CLOCK_SKEW_SECONDS:  # what jwt.decode would say now
            raise jwt.ExpiredSignatureError("Signature has expired")
        return claims

    async def _verified_claims(self, token: str) -> dict[str, Any]:
        header = jwt.get_unverified_header(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGORITHMS:
            raise jwt.InvalidAlgorithmError(f"algorithm {str(alg)[:20]!r} is not accepted")
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in ALLOWED_TYPES):
            raise jwt.InvalidTokenError(f"token type {str(typ)[:40]!r} is not an access token")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise jwt.InvalidTokenError("kid is not a string")
        key = await self._keys.key_for(kid, alg)
        if key is None:
            raise jwt.InvalidKeyError("no published key of the issuer verifies this token")
        if not key.verifies(alg):
            raise jwt.InvalidAlgorithmError("the token's algorithm is not its key's")
        policy = self.policy
        claims: dict[str, Any] = jwt.decode(
            token, key.key.key, algorithms=[alg], audience=list(policy.audiences), issuer=policy.issuer,
            leeway=CLOCK_SKEW_SECONDS, options={"require": ["exp", "iss", "aud"], "verify_iat": True})
        iat = claims.get("iat")
        if isinstance(iat, (int, float)) and iat > self._clock() + CLOCK_SKEW_SECONDS:
            raise jwt.ImmatureSignatureError("issued in the future")
        return claims

    def _identity(self, claims: Mapping[str, Any]) -> tuple[Identity | None, str]:
        """The identity and the session binding; (None, why) when a claim we need is missing."""
        policy = self.policy
        raw_id = claims.get(policy.id_claim)
        if not isinstance(raw_id, str) or not raw_id:
            return None, f"the {policy.id_claim!r} claim is missing"
        budget = claims.get(policy.budget_claim) if policy.budget_claim else None
        client = next((v for v in (claims.get("azp"), claims.get("client_id")) if isinstance(v, str)), "")
        subject = claims.get("sub")
        exp = claims.get("exp")
        identity = Identity(
            token_id=token_id_for(raw_id),
            budget_id=token_id_for(budget) if isinstance(budget, str) and budget else None,
            expires_at=float(exp) if isinstance(exp, (int, float)) else None,
            scopes=scope_set(claims),
            tool_scopes=policy.tool_scopes,
            client_id=client or None,
            subject=subject if isinstance(subject, str) else None,
        )
        return identity, session_binding(policy.issuer, subject if isinstance(subject, str) else raw_id, client)

    async def aclose(self) -> None:
        await self._keys.aclose()
        await self.revocations.aclose()


def _reason(exc: jwt.PyJWTError) -> str:
    """A short, safe reason for logs: which check failed, never the token."""
    names: Sequence[tuple[type[jwt.PyJWTError], str]] = (
        (jwt.InvalidAudienceError, "wrong audience"),
        (jwt.InvalidIssuerError, "wrong issuer"),
        (jwt.ImmatureSignatureError, "not valid yet"),
        (jwt.MissingRequiredClaimError, "a required claim is missing"),
        (jwt.InvalidSignatureError, "signature does not verify"),
        (jwt.DecodeError, "malformed token"),
    )
    for kind, text in names:
        if isinstance(exc, kind):
            return text
    return str(exc)[:200] or type(exc).__name__
