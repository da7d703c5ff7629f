"""What the gateway says for its upstreams as one: the capabilities it offers and why a tool is unknown.

Pure functions of what the upstreams reported, apart from the pool that gathers it (pool.py), so the
rules read (and test) on their own; the fakes of the transport tests give the same answers with them.
"""

from __future__ import annotations

from collections.abc import Mapping

from satgate_mcp.errors import GatewayError, UnknownTarget, UpstreamUnavailable
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.task_ids import TASKS_EXTENSION

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
        tasks = merged_tasks([caps.get("tasks"), offered.get("tasks")])
        if tasks is not None:
            caps["tasks"] = tasks
        extensions = offered.get("extensions")
        if isinstance(extensions, dict) and TASKS_EXTENSION in extensions:  # relayed with sealed ids (task_relay.py)
            caps["extensions"] = {TASKS_EXTENSION: {}}
    return caps


def lists_tasks(results: Mapping[str, JsonObj | None]) -> list[str]:
    """The upstreams (name -> initialize result) whose 2025-11-25 ``capabilities.tasks`` offers ``list``."""
    return [name for name, result in results.items()
            if isinstance(tasks := ((result or {}).get("capabilities") or {}).get("tasks"), dict) and "list" in tasks]


def merged_tasks(offers: list[object]) -> JsonObj | None:
    """2025-11-25's ``capabilities.tasks`` for the gateway: each part some upstream offers (None when none does).

    Listing is the gateway's own (the callers' tasks of every upstream that lists), so is cancelling; a request
    kind may be task-augmented when some upstream's tools may be."""
    merged: JsonObj = {}
    for offer in offers:
        if not isinstance(offer, dict):
            continue
        merged.update({key: {} for key in ("list", "cancel") if key in offer})
        tools = (offer.get("requests") or {}).get("tools") if isinstance(offer.get("requests"), dict) else None
        if isinstance(tools, dict) and "call" in tools:
            merged["requests"] = {"tools": {"call": {}}}
    return merged or None


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
