"""Cached metric children are the very children ``labels()`` gives: what they count is what is scraped."""

from __future__ import annotations

from satgate_mcp.metrics import Metrics


def test_a_cached_child_is_the_labelled_child_and_counts_into_the_registry() -> None:
    metrics = Metrics()
    metrics.tool_call_outcomes("bench", "ok").inc()
    metrics.tool_call_outcomes("bench", "ok").inc()
    metrics.tool_call_outcomes("bench", "timeout").inc()
    metrics.upstream_latencies("bench", "tools/call").observe(0.01)
    assert metrics.tool_call_outcomes("bench", "ok") is metrics.tool_calls.labels(upstream="bench", outcome="ok")
    sample = metrics.registry.get_sample_value
    assert sample("satgate_tool_calls_total", {"upstream": "bench", "outcome": "ok"}) == 2
    assert sample("satgate_tool_calls_total", {"upstream": "bench", "outcome": "timeout"}) == 1
    assert sample("satgate_upstream_latency_seconds_count", {"upstream": "bench", "method": "tools/call"}) == 1
