"""The overview's figures: read from what the gateway already counts, sampled every few seconds, never per call.

A sample is the cumulative counters of this process at one moment (the Prometheus registry's tool calls,
refusals and latency buckets, and the session registry's size); the plots are differences of neighbouring
samples. An hour of samples is a small ring buffer, filled by one background task (``Sampler``).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter as Tally
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import Session

#: How often a sample is taken and, with Redis, this process's figures are published.
SAMPLE_SECONDS = 5.0
#: One hour of samples.
RING = 720
#: Outcomes of a tool call that are the gateway's or the upstream's failure (a tool's own error is an answer).
FAILED_OUTCOMES = frozenset({"error", "timeout", "unavailable"})
#: Tenants shown per process; the rest are summed under ``(other)``.
TOP_TENANTS = 10


@dataclass(frozen=True, slots=True)
class Sample:
    """This process's cumulative counters at ``t`` (wall clock seconds)."""

    t: float
    calls: float
    errors: float
    refusals: Mapping[str, float]
    sessions: int
    #: upstream -> cumulative count per bucket upper bound, in the histogram's order.
    latency: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)


def _samples(metric: MetricWrapperBase, suffix: str) -> Iterable[tuple[dict[str, str], float]]:
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                yield sample.labels, sample.value


def take_sample(metrics: Metrics, sessions: int, now: float) -> Sample:
    calls = errors = 0.0
    for labels, value in _samples(metrics.tool_calls, "_total"):
        calls += value
        if labels.get("outcome") in FAILED_OUTCOMES:
            errors += value
    refusals = {labels["reason"]: value for labels, value in _samples(metrics.refusals, "_total")}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for labels, value in _samples(metrics.upstream_latency, "_bucket"):
        if labels.get("method") == "tools/call":
            buckets.setdefault(labels["upstream"], []).append((float(labels["le"]), value))
    latency = {name: tuple(sorted(found)) for name, found in buckets.items()}
    return Sample(now, calls, errors, refusals, sessions, latency)


def rate(new: float, old: float, seconds: float) -> float:
    """Per second between two cumulative readings; a counter that went back (a restart) counts from zero."""
    if seconds <= 0:
        return 0.0
    return max(0.0, new - old if new >= old else new) / seconds


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram (bucket upper bounds), interpolated within its bucket, in
    seconds; None with no observation. A value in the ``+Inf`` bucket reads as the last finite bound."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    wanted, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= wanted:
            if math.isinf(upper):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((wanted - below) / inside if inside > 0 else 1.0)
        lower, below = upper, count
    return lower


def window(new: Sequence[tuple[float, float]], old: Sequence[tuple[float, float]] | None
           ) -> list[tuple[float, float]]:
    """The observations between two readings of one histogram, bucket by bucket."""
    if not old or len(old) != len(new) or old[-1][1] > new[-1][1]:
        return list(new)
    return [(bound, count - before) for (bound, count), (_, before) in zip(new, old, strict=True)]


class Ring:
    """The last hour of samples; plots are rates between neighbours."""

    def __init__(self, size: int = RING) -> None:
        self.samples: deque[Sample] = deque(maxlen=size)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def series(self) -> dict[str, Any]:
        """Per interval: time, calls/s, errors/s, and refusals/s by reason (every reason seen in the hour)."""
        points = list(self.samples)
        reasons = sorted({reason for s in points for reason in s.refusals})
        out: dict[str, Any] = {"t": [], "calls": [], "errors": [], "refusals": {r: [] for r in reasons}}
        for old, new in itertools.pairwise(points):
            seconds = new.t - old.t
            out["t"].append(round(new.t, 1))
            out["calls"].append(round(rate(new.calls, old.calls, seconds), 3))
            out["errors"].append(round(rate(new.errors, old.errors, seconds), 3))
            for reason in reasons:
                out["refusals"][reason].append(
                    round(rate(new.refusals.get(reason, 0.0), old.refusals.get(reason, 0.0), seconds), 3))
        return out

    def latency(self) -> dict[str, dict[str, float | None]]:
        """p50 and p95 per upstream over the hour the ring holds, in milliseconds."""
        if not self.samples:
            return {}
        first, last = self.samples[0], self.samples[-1]
        found: dict[str, dict[str, float | None]] = {}
        for name, buckets in last.latency.items():
            seen = window(buckets, first.latency.get(name) if first is not last else None)
            found[name] = {q: _ms(quantile(seen, value)) for q, value in (("p50", 0.5), ("p95", 0.95))}
        return found

    def recent_rates(self) -> dict[str, float]:
        """Calls, errors and refusals per second over the last interval (what a process publishes)."""
        if len(self.samples) < 2:
            return {"calls": 0.0, "errors": 0.0, "refusals": 0.0}
        old, new = self.samples[-2], self.samples[-1]
        seconds = new.t - old.t
        return {"calls": round(rate(new.calls, old.calls, seconds), 3),
                "errors": round(rate(new.errors, old.errors, seconds), 3),
                "refusals": round(rate(sum(new.refusals.values()), sum(old.refusals.values()), seconds), 3)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def session_mix(sessions: Iterable[Session]) -> dict[str, dict[str, int]]:
    """Live sessions by protocol revision (the era) and by tenant (the largest few, the rest as ``(other)``)."""
    eras: Tally[str] = Tally()
    tenants: Tally[str] = Tally()
    for session in sessions:
        eras[session.protocol_version] += 1
        tenants[session.identity.tenant or "(none)"] += 1
    top = dict(tenants.most_common(TOP_TENANTS))
    rest = sum(tenants.values()) - sum(top.values())
    if rest:
        top["(other)"] = rest
    return {"eras": dict(eras), "tenants": top}
