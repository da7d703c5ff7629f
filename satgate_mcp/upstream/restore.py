"""What a restarted upstream is told again: a new child, or a new upstream session, starts knowing nothing of the
log level or the resource subscriptions its sessions set on the one before it.

The shared pool restores its own upstreams; an isolated upstream restores each client child, whose
subscriptions are its owner's alone. Both keep what they hold with ``note_subscription`` and ask again here.
"""

from __future__ import annotations

from collections.abc import Iterable

from structlog.typing import FilteringBoundLogger

from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import Upstream
from satgate_mcp.upstream.wire import SUBSCRIPTION_METHODS


def note_subscription(held: set[str], method: str, params: JsonObj | None, reply: JsonObj) -> str | None:
    """Keep ``held`` what the upstream holds after a (un)subscribe it answered (a refused subscribe adds nothing);
    the URI when it was noted, else None."""
    subscribe = SUBSCRIPTION_METHODS.get(method)
    uri = (params or {}).get("uri")
    if subscribe is None or not isinstance(uri, str) or (subscribe and "error" in reply):
        return None
    if subscribe:
        held.add(uri)
    else:
        held.discard(uri)
    return uri


def restore_asks(level: str | None, uris: Iterable[str]) -> list[tuple[str, JsonObj]]:
    """The requests that set a fresh upstream as the old one was: the level first, then each URI in order."""
    asks: list[tuple[str, JsonObj]] = [("logging/setLevel", {"level": level})] if level is not None else []
    return asks + [("resources/subscribe", {"uri": uri}) for uri in sorted(uris)]


async def ask_again(upstream: Upstream, asks: list[tuple[str, JsonObj]], log: FilteringBoundLogger) -> bool:
    """Send each ask; False when the upstream went away meanwhile (its next start restores again)."""
    for method, params in asks:
        try:
            reply = await upstream.request(method, params)
        except UpstreamUnavailable as exc:
            log.warning("upstream_restore_failed", method=method, error=exc.message)
            return False
        if "error" in reply:
            log.warning("upstream_restore_refused", method=method, error=reply.get("error"))
    return True
