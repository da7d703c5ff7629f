"""Users' grants to ``"oauth_user"`` upstreams, and the authorizations they are waiting on: records and their rules.

Two kinds of record, both in the state store so any gateway process can use what another one started:

- a ``PendingAuthorization``: the ``state`` of one authorization URL, bound to the caller (token id or subject)
  and the upstream, with its PKCE verifier; single use (``take`` removes it), good for ten minutes, and kept a
  while longer only so a late callback is told "expired" rather than "unknown";
- a ``StoredGrant``: one per (owner, upstream), its refresh token sealed (AES-GCM, upstream/credential_box.py)
  so the store never holds it in the clear. ``grant_id`` names one authorization: a refresh writes back only onto
  the grant it read (``update``), so a revocation in between is never undone.

The stores (memory, SQLite, Redis) carry these out; the decisions are the pure functions below.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from typing import Literal, Protocol

#: How long an authorization URL can be completed.
STATE_TTL_SECONDS = 600.0
#: How long a used-up or expired state is still told apart from an unknown one.
STATE_GRACE_SECONDS = 3600.0
#: Authorizations one owner may have waiting at once (each call without a grant starts one).
PENDING_PER_OWNER = 20

Refusal = Literal["unknown", "expired", "other_upstream"]


@dataclass(frozen=True, slots=True)
class PendingAuthorization:
    state: str
    owner: str
    upstream: str
    #: PKCE ``code_verifier``, sealed like a refresh token (bound to this state).
    verifier: str
    redirect_uri: str
    created_at: float
    expires_at: float
    #: Set once its callback took it: the record stays (until its grace ends) only to say so.
    used: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | bytes) -> PendingAuthorization:
        return PendingAuthorization(**json.loads(text))


@dataclass(frozen=True, slots=True)
class StoredGrant:
    owner: str
    upstream: str
    grant_id: str
    #: The refresh token (and its scope), sealed with the owner and upstream as associated data.
    sealed: str
    created_at: float
    refreshed_at: float
    #: What the user granted (as the authorization server said), for ``credentials list``.
    scope: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | bytes) -> StoredGrant:
        return StoredGrant(**json.loads(text))

    def view(self) -> dict[str, object]:
        """What ``credentials list --json`` shows: never the sealed token."""
        return {"subject": self.owner, "upstream": self.upstream, "grant_id": self.grant_id, "scope": self.scope,
                "created_at": self.created_at, "refreshed_at": self.refreshed_at}


class GrantStore(Protocol):
    async def begin(self, pending: PendingAuthorization, now: float, per_owner: int = PENDING_PER_OWNER) -> bool:
        """Keep ``pending`` (until ``kept_until``); False when its owner already has ``per_owner`` waiting."""
        ...

    async def take(self, state: str, now: float) -> PendingAuthorization | None:
        """Atomically: the record as it was, and from now on marked used (so exactly one callback gets it unused)."""
        ...

    async def put(self, grant: StoredGrant) -> None:
        """The grant a completed authorization gave: it replaces any the owner had for that upstream."""
        ...

    async def update(self, grant: StoredGrant) -> bool:
        """Write ``grant`` only over the same ``grant_id`` (a refresh); False when it was revoked or replaced."""
        ...

    async def get(self, owner: str, upstream: str) -> StoredGrant | None: ...

    async def drop(self, owner: str, upstream: str, grant_id: str) -> bool:
        """Forget that very grant (the authorization server refused it), not a newer one."""
        ...

    async def revoke(self, owner: str, upstream: str | None = None) -> int:
        """Forget the owner's grant for ``upstream``, or all of its grants; how many."""
        ...

    async def listing(self, owner: str | None = None) -> list[StoredGrant]:
        """Every grant (or the owner's), by owner then upstream."""
        ...

    async def close(self) -> None: ...


def new_state() -> str:
    """An authorization's ``state``: 256 random bits, unguessable, URL-safe."""
    return secrets.token_urlsafe(32)


def new_grant_id() -> str:
    return secrets.token_hex(8)


def kept_until(pending: PendingAuthorization) -> float:
    return pending.expires_at + STATE_GRACE_SECONDS


def callback_refusal(pending: PendingAuthorization | None, upstream: str, now: float) -> Refusal | None:
    """Why a callback with this state may not complete (None: it may): unknown or used already, expired, or
    issued for another upstream's callback."""
    if pending is None or pending.used:
        return "unknown"
    if pending.upstream != upstream:
        return "other_upstream"
    if now >= pending.expires_at:
        return "expired"
    return None


def taken(pending: PendingAuthorization | None, now: float) -> tuple[PendingAuthorization | None,
                                                                    PendingAuthorization | None]:
    """(what ``take`` returns, what it stores back): a live record is returned as it was and kept marked used."""
    if pending is None or kept_until(pending) <= now:
        return None, None
    if pending.used:
        return pending, None
    return pending, PendingAuthorization(**{**asdict(pending), "used": True})


def ordered(grants: list[StoredGrant]) -> list[StoredGrant]:
    return sorted(grants, key=lambda g: (g.owner, g.upstream))
