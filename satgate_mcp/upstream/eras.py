"""Which era a request goes upstream in: the client's own when the upstream speaks it (issue 25).

An upstream on the official SDKs serves both revisions. Spoken to in one, it loses the other's
clients something: a 2026-07-28 client bridged onto a 2025 session gets its inputs renamed and
asked one at a time, and the gateway's capabilities instead of its own; a 2025 client bridged onto
2026-07-28 loses requests mid-call, ``logging/setLevel`` and subscriptions. So with ``"protocol":
"auto"`` a connection that completed the handshake learns, once, whether the upstream also answers
``server/discover``, and sends 2026-07-28 requests to that second, sessionless connection.
Translation between eras is left for an upstream that lacks the client's era.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal, Protocol

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import (
    UPSTREAM_READY,
    NotificationCallback,
    Upstream,
    initialize_timeout,
    is_input_carrier,
    is_relay,
)

Era = Literal["2025", "2026"]

#: How many times an upstream's 2026-07-28 side is looked for when it never answered (its child died, it was down).
MAX_PROBES = 3


class Probe(Upstream, Protocol):
    """A connection that can tell "not 2026-07-28" (an answer) from no answer at all."""

    declined: bool


def probe_final(found: bool, declined: bool, tries: int) -> bool:
    """Whether the look for the 2026-07-28 side is over: found, refused by the upstream itself, or tried enough.

    A child killed during ``server/discover``, or an upstream restarting just then, is no answer: the next 2026
    client looks again, so one fault does not bridge every later 2026 client for the process's life.
    """
    return found or declined or tries >= MAX_PROBES


def wants_modern_twin(protocol: str, primary_modern: bool, client: Era | None) -> bool:
    """Whether a request should look for the upstream's 2026-07-28 side next to its 2025 session.

    Only ``auto`` learns both eras: ``2025`` never leaves the handshake, ``2026`` keeps the era it found first.
    """
    return protocol == "auto" and not primary_modern and client == "2026"


#: 2025 revisions' "resource not found"; 2026-07-28 answers -32602 with ``data.uri`` instead (SEP-2164).
RESOURCE_NOT_FOUND = -32002


def client_era(on_progress: object) -> Era | None:
    """The era of the client a request runs for: a 2026 client's relay carries input, a 2025 session's does not."""
    if is_input_carrier(on_progress):
        return "2026"
    return "2025" if is_relay(on_progress) else None


def resource_error_in_era(reply: JsonObj, uri: str, client: Era | None) -> JsonObj:
    """An unknown resource's error as the client's era words it, whichever era the upstream answered in.

    2026-07-28: -32602 with ``data.uri``; 2025: -32002 (a -32602 naming the URI in ``data.uri`` is a 2026
    upstream's "not found"). Any other reply, or the gateway's own request, is left as it is.
    """
    error = reply.get("error")
    if client is None or not isinstance(error, dict):
        return reply
    found = error.get("data")
    data: JsonObj = found if isinstance(found, dict) else {}
    code = error.get("code")
    if client == "2026" and (code == RESOURCE_NOT_FOUND or (code == jsonrpc.INVALID_PARAMS and "uri" not in data)):
        return {**reply, "error": {**error, "code": jsonrpc.INVALID_PARAMS, "data": {**data, "uri": uri}}}
    if client == "2025" and code == jsonrpc.INVALID_PARAMS and data.get("uri") == uri:
        return {**reply, "error": {**error, "code": RESOURCE_NOT_FOUND}}
    return reply


class ModernTwin:
    """The 2026-07-28 side of an upstream that answered the handshake: probed once, on the first 2026 request.

    A stdio server serves one era per connection (the SDK locks a pipe to the era of its first request),
    so over stdio the twin is a second child; over HTTP it is a sessionless connection to the same URL.
    An upstream that answers ``server/discover`` without 2026-07-28 is not asked again: its 2026 clients are bridged.
    """

    def __init__(self, make: Callable[[], Probe], call_timeout: float) -> None:
        self._make = make
        self._settle = initialize_timeout(call_timeout)
        self._lock = asyncio.Lock()
        self._probed = False
        self._tries = 0
        self._twin: Upstream | None = None
        self._closed = False
        self.on_notification: NotificationCallback | None = None
        self._log = structlog.get_logger("satgate_mcp.upstream")

    @property
    def probed(self) -> bool:
        return self._probed

    @property
    def current(self) -> Upstream | None:
        """The modern connection when it was found already; never probes."""
        return self._twin

    async def get(self) -> Upstream | None:
        """The modern connection, or None when the upstream does not speak 2026-07-28 (asked only the first time)."""
        if self._probed:
            return self._twin
        async with self._lock:
            if self._probed or self._closed:
                return self._twin
            twin = self._make()
            await twin.start(self._forward)
            found = await twin.wait_settled(self._settle) and twin.modern
            self._tries += 1
            self._log.info("upstream_modern_side", upstream=twin.name, speaks_2026=found, declined=twin.declined,
                           tries=self._tries)
            if not found:
                await twin.close()
            self._twin, self._probed = (twin if found else None), probe_final(found, twin.declined, self._tries)
            return self._twin

    async def _forward(self, method: str, params: JsonObj | None) -> None:
        """The twin's list changes and updates are the upstream's; its readiness is not (the session's state is
        restored on the primary connection only)."""
        if method != UPSTREAM_READY and self.on_notification is not None:
            await self.on_notification(method, params)

    async def close(self) -> None:
        self._closed = True
        async with self._lock:
            twin, self._twin = self._twin, None
        if twin is not None:
            await twin.close()
