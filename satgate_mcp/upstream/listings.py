"""Each upstream's lists, fetched in full, merged into one catalogue and kept fresh.

The pool (pool.py) routes requests and runs the upstreams; this base keeps what routing reads: every
page of each upstream's tools, resources, templates and prompts, re-listed when they go stale, with
each merged list that changed announced to the pool's listener once the pool has started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import Notice, TaskNotice, Upstream
from satgate_mcp.upstream.catalog import ALL_LISTS, ANNOUNCED, LISTINGS, Catalog, Kind, NameClash
from satgate_mcp.upstream.surface import lists_tasks

log = structlog.get_logger("satgate_mcp.upstream")

MAX_PAGES = 1000

#: Awaited with an upstream's freshly listed tools (under its own names) before the merged list takes them.
ToolsHook = Callable[[str, list[JsonObj]], Awaitable[None]]


class UpstreamListings:
    """The merged lists of every upstream, in configuration order; ``UpstreamPool`` builds on it."""

    def __init__(self, upstreams: dict[str, Upstream], order: list[str], prefixes: dict[str, str]) -> None:
        self._upstreams = upstreams
        self._order = order
        self._prefixes = prefixes
        self._catalog = Catalog(order, prefixes)
        self._tool_index: tuple[int, dict[str, JsonObj] | None] = (0, None)
        self._locks = {name: asyncio.Lock() for name in order}
        self._stale: dict[str, set[Kind]] = {name: set() for name in order}
        #: Set once the pool has started: from then on a changed list is announced and a clash is logged.
        self._started = False
        self._listener: Notice | None = None
        self._task_listener: TaskNotice | None = None
        self._tools_hook: ToolsHook | None = None

    def listen_tasks(self, listener: TaskNotice) -> None:
        """The one listener for task status notifications: (upstream, method, params)."""
        self._task_listener = listener

    def task_listers(self) -> list[str]:
        """The ready upstreams that list their tasks (2025-11-25 ``capabilities.tasks.list``), in order."""
        return lists_tasks({n: self._upstreams[n].initialize_result for n in self._order if self._upstreams[n].ready})

    async def watch_tasks(self, upstream: str, task_ids: frozenset[str]) -> None:
        """The task ids clients' listen streams follow on ``upstream`` (its listen filter's ``taskIds``).

        Only a connection that listens can follow one: an isolated upstream's children do not."""
        watch = getattr(self._upstreams.get(upstream), "watch_tasks", None)
        if watch is not None:
            await watch(task_ids)

    def learn_tools(self, hook: ToolsHook) -> None:
        """The one hook that sees each upstream's tools as listed, before anyone is shown them (tool pinning)."""
        self._tools_hook = hook

    def announce_tools(self) -> None:
        """What callers may be shown changed while no upstream's list did (an approval): sessions re-list."""
        self._catalog.touch("tools")
        if self._started and self._listener is not None:
            self._listener(ANNOUNCED["tools"], None)

    def tools(self) -> list[JsonObj]:
        return [dict(tool) for tool in self._catalog.tools]

    def tool(self, name: str) -> JsonObj | None:
        """One listed tool's definition, not a copy (read it, never change it): what a guard judges a call by,
        found per call in a dict made once per version of the list."""
        version, index = self._tool_index
        if version != self._catalog.version or index is None:
            index = {str(t.get("name")): t for t in self._catalog.tools}
            self._tool_index = (self._catalog.version, index)
        return index.get(name)

    @property
    def tools_version(self) -> int:
        """Goes up whenever the union of tools changes, so sessions can tell they saw an older list."""
        return self._catalog.version

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

    def _offers(self, name: str, capability: str) -> bool:
        offered = (self._upstreams[name].initialize_result or {}).get("capabilities") or {}
        return capability in offered

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
                        if kind == "tools" and self._tools_hook is not None:
                            await self._tools_hook(name, items)
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
