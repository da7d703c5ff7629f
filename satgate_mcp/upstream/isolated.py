"""A stdio upstream with a child of its own per token id or per client session (``"isolation"``).

One child for everyone cannot hold per-client state (roots, log level, subscriptions, open files),
and on one pipe the gateway cannot always say whose a message is. Here each owner (a verified
token id for ``token``, a client session for ``session``) gets its own child, so everything that
child says belongs to that owner:

- The catalogue child starts with the gateway and is never given a client's request. It answers
  the handshake (capabilities, instructions) and the lists (tools, prompts, resources, templates),
  so the merged catalogue is known before any client comes, and it is what readiness reports.
- A client child is spawned on its owner's first request, at most ``max_instances`` at once;
  past that a request is refused (-32010, ``"reason": "max_instances"``), counted and logged.
- A client child is reaped when it has had nothing to do for the session idle TTL (``sweep``),
  when its session ends (``session``), or when every session that used it has ended (``token``).
  A resumed session therefore always meets a fresh child. ``close`` stops every child and waits.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.errors import GatewayError, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.upstream.base import (
    CALLER,
    Caller,
    NotificationCallback,
    Origin,
    ProgressCallback,
    Upstream,
    initialize_timeout,
)
from satgate_mcp.upstream.inbox import RELIST_NOTIFICATION
from satgate_mcp.upstream.restore import ask_again, note_subscription, restore_asks
from satgate_mcp.upstream.stdio import StdioUpstream

log = structlog.get_logger("satgate_mcp.upstream")

#: What the catalogue child answers, whoever asks: the lists the merged catalogue is built from.
CATALOGUE_METHODS = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list"})
RESOURCE_UPDATED = "notifications/resources/updated"
#: RFC 5424 severities as MCP names them, most verbose first (a child gets its owner's most verbose one).
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class IsolatedChild(Upstream, Protocol):
    """One owner's connection: a stdio child, or an HTTP connection with its own upstream session."""

    @property
    def pid(self) -> int | None: ...


#: Builds one child connection; ``label`` ("catalogue" or the owner) is for its log lines.
ChildFactory = Callable[[str], IsolatedChild]


def owner_key(isolation: str, caller: Caller | None) -> str | None:
    """Whose child a request runs on: the token id (``token``) or the session (``session``); None without a caller.

    A stateless (2026-07-28) caller has no session: its session id is ``token:<id>``, so under ``session``
    it gets one child per token, which is all it can tell apart.
    """
    if caller is None:
        return None
    key = caller.token_id if isolation == "token" else caller.session_id
    return key or None


def most_verbose(levels: list[str]) -> str | None:
    known = [level for level in levels if level in LOG_LEVELS]
    return min(known, key=LOG_LEVELS.index) if known else None


def idle_children(last_used: dict[str, float], inflight: dict[str, int], now: float, ttl: float) -> list[str]:
    """Owners whose child has no call in flight and nothing to do for ``ttl`` seconds."""
    return sorted(key for key, used in last_used.items() if inflight.get(key, 0) == 0 and now - used >= ttl)


class InstancesExhausted(UpstreamUnavailable):
    """Every allowed child is taken by another owner: refused before anything was sent (so refunded)."""


def instances_exhausted(name: str, isolation: str, cap: int) -> InstancesExhausted:
    return InstancesExhausted(
        f'upstream {name!r} already runs its "max_instances" ({cap}) children, one per '
        f'{"token" if isolation == "token" else "client session"} ("isolation": "{isolation}"); retry once '
        "another client's child was reaped (idle or ended), or raise \"max_instances\"",
        {"upstream": name, "reason": "max_instances", "isolation": isolation, "max_instances": cap}, sent=False)


def no_client_refusal(name: str, method: str) -> JsonObj:
    """A request with no caller (the gateway's own) that only a client's child could answer."""
    return jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST,
                                  f"upstream {name!r} runs a child per client (\"isolation\"), and {method!r} "
                                  "came with no client to pick one for", {"error": "no_client", "upstream": name})


@dataclass(eq=False)
class _Child:
    key: str
    upstream: IsolatedChild
    last_used: float
    inflight: int = 0
    #: Sessions that sent requests here: a ``token`` child is reaped once all of them have ended.
    sessions: set[str] = field(default_factory=set)
    #: The log level last sent to this child (None: never set).
    level: str | None = None
    #: Whether it was ready once (until then a request waits for the handshake, not the restart grace).
    started: bool = False
    #: The URIs its owner's sessions subscribed to on it: asked again of it after it restarts.
    subscribed: set[str] = field(default_factory=set)


class IsolatedUpstream:
    """The ``Upstream`` protocol over a catalogue child and one child per owner."""

    def __init__(self, name: str, spec: StdioUpstreamSpec | HttpUpstreamSpec, *, publisher: Publisher,
                 metrics: Metrics, idle_ttl: float = 1800.0, clock: Callable[[], float] = time.monotonic,
                 factory: ChildFactory | None = None, catalogue: IsolatedChild | None = None,
                 isolation: str | None = None) -> None:
        """An HTTP upstream whose auth is per caller passes its own ``factory``, ``catalogue`` and ``isolation``."""
        self.name = name
        self._spec = spec
        self._isolation = isolation or spec.isolation
        self._metrics = metrics
        self._idle_ttl = idle_ttl
        self._clock = clock
        if factory is None:
            assert isinstance(spec, StdioUpstreamSpec)
            factory = partial(_stdio_child, name, spec, publisher, metrics)
        self._make = factory
        self._catalogue = catalogue or self._make("catalogue")
        self._children: dict[str, _Child] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        #: owner -> session -> the level that session asked for (kept before the child exists, too).
        self._levels: dict[str, dict[str, str]] = {}
        self._on_notification: NotificationCallback | None = None
        #: Where a client child's ``notifications/resources/updated`` goes, with (upstream, owner): the pool's.
        self.on_resource_updated: Callable[[JsonObj | None, Origin], None] | None = None
        self._closed = False
        self._warned_full = False
        self._log = log.bind(upstream=name, isolation=self._isolation)
        self._instances = metrics.upstream_instances.labels(upstream=name)
        self._instances.set(0)

    # -- the Upstream protocol: what the pool sees is the catalogue child ----------------------

    @property
    def isolation(self) -> str:
        return self._isolation

    @property
    def ready(self) -> bool:
        """Ready once the catalogue child is: the command starts and initializes, so a client child can too."""
        return self._catalogue.ready

    @property
    def initialize_result(self) -> JsonObj | None:
        return self._catalogue.initialize_result

    @property
    def modern(self) -> bool:
        return self._catalogue.modern

    async def start(self, on_notification: NotificationCallback) -> None:
        self._on_notification = on_notification
        await self._start_child(self._catalogue)
        for child in list(self._children.values()):  # adopted from the previous process (pool_handover)
            await self._start_child(child.upstream, child)

    async def _catalogue_notice(self, method: str, params: JsonObj | None) -> None:
        """The catalogue child's list changes are the pool's; a resource update it sends is nobody's (it holds
        no subscription), so it cannot reach the sessions subscribed on the client children."""
        if method != RESOURCE_UPDATED and self._on_notification is not None:
            await self._on_notification(method, params)

    async def listening(self, timeout: float) -> bool:
        """The catalogue child's lists are the ones shown, and no client asks it anything: nothing to wait for."""
        return True

    async def wait_ready(self, timeout: float) -> bool:
        return await self._catalogue.wait_ready(timeout)

    async def wait_settled(self, timeout: float) -> bool:
        return await self._catalogue.wait_settled(timeout)

    @property
    def last_failure(self) -> dict[str, str] | None:
        return self._catalogue.last_failure

    async def request(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None,
                      timeout: float | None = None) -> JsonObj:
        """The lists from the catalogue child; everything else on the caller's own child."""
        if method in CATALOGUE_METHODS:  # without the caller's relay: nothing a client says reaches this child
            return await self._catalogue.request(method, params, timeout=timeout)
        caller = CALLER.get()
        key = owner_key(self._isolation, caller)
        if key is None or caller is None:
            return no_client_refusal(self.name, method)
        if method == "resources/unsubscribe" and key not in self._children:
            return jsonrpc.result_response(None, {})  # its child was reaped: a fresh one holds no subscription
        child = await self._child_for(key)
        child.sessions.add(caller.session_id)
        child.inflight += 1
        try:
            await self._apply_level(child)
            reply = await child.upstream.request(method, params, on_progress=on_progress, timeout=timeout)
            note_subscription(child.subscribed, method, params, reply)
            return reply
        finally:
            child.inflight -= 1
            child.last_used = self._clock()

    async def notify(self, method: str, params: JsonObj | None) -> None:
        """To the caller's child when it runs; never to the catalogue child, which hears no client."""
        key = owner_key(self._isolation, CALLER.get())
        child = self._children.get(key) if key is not None else None
        if child is not None:
            await child.upstream.notify(method, params)

    async def close(self) -> None:
        """Stop the catalogue child and every client child, and wait until each is reaped."""
        self._closed = True
        for key in list(self._children):
            self._reap(key, "shutdown")
        self._stopping.add(asyncio.ensure_future(self._catalogue.close()))
        await asyncio.gather(*list(self._stopping), return_exceptions=True)

    # -- the owners' children --------------------------------------------------------------------

    def pids(self) -> dict[str, int | None]:
        """Owner -> its child's pid ("" for the catalogue child): for tests and diagnostics."""
        return {"": self._catalogue.pid, **{key: child.upstream.pid for key, child in self._children.items()}}

    def instances(self) -> int:
        return len(self._children)

    async def _child_for(self, key: str) -> _Child:
        child = self._children.get(key)
        if child is not None:
            child.last_used = self._clock()
            if not child.started:
                await self._first_ready(child)
            return child
        if self._closed:
            raise UpstreamUnavailable(f"upstream {self.name!r} is shutting down", {"upstream": self.name},
                                      sent=False)
        if len(self._children) >= self._spec.max_instances:
            self._metrics.upstream_instance_refusals.labels(upstream=self.name).inc()
            if not self._warned_full:
                self._warned_full = True
                self._log.warning("upstream_instances_exhausted", max_instances=self._spec.max_instances,
                                  fix='raise "max_instances" or lower SATGATE_SESSION_IDLE_TTL; later refusals '
                                      "are only counted (satgate_upstream_instance_refusals_total)")
            raise instances_exhausted(self.name, self._isolation, self._spec.max_instances)
        child = self._children[key] = _Child(key, self._make(key), self._clock())
        self._instances.set(len(self._children))
        self._log.info("upstream_instance_spawning", owner=key, instances=len(self._children))
        await self._start_child(child.upstream, child)
        await self._first_ready(child)
        return child

    async def _first_ready(self, child: _Child) -> None:
        """A new child gets the handshake's time to come up (a restarting one only a short grace, as any child).

        One that never does is reaped: the next request tries a fresh one.
        """
        if await child.upstream.wait_ready(initialize_timeout(self._spec.timeout)):
            child.started = True
            return
        if self._children.get(child.key) is child:
            self._reap(child.key, "never_ready")
        raise UpstreamUnavailable(f"upstream {self.name!r} could not start a child for this client",
                                  {"upstream": self.name}, sent=False)

    async def _start_child(self, upstream: IsolatedChild, child: _Child | None = None) -> None:
        """Started outside the caller's context: the child's tasks outlive the request that spawned it."""
        if self._on_notification is None:
            raise RuntimeError("start() first")
        callback: NotificationCallback = (self._catalogue_notice if child is None
                                          else partial(self._child_notice, child))
        task = asyncio.get_running_loop().create_task(upstream.start(callback), context=contextvars.Context())
        await task

    async def _child_notice(self, child: _Child, method: str, params: JsonObj | None) -> None:
        """What a client child says about itself. The catalogue is the catalogue child's, so its list changes
        are not the pool's; a (re)started child has lost the level it was set to; a resource update is for the
        sessions subscribed on this child alone (its origin says which child). Its subscriptions are asked again
        of a restarted child; its level on the owner's next request."""
        if method == RELIST_NOTIFICATION:
            child.level = None
            if child.started and child.subscribed:  # a restart: the new child has none of them
                task = asyncio.create_task(self._resubscribe(child))
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        elif method == RESOURCE_UPDATED and self.on_resource_updated is not None:
            self.on_resource_updated(params, (self.name, child.key))

    async def _resubscribe(self, child: _Child) -> None:
        await ask_again(child.upstream, restore_asks(None, child.subscribed), self._log.bind(owner=child.key))

    async def _apply_level(self, child: _Child) -> None:
        """The most verbose level the owner's sessions asked for, once per change (when the upstream logs)."""
        wanted = most_verbose(list(self._levels.get(child.key, {}).values()))
        if wanted is None or wanted == child.level or not self._offers_logging():
            return
        child.level = wanted
        try:
            reply = await child.upstream.request("logging/setLevel", {"level": wanted})
        except GatewayError as exc:  # the call that follows meets the same trouble; the level is tried again
            child.level = None
            self._log.warning("upstream_set_log_level_failed", owner=child.key, level=wanted, error=exc.message)
            return
        if "error" in reply:
            self._log.warning("upstream_set_log_level_failed", owner=child.key, level=wanted, error=reply["error"])

    def _offers_logging(self) -> bool:
        if self._catalogue.modern:  # a 2026-07-28 upstream takes its level from each request's _meta
            return False
        capabilities = (self._catalogue.initialize_result or {}).get("capabilities") or {}
        return isinstance(capabilities, dict) and "logging" in capabilities

    async def set_caller_log_level(self, caller: Caller, level: str) -> None:
        """A session's ``logging/setLevel``: kept for its owner, and sent to the owner's child if it runs."""
        key = owner_key(self._isolation, caller)
        if key is None:
            return
        self._levels.setdefault(key, {})[caller.session_id] = level
        child = self._children.get(key)
        if child is not None:
            child.inflight += 1  # not reaped while the level is on its way
            try:
                await self._apply_level(child)
            finally:
                child.inflight -= 1

    def session_ended(self, session_id: str) -> list[str]:
        """A session ended (DELETE, idle, shutdown): its child goes, or (``token``) the token's once unused."""
        for levels in self._levels.values():
            levels.pop(session_id, None)
        self._levels = {key: levels for key, levels in self._levels.items() if levels}
        reaped = []
        for key, child in list(self._children.items()):
            child.sessions.discard(session_id)
            if (key == session_id and self._isolation == "session") or (
                    self._isolation == "token" and not child.sessions and child.inflight == 0):
                self._reap(key, "session_ended")
                reaped.append(key)
        return reaped

    def sweep(self, now: float | None = None) -> list[str]:
        """Reap every child idle for the TTL; returns their owners (tests drive it with a fake clock)."""
        now = self._clock() if now is None else now
        idle = idle_children({k: c.last_used for k, c in self._children.items()},
                             {k: c.inflight for k, c in self._children.items()}, now, self._idle_ttl)
        for key in idle:
            self._reap(key, "idle")
        return idle

    def _reap(self, key: str, reason: str) -> None:
        """Forget the child at once (its owner's next request spawns a fresh one) and stop it in the background."""
        child = self._children.pop(key, None)
        if child is None:
            return
        self._instances.set(len(self._children))
        self._warned_full = False
        self._log.info("upstream_instance_reaped", owner=key, reason=reason, pid=child.upstream.pid,
                       instances=len(self._children))
        task = asyncio.ensure_future(child.upstream.close())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def stopped(self) -> None:
        """Until every reaped child has exited (tests await this instead of sleeping)."""
        if self._stopping:
            await asyncio.gather(*list(self._stopping), return_exceptions=True)


def _stdio_child(name: str, spec: StdioUpstreamSpec, publisher: Publisher, metrics: Metrics,
                 label: str) -> StdioUpstream:
    return StdioUpstream(name, spec, publisher=publisher, metrics=metrics, instance=label)
