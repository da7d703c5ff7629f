"""A policy reload tells ``list_changed`` to the sessions and listen streams whose lists it changed, and no others.

The lists are taken from the pool as they are now; each caller's verdict comes from ``Affected`` (once per token).
A session without a stream that is not affected is marked as having seen the new tools version, so it is not
owed a ``list_changed`` ahead of its next answer either.
"""

from __future__ import annotations

from functools import partial

import structlog

from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import Pool
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.policy.decide import LISTED, Decider
from satgate_mcp.policy.reload_scope import Affected, Item
from satgate_mcp.sessions import Session, SessionRegistry
from satgate_mcp.transport.listen import Listeners
from satgate_mcp.transport.session_stream import StreamHub
from satgate_mcp.upstream.catalog import ANNOUNCED, Kind


async def listed_items(pool: Pool, kind: Kind) -> list[Item] | None:
    """The whole list of ``kind`` as the pool has it now, each item with its owning upstream (tools); None when it
    cannot be listed now (then every caller is told, as before)."""
    if kind == "tools":
        return [(item, pool.owner_of_tool(item["name"]) if isinstance(item.get("name"), str) else None)
                for item in pool.tools()]
    try:
        found = (await pool.listing(kind)).get(kind)
    except Exception:  # an upstream down or failing: unknown, so nobody is left untold
        log.warning("reload_listing_failed", kind=kind)
        return None
    return [(item, None) for item in found if isinstance(item, dict)] if isinstance(found, list) else None


log = structlog.get_logger("satgate_mcp.transport.reload_notices")


class ReloadNotices:
    """Wired as the policy file's ``on_lists_changed``."""

    def __init__(self, pool: Pool, registry: SessionRegistry, hub: StreamHub, listeners: Listeners,
                 dispatcher: Dispatcher) -> None:
        self._pool, self._registry, self._hub, self._listeners = pool, registry, hub, listeners
        self._dispatcher = dispatcher

    async def __call__(self, kinds: list[str], old: Decider, new: Decider) -> None:
        announced: list[Kind] = [kind for kind in ("tools", "prompts", "resources") if kind in kinds and kind in LISTED]
        items = {kind: await listed_items(self._pool, kind) for kind in announced}
        affected = Affected(old, new, items)
        before = self._dispatcher.tools_version
        self._dispatcher.guards_changed(kinds)
        after = self._dispatcher.tools_version
        if "tools" in announced:
            for session in self._registry:
                if session.tools_seen == before and not affected(session.identity, "tools"):
                    session.saw_tools(after)  # its list did not change: it is owed nothing
        for kind in announced:
            method = ANNOUNCED[kind]
            self._hub.tell(method, partial(_session_affected, affected, kind))
            self._listeners.tell(method, partial(_caller_affected, affected, kind))


def _session_affected(affected: Affected, kind: Kind, session: Session) -> bool:
    return affected(session.identity, kind)


def _caller_affected(affected: Affected, kind: Kind, identity: Identity) -> bool:
    return affected(identity, kind)
