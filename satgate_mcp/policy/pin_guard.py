"""The pinning guard: pins each upstream tool definition as the pool learns it, and holds back changed ones.

The pool hands every freshly listed tools list of an upstream to ``learn`` before anyone is shown it; that is
where definitions are fingerprinted, compared with their pins (a mirror of the store in memory) and, when
something is new or changed, written to the store. A call's check is a set lookup. Approvals made anywhere
(``satgate-mcp tools approve``) reach every process by polling the store's version counter (every
``POLL_SECONDS``); when what callers may be shown changes, the pool announces ``list_changed``.

``warn`` pins and reports changes (one ``tool_definition_changed`` event per change, by the process whose
write recorded it) and serves them; ``enforce`` also hides changed and new tools and refuses their calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import TypeVar

import structlog

from satgate_mcp import events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import Publisher
from satgate_mcp.guards import Asked, ClientFacts, Proceed
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy import pins
from satgate_mcp.policy.pins import Mode, Pin, PinStore, Seen
from satgate_mcp.upstream.catalog import Kind

log = structlog.get_logger("satgate_mcp.pins")

T = TypeVar("T")

#: How often each process looks for approvals (and pins written elsewhere): well within the promised second.
POLL_SECONDS = 0.5


def _no_owner(name: str) -> str | None:
    return None


def _nothing() -> None:
    return None


class PinGuard:
    """``Guard`` of pinned tool definitions; ``learn`` is the pool's tools hook (listings.py)."""

    def __init__(self, store: PinStore, *, mode: Mode, prefixes: Mapping[str, str], publisher: Publisher,
                 metrics: Metrics, timeout: float, clock: Callable[[], float] = time.time,
                 poll_seconds: float = POLL_SECONDS) -> None:
        self._store = store
        self.mode = mode
        self._prefixes = dict(prefixes)
        self._publisher = publisher
        self._metrics = metrics
        self._timeout = timeout
        self._clock = clock
        self._poll_seconds = poll_seconds
        #: The store's pins as this process last read (or wrote) them.
        self._pins: dict[tuple[str, str], Pin] = {}
        #: Each upstream's tools as last learned: its own tool name -> what was seen.
        self._learned: dict[str, dict[str, Seen]] = {}
        #: Upstreams whose first pinning is known to be recorded; upstreams whose last learning the store missed.
        self._recorded: set[str] = set()
        self._unrecorded: set[str] = set()
        #: (upstream, listed name) of every tool held back, and the listed names alone (the fast "no" of a list).
        self._held: frozenset[tuple[str, str]] = frozenset()
        self._held_names: frozenset[str] = frozenset()
        self._version: int | None = None
        self._owner: Callable[[str], str | None] = _no_owner
        self._announce: Callable[[], None] = _nothing
        self._poller: asyncio.Task[None] | None = None
        self._failing = False

    def attach(self, owner: Callable[[str], str | None], announce: Callable[[], None]) -> None:
        """The pool's links: who owns a listed tool name, and how a change of what may be shown is announced."""
        self._owner, self._announce = owner, announce

    @property
    def enforcing(self) -> bool:
        return self.mode == "enforce"

    def held_tools(self) -> frozenset[tuple[str, str]]:
        """(upstream, listed name) of every tool held back now."""
        return self._held

    # -- the guard ------------------------------------------------------------------------------

    async def guard(self, asked: Asked, proceed: Proceed) -> JsonObj:
        if asked.target == "tool" and (asked.upstream, asked.name) in self._held:
            raise self._refusal(str(asked.upstream), asked.name)
        return await proceed()

    def hides(self, identity: Identity, kind: Kind, item: JsonObj, client: ClientFacts | None) -> bool:
        if kind != "tools" or not self._held_names:
            return False
        name = item.get("name")
        return name in self._held_names and (self._owner(str(name)), name) in self._held

    def _refusal(self, upstream: str, listed: str) -> GatewayError:
        tool = listed.removeprefix(self._prefixes.get(upstream, ""))
        pin = self._pins.get((upstream, tool))
        command = f"{pins.APPROVE_COMMAND} {upstream}/{tool}"
        if pin is None:
            status = "unverified"
            message = (f"Tool {listed!r} could not be checked against its pin (the state store did not answer); "
                       f"it is held until it can be, or until an operator approves it: {command}")
        else:  # held: new, or serving something other than what was approved
            held_as: pins.Status = "new" if pin.approved is None else "changed"
            status, message = held_as, pins.refusal_message(upstream, tool, held_as)
        self._metrics.refusals.labels(reason="tool_definition_changed").inc()
        return GatewayError(message, {"error": "tool_definition_changed", "tool": listed, "upstream": upstream,
                                      "status": status, "approve": command}, code=jsonrpc.TOOL_NOT_ALLOWED)

    # -- learning definitions (the pool's hook) -------------------------------------------------------

    async def learn(self, upstream: str, items: list[JsonObj]) -> None:
        """An upstream's tools as just listed, before the merged list takes them: pin, compare, record."""
        seen: dict[str, Seen] = {}
        for item in items:
            name = item.get("name")
            if isinstance(name, str) and name and name not in seen:
                seen[name] = Seen.of(item)
        self._learned[upstream] = seen
        self._recompute()  # a definition the mirror does not know is held from this moment (enforce)
        await self._record_bounded(upstream)
        self._recompute()

    async def _record_bounded(self, upstream: str) -> None:
        try:
            await self._record(upstream, self._learned[upstream])
        except Exception as exc:  # a store fault: tools the mirror cannot vouch for stay held; retried on the next poll
            self._unrecorded.add(upstream)
            log.warning("tool_pins_unrecorded", upstream=upstream, error=f"{type(exc).__name__}: {exc}")
        else:
            self._unrecorded.discard(upstream)

    async def _record(self, upstream: str, seen: Mapping[str, Seen]) -> None:
        now = self._clock()
        if upstream not in self._recorded:
            first = [pins.first_pin(upstream, tool, s, now, hold=False) for tool, s in seen.items()]
            recorded = await self._bounded(self._store.first_pinning(upstream, first))
            self._recorded.add(upstream)
            if recorded:
                self._pins.update({(pin.upstream, pin.tool): pin for pin in first})
                log.info("tool_pins_first", upstream=upstream, tools=len(first))
                return
        for tool, definition in seen.items():
            known = self._pins.get((upstream, tool))
            if known is not None and pins.observe(known, upstream, tool, definition, now, hold_new=False) is None:
                continue  # the mirror says nothing is to be written
            change = partial(pins.observe, upstream=upstream, tool=tool, seen=definition, now=now,
                             hold_new=self.enforcing)
            before, after = await self._bounded(self._store.update(upstream, tool, change))
            if after is not None:
                self._pins[(upstream, tool)] = after
            if pins.is_change(before, after):
                self._report(after)

    async def _bounded(self, pending: Awaitable[T]) -> T:
        async with asyncio.timeout(self._timeout):
            return await pending

    def _report(self, after: Pin | None) -> None:
        assert after is not None
        self._metrics.tool_definition_changes.labels(upstream=after.upstream).inc()
        self._publisher.publish(events.TOOL_DEFINITION_CHANGED, upstream=after.upstream, tool=after.tool,
                                old_fingerprint=after.approved, new_fingerprint=after.pending,
                                changed=pins.changed_fields(after.approved_definition, after.pending_definition),
                                status=after.status, mode=self.mode)

    def _recompute(self) -> None:
        """Which learned tools are held back now; a change of that set is announced (sessions re-list)."""
        if not self.enforcing:
            return
        held = frozenset((upstream, self._prefixes.get(upstream, "") + tool)
                         for upstream, tools in self._learned.items() for tool, seen in tools.items()
                         if pins.held(self.mode, self._pins.get((upstream, tool)), seen.fingerprint))
        if held != self._held:
            self._held, self._held_names = held, frozenset(name for _, name in held)
            self._announce()

    # -- following the store ----------------------------------------------------------------------

    async def start(self) -> None:
        """Read every pin (bounded: a store that does not answer leaves enforce holding until it does), then
        follow approvals."""
        await self.refresh()
        self._poller = asyncio.create_task(self._poll(), name="tool-pins-poller")

    async def refresh(self) -> bool:
        """One look at the store: reload the pins when its version moved, retry what it missed. True: it answered."""
        try:
            version = await self._bounded(self._store.version())
            if version != self._version:
                self._load(await self._bounded(self._store.pins()))
                self._version = version
            for upstream in sorted(self._unrecorded):
                await self._record_bounded(upstream)
        except Exception as exc:
            if not self._failing:
                log.warning("tool_pins_unreadable", error=f"{type(exc).__name__}: {exc}")
            self._failing = True
            return False
        self._failing = False
        self._recompute()
        return True

    def _load(self, found: Iterable[Pin]) -> None:
        self._pins = {(pin.upstream, pin.tool): pin for pin in found}

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            await self.refresh()

    async def aclose(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
