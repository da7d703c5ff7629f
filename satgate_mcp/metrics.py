"""Prometheus metrics, one registry per app so several apps can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.active_sessions = Gauge("satgate_active_sessions", "Sessions currently held by this process", registry=r)
        self.tombstones = Gauge("satgate_session_tombstones", "Deleted session ids this process refuses to resume",
                                registry=r)
        self.sessions_opened = Counter("satgate_sessions_opened", "Sessions opened by initialize", registry=r)
        self.sessions_resumed = Counter("satgate_sessions_resumed", "Sessions rebuilt from a verified token",
                                        registry=r)
        self.requests = Counter("satgate_requests", "HTTP requests by JSON-RPC method and status",
                                ["method", "status"], registry=r)
        self.tool_calls = Counter("satgate_tool_calls", "Tool calls by upstream and outcome",
                                  ["upstream", "outcome"], registry=r)
        self.upstream_latency = Histogram("satgate_upstream_latency_seconds", "Upstream request latency",
                                          ["upstream", "method"], registry=r)
        self.refusals = Counter("satgate_refusals", "Requests refused, by reason", ["reason"], registry=r)
        self.upstream_restarts = Counter("satgate_upstream_restarts", "Upstream restarts or reconnects",
                                         ["upstream"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
