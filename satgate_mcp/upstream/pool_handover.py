"""The pool's side of a handover: which children go, what goes with them, and who expects them.

Every stdio child goes: a shared upstream's one child, and an isolated upstream's catalogue child and
each client's child (its owner in the record's ``instance``, with the level and subscriptions it holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.settings import StdioUpstreamSpec
from satgate_mcp.upstream.catalog import ALL_LISTS, LISTINGS
from satgate_mcp.upstream.handover_state import ChildRecord, adoption_refusal
from satgate_mcp.upstream.isolated import IsolatedUpstream, _Child
from satgate_mcp.upstream.pool import UpstreamPool
from satgate_mcp.upstream.stdio_handover import Delivery, StdioHandover

log = structlog.get_logger("satgate_mcp.upstream")

CATALOGUE = "catalogue"


@dataclass
class Unit:
    """One child with what the pool (or its isolated upstream) knows of it beyond the connection."""

    name: str
    upstream: StdioHandover
    lists: dict[str, JsonObj]
    subscriptions: list[str]
    log_level: str | None


def _lists(pool: UpstreamPool, name: str) -> dict[str, JsonObj]:
    return {LISTINGS[kind].method: {LISTINGS[kind].key: pool._catalog.items(name, kind)} for kind in ALL_LISTS}


def units(pool: UpstreamPool) -> list[Unit]:
    """Every stdio child of the pool that could be handed over."""
    found = []
    for name, upstream in pool._upstreams.items():
        if isinstance(upstream, StdioHandover):
            found.append(Unit(name, upstream, _lists(pool, name), sorted(pool._subscribed.get(name, set())),
                              pool._log_level))
        elif isinstance(upstream, IsolatedUpstream) and isinstance(upstream._catalogue, StdioHandover):
            found.append(Unit(name, upstream._catalogue, _lists(pool, name), [], None))
            found += [Unit(name, child.upstream, {}, sorted(child.subscribed), child.level)
                      for child in upstream._children.values() if isinstance(child.upstream, StdioHandover)]
    return found


def describe_children(pool: UpstreamPool) -> list[ChildRecord]:
    """The records of the children running now (what the next process plans its start with)."""
    records = []
    for unit in units(pool):
        if unit.upstream.ready and (record := unit.upstream.describe(unit.lists, unit.subscriptions,
                                                                     unit.log_level)) is not None:
            records.append(record)
    return records


def _stdio_specs(pool: UpstreamPool) -> dict[str, StdioUpstreamSpec]:
    specs = {}
    for name, upstream in pool._upstreams.items():
        spec = getattr(upstream, "_spec", None)
        if isinstance(spec, StdioUpstreamSpec):
            specs[name] = spec
    return specs


def _expect_isolated(isolated: IsolatedUpstream, record: ChildRecord) -> str | None:
    """Expect an isolated upstream's child; why not, when it cannot be."""
    if record.instance == CATALOGUE:
        if not isinstance(isolated._catalogue, StdioHandover):
            return "its catalogue child is not a stdio child"
        isolated._catalogue.expect(record)
        return None
    key = record.instance or ""
    if key in isolated._children or len(isolated._children) >= isolated._spec.max_instances:
        return f'owner {key!r} already has a child, or "max_instances" is reached'
    upstream = isolated._make(key)
    if not isinstance(upstream, StdioHandover):
        return "its children are not stdio children"
    upstream.expect(record)
    isolated._children[key] = _Child(key, upstream, isolated._clock(), level=record.log_level, started=True,
                                     subscribed=set(record.subscriptions))
    isolated._instances.set(len(isolated._children))
    return None


def _expect(pool: UpstreamPool, record: ChildRecord) -> str | None:
    upstream = pool._upstreams[record.upstream]
    if isinstance(upstream, IsolatedUpstream):
        return _expect_isolated(upstream, record)
    if not isinstance(upstream, StdioHandover):
        return "it is no longer a stdio upstream"
    upstream.expect(record)
    pool._subscribed[record.upstream] |= set(record.subscriptions)
    pool._log_level = pool._log_level or record.log_level
    return None


def expect_children(pool: UpstreamPool, records: list[ChildRecord]) -> list[tuple[str, str | None]]:
    """Mark each adoptable child in transit (before the pool starts); the (upstream, instance) expected.

    Each child that will not be adopted gets one log line saying why (it starts fresh, as on any start)."""
    specs = _stdio_specs(pool)
    expected = []
    for record in records:
        refusal = adoption_refusal(record, specs) or _expect(pool, record)
        if refusal is not None:
            log.warning("upstream_handover_refused", upstream=record.upstream, instance=record.instance,
                        pid=record.pid, reason=refusal)
            continue
        expected.append((record.upstream, record.instance))
    return expected


async def give_children(pool: UpstreamPool, wait: float, expected: set[tuple[str, str | None]],
                        ) -> tuple[list[Delivery], list[tuple[str, str | None, str]]]:
    """Hand over every child expected that can be (each waits for its calls in flight, within ``wait``); why not,
    else. A child not expected (the next process refused its record) stays, and stops with this process."""
    deliveries: list[Delivery] = []
    refused: list[tuple[str, str | None, str]] = []
    for unit in units(pool):
        if (unit.name, unit.upstream._instance) not in expected:
            continue
        given = await unit.upstream.hand_over(unit.lists, unit.subscriptions, unit.log_level, wait=wait)
        if isinstance(given, str):
            refused.append((unit.name, unit.upstream._instance, given))
            log.warning("upstream_not_handed_over", upstream=unit.name, instance=unit.upstream._instance,
                        reason=given)
        else:
            deliveries.append(given)
    return deliveries, refused


def _target(pool: UpstreamPool, name: str, instance: str | None) -> StdioHandover | None:
    upstream = pool._upstreams.get(name)
    if isinstance(upstream, IsolatedUpstream):
        if instance == CATALOGUE:
            upstream = upstream._catalogue
        else:
            child = upstream._children.get(instance or "")
            upstream = child.upstream if child is not None else None
    return upstream if isinstance(upstream, StdioHandover) else None


def deliver(pool: UpstreamPool, name: str, instance: str | None, delivery: Delivery | None) -> None:
    """The pipes of an expected child, or None: it will not come (a fresh child starts)."""
    upstream = _target(pool, name, instance)
    if upstream is not None:
        upstream.deliver(delivery)
    elif delivery is not None:
        delivery.refuse()
