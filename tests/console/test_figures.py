"""The overview's arithmetic: rates between samples, quantiles from histogram buckets, the hour's ring."""

from __future__ import annotations

import math

import pytest

from satgate_mcp.auth.base import Identity
from satgate_mcp.console import figures
from satgate_mcp.console.figures import Ring, Sample, quantile, rate, session_mix, take_sample, window
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import Session

INF = math.inf


@pytest.mark.parametrize(("new", "old", "seconds", "expected"), [
    pytest.param(20.0, 10.0, 5.0, 2.0, id="steady"),
    pytest.param(10.0, 10.0, 5.0, 0.0, id="idle"),
    pytest.param(3.0, 10.0, 5.0, 0.6, id="a-restart-counts-from-zero"),
    pytest.param(20.0, 10.0, 0.0, 0.0, id="no-time"),
])
def test_rate(new: float, old: float, seconds: float, expected: float) -> None:
    assert rate(new, old, seconds) == pytest.approx(expected)


BUCKETS = ((0.01, 50.0), (0.1, 90.0), (1.0, 100.0), (INF, 100.0))


@pytest.mark.parametrize(("buckets", "q", "expected"), [
    pytest.param(BUCKETS, 0.5, 0.01, id="p50-at-a-bound"),
    pytest.param(BUCKETS, 0.7, 0.055, id="p70-interpolated"),
    pytest.param(BUCKETS, 0.95, 0.55, id="p95"),
    pytest.param(((0.1, 0.0), (INF, 4.0)), 0.5, 0.1, id="beyond-the-last-bound"),
    pytest.param(((0.1, 0.0), (INF, 0.0)), 0.5, None, id="no-observation"),
    pytest.param((), 0.5, None, id="no-buckets"),
])
def test_quantile(buckets: tuple[tuple[float, float], ...], q: float, expected: float | None) -> None:
    found = quantile(buckets, q)
    assert found == (pytest.approx(expected) if expected is not None else None)


def test_a_window_is_what_happened_between_two_readings() -> None:
    assert window(((0.1, 5.0), (INF, 9.0)), ((0.1, 2.0), (INF, 3.0))) == [(0.1, 3.0), (INF, 6.0)]
    assert window(((0.1, 1.0), (INF, 2.0)), ((0.1, 2.0), (INF, 3.0))) == [(0.1, 1.0), (INF, 2.0)]  # a restart
    assert window(((0.1, 1.0), (INF, 2.0)), None) == [(0.1, 1.0), (INF, 2.0)]


def test_the_ring_plots_rates_between_neighbours_and_keeps_an_hour() -> None:
    ring = Ring(size=3)
    for t, calls, refused in ((0.0, 0.0, 0.0), (5.0, 10.0, 0.0), (10.0, 30.0, 5.0), (15.0, 30.0, 5.0)):
        ring.add(Sample(t, calls, calls / 10, {"rate_limited": refused} if refused else {}, 1))
    series = ring.series()
    assert series["t"] == [10.0, 15.0]
    assert series["calls"] == [4.0, 0.0]
    assert series["errors"] == [0.4, 0.0]
    assert series["refusals"] == {"rate_limited": [1.0, 0.0]}
    assert ring.recent_rates() == {"calls": 0.0, "errors": 0.0, "refusals": 0.0}


def test_a_sample_reads_what_the_gateway_already_counts() -> None:
    metrics = Metrics()
    metrics.tool_call_outcomes("demo", "ok").inc(3)
    metrics.tool_call_outcomes("demo", "timeout").inc()
    metrics.tool_call_outcomes("demo", "tool_error").inc()  # the tool's own answer, not a failure
    metrics.refusals.labels(reason="policy_denied").inc(2)
    metrics.upstream_latencies("demo", "tools/call").observe(0.02)
    sample = take_sample(metrics, 7, 100.0)
    assert (sample.calls, sample.errors, sample.sessions) == (5.0, 1.0, 7)
    assert sample.refusals == {"policy_denied": 2.0}
    ring = Ring()
    ring.add(sample)
    assert ring.latency()["demo"]["p50"] is not None


def session(protocol: str, tenant: str | None) -> Session:
    return Session("id", "hash", Identity("t", tenant=tenant), protocol, 0.0, 0.0)


def test_sessions_by_era_and_by_the_largest_tenants() -> None:
    sessions = [session("2025-11-25", f"tenant-{i}") for i in range(figures.TOP_TENANTS + 2)]
    sessions += [session("2025-06-18", None)] * 3
    mix = session_mix(sessions)
    assert mix["eras"] == {"2025-11-25": figures.TOP_TENANTS + 2, "2025-06-18": 3}
    assert mix["tenants"]["(none)"] == 3
    assert sum(mix["tenants"].values()) == len(sessions)
    assert len(mix["tenants"]) == figures.TOP_TENANTS + 1
