"""Users' upstream grants and waiting authorizations in this process's memory (``SATGATE_STATE_DIR=memory``).

Every operation runs without an ``await`` inside, so on one event loop each is atomic.
"""

from __future__ import annotations

from satgate_mcp.oauth_grants import (
    PENDING_PER_OWNER,
    PendingAuthorization,
    StoredGrant,
    kept_until,
    ordered,
    taken,
)


class MemoryGrantStore:
    """``GrantStore`` in memory: authorizations by state, grants by (owner, upstream)."""

    def __init__(self) -> None:
        self._pending: dict[str, PendingAuthorization] = {}
        self._grants: dict[tuple[str, str], StoredGrant] = {}

    async def begin(self, pending: PendingAuthorization, now: float, per_owner: int = PENDING_PER_OWNER) -> bool:
        for state in [s for s, p in self._pending.items() if kept_until(p) <= now]:
            del self._pending[state]
        waiting = sum(1 for p in self._pending.values() if p.owner == pending.owner and not p.used
                      and p.expires_at > now)
        if waiting >= per_owner:
            return False
        self._pending[pending.state] = pending
        return True

    async def take(self, state: str, now: float) -> PendingAuthorization | None:
        found, keep = taken(self._pending.get(state), now)
        if keep is not None:
            self._pending[state] = keep
        return found

    async def put(self, grant: StoredGrant) -> None:
        self._grants[(grant.owner, grant.upstream)] = grant

    async def update(self, grant: StoredGrant) -> bool:
        current = self._grants.get((grant.owner, grant.upstream))
        if current is None or current.grant_id != grant.grant_id:
            return False
        self._grants[(grant.owner, grant.upstream)] = grant
        return True

    async def get(self, owner: str, upstream: str) -> StoredGrant | None:
        return self._grants.get((owner, upstream))

    async def drop(self, owner: str, upstream: str, grant_id: str) -> bool:
        current = self._grants.get((owner, upstream))
        if current is None or current.grant_id != grant_id:
            return False
        del self._grants[(owner, upstream)]
        return True

    async def revoke(self, owner: str, upstream: str | None = None) -> int:
        doomed = [key for key in self._grants if key[0] == owner and upstream in (None, key[1])]
        for key in doomed:
            del self._grants[key]
        return len(doomed)

    async def listing(self, owner: str | None = None) -> list[StoredGrant]:
        return ordered([g for g in self._grants.values() if owner in (None, g.owner)])

    async def close(self) -> None:
        return None
