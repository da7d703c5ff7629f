"""Prometheus metrics, one registry per app so several apps can live in one process (tests)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST

M = TypeVar("M", Counter, Gauge, Histogram)


class Children(Generic[M]):
    """A labelled metric's children by label values, looked up once: ``labels()`` validates its arguments,
    builds a key and takes a lock on every call. Only for label values from a bounded set."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


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
        self.unattributed = Counter("satgate_upstream_unattributed",
                                    "Upstream requests refused and notifications dropped: no single client to give "
                                    "them to", ["upstream", "kind"], registry=r)
        self.upstream_instances = Gauge("satgate_upstream_instances",
                                        "Client children an isolated stdio upstream runs now (catalogue child "
                                        "not counted)", ["upstream"], registry=r)
        self.upstream_instance_refusals = Counter("satgate_upstream_instance_refusals",
                                                  "Requests refused: the isolated upstream ran max_instances "
                                                  "children", ["upstream"], registry=r)
        self.refusals = Counter("satgate_refusals", "Requests refused, by reason", ["reason"], registry=r)
        self.upstream_restarts = Counter("satgate_upstream_restarts", "Upstream restarts or reconnects",
                                         ["upstream"], registry=r)
        self.circuit_state = Gauge("satgate_upstream_circuit_state",
                                   "An HTTP upstream's circuit breaker: 0 closed, 1 open, 2 half-open (a probe out)",
                                   ["upstream"], registry=r)
        self.circuit_fast_failures = Counter("satgate_upstream_circuit_fast_failures",
                                             "Calls failed at once, unsent, while the upstream's circuit was open",
                                             ["upstream"], registry=r)
        self.store_errors = Counter("satgate_store_errors", "Shared or embedded store operations that failed",
                                    ["op"], registry=r)
        self.fail_open_admissions = Counter("satgate_fail_open_admissions",
                                            "Calls admitted unmetered while the store was down "
                                            "(SATGATE_STORE_FAIL_MODE=open)", registry=r)
        self.trace_export_failures = Counter("satgate_trace_export_failures",
                                             "Batches of spans the trace exporter could not deliver (SATGATE_TRACING)",
                                             registry=r)
        self.audit_dropped = Counter("satgate_audit_dropped", "Audit lines not written: the queue was full or the "
                                     "disk failed (SATGATE_AUDIT_FILE)", registry=r)
        self._governance(r)
        #: The children a call's path touches, by label values in the order the metric declares them.
        self.tool_call_outcomes = Children(self.tool_calls)
        self.upstream_latencies = Children(self.upstream_latency)
        self.policy_decision = Children(self.policy_decisions)

    def _governance(self, r: CollectorRegistry) -> None:
        """Policy rules, pinned definitions, tool controls, approval holds and confirmations."""
        self.policy_decisions = Counter("satgate_policy_decisions", "Calls judged by policy rules, by deciding rule "
                                        "(`(default)`: none matched) and effect (allow, deny, error)",
                                        ["rule", "effect"], registry=r)
        self.policy_reloads = Counter("satgate_policy_reloads", "Changes of SATGATE_POLICY_FILE, by outcome "
                                      "(loaded, rejected)", ["outcome"], registry=r)
        self.tool_definition_changes = Counter("satgate_tool_definition_changes",
                                               "Upstream tool definitions seen to differ from their pins "
                                               "(SATGATE_TOOL_PINNING), once per change", ["upstream"], registry=r)
        self.control_breaches = Counter("satgate_control_breaches",
                                        "Tool calls that broke a token's tool controls, by refusal code and mode "
                                        "(`enforced`: refused; `observed`: SATGATE_ENFORCEMENT=observe let it through)",
                                        ["error", "mode"], registry=r)
        self.approvals = Counter("satgate_approval_holds", "Held tool calls, by what the call found (`requested`: a "
                                 "new approval asked for; `pending`, `approved` (run once), `denied`, `expired`, "
                                 "`full`: the token's queue of pending approvals is full)", ["outcome"], registry=r)
        self.approval_webhook = Counter("satgate_approval_webhook_deliveries", "Approval webhook payloads, by outcome "
                                        "(`delivered`, `given_up` after its tries or a 4xx, `dropped`: the queue was "
                                        "full)", ["outcome"], registry=r)
        self.confirmations = Counter("satgate_confirmations", "Tool calls that asked their user for confirmation, by "
                                     "answer (`accepted`, `declined`, `unavailable`)", ["answer"], registry=r)

    def watch_revocation_files(self, files: Sequence[WatchedFile]) -> None:
        """Export the revocation files' health; a no-op when none is configured."""
        if files:
            self.registry.register(_RevocationFileCollector(files))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WatchedFile(Protocol):
    """What a revocation file store reports (``FileRevocationStore`` fits)."""

    problem: str
    problems: int

    def check(self) -> None: ...


class _RevocationFileCollector(Collector):
    """Read at scrape time, after a fresh check: an idle gateway still shows a deleted file."""

    def __init__(self, files: Sequence[WatchedFile]) -> None:
        self._files = tuple(files)

    def describe(self) -> Iterator[Metric]:
        """Registration asks for names only: no file check before the first lookup."""
        return self._families()

    def collect(self) -> Iterator[Metric]:
        for watched in self._files:
            watched.check()
        return self._families()

    def _families(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "satgate_revocation_file_errors",
            "Times the revocation file went missing or unreadable (the last known ids stay revoked)",
            value=sum(watched.problems for watched in self._files))
        yield GaugeMetricFamily(
            "satgate_revocation_file_unusable",
            "1 while the revocation file is missing or unreadable and the last known ids are enforced",
            value=float(any(watched.problem for watched in self._files)))
