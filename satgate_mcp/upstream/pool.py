"""Every configured upstream behind one MCP surface: merged listings and request routing.

The pool keeps each upstream's catalog (tools, resources, templates, prompts), refreshes it when
the upstream says its lists changed or comes back after a restart, and routes each request to
the upstream that advertised its target. Tool names must be unique across upstreams; an operator
resolves a clash with a per-upstream ``tool_prefix``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from types import MappingProxyType
from typing import Any

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.errors import ConfigError, GatewayError, UnknownTarget, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.upstream.base import ProgressCallback, Upstream, strip_client_credentials

log = structlog.get_logger("satgate_mcp.upstream")

#: Receives (upstream name, method, params) for every upstream notification, after the pool refreshed.
NotificationListener = Callable[[str, str, JsonObj | None], Awaitable[None]]

MAX_PAGES = 1000
ALL_LISTS = frozenset({"tools", "resources", "templates", "prompts"})
#: list method -> (key in its result, catalog field, server capability that offers it)
LISTS: dict[str, tuple[str, str, str]] = {
    "tools/list": ("tools", "tools", "tools"),
    "resources/list": ("resources", "resources", "resources"),
    "resources/templates/list": ("resourceTemplates", "templates", "resources"),
    "prompts/list": ("prompts", "prompts", "prompts"),
}
#: notification -> the catalog fields it makes stale; a relisting after a restart refreshes everything.
STALE_AFTER = {
    "notifications/tools/list_changed": ALL_LISTS,
    "notifications/resources/list_changed": frozenset({"resources", "templates"}),
    "notifications/prompts/list_changed": frozenset({"prompts"}),
}


@dataclass(frozen=True, slots=True)
class ToolClash:
    tool: str
    kept: str
    other: str

    def message(self) -> str:
        return (f"tool {self.tool!r} is advertised by upstreams {self.kept!r} and {self.other!r}; "
                f"set a distinct \"tool_prefix\" on one of them in SATGATE_UPSTREAMS "
                f"(for example \"tool_prefix\": \"{self.other}_\")")


@dataclass(frozen=True, slots=True)
class ToolIndex:
    tools: list[JsonObj]
    #: exposed name -> (upstream, the upstream's own name for the tool)
    owners: dict[str, tuple[str, str]]
    clashes: list[ToolClash]


def merge_tools(
    order: Sequence[str],
    listings: Mapping[str, Sequence[JsonObj]],
    prefixes: Mapping[str, str],
    previous: Mapping[str, str] | None = None,
) -> ToolIndex:
    """The union of the upstreams' tools under their exposed (prefixed) names.

    On a clash the previous owner keeps the name (a list change must not move a tool under a
    running client), else the upstream configured first does.
    """
    previous = previous or {}
    candidates: dict[str, list[tuple[str, JsonObj]]] = {}
    for upstream in order:
        seen: set[str] = set()
        for tool in listings.get(upstream, ()):
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str) or not name:
                continue
            exposed = prefixes.get(upstream, "") + name
            if exposed not in seen:
                seen.add(exposed)
                candidates.setdefault(exposed, []).append((upstream, tool))
    tools, owners, clashes = [], {}, []
    for exposed, found in candidates.items():
        keep = next((c for c in found if c[0] == previous.get(exposed)), found[0])
        clashes += [ToolClash(exposed, keep[0], other[0]) for other in found if other is not keep]
        owners[exposed] = (keep[0], str(keep[1]["name"]))
        tools.append({**keep[1], "name": exposed})
    return ToolIndex(tools, owners, clashes)


def first_owner(order: Sequence[str], listings: Mapping[str, Sequence[JsonObj]], key: str) -> dict[str, str]:
    """Value of ``key`` (a prompt name, a resource uri) -> the first upstream listing it."""
    owners: dict[str, str] = {}
    for upstream in order:
        for item in listings.get(upstream, ()):
            value = item.get(key) if isinstance(item, dict) else None
            if isinstance(value, str):
                owners.setdefault(value, upstream)
    return owners


#: Bytes each kind of variable does not match: ``{x}`` is one path segment (never the query or
#: fragment); ``{+x}``/``{#x}`` is anything on one line (what the regex ``.*`` used to match).
_SEGMENT, _ANYTHING = 0, 1
_STOPS = {_SEGMENT: b"/?#", _ANYTHING: b"\n"}
#: translate tables: 0xFF where a variable of that kind may consume the byte, 0x00 where it stops.
_FREE_TABLES = {kind: bytes(0 if i in stops else 0xFF for i in range(256)) for kind, stops in _STOPS.items()}
TemplatePart = bytes | int


@lru_cache(maxsize=1024)
def compile_template(template: str) -> tuple[TemplatePart, ...]:
    """Literals (UTF-8 bytes, adjacent ones joined) and variable kinds; one left-to-right scan.

    ``{+x}``/``{#x}`` match anything, any other ``{x}`` one segment; an unclosed ``{`` is literal.
    """
    parts: list[TemplatePart] = []

    def add(part: TemplatePart) -> None:
        if part == b"":
            return
        if isinstance(part, bytes) and parts and isinstance(parts[-1], bytes):
            parts[-1] += part
        elif not (parts and part == _SEGMENT and parts[-1] == _SEGMENT):  # {a}{b} is the same as {a}
            parts.append(part)

    pos = 0
    while (start := template.find("{", pos)) != -1 and (end := template.find("}", start)) != -1:
        add(template[pos:start].encode("utf-8", "surrogatepass"))
        add(_ANYTHING if template[start + 1 : start + 2] in ("+", "#") else _SEGMENT)
        pos = end + 1
    add(template[pos:].encode("utf-8", "surrogatepass"))
    return tuple(parts)


@lru_cache(maxsize=256)
def _byte_table(value: int) -> bytes:
    """A translate table marking one byte value with 0x01 and every other with 0x00."""
    return bytes(1 if i == value else 0 for i in range(256))



def template_matches(template: str, uri: str) -> bool:
    """RFC 6570 templates, loosely: ``{x}`` matches one path segment, ``{+x}``/``{#x}`` anything.

    Linear in the URI whatever the template (a client picks the URI, up to the body limit): the
    set of positions reachable after each part is a bitset over the URI's bytes (one byte per
    position, 0x01 = reachable), advanced by a few whole-integer operations per template part, so
    nothing ever backtracks. UTF-8 keeps the meaning of the old character-wise regex: a literal
    starts on a character boundary, and bytes of multi-byte characters are never ``/?#``.
    """
    parts = compile_template(template)
    data = uri.encode("utf-8", "surrogatepass")
    n = len(data)
    if sum(len(p) for p in parts if isinstance(p, bytes)) > n:
        return False
    ones = int.from_bytes(b"\x01" * (n + 1), "little")  # positions 0..n
    free: dict[int, int] = {}  # variable kind -> 0xFF where it may consume the byte
    reach = 1  # only position 0
    for part in parts:
        if isinstance(part, bytes):
            for offset, value in enumerate(part):
                reach &= int.from_bytes(data.translate(_byte_table(value)), "little") >> (8 * offset)
                if not reach:
                    return False
            reach <<= 8 * len(part)
        else:
            if part not in free:
                free[part] = int.from_bytes(data.translate(_FREE_TABLES[part]), "little")
            run = free[part]
            # From each reachable position inside a run of free bytes, the carry of the addition
            # runs to the end of that run: every position up to and including the run's end.
            reach |= ((run + (reach & run)) ^ run) & ones
    return bool((reach >> (8 * n)) & 1)


@dataclass(slots=True)
class Catalog:
    tools: list[JsonObj] = field(default_factory=list)
    resources: list[JsonObj] = field(default_factory=list)
    templates: list[JsonObj] = field(default_factory=list)
    prompts: list[JsonObj] = field(default_factory=list)


def make_upstream(
    name: str, spec: StdioUpstreamSpec | HttpUpstreamSpec, *, publisher: Publisher, metrics: Metrics
) -> Upstream:
    if isinstance(spec, StdioUpstreamSpec):
        from satgate_mcp.upstream.stdio import StdioUpstream

        return StdioUpstream(name, spec, publisher=publisher, metrics=metrics)
    from satgate_mcp.upstream.http import HttpUpstream

    return HttpUpstream(name, spec, publisher=publisher, metrics=metrics)


class UpstreamPool:
    def __init__(
        self,
        specs: Mapping[str, StdioUpstreamSpec | HttpUpstreamSpec],
        *,
        publisher: Publisher,
        metrics: Metrics,
        start_timeout: float = 10.0,
    ) -> None:
        upstreams = {n: make_upstream(n, s, publisher=publisher, metrics=metrics) for n, s in specs.items()}
        self._setup(upstreams, {n: s.tool_prefix for n, s in specs.items()}, start_timeout)

    @classmethod
    def from_upstreams(
        cls,
        upstreams: Mapping[str, Upstream],
        *,
        prefixes: Mapping[str, str] | None = None,
        start_timeout: float = 10.0,
    ) -> UpstreamPool:
        """A pool over ready-made upstream objects (tests, embedding applications)."""
        pool = cls.__new__(cls)
        pool._setup(dict(upstreams), dict(prefixes or {}), start_timeout)
        return pool

    def _setup(self, upstreams: dict[str, Upstream], prefixes: dict[str, str], start_timeout: float) -> None:
        self._upstreams = upstreams
        self._order = list(upstreams)
        self._prefixes = prefixes
        self._start_timeout = start_timeout
        self._catalogs = {name: Catalog() for name in upstreams}
        self._locks = {name: asyncio.Lock() for name in upstreams}
        self._stale: dict[str, set[str]] = {name: set() for name in upstreams}
        self._index = ToolIndex([], {}, [])
        self._tools_version = 0
        self._prompt_owner: dict[str, str] = {}
        self._resource_owner: dict[str, str] = {}
        self._listeners: list[NotificationListener] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every upstream, wait (bounded) until they are ready, list them; a tool clash is fatal."""
        for name, upstream in self._upstreams.items():
            await upstream.start(partial(self._on_notification, name))
        await asyncio.gather(*(u.wait_ready(self._start_timeout) for u in self._upstreams.values()))
        await asyncio.gather(*(self._refresh(name, ALL_LISTS) for name in self._order))
        clashes = self._rebuild()
        if clashes:
            await self.close()
            raise ConfigError("; ".join(c.message() for c in clashes))
        self._started = True
        log.info("upstreams_started", ready=self.readiness(), tools=len(self._index.tools))

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        results = await asyncio.gather(*(u.close() for u in self._upstreams.values()), return_exceptions=True)
        for name, result in zip(self._upstreams, results, strict=True):
            if isinstance(result, BaseException):
                log.error("upstream_close_failed", upstream=name, error=repr(result))

    @property
    def upstreams(self) -> Mapping[str, Upstream]:
        return MappingProxyType(self._upstreams)

    def readiness(self) -> dict[str, bool]:
        return {name: u.ready for name, u in self._upstreams.items()}

    @property
    def all_ready(self) -> bool:
        return all(u.ready for u in self._upstreams.values())

    def add_listener(self, listener: NotificationListener) -> None:
        """Be told about upstream notifications (after list changes were applied), e.g. to tell clients."""
        self._listeners.append(listener)

    # -- what the gateway advertises ---------------------------------------------------------

    def capabilities(self) -> JsonObj:
        """Tools always; resources, prompts and completions when some upstream offers them.

        No ``subscribe``/``listChanged`` for resources and prompts: the gateway has no stream
        to deliver their updates on.
        """
        caps: JsonObj = {"tools": {"listChanged": True}}
        for upstream in self._upstreams.values():
            offered = (upstream.initialize_result or {}).get("capabilities") or {}
            for key in ("resources", "prompts", "completions"):
                if key in offered:
                    caps[key] = {}
        return caps

    def tools(self) -> list[JsonObj]:
        return [dict(tool) for tool in self._index.tools]

    @property
    def tools_version(self) -> int:
        """Goes up whenever the union of tools changes, so sessions can tell they saw an older list."""
        return self._tools_version

    def owner_of_tool(self, name: str) -> str | None:
        owner = self._index.owners.get(name)
        return owner[0] if owner else None

    # -- requests ----------------------------------------------------------------------------

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        """The reply message (``result`` or ``error``, id ``None``) for one client request.

        Raises ``UnknownTarget`` for a tool, prompt or resource no upstream offers, and the
        upstream's ``UpstreamUnavailable``/``UpstreamTimeout``.
        """
        params = strip_client_credentials(params)
        if method == "ping":
            return jsonrpc.result_response(None, {})
        if method == "tools/call":
            return _anonymous(await self._call_tool(params or {}, on_progress))
        if method in LISTS:
            if (params or {}).get("cursor") is not None:
                raise GatewayError("Invalid cursor", {"error": "invalid_cursor"}, code=jsonrpc.INVALID_PARAMS)
            if method == "tools/list":
                return jsonrpc.result_response(None, {"tools": self.tools()})
            return jsonrpc.result_response(None, await self._union(method))
        if method == "prompts/get":
            name = str((params or {}).get("name", ""))
            if name not in self._prompt_owner:
                await self._union("prompts/list")  # prompts may change without notice: look again
            owner = self._prompt_owner.get(name)
            if owner is None:
                raise UnknownTarget(f"No upstream offers prompt {name[:200]!r}",
                                    {"error": "unknown_prompt", "prompt": name[:200]})
            return _anonymous(await self._forward(method, params, [owner], f"prompt {name!r}", on_progress))
        if method in ("resources/read", "resources/subscribe", "resources/unsubscribe"):
            uri = str((params or {}).get("uri", ""))
            candidates = self._candidates(self._owner_of_uri(uri), "resources")
            return _anonymous(await self._forward(method, params, candidates, f"resource {uri!r}", on_progress))
        if method == "completion/complete":
            ref = (params or {}).get("ref") or {}
            ref = ref if isinstance(ref, dict) else {}
            if ref.get("type") == "ref/prompt":
                owner, offering, what = self._prompt_owner.get(str(ref.get("name"))), "prompts", "prompt"
            else:
                owner, offering, what = self._owner_of_uri(str(ref.get("uri"))), "resources", "resource"
            candidates = self._candidates(owner, offering)
            target = f"{what} {ref.get('name') or ref.get('uri')!r}"
            return _anonymous(await self._forward(method, params, candidates, target, on_progress))
        return jsonrpc.error_response(None, jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}",
                                      {"error": "method_not_found"})

    async def _call_tool(self, params: JsonObj, on_progress: ProgressCallback | None) -> JsonObj:
        name = params.get("name")
        owner = self._index.owners.get(name) if isinstance(name, str) else None
        if owner is None:
            raise UnknownTarget(f"Unknown tool: {name}", {"error": "unknown_tool", "tool": str(name)[:200]})
        upstream, original = owner
        forwarded = {**params, "name": original}
        return await self._upstreams[upstream].request("tools/call", forwarded, on_progress=on_progress)

    def _owner_of_uri(self, uri: str) -> str | None:
        owner = self._resource_owner.get(uri)
        if owner is not None:
            return owner
        for name in self._order:
            for template in self._catalogs[name].templates:
                text = template.get("uriTemplate")
                if isinstance(text, str) and (text == uri or template_matches(text, uri)):
                    return name
        return None

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
        """Ask each candidate in turn; the first success wins, else the last answer or failure stands."""
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
                return reply
        if reply is not None:
            return reply
        assert failure is not None
        raise failure

    async def _union(self, method: str) -> JsonObj:
        """A fresh union across upstreams (resources change without notice); also updates routing."""
        key, attr, capability = LISTS[method]
        names = [n for n in self._order if self._upstreams[n].ready and self._offers(n, capability)]
        pages = await asyncio.gather(*(self._fetch_all(n, method, key) for n in names))
        for name, items in zip(names, pages, strict=True):
            if items is not None:
                setattr(self._catalogs[name], attr, items)
        self._rebuild()
        unique = "uri" if attr == "resources" else ("uriTemplate" if attr == "templates" else "name")
        merged: list[JsonObj] = []
        seen: set[str] = set()
        for name in self._order:
            for item in getattr(self._catalogs[name], attr):
                marker = item.get(unique)
                if isinstance(marker, str):
                    if marker in seen:
                        continue
                    seen.add(marker)
                merged.append(item)
        return {key: merged}

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

    async def _refresh(self, name: str, stale: frozenset[str]) -> None:
        """Re-list what went stale; requests that pile up while one runs are served by a single next one."""
        upstream = self._upstreams[name]
        self._stale[name] |= stale
        async with self._locks[name]:
            stale, self._stale[name] = frozenset(self._stale[name]), set()
            if not stale or not upstream.ready:
                return
            catalog = self._catalogs[name]
            for method, (key, attr, capability) in LISTS.items():
                if attr in stale and (attr == "tools" or self._offers(name, capability)):
                    items = await self._fetch_all(name, method, key)
                    if items is not None:
                        setattr(catalog, attr, items)
        clashes = self._rebuild()
        if self._started:  # before that, start() reports clashes as a configuration error
            for clash in clashes:
                log.error("upstream_tool_clash", tool=clash.tool, kept=clash.kept, ignored=clash.other,
                          fix=clash.message())

    def _rebuild(self) -> list[ToolClash]:
        previous = {exposed: owner[0] for exposed, owner in self._index.owners.items()}
        tools = {n: c.tools for n, c in self._catalogs.items()}
        before = self._index.tools
        self._index = merge_tools(self._order, tools, self._prefixes, previous)
        if self._index.tools != before:
            self._tools_version += 1
        self._prompt_owner = first_owner(self._order, {n: c.prompts for n, c in self._catalogs.items()}, "name")
        self._resource_owner = first_owner(self._order, {n: c.resources for n, c in self._catalogs.items()}, "uri")
        return self._index.clashes

    async def _on_notification(self, name: str, method: str, params: JsonObj | None) -> None:
        task = asyncio.create_task(self._apply_notification(name, method, params))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply_notification(self, name: str, method: str, params: JsonObj | None) -> None:
        stale = STALE_AFTER.get(method)
        if stale is not None:
            await self._refresh(name, stale)
            log.info("upstream_lists_refreshed", upstream=name, cause=method, tools=len(self._index.tools))
        for listener in list(self._listeners):
            try:
                await listener(name, method, params)
            except Exception as exc:
                log.warning("upstream_listener_failed", upstream=name, method=method, error=repr(exc))


def _anonymous(reply: JsonObj) -> JsonObj:
    """The transport puts the client's id on the reply; the upstream's own id must not leak."""
    return jsonrpc.with_id(reply, None)
