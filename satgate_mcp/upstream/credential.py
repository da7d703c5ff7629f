"""The caller's verified credential, for upstreams whose auth is per caller.

Set by the transport where the bearer token is verified (``RequestChecks.principal``), read only where an
upstream asks for its headers: a context variable, like ``base.CALLER``, so nothing in between carries a raw
token it has no use for. The token is never logged and never put in an event: ``repr`` leaves it out.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CallerCredential:
    """Who calls (as the gateway verified it) and the access token they presented."""

    token: str = field(repr=False)
    token_id: str
    #: The subject the token names (OAuth ``sub``); the token id where the credential has none.
    subject: str
    tenant: str | None = None

    @property
    def digest(self) -> bytes:
        """What a cached upstream token is bound to: only this very token may use it again."""
        return hashlib.sha256(self.token.encode("utf-8")).digest()


CREDENTIAL: ContextVar[CallerCredential | None] = ContextVar("satgate_caller_credential", default=None)


#: ``scheme://host`` of the request being served, when its Host is a loopback name: where an ``oauth_user``
#: upstream sends the user back when no SATGATE_PUBLIC_URL (or OAuth audience) says otherwise.
LOOPBACK_BASE: ContextVar[str | None] = ContextVar("satgate_loopback_base", default=None)
