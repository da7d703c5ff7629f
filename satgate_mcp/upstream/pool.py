"""Every configured upstream behind one MCP surface: listing, refreshing and routing requests.

The pool keeps each upstream's listings in a ``Catalog`` (listings.py), refreshes them when the
upstream says its lists changed or comes back after a restart, and routes each request to the
upstream that advertised its target.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from functools import partial

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.errors import ConfigError, GatewayError, UnknownTarget, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.task_ids import TASK_NOTIFICATIONS
from satgate_mcp.upstream.base import CALLER, UPSTREAM_READY, Caller, Notice, Origin, ProgressCallback, Scope
from satgate_mcp.upstream.catalog import ALL_LISTS, STALE_AFTER
from satgate_mcp.upstream.eras import client_era, resource_error_in_era
from satgate_mcp.upstream.factory import make_upstream
from satgate_mcp.upstream.identity import UpstreamIdentity
from satgate_mcp.upstream.isolated import IsolatedUpstream, owner_key
from satgate_mcp.upstream.listings import UpstreamListings
from satgate_mcp.upstream.restore import ask_again, restore_asks
from satgate_mcp.upstream.stdio_handover import StdioHandover
from satgate_mcp.upstream.surface import merged_capabilities, unlisted_tool

log = structlog.get_logger("satgate_mcp.upstream")

#: Upstream notifications passed on to the listener as they are (the listener decides who gets them).
RELAYED = frozenset({"notifications/resources/updated"})


class UpstreamPool(UpstreamListings):
    """Typed operations over every upstream; the dispatcher decides which one a request needs."""

    def __init__(
        self,
        specs: Mapping[str, StdioUpstreamSpec | HttpUpstreamSpec],
        *,
        publisher: Publisher,
        metrics: Metrics,
        start_timeout: float = 10.0,
        idle_ttl: float = 1800.0,
        sweep_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        identity: UpstreamIdentity | None = None,
    ) -> None:
        """``idle_ttl``: a client child of an isolated upstream idle this long is reaped (the session idle TTL).

        ``identity``: what upstreams with ``"auth"`` need (signing key, revocations, users' grants)."""
        upstreams = {n: make_upstream(n, s, publisher=publisher, metrics=metrics, idle_ttl=idle_ttl, clock=clock,
                                      identity=identity) for n, s in specs.items()}
        super().__init__(upstreams, list(specs), {n: s.tool_prefix for n, s in specs.items()})
        self._isolated = {n: u for n, u in self._upstreams.items() if isinstance(u, IsolatedUpstream)}
        for isolated in self._isolated.values():
            isolated.on_resource_updated = self._owned_update
        self._sweep_interval = sweep_interval
        self._sweeper: asyncio.Task[None] | None = None
        self._start_timeout = start_timeout
        self._tasks: set[asyncio.Task[None]] = set()
        #: Set once a 2026-07-28 client came: the upstreams' 2026-07-28 sides were looked for.
        self._modern_expected = False
        #: What a 2025 upstream was told that its restart forgets: the level set, the URIs subscribed on it.
        self._log_level: str | None = None
        self._subscribed: dict[str, set[str]] = {name: set() for name in specs}

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every upstream, wait (bounded) until they are ready, list them; a tool clash is fatal."""
        for name, upstream in self._upstreams.items():
            await upstream.start(partial(self._on_notification, name))
        # Ready, or down after a failed try: a child that exited at once never holds up the gateway's start.
        await asyncio.gather(*(u.wait_settled(self._start_timeout) for u in self._upstreams.values()))
        await asyncio.gather(*(self._refresh(name, ALL_LISTS) for name in self._order))
        clashes = self._rebuild()
        if clashes:
            await self.close()
            raise ConfigError("; ".join(c.message() for c in clashes))
        self._started = True
        if self._isolated:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="upstream-instance-sweeper")
        log.info("upstreams_started", ready=self.readiness(), tools=len(self._catalog.tools))

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        results = await asyncio.gather(*(u.close() for u in self._upstreams.values()), return_exceptions=True)
        for name, result in zip(self._upstreams, results, strict=True):
            if isinstance(result, BaseException):
                log.error("upstream_close_failed", upstream=name, error=repr(result))

    def readiness(self) -> dict[str, bool]:
        """An isolated upstream is ready when its catalogue child is (the command starts and initializes)."""
        return {name: u.ready for name, u in self._upstreams.items()}

    def failures(self) -> dict[str, dict[str, str]]:
        """The upstreams down after a failed try, each with its last exit status and stderr line."""
        return {name: failure for name, u in self._upstreams.items() if (failure := u.last_failure) is not None}

    def circuits(self) -> dict[str, dict[str, object]]:
        """Each HTTP upstream's circuit breaker (upstream/breaker.py): its state, and while open when it probes."""
        return {name: breaker.detail() for name, u in self._upstreams.items()
                if (breaker := getattr(u, "breaker", None)) is not None}

    def child_pids(self) -> dict[str, int | None]:
        """Each upstream's running stdio child (the console shows it); None for HTTP or a child not running."""
        return {name: pid if isinstance(pid := getattr(u, "pid", None), int) else None
                for name, u in self._upstreams.items()}

    # -- isolated upstreams: a child per token or session ------------------------------------

    def isolated(self, name: str) -> IsolatedUpstream | None:
        return self._isolated.get(name)

    def sweep(self, now: float | None = None) -> dict[str, list[str]]:
        """Reap the idle client children of every isolated upstream: upstream -> owners reaped."""
        swept = {name: upstream.sweep(now) for name, upstream in self._isolated.items()}
        return {name: owners for name, owners in swept.items() if owners}

    def session_ended(self, session_id: str) -> None:
        """The registry closed a session: children that were its own (or its token's, now unused) go."""
        for upstream in self._isolated.values():
            upstream.session_ended(session_id)

    async def set_caller_log_level(self, caller: Caller, level: str) -> None:
        """A session's own level for the children that are its (or its token's); shared ones: ``set_log_level``."""
        await asyncio.gather(*(u.set_caller_log_level(caller, level) for u in self._isolated.values()))

    def subscription_scope(self, uri: str) -> Scope:
        """The isolated children the current caller's subscription to ``uri`` would reach: (upstream, owner) pairs.

        Empty when only shared upstreams may own the URI (or there is no caller): one upstream subscription then
        serves every session, as before isolation.
        """
        caller = CALLER.get()
        scope = set()
        for name in self._candidates(self._catalog.uri_owner(uri), "resources"):
            isolated = self._isolated.get(name)
            key = owner_key(isolated.isolation, caller) if isolated is not None else None
            if key is not None:
                scope.add((name, key))
        return frozenset(scope)

    def _owned_update(self, params: JsonObj | None, origin: Origin) -> None:
        if self._listener is not None:
            self._listener("notifications/resources/updated", params, origin)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            self.sweep()

    # -- what the gateway advertises ---------------------------------------------------------

    def capabilities(self) -> JsonObj:
        """Tools always; resources, prompts, completions and logging when some upstream offers them.

        ``subscribe`` and ``listChanged`` for resources and prompts when some upstream offers
        them: the session's GET stream carries what they announce.
        """
        return merged_capabilities([r for u in self._upstreams.values()  # a dual upstream's two eras
                                    for r in (u.initialize_result, getattr(u, "modern_result", None))])

    def instructions(self) -> list[tuple[str, str]]:
        """(upstream, its ``instructions``) for every initialized upstream that gave some, in configuration order."""
        found = []
        for name in self._order:
            text = (self._upstreams[name].initialize_result or {}).get("instructions")
            if isinstance(text, str) and text.strip():
                found.append((name, text.strip()))
        return found

    async def listening(self, timeout: float) -> None:
        """Every ready upstream's change streams in force (``Upstream.listening``), waited for together, bounded."""
        await asyncio.gather(*(u.listening(timeout) for u in self._upstreams.values() if u.ready))

    def expect_modern(self, timeout: float) -> None:
        """A 2026-07-28 client discovered the gateway: look for each dual upstream's 2026-07-28 side now, in the
        background, so its first request does not wait for it (over stdio that side is a child to start)."""
        if not self._modern_expected:
            self._modern_expected = True
            task = asyncio.create_task(self.listening(timeout), name="upstream-modern-sides")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def listen(self, listener: Notice) -> None:
        """The one listener for list changes and resource updates (the gateway's stream hub)."""
        self._listener = listener

    async def set_log_level(self, level: str) -> None:
        """``logging/setLevel`` to every ready shared 2025 upstream that offers logging; a failure is logged, not fatal.

        An isolated upstream's children get their own sessions' levels instead (``set_caller_log_level``).

        A 2026-07-28 upstream has no such method (a level travels in each request's ``_meta``): it is left out.
        """
        self._log_level = level
        self._keep(*self._order)
        names = [n for n in self._order if n not in self._isolated
                 and self._upstreams[n].ready and not self._upstreams[n].modern and self._offers(n, "logging")]
        replies = await asyncio.gather(*(self._upstreams[n].request("logging/setLevel", {"level": level})
                                         for n in names), return_exceptions=True)
        for name, reply in zip(names, replies, strict=True):
            if isinstance(reply, BaseException) or "error" in reply:
                log.warning("upstream_set_log_level_failed", upstream=name, level=level,
                            error=repr(reply) if isinstance(reply, BaseException) else reply.get("error"))

    def _keep(self, *names: str) -> None:
        """A shared stdio child's kept record (systemd's fd store) follows what it was told."""
        for name in names:
            if isinstance(upstream := self._upstreams.get(name), StdioHandover):
                upstream.keep_state(sorted(self._subscribed[name]), self._log_level)

    def owner_of_tool(self, name: str) -> str | None:
        owner = self._catalog.tool_owner(name)
        return owner[0] if owner else None

    def unknown_tool(self, name: str) -> GatewayError:
        """The error for a call to a tool no upstream lists: ``unlisted_tool`` given who is down now."""
        return unlisted_tool(name, self.failures(), self._prefixes)

    # -- requests ----------------------------------------------------------------------------
    # Each answers with the upstream's reply message (``result`` or ``error``, id ``None``) and raises
    # ``UnknownTarget`` when no upstream offers the target, or the upstream's ``UpstreamUnavailable``
    # or ``UpstreamTimeout``.

    async def call_tool(self, params: JsonObj, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        """``tools/call`` on the tool's owner, under the upstream's own name for it."""
        name = params.get("name")
        owner = self._catalog.tool_owner(name) if isinstance(name, str) else None
        if owner is None:
            raise self.unknown_tool(str(name)[:200])
        upstream, original = owner
        forwarded = {**params, "name": original}
        return _anonymous(await self._upstreams[upstream].request("tools/call", forwarded, on_progress=on_progress))

    async def task_request(self, upstream: str, method: str, params: JsonObj, *,
                           on_progress: ProgressCallback | None = None, timeout: float | None = None
                           ) -> JsonObj | None:
        """A task method on the upstream a sealed task id names; None when no such upstream is configured now."""
        found = self._upstreams.get(upstream)
        return None if found is None else _anonymous(await found.request(method, params, on_progress=on_progress,
                                                                         timeout=timeout))

    async def read_resource(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        """The owner's answer; an unknown resource's error in the client's era (-32602 + data.uri, or -32002)."""
        reply = await self._resource_request("resources/read", params, on_progress)
        return resource_error_in_era(reply, str((params or {}).get("uri", "")), client_era(on_progress))

    async def subscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        """Remembered per upstream (the subscriptions table counts sessions), so a restarted upstream is asked again."""
        uri = str((params or {}).get("uri", ""))
        name, reply = await self._forward_named("resources/subscribe", params, self._resource_candidates(uri),
                                                f"resource {uri!r}", on_progress)
        if name is not None and name not in self._isolated and "error" not in reply:
            self._subscribed[name].add(uri)  # an isolated upstream's children keep their own
            self._keep(name)
        return reply

    async def unsubscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        uri = str((params or {}).get("uri", ""))
        for held in self._subscribed.values():
            held.discard(uri)
        self._keep(*self._order)
        return await self._resource_request("resources/unsubscribe", params, on_progress)

    async def get_prompt(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        """``prompts/get`` on the prompt's owner, under the upstream's own name for it."""
        name = str((params or {}).get("name", ""))
        if self._catalog.prompt_owner(name) is None:
            await self.listing("prompts")  # prompts may change without notice: look again
        owner = self._catalog.prompt_owner(name)
        if owner is None:
            raise UnknownTarget(f"No upstream offers prompt {name[:200]!r}",
                                {"error": "unknown_prompt", "prompt": name[:200]})
        upstream, original = owner
        return await self._forward("prompts/get", {**(params or {}), "name": original}, [upstream],
                                   f"prompt {name!r}", on_progress)

    async def complete(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        """``completion/complete`` on the owner of the prompt or resource (template) its ref names."""
        ref = (params or {}).get("ref") or {}
        ref = ref if isinstance(ref, dict) else {}
        if ref.get("type") == "ref/prompt":
            prompt = self._catalog.prompt_owner(str(ref.get("name")))
            owner, offering, what = (prompt[0] if prompt else None), "prompts", "prompt"
            if prompt is not None:
                params = {**(params or {}), "ref": {**ref, "name": prompt[1]}}
        else:
            owner, offering, what = self._catalog.uri_owner(str(ref.get("uri"))), "resources", "resource"
        target = f"{what} {ref.get('name') or ref.get('uri')!r}"
        return await self._forward("completion/complete", params, self._candidates(owner, offering), target,
                                   on_progress)

    async def _resource_request(self, method: str, params: JsonObj | None,
                                on_progress: ProgressCallback | None) -> JsonObj:
        uri = str((params or {}).get("uri", ""))
        candidates = self._resource_candidates(uri)
        if not candidates:
            raise UnknownTarget(f"No upstream offers resource {uri!r}",
                                {"error": "unknown_target", "method": method, "uri": uri[:2000]})
        return await self._forward(method, params, candidates, f"resource {uri!r}", on_progress)

    def _resource_candidates(self, uri: str) -> list[str]:
        return self._candidates(self._catalog.uri_owner(uri), "resources")

    def _candidates(self, owner: str | None, capability: str) -> list[str]:
        """The owner from the listings, else every ready upstream that offers the capability."""
        if owner is not None:
            return [owner]
        return [n for n in self._order if self._upstreams[n].ready and self._offers(n, capability)]

    async def _forward(self, method: str, params: JsonObj | None, candidates: list[str], target: str,
                       on_progress: ProgressCallback | None) -> JsonObj:
        return (await self._forward_named(method, params, candidates, target, on_progress))[1]

    async def _forward_named(self, method: str, params: JsonObj | None, candidates: list[str], target: str,
                             on_progress: ProgressCallback | None) -> tuple[str | None, JsonObj]:
        """Ask each candidate in turn; the first success wins (with who gave it), else the last answer or failure."""
        if not candidates:
            raise UnknownTarget(f"No upstream offers {target}", {"error": "unknown_target", "method": method})
        reply: JsonObj | None = None
        failure: GatewayError | None = None
        for name in candidates:
            try:
                reply = await self._upstreams[name].request(method, params, on_progress=on_progress)
            except UpstreamUnavailable as exc:
                failure = exc
                continue
            if "error" not in reply:
                return name, _anonymous(reply)
        if reply is not None:
            return None, _anonymous(reply)
        assert failure is not None
        raise failure

    # -- notifications: re-listing, restoring ------------------------------------------------

    async def _on_notification(self, name: str, method: str, params: JsonObj | None) -> None:
        if method in TASK_NOTIFICATIONS:  # its creator alone is told (task_relay.py): it needs the upstream's name
            if self._task_listener is not None:
                self._task_listener(name, method, params)
            return
        if method in RELAYED:
            if self._listener is not None:
                self._listener(method, params)
            return
        task = asyncio.create_task(self._apply_notification(name, method))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply_notification(self, name: str, method: str) -> None:
        """Re-list what a list-changed notification (or a restart) made stale; a restart also forgot its state."""
        if method == UPSTREAM_READY:
            await self._restore(name)
        stale = STALE_AFTER.get(method)
        if stale is not None:
            await self._refresh(name, stale)
            log.info("upstream_lists_refreshed", upstream=name, cause=method, tools=len(self._catalog.tools))

    async def _restore(self, name: str) -> None:
        """A (re)started 2025 upstream is told again what it forgot: the log level, the URIs subscribed on it."""
        upstream = self._upstreams[name]
        if upstream.modern or name in self._isolated:
            return  # a 2026 upstream's level rides on each request; an isolated one restores each child itself
        level = self._log_level if self._offers(name, "logging") else None
        asks = restore_asks(level, self._subscribed[name])
        if asks and await ask_again(upstream, asks, log.bind(upstream=name)):
            log.info("upstream_state_restored", upstream=name, log_level=self._log_level,
                     subscriptions=len(self._subscribed[name]))


def _anonymous(reply: JsonObj) -> JsonObj:
    """The transport puts the client's id on the reply; the upstream's own id must not leak."""
    return jsonrpc.with_id(reply, None)
