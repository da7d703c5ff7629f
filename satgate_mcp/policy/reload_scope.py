"""Which callers a policy reload changes the lists of: only they are told ``list_changed``.

A reload swaps one ``Decider`` for another; a caller is affected when some item of a list (as the pool lists it
now) is hidden from it by one and not the other. The verdict depends on the token only (list hiding never reads a
call's arguments), so it is decided once per token however many sessions hold it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from satgate_mcp.auth.base import Identity
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.decide import Decider
from satgate_mcp.upstream.catalog import Kind

#: One listed item and the upstream that owns it (tools: its name's owner; None where unknown).
Item = tuple[JsonObj, str | None]


def identity_key(identity: Identity) -> tuple[object, ...]:
    """What list hiding can read of a caller: equal keys, equal verdicts."""
    return (identity.token_id, identity.caveats, identity.tenant, identity.subject,
            tuple(sorted(identity.scopes)) if identity.scopes is not None else None, identity.admin)


class Affected:
    """``affected(identity, kind)``: whether the reload from ``old`` to ``new`` changes what ``identity`` is shown of
    the ``kind`` list (``items``: the list as the pool has it; None for a kind: unknown, so everyone is)."""

    def __init__(self, old: Decider, new: Decider, items: Mapping[Kind, Sequence[Item] | None]) -> None:
        self._old, self._new, self._items = old, new, items
        self._verdicts: dict[tuple[object, ...], bool] = {}

    def __call__(self, identity: Identity, kind: Kind) -> bool:
        key = (kind, *identity_key(identity))
        verdict = self._verdicts.get(key)
        if verdict is None:
            items = self._items.get(kind, ())
            verdict = self._verdicts[key] = items is None or any(
                self._old.hidden(identity, kind, item, upstream) != self._new.hidden(identity, kind, item, upstream)
                for item, upstream in items)
        return verdict
