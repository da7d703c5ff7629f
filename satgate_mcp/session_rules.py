"""The session registry's two quota decisions as pure functions, table-tested on their own.

Where a new session finds room within its token's quota, and where a DELETE's tombstone goes: the
registry (``sessions``) applies them; keeping them here keeps it to bookkeeping.
"""

from __future__ import annotations

from enum import StrEnum


class QuotaAction(StrEnum):
    ADMIT = "admit"
    EVICT = "evict"
    BUSY = "busy"


def live_quota_action(held: int, quota: int, has_idle: bool) -> QuotaAction:
    """A token below its quota is admitted; at it, its LRU idle session makes room, else it waits (503)."""
    if held < quota:
        return QuotaAction.ADMIT
    return QuotaAction.EVICT if has_idle else QuotaAction.BUSY


class TombstoneAction(StrEnum):
    RECORD = "record"
    #: Replace the deleting token's tombstones by one block on its own resumes (until now + TTL).
    BLOCK_OWN = "block_own"
    #: The map is full: the largest other holder's tombstones become one block on *its* resumes.
    BLOCK_LARGEST = "block_largest"


def tombstone_action(own: int, quota: int, total: int, bound: int, largest_other: int) -> TombstoneAction:
    """Where a DELETE's tombstone goes, so that one token's deletes only ever cost that token.

    Past its quota a token blocks its own resumes. When the shared map is full, room is taken from
    whoever holds the most (max-min fairness): a token is only blocked for holding at least as
    many tombstones as every other token, never because a bigger holder filled the map.
    """
    if own >= quota:
        return TombstoneAction.BLOCK_OWN
    if total < bound:
        return TombstoneAction.RECORD
    return TombstoneAction.BLOCK_LARGEST if largest_other > own else TombstoneAction.BLOCK_OWN
