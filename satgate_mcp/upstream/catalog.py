"""What the upstreams offer, merged: one tool namespace, and which upstream answers for a name or URI.

No I/O: the pool fetches each upstream's listings and hands them in; the naming rules (prefixes,
clashes, who owns a prompt or a resource) are decided here. Tool, prompt and resource template
names must be unique across upstreams; an operator resolves a clash with a per-upstream
``tool_prefix``, which prefixes all three.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import UPSTREAM_READY
from satgate_mcp.upstream.templates import template_matches

#: The kinds of list an upstream may offer.
Kind = Literal["tools", "resources", "templates", "prompts"]
ALL_LISTS: frozenset[Kind] = frozenset({"tools", "resources", "templates", "prompts"})


@dataclass(frozen=True, slots=True)
class Listing:
    """How one kind of list is asked for and read."""

    method: str
    #: key of the items in the list result
    key: str
    #: server capability that offers it
    capability: str
    #: item field that names an item: items naming the same thing are merged into one
    names_by: str


LISTINGS: dict[Kind, Listing] = {
    "tools": Listing("tools/list", "tools", "tools", "name"),
    "resources": Listing("resources/list", "resources", "resources", "uri"),
    "templates": Listing("resources/templates/list", "resourceTemplates", "resources", "uriTemplate"),
    "prompts": Listing("prompts/list", "prompts", "prompts", "name"),
}
#: notification -> the kinds it makes stale; a relisting after a restart refreshes everything.
STALE_AFTER: dict[str, frozenset[Kind]] = {
    UPSTREAM_READY: ALL_LISTS,
    "notifications/tools/list_changed": ALL_LISTS,
    "notifications/resources/list_changed": frozenset({"resources", "templates"}),
    "notifications/prompts/list_changed": frozenset({"prompts"}),
}


#: Kinds whose items are named, and so may clash, prefixed like tools: kind -> what a message calls one.
NAMED: dict[Kind, str] = {"tools": "tool", "prompts": "prompt", "templates": "resource template"}
#: Kinds announced to clients when their union changes (templates ride on resources).
ANNOUNCED: dict[Kind, str] = {
    "tools": "notifications/tools/list_changed",
    "resources": "notifications/resources/list_changed",
    "templates": "notifications/resources/list_changed",
    "prompts": "notifications/prompts/list_changed",
}


@dataclass(frozen=True, slots=True)
class NameClash:
    """Two upstreams advertise one exposed name: a tool, a prompt or a resource template."""

    name: str
    kept: str
    other: str
    kind: str = "tool"

    def message(self) -> str:
        return (f"{self.kind} {self.name!r} is advertised by upstreams {self.kept!r} and {self.other!r}; "
                f"set a distinct \"tool_prefix\" on one of them in SATGATE_UPSTREAMS "
                f"(for example \"tool_prefix\": \"{self.other}_\"; it prefixes tools, prompts and "
                f"resource template names)")


@dataclass(frozen=True, slots=True)
class NameIndex:
    items: list[JsonObj]
    #: exposed name -> (upstream, the upstream's own name for the item)
    owners: dict[str, tuple[str, str]]
    clashes: list[NameClash]

    @property
    def tools(self) -> list[JsonObj]:
        return self.items


def merge_named(
    order: Sequence[str],
    listings: Mapping[str, Sequence[JsonObj]],
    prefixes: Mapping[str, str],
    previous: Mapping[str, str] | None = None,
    kind: str = "tool",
) -> NameIndex:
    """The union of the upstreams' items (tools, prompts, templates) under their exposed (prefixed) names, sorted by
    name: a list comes back in one order whatever order the upstreams gave (the 2026-07-28 tools list SHOULD), and an
    upstream that only reorders its list changes nothing a client sees.

    On a clash the previous owner keeps the name (a list change must not move an item under a
    running client), else the upstream configured first does; the clash is reported, never hidden.
    """
    previous = previous or {}
    candidates: dict[str, list[tuple[str, JsonObj]]] = {}
    for upstream in order:
        seen: set[str] = set()
        for item in listings.get(upstream, ()):
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name:
                continue
            exposed = prefixes.get(upstream, "") + name
            if exposed not in seen:
                seen.add(exposed)
                candidates.setdefault(exposed, []).append((upstream, item))
    items, owners, clashes = [], {}, []
    for exposed, found in candidates.items():
        keep = next((c for c in found if c[0] == previous.get(exposed)), found[0])
        clashes += [NameClash(exposed, keep[0], other[0], kind) for other in found if other is not keep]
        owners[exposed] = (keep[0], str(keep[1]["name"]))
        items.append({**keep[1], "name": exposed})
    return NameIndex(sorted(items, key=lambda item: str(item["name"])), owners, clashes)


def first_owner(order: Sequence[str], listings: Mapping[str, Sequence[JsonObj]], key: str) -> dict[str, str]:
    """Value of ``key`` (a resource uri) -> the first upstream listing it."""
    owners: dict[str, str] = {}
    for upstream in order:
        for item in listings.get(upstream, ()):
            value = item.get(key) if isinstance(item, dict) else None
            if isinstance(value, str):
                owners.setdefault(value, upstream)
    return owners


def merge_unique(order: Sequence[str], listings: Mapping[str, Sequence[JsonObj]], key: str) -> list[JsonObj]:
    """Every upstream's items in configuration order; of the items with the same ``key`` only the first."""
    merged: list[JsonObj] = []
    seen: set[str] = set()
    for upstream in order:
        for item in listings.get(upstream, ()):
            marker = item.get(key)
            if isinstance(marker, str):
                if marker in seen:
                    continue
                seen.add(marker)
            merged.append(item)
    return merged


def _uri(item: JsonObj) -> str:
    """A resource's sort key: its URI (an item without one, kept as the upstream gave it, sorts first)."""
    uri = item.get("uri")
    return uri if isinstance(uri, str) else ""


class Catalog:
    """Each upstream's last good listings and what follows from them: exposed names, owners, versions."""

    def __init__(self, order: Sequence[str], prefixes: Mapping[str, str]) -> None:
        self._order = list(order)
        self._prefixes = dict(prefixes)
        self._lists: dict[Kind, dict[str, list[JsonObj]]] = {kind: {n: [] for n in order} for kind in ALL_LISTS}
        self._named: dict[Kind, NameIndex] = {kind: NameIndex([], {}, []) for kind in NAMED}
        self._resources: list[JsonObj] = []
        self._versions: dict[Kind, int] = dict.fromkeys(ALL_LISTS, 0)
        self._resource_owner: dict[str, str] = {}

    def update(self, upstream: str, kind: Kind, items: list[JsonObj]) -> None:
        """Replace one upstream's list; owners follow on the next ``rebuild``."""
        self._lists[kind][upstream] = items

    def items(self, upstream: str, kind: Kind) -> list[JsonObj]:
        """One upstream's last good list of one kind."""
        return self._lists[kind].get(upstream, [])

    def rebuild(self) -> list[NameClash]:
        """Recompute names, owners and versions from the lists; the clashes found (the old owner kept each name)."""
        clashes: list[NameClash] = []
        for kind, what in NAMED.items():
            before = self._named[kind]
            previous = {exposed: owner[0] for exposed, owner in before.owners.items()}
            index = merge_named(self._order, self._lists[kind], self._prefixes, previous, what)
            if index.items != before.items:
                self._versions[kind] += 1
            self._named[kind] = index
            clashes += index.clashes
        resources = sorted(merge_unique(self._order, self._lists["resources"], "uri"), key=_uri)
        if resources != self._resources:
            self._versions["resources"] += 1
        self._resources = resources
        self._resource_owner = first_owner(self._order, self._lists["resources"], "uri")
        return clashes

    @property
    def tools(self) -> list[JsonObj]:
        return self._named["tools"].items

    def touch(self, kind: Kind) -> None:
        """What callers may be shown of ``kind`` changed though no list did (an approval): a new version."""
        self._versions[kind] += 1

    @property
    def version(self) -> int:
        """Goes up whenever the union of tools changes, so sessions can tell they saw an older list."""
        return self._versions["tools"]

    def versions(self) -> dict[Kind, int]:
        """Each kind's version: it goes up whenever that union changes (what a list_changed announces)."""
        return dict(self._versions)

    def tool_owner(self, exposed: str) -> tuple[str, str] | None:
        """(upstream, its own name for the tool) for an exposed tool name."""
        return self._named["tools"].owners.get(exposed)

    def prompt_owner(self, exposed: str) -> tuple[str, str] | None:
        """(upstream, its own name for the prompt) for an exposed prompt name."""
        return self._named["prompts"].owners.get(exposed)

    def uri_owner(self, uri: str) -> str | None:
        """The first upstream listing the resource, else the first whose template matches it."""
        owner = self._resource_owner.get(uri)
        if owner is not None:
            return owner
        for name in self._order:
            for template in self._lists["templates"][name]:
                text = template.get("uriTemplate")
                if isinstance(text, str) and (text == uri or template_matches(text, uri)):
                    return name
        return None

    def merged(self, kind: Kind) -> list[JsonObj]:
        if kind in self._named:
            return self._named[kind].items
        return self._resources
