"""Every configured upstream behind one MCP surface: listing, refreshing and routing requests.

The pool keeps each upstream's listings in a ``Catalog``, refreshes them when the upstream says
its lists changed or comes back after a restart, and routes each request to the upstream that
advertised its target.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.errors import ConfigError, GatewayError, UnknownTarget, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.upstream.base import CALLER, UPSTREAM_READY, Caller, Origin, ProgressCallback, Scope, Upstream
from satgate_mcp.upstream.catalog import ALL_LISTS, ANNOUNCED, LISTINGS, STALE_AFTER, Catalog, Kind, NameClash
from satgate_mcp.upstream.isolated import IsolatedUpstream, owner_key

log = structlog.get_logger("satgate_mcp.upstream")

MAX_PAGES = 1000
class Notice(Protocol):
    """What the pool tells its listener: a merged list changed, or a resource was updated.

    ``origin`` names the isolated upstream's child an update came from (upstream, owner): it is
    for the sessions subscribed on that child only. None: from a shared upstream.
    """

    def __call__(self, method: str, params: JsonObj | None, origin: Origin | None = None) -> None: ...
#: Upstream notifications passed on to the listener as they are (the listener decides who gets them).
RELAYED = frozenset({"notifications/resources/updated"})


def make_upstream(
    name: str, spec: StdioUpstreamSpec | HttpUpstreamSpec, *, publisher: Publisher, metrics: Metrics,
    idle_ttl: float = 1800.0, clock: Callable[[], float] = time.monotonic,
) -> Upstream:
    if isinstance(spec, StdioUpstreamSpec) and spec.isolation != "shared":
        return IsolatedUpstream(name, spec, publisher=publisher, metrics=metrics, idle_ttl=idle_ttl, clock=clock)
    if isinstance(spec, StdioUpstreamSpec):
        from satgate_mcp.upstream.stdio import StdioUpstream

        return StdioUpstream(name, spec, publisher=publisher, metrics=metrics)
    from satgate_mcp.upstream.http import HttpUpstream

    return HttpUpstream(name, spec, publisher=publisher, metrics=metrics)


class UpstreamPool:
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
    ) -> None:
        """``idle_ttl``: a client child of an isolated upstream idle this long is reaped (the session idle TTL)."""
        self._upstreams = {n: make_upstream(n, s, publisher=publisher, metrics=metrics, idle_ttl=idle_ttl,
                                            clock=clock) for n, s in specs.items()}
        self._isolated = {n: u for n, u in self._upstreams.items() if isinstance(u, IsolatedUpstream)}
        for isolated in self._isolated.values():
            isolated.on_resource_updated = self._owned_update
        self._sweep_interval = sweep_interval
        self._sweeper: asyncio.Task[None] | None = None
        self._order = list(specs)
        self._start_timeout = start_timeout
        self._prefixes = {n: s.tool_prefix for n, s in specs.items()}
        self._catalog = Catalog(self._order, self._prefixes)
        self._locks = {name: asyncio.Lock() for name in specs}
        self._stale: dict[str, set[Kind]] = {name: set() for name in specs}
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._listener: Notice | None = None
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
        return merged_capabilities([u.initialize_result for u in self._upstreams.values()])

    def instructions(self) -> list[tuple[str, str]]:
        """(upstream, its ``instructions``) for every initialized upstream that gave some, in configuration order."""
        found = []
        for name in self._order:
            text = (self._upstreams[name].initialize_result or {}).get("instructions")
            if isinstance(text, str) and text.strip():
                found.append((name, text.strip()))
        return found

    def listen(self, listener: Notice) -> None:
        """The one listener for list changes and resource updates (the gateway's stream hub)."""
        self._listener = listener

    def tools(self) -> list[JsonObj]:
        return [dict(tool) for tool in self._catalog.tools]

    async def set_log_level(self, level: str) -> None:
        """``logging/setLevel`` to every ready shared 2025 upstream that offers logging; a failure is logged, not fatal.

        An isolated upstream's children get their own sessions' levels instead (``set_caller_log_level``).

        A 2026-07-28 upstream has no such method (a level travels in each request's ``_meta``): it is left out.
        """
        self._log_level = level
        names = [n for n in self._order if n not in self._isolated
                 and self._upstreams[n].ready and not self._upstreams[n].modern and self._offers(n, "logging")]
        replies = await asyncio.gather(*(self._upstreams[n].request("logging/setLevel", {"level": level})
                                         for n in names), return_exceptions=True)
        for name, reply in zip(names, replies, strict=True):
            if isinstance(reply, BaseException) or "error" in reply:
                log.warning("upstream_set_log_level_failed", upstream=name, level=level,
                            error=repr(reply) if isinstance(reply, BaseException) else reply.get("error"))

    @property
    def tools_version(self) -> int:
        """Goes up whenever the union of tools changes, so sessions can tell they saw an older list."""
        return self._catalog.version

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

    async def read_resource(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        return await self._resource_request("resources/read", params, on_progress)

    async def subscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        """Remembered per upstream (the subscriptions table counts sessions), so a restarted upstream is asked again."""
        uri = str((params or {}).get("uri", ""))
        name, reply = await self._forward_named("resources/subscribe", params, self._resource_candidates(uri),
                                                f"resource {uri!r}", on_progress)
        if name is not None and name not in self._isolated and "error" not in reply:
            self._subscribed[name].add(uri)  # an isolated upstream's children keep their own
        return reply

    async def unsubscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        uri = str((params or {}).get("uri", ""))
        for held in self._subscribed.values():
            held.discard(uri)
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

    async def listing(self, kind: Kind) -> JsonObj:
        """The list result for one kind: tools as exposed, the others freshly fetched (they change without notice).

        Fetching also updates routing. One page: merged lists carry no cursor.
        """
        if kind == "tools":
            return {"tools": self.tools()}
        listing = LISTINGS[kind]
        names = [n for n in self._order if self._upstreams[n].ready and self._offers(n, listing.capability)]
        pages = await asyncio.gather(*(self._fetch_all(n, listing.method, listing.key) for n in names))
        for name, items in zip(names, pages, strict=True):
            if items is not None:
                self._catalog.update(name, kind, items)
        self._log_clashes(self._rebuild())
        return {listing.key: [dict(item) for item in self._catalog.merged(kind)]}

    async def _resource_request(self, method: str, params: JsonObj | None,
                                on_progress: ProgressCallback | None) -> JsonObj:
        uri = str((params or {}).get("uri", ""))
        return await self._forward(method, params, self._resource_candidates(uri), f"resource {uri!r}", on_progress)

    def _resource_candidates(self, uri: str) -> list[str]:
        return self._candidates(self._catalog.uri_owner(uri), "resources")

    def _candidates(self, owner: str | None, capability: str) -> list[str]:
        """The owner from the listings, else every ready upstream that offers the capability."""
        if owner is not None:
            return [owner]
        return [n for n in self._order if self._upstreams[n].ready and self._offers(n, capability)]

    def _offers(self, name: str, capability: str) -> bool:
        offered = (self._upstreams[name].initialize_result or {}).get("capabilities") or {}
        return capability in offered

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

    # -- catalogs ----------------------------------------------------------------------------

    async def _fetch_all(self, name: str, method: str, key: str) -> list[JsonObj] | None:
        """Every page of one list from one upstream; None when it could not be listed."""
        upstream = self._upstreams[name]
        items: list[JsonObj] = []
        cursor: Any = None
        seen_cursors: set[Any] = set()
        for _ in range(MAX_PAGES):
            try:
                reply = await upstream.request(method, {"cursor": cursor} if cursor is not None else None)
            except GatewayError as exc:
                log.warning("upstream_list_failed", upstream=name, method=method, error=exc.message)
                return None
            result = reply.get("result")
            if not isinstance(result, dict) or not isinstance(result.get(key), list):
                log.warning("upstream_list_failed", upstream=name, method=method, error=reply.get("error"))
                return None
            items += [item for item in result[key] if isinstance(item, dict)]
            cursor = result.get("nextCursor")
            if not isinstance(cursor, (str, int)) or cursor in seen_cursors:
                return items
            seen_cursors.add(cursor)
        log.warning("upstream_list_truncated", upstream=name, method=method, pages=MAX_PAGES)
        return items

    async def _refresh(self, name: str, stale: frozenset[Kind]) -> None:
        """Re-list what went stale; requests that pile up while one runs are served by a single next one."""
        upstream = self._upstreams[name]
        self._stale[name] |= stale
        async with self._locks[name]:
            stale, self._stale[name] = frozenset(self._stale[name]), set()
            if not stale or not upstream.ready:
                return
            for kind, listing in LISTINGS.items():
                if kind in stale and (kind == "tools" or self._offers(name, listing.capability)):
                    items = await self._fetch_all(name, listing.method, listing.key)
                    if items is not None:
                        self._catalog.update(name, kind, items)
        self._log_clashes(self._rebuild())

    def _rebuild(self) -> list[NameClash]:
        """Rebuild the catalog and announce each merged list that changed (once started)."""
        before = self._catalog.versions()
        clashes = self._catalog.rebuild()
        after = self._catalog.versions()
        if self._started and self._listener is not None:
            for method in dict.fromkeys(ANNOUNCED[k] for k in ALL_LISTS if after[k] != before[k]):
                self._listener(method, None)
        return clashes

    def _log_clashes(self, clashes: list[NameClash]) -> None:
        if self._started:  # before that, start() reports clashes as a configuration error
            for clash in clashes:
                what = clash.kind.split()[-1]  # tool, prompt, template
                log.error(f"upstream_{what}_clash", **{what: clash.name}, kept=clash.kept, ignored=clash.other,
                          fix=clash.message())

    async def _on_notification(self, name: str, method: str, params: JsonObj | None) -> None:
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
        asks: list[tuple[str, JsonObj]] = []
        if self._log_level is not None and self._offers(name, "logging"):
            asks.append(("logging/setLevel", {"level": self._log_level}))
        asks += [("resources/subscribe", {"uri": uri}) for uri in sorted(self._subscribed[name])]
        for method, params in asks:
            try:
                reply = await upstream.request(method, params)
            except UpstreamUnavailable as exc:
                log.warning("upstream_restore_failed", upstream=name, method=method, error=exc.message)
                return
            if "error" in reply:
                log.warning("upstream_restore_refused", upstream=name, method=method, error=reply.get("error"))
        if asks:
            log.info("upstream_state_restored", upstream=name, log_level=self._log_level,
                     subscriptions=len(self._subscribed[name]))


#: Capability -> the flags of it the gateway offers when some upstream does (its stream delivers them).
OFFERED_FLAGS: dict[str, tuple[str, ...]] = {
    "resources": ("subscribe", "listChanged"),
    "prompts": ("listChanged",),
    "completions": (),
    "logging": (),
}


def merged_capabilities(results: list[JsonObj | None]) -> JsonObj:
    """What the gateway offers, given each upstream's initialize result: the union of what they offer."""
    caps: JsonObj = {"tools": {"listChanged": True}}
    for result in results:
        offered = (result or {}).get("capabilities") or {}
        for key, flags in OFFERED_FLAGS.items():
            if key in offered:
                theirs = offered[key] if isinstance(offered[key], dict) else {}
                mine = caps.setdefault(key, {})
                mine.update({flag: True for flag in flags if theirs.get(flag) is True})
    return caps


def unlisted_tool(name: str, down: Mapping[str, Mapping[str, str]], prefixes: Mapping[str, str]) -> GatewayError:
    """Why no upstream lists ``name``, as its caller should hear it.

    An upstream that is down lists nothing, so its tools look unknown. When ``name`` carries the ``tool_prefix`` of
    a down upstream (the longest such prefix) the call is for it: -32010 ``upstream_unavailable`` naming it and its
    exit status. Otherwise the tool may be one of a down unprefixed upstream's: still -32602 ``unknown_tool``, but
    naming who is down. The child's stderr line stays out: it is for the operator (logs, ``/readyz``), not agents.
    """
    owners = sorted((n for n, prefix in prefixes.items() if prefix and name.startswith(prefix)),
                    key=lambda n: len(prefixes[n]), reverse=True)
    if owners and owners[0] in down:  # the longest prefix names the owner, whether it is up or down
        owner = owners[0]
        status = down[owner].get("status", "down")
        return UpstreamUnavailable(
            f"Tool {name!r} belongs to upstream {owner!r}, which is down ({status}); it is restarted with backoff "
            "and its tools are served again once it is up", {"upstream": owner, "tool": name, "status": status},
            sent=False)
    unprefixed = sorted(n for n in down if not prefixes.get(n))
    if not unprefixed:
        return UnknownTarget(f"Unknown tool: {name}", {"error": "unknown_tool", "tool": name})
    which = ("upstream " if len(unprefixed) == 1 else "upstreams ") + ", ".join(repr(n) for n in unprefixed)
    return UnknownTarget(f"Unknown tool: {name} (perhaps one of {which}, down: a down upstream lists no tools until "
                         "it is back up)", {"error": "unknown_tool", "tool": name, "down": unprefixed})


def _anonymous(reply: JsonObj) -> JsonObj:
    """The transport puts the client's id on the reply; the upstream's own id must not leak."""
    return jsonrpc.with_id(reply, None)
