"""``SATGATE_AUTH_MODE=header``: the authenticator for macaroon bearer tokens (the format: macaroons.py)."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from satgate_mcp.auth import macaroons
from satgate_mcp.auth.base import AuthOutcome, AuthResult, Identity, TokenError, bearer_from_header
from satgate_mcp.auth.macaroons import is_expired
from satgate_mcp.auth.revocation import RevocationStore

_log = structlog.get_logger(__name__)


@dataclass(slots=True)
class _Verified:
    identity: Identity | None
    outcome: AuthOutcome
    reason: str
    until: float
    hint: str = ""


class MacaroonAuthenticator:
    """``SATGATE_AUTH_MODE=header``: macaroon bearer tokens, checked on every request.

    The expensive part (deserialize, HMAC chain) is cached per token hash for ``cache_seconds``
    in a bounded LRU. Expiry is compared against the clock and revocation asked of the store on
    every call, so the cache can neither outlive ``expires`` nor hide a revocation; the stores
    answer from local state at most half a second old.
    """

    mode = "header"

    def __init__(
        self,
        root_key: str,
        revocations: RevocationStore,
        *,
        clock: Callable[[], float] = time.time,
        cache_seconds: float = 1.0,
        max_cached: int = 10_000,
        fail_open: bool = False,
    ) -> None:
        self._fail_open = fail_open
        self._root_key = root_key
        self.revocations = revocations
        self._clock = clock
        self._cache_seconds = cache_seconds
        self._max_cached = max_cached
        self._cache: OrderedDict[bytes, _Verified] = OrderedDict()

    def _verified(self, token: str, now: float) -> _Verified:
        key = hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).digest()
        entry = self._cache.get(key)
        if entry is not None and entry.until > now:
            self._cache.move_to_end(key)
            return entry
        try:
            # looked up on the module: tests count verifications by replacing it there
            entry = _Verified(macaroons.verify_signature(self._root_key, token), AuthOutcome.OK, "", 0.0)
        except TokenError as exc:
            entry = _Verified(None, exc.outcome, exc.reason, 0.0, exc.hint)
        entry.until = now + self._cache_seconds
        self._cache[key] = entry
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return entry

    async def authenticate(self, authorization: str | None) -> AuthResult:
        token = bearer_from_header(authorization)
        if token is None:
            return AuthResult(AuthOutcome.MISSING, reason="no bearer token")
        now = self._clock()
        entry = self._verified(token, now)
        identity = entry.identity
        if identity is None:
            return AuthResult(entry.outcome, reason=entry.reason, hint=entry.hint)
        try:
            revoked = await self._revoked_id(identity)
        except Exception as exc:  # a store outage must neither crash nor read as the client's fault
            _log.warning("revocation_check_failed", token_id=identity.token_id, error=type(exc).__name__,
                         fail_mode="open" if self._fail_open else "closed")
            if is_expired(identity, now):  # refused whatever the store would say: no reason to ask a retry
                return AuthResult(AuthOutcome.EXPIRED, identity, token, "token expired")
            if not self._fail_open:
                return AuthResult(AuthOutcome.UNAVAILABLE, identity, token, "revocation store unavailable")
            revoked = None
        if revoked is not None:
            reason = "token revoked" if revoked == identity.token_id else "an ancestor token was revoked"
            return AuthResult(AuthOutcome.REVOKED, identity, token, reason)
        if is_expired(identity, now):
            return AuthResult(AuthOutcome.EXPIRED, identity, token, "token expired")
        return AuthResult(AuthOutcome.OK, identity, token)

    async def _revoked_id(self, identity: Identity) -> str | None:
        for token_id in (identity.token_id, *reversed(identity.ancestors)):
            if await self.revocations.is_revoked(token_id):
                return token_id
        return None

    def forget(self) -> None:
        """Drop every cached verification (tests, or after rotating the root key)."""
        self._cache.clear()

    async def aclose(self) -> None:
        await self.revocations.aclose()
