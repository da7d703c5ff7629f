"""A stdio child passed between gateway processes: given away by the old one, adopted by the new one.

The old process gives a child away only when it is up and idle (its calls in flight finished, bounded by
the drain): then the next process gets the child's pipes and pidfd with its record (``handover_state``)
and adopts it without a new ``initialize``: same pid, same state. Until the pipes arrive the child is
"in transit": the new process lists it from the record and its calls wait for it (at most
``TRANSIT_SECONDS``); a child that does not arrive in time is replaced by a fresh one, the reason logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from dataclasses import dataclass, field
from typing import Protocol

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.settings import StdioUpstreamSpec
from satgate_mcp.upstream.child_process import ChildProcess, close_fds
from satgate_mcp.upstream.connection import UpstreamConnection
from satgate_mcp.upstream.handover_state import ChildRecord, spec_digest

#: How long calls (and the start of the child's supervision) wait for a child in transit.
TRANSIT_SECONDS = 5.0
#: The listen requests of an adopted modern child: ids unique across processes (the old one's stay open).
ADOPTED_LISTEN_ID = "satgate-listen-adopted"


#: Added to the next id of a child adopted after a crash: answers to the dead process's requests match nothing.
GENERATION_STRIDE = 1 << 32


class ChildStore(Protocol):
    """Where a running child's pipes and record are kept so that a crashed process's successor finds them."""

    def keep(self, record: ChildRecord, fds: list[int], pidfd: int) -> None: ...

    def forget(self, upstream: str, instance: str | None) -> None: ...


_STORE: list[ChildStore] = []


def set_store(store: ChildStore | None) -> None:
    """The runner's fd store (systemd's), or None: children are then kept nowhere but here."""
    _STORE[:] = [] if store is None else [store]


@dataclass
class Delivery:
    """A child's record with its pipes (stdin's write end, stdout's and stderr's read ends) and pidfd."""

    record: ChildRecord
    fds: list[int]
    pidfd: int
    #: From the fd store after a crash (not handed over): its last line may be half written, its ids reused.
    crashed: bool = False

    def discard(self) -> None:
        """Close this process's copies (the sender's, once sent)."""
        close_fds([*self.fds, self.pidfd])

    def refuse(self) -> None:
        """A child that arrived but is not adopted: asked to stop (its pipes close too), never left running."""
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGTERM)
        self.discard()


@dataclass
class Transit:
    """A child announced by the old process whose pipes have not arrived yet."""

    record: ChildRecord
    arrived: asyncio.Future[Delivery | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def listed(self, method: str, params: JsonObj | None) -> JsonObj | None:
        """A list the record holds, answered from it (the first page only: the record keeps whole lists)."""
        result = self.record.lists.get(method)
        if result is None or (params or {}).get("cursor") is not None:
            return None
        return jsonrpc.result_response(None, result)


class StdioHandover(UpstreamConnection[StdioUpstreamSpec]):
    """What a stdio upstream does to give its child away, or to take one over (``StdioUpstream`` builds on it)."""

    _proc: ChildProcess | None
    _pending: dict[int, asyncio.Future[JsonObj]]
    _supervisor: asyncio.Task[None] | None
    _listens: itertools.count[int]
    _listen_id: str | None
    #: A child announced by the old process (``expect``), until it arrives or is given up on.
    _transit: Transit | None = None
    #: Set once this process gave its child away: its end is not the child's end.
    _handed_over = False
    _instance: str | None = None
    #: What the pool told this (shared) child: subscriptions and log level, kept in its stored record.
    _kept: tuple[list[str], str | None] = ([], None)

    @property
    def ready(self) -> bool:
        """A child in transit counts as ready: its lists are known, and its calls wait for it."""
        return self._ready.is_set() or self._transit is not None

    async def wait_settled(self, timeout: float) -> bool:
        if self._transit is not None:
            return True
        return await super().wait_settled(timeout)

    def expect(self, record: ChildRecord) -> None:
        """Before ``start``: the old process will send this child; until then it is in transit."""
        self._transit = Transit(record)
        self._modern, self._init_result = record.modern, record.init_result  # what the pool lists it by

    def deliver(self, delivery: Delivery | None) -> None:
        """The pipes arrived (or None: they will not); late ones are closed (a fresh child was started)."""
        transit = self._transit
        if transit is None or transit.arrived.done():
            if delivery is not None:
                self._log.warning("upstream_handover_late", pid=delivery.record.pid)
                delivery.refuse()
            return
        transit.arrived.set_result(delivery)

    async def _take_delivery(self) -> Delivery | None:
        """The child to adopt instead of spawning one: the one in transit, if it arrives in time."""
        transit = self._transit
        if transit is None:
            return None
        try:
            async with asyncio.timeout(TRANSIT_SECONDS):
                delivery = await asyncio.shield(transit.arrived)
        except TimeoutError:
            delivery = None
            transit.arrived.cancel()
            self._log.warning("upstream_handover_missed", reason=f"no child arrived within {TRANSIT_SECONDS:g}s",
                              pid=transit.record.pid)
        if delivery is None:
            self._transit = None  # a fresh child now: calls wait for it as for any start
        return delivery

    async def _wait_transit(self) -> None:
        """Calls for a child in transit wait until it is adopted or given up on."""
        transit = self._transit
        if transit is not None:
            await asyncio.wait({asyncio.shield(transit.arrived)}, timeout=TRANSIT_SECONDS)

    async def _resume(self, delivery: Delivery) -> None:
        """Adopt what the old process knew instead of ``initialize``: the child never notices the restart."""
        record = delivery.record
        self._transit = None
        self._modern, self._init_result = record.modern, record.init_result
        next_id = record.next_id + (GENERATION_STRIDE if delivery.crashed else 0)
        self._ids = itertools.count(next_id)
        self._log.info("upstream_adopted", pid=record.pid, next_id=next_id, crashed=delivery.crashed)
        if delivery.crashed:  # ends a request the dead process left half written: the child reads one bad line
            await self._write_raw(b"\n")
        if record.modern:  # the old process's listen stream went with it: this one opens its own
            self._resource_subscriptions |= set(record.subscriptions)
            self._listen_id = f"{ADOPTED_LISTEN_ID}-{os.getpid()}-{next(self._listens)}"
            await self._write(self._listen_request(self._listen_id))

    async def _write(self, message: JsonObj) -> None:
        raise NotImplementedError

    async def _write_raw(self, data: bytes) -> None:
        proc = self._proc
        if proc is not None and not proc.stdin.is_closing():
            with contextlib.suppress(OSError):
                proc.stdin.write(data)
                await proc.stdin.drain()

    def _mark_ready(self) -> None:
        super()._mark_ready()
        self._store()

    def keep_state(self, subscriptions: list[str], log_level: str | None) -> None:
        """The pool's state for this child changed: its stored record is replaced."""
        if self._kept != (subscriptions, log_level):
            self._kept = (subscriptions, log_level)
            if self._ready.is_set():
                self._store()

    def _store(self) -> None:
        """Kept in the fd store (when there is one): a crash of this process does not lose the child."""
        proc = self._proc
        if _STORE and proc is not None:
            subscriptions = sorted(set(self._kept[0]) | self._resource_subscriptions)
            record = self.describe({}, subscriptions, self._kept[1])
            if record is not None:
                _STORE[0].keep(record, *proc.duplicates())

    def _begin_close(self) -> bool:
        """A child stopped with its process (not handed over) leaves the fd store with it."""
        closing = super()._begin_close()
        if closing and _STORE and not self._handed_over:
            _STORE[0].forget(self.name, self._instance)
        return closing

    def describe(self, lists: dict[str, JsonObj], subscriptions: list[str], log_level: str | None,
                 ) -> ChildRecord | None:
        """The running child's record (its next id taken: ids stay unique), or None when none is running."""
        proc = self._proc
        if proc is None:
            return None
        return ChildRecord(upstream=self.name, instance=self._instance, pid=proc.pid,
                           spec_digest=spec_digest(self._spec), modern=self._modern,
                           init_result=self._init_result or {}, next_id=next(self._ids), lists=lists,
                           subscriptions=subscriptions, log_level=log_level)

    async def hand_over(self, lists: dict[str, JsonObj], subscriptions: list[str], log_level: str | None,
                        wait: float) -> Delivery | str:
        """Give the child away once its calls in flight finished (within ``wait``); else why not.

        Afterwards this connection is closed, and the child is no longer this process's to stop."""
        proc = self._proc
        if proc is None or not self._ready.is_set() or self._closing.is_set():
            return "the child is not running (starting or mid-restart)"
        if self._twin is not None and self._twin.current is not None:
            return "it has a second (2026-07-28) child"
        if self._pending:
            await asyncio.wait(list(self._pending.values()), timeout=wait)
        if self._pending:
            return f"{len(self._pending)} calls still in flight after {wait:g}s"
        record = self.describe(lists, subscriptions, log_level)
        assert record is not None
        fds, pidfd = proc.give_away()
        self._handed_over = True
        self._begin_close()
        proc.release()  # the watch sees the pipes end; the supervisor stops without stopping the child
        if self._supervisor is not None:
            await asyncio.wait({self._supervisor}, timeout=5.0)
        await self._inbox.aclose()
        self._log.info("upstream_handed_over", pid=record.pid, next_id=record.next_id)
        return Delivery(record, fds, pidfd)
