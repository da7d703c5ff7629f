"""Statistics: percentiles, medians, ratios and the per-round summary, all pure so they are table-tested.

NaN stands for a figure that could not be had (no calls, no baseline in the round): it propagates instead of
turning into a zero that would read as a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: The comparison's targets, in the order each round runs them.
TARGETS = ("baseline", "gateway-none", "gateway-header")
#: Header mode on Redis, every call charged and rate limited: measured when the bench's Redis is reachable.
METERED = "gateway-metered"
#: OAuth mode, against an authorization server the bench runs in its own process.
OAUTH = "gateway-oauth"

#: The figures of a round that the summary takes the median of.
ROUND_METRICS = ("calls_per_second", "ratio", "p50_ms", "p99_ms", "sequential_p50_ms", "server_cpu_ms_per_call",
                 "server_main_cpu_ms_per_call", "server_children_cpu_ms_per_call", "initialize_per_second",
                 "loadgen_cpu_pct")


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (``fraction`` in 0..1); NaN when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def median(values: Sequence[float]) -> float:
    """The median of the figures that were had (NaN ones left out); NaN when none was."""
    real = sorted(v for v in values if not math.isnan(v))
    if not real:
        return math.nan
    mid = len(real) // 2
    return real[mid] if len(real) % 2 else (real[mid - 1] + real[mid]) / 2


def ratio(value: float, base: float) -> float:
    """``value / base``, NaN when either is missing or the base is not positive (never a division error)."""
    return value / base if base > 0 and not math.isnan(value) and not math.isnan(base) else math.nan


def cpu_ms_per_call(ticks: int, clk_tck: int, calls: int) -> float:
    """CPU milliseconds per call from clock ticks; NaN without calls or without a clock."""
    return ticks * 1000.0 / clk_tck / calls if calls > 0 and clk_tck > 0 else math.nan


def interleave(rounds: int, targets: Sequence[str] = TARGETS) -> list[tuple[int, str]]:
    """(round, target) in run order: every target once per round, so drift hits each alike."""
    return [(r, t) for r in range(1, rounds + 1) for t in targets]


def with_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row plus ``ratio``: its calls/s over the baseline's in the same round (NaN without one)."""
    base = {r["round"]: float(r["calls_per_second"]) for r in rows if r["target"] == "baseline"}
    return [{**r, "ratio": ratio(float(r["calls_per_second"]), base.get(r["round"], math.nan))} for r in rows]


def summarize_rounds(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per target, the median over rounds of every figure (ratios are per round first, then the median)."""
    out: dict[str, dict[str, float]] = {}
    for target in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == target]
        out[target] = {m: median([float(r[m]) for r in mine if r.get(m) is not None]) for m in ROUND_METRICS}
        out[target]["errors"] = float(sum(int(r.get("errors", 0)) for r in mine))
    return out


@dataclass
class Tally:
    """One client's calls in the default mode: latencies in ms, and how many of them failed."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0


@dataclass(frozen=True)
class Report:
    """The default mode's figures; ``--json`` prints them field by field, in this order."""

    clients: int
    calls_per_client: int
    client_kind: str
    auth: str
    ok: int
    errors: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    rss_before_kib: int | None
    rss_after_kib: int | None
    rss_peak_kib: int | None

    @property
    def calls_per_second(self) -> float:
        return (self.ok + self.errors) / self.seconds if self.seconds > 0 else math.nan


@dataclass(frozen=True)
class RunLabel:
    """What a default-mode run was (the options it echoes back), apart from what it measured."""

    clients: int
    calls_per_client: int
    client_kind: str
    auth: str


def summarize(tallies: Sequence[Tally], seconds: float, label: RunLabel,
              rss: tuple[int | None, int | None, int | None]) -> Report:
    """Every client's calls pooled into one report; ``rss`` is (before, after, peak) in KiB."""
    ms = sorted(x for t in tallies for x in t.latencies_ms)
    errors = sum(t.errors for t in tallies)
    return Report(label.clients, label.calls_per_client, label.client_kind, label.auth, len(ms) - errors, errors,
                  seconds, percentile(ms, 0.50), percentile(ms, 0.90), percentile(ms, 0.99),
                  ms[-1] if ms else math.nan, *rss)
