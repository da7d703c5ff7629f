"""The pool's side of a handover: which children go, what goes with them, and who expects them.

Shared stdio upstreams only, so far: an isolated upstream's children are started fresh by the next process.
"""

from __future__ import annotations

import structlog

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.settings import StdioUpstreamSpec
from satgate_mcp.upstream.catalog import ALL_LISTS, LISTINGS
from satgate_mcp.upstream.handover_state import ChildRecord, adoption_refusal
from satgate_mcp.upstream.pool import UpstreamPool
from satgate_mcp.upstream.stdio_handover import Delivery, StdioHandover

log = structlog.get_logger("satgate_mcp.upstream")


def stdio_children(pool: UpstreamPool) -> dict[str, StdioHandover]:
    """The upstreams whose one child can be handed over."""
    return {name: u for name, u in pool._upstreams.items() if isinstance(u, StdioHandover)}


def _extras(pool: UpstreamPool, name: str) -> tuple[dict[str, JsonObj], list[str], str | None]:
    """What the pool knows of an upstream beyond its connection: its lists, subscriptions, the log level set."""
    lists: dict[str, JsonObj] = {}
    for kind in ALL_LISTS:
        listing = LISTINGS[kind]
        lists[listing.method] = {listing.key: pool._catalog.items(name, kind)}
    return lists, sorted(pool._subscribed.get(name, set())), pool._log_level


def describe_children(pool: UpstreamPool) -> list[ChildRecord]:
    """The records of the children running now (what the next process plans its start with)."""
    records = []
    for name, upstream in stdio_children(pool).items():
        if upstream.ready and (record := upstream.describe(*_extras(pool, name))) is not None:
            records.append(record)
    return records


def expect_children(pool: UpstreamPool, records: list[ChildRecord]) -> list[str]:
    """Mark each adoptable child in transit (before the pool starts); the names expected. Refusals are logged."""
    children = stdio_children(pool)
    specs: dict[str, StdioUpstreamSpec] = {name: u._spec for name, u in children.items()}
    expected = []
    for record in records:
        refusal = adoption_refusal(record, specs)
        if refusal is not None:
            log.warning("upstream_handover_refused", upstream=record.upstream, pid=record.pid, reason=refusal)
            continue
        children[record.upstream].expect(record)
        pool._subscribed[record.upstream] |= set(record.subscriptions)
        pool._log_level = pool._log_level or record.log_level
        expected.append(record.upstream)
    return expected


async def give_children(pool: UpstreamPool, wait: float) -> tuple[list[Delivery], dict[str, str]]:
    """Hand over every child that can be (each waits for its calls in flight, within ``wait``); why not, else."""
    deliveries: list[Delivery] = []
    refused: dict[str, str] = {}
    for name, upstream in stdio_children(pool).items():
        given = await upstream.hand_over(*_extras(pool, name), wait=wait)
        if isinstance(given, str):
            refused[name] = given
            log.warning("upstream_not_handed_over", upstream=name, reason=given)
        else:
            deliveries.append(given)
    return deliveries, refused


def deliver(pool: UpstreamPool, name: str, delivery: Delivery | None) -> None:
    """The pipes of an expected child, or None: it will not come (a fresh child starts)."""
    upstream = stdio_children(pool).get(name)
    if upstream is not None:
        upstream.deliver(delivery)
    elif delivery is not None:
        delivery.discard()
