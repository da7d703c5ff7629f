"""Which connection a configured upstream gets: an HTTP one with per-call credentials (``"auth"``), a child per
client (``"isolation"``), one shared stdio child, or one HTTP connection. The heavier modules load only when used."""

from __future__ import annotations

import time
from collections.abc import Callable

from satgate_mcp.events import Publisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.upstream.base import Upstream
from satgate_mcp.upstream.identity import UpstreamIdentity
from satgate_mcp.upstream.isolated import IsolatedUpstream


def make_upstream(
    name: str, spec: StdioUpstreamSpec | HttpUpstreamSpec, *, publisher: Publisher, metrics: Metrics,
    idle_ttl: float = 1800.0, clock: Callable[[], float] = time.monotonic, identity: UpstreamIdentity | None = None,
) -> Upstream:
    if isinstance(spec, HttpUpstreamSpec) and spec.auth is not None:
        from satgate_mcp.upstream.authorized import make_authorized

        return make_authorized(name, spec, identity=identity or UpstreamIdentity(), publisher=publisher,
                               metrics=metrics, idle_ttl=idle_ttl, clock=clock)
    if isinstance(spec, StdioUpstreamSpec) and spec.isolation != "shared":
        return IsolatedUpstream(name, spec, publisher=publisher, metrics=metrics, idle_ttl=idle_ttl, clock=clock)
    if isinstance(spec, StdioUpstreamSpec):
        from satgate_mcp.upstream.stdio import StdioUpstream

        return StdioUpstream(name, spec, publisher=publisher, metrics=metrics)
    from satgate_mcp.upstream.http import HttpUpstream

    return HttpUpstream(name, spec, publisher=publisher, metrics=metrics, clock=clock)
