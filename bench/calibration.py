"""Calibration against the machine the issue measured on: its figures, and this run's translated to it.

Machines differ severalfold in Python speed, so an absolute CPU target only travels between them as a share of a
baseline measured on the same machine, or scaled by how fast each runs the same Python (the stdio upstream over
its own pipes: no HTTP, no gateway).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.stats import ratio

#: The issue's figure for the stdio upstream driven over its pipes on its machine.
ISSUE_PIPES_CALLS_PER_SECOND = 5973.0
#: The issue's CPU target measured on its machine: the gateway process 0.20 ms a call where the upstream's own
#: HTTP server took 0.28 ms.
ISSUE_CPU_TARGET_MS, ISSUE_BASELINE_CPU_MS = 0.20, 0.28
MAIN_CPU = "server_main_cpu_ms_per_call"


def machine_factor(pipes_calls_per_second: float) -> float:
    """How many times slower than the issue's machine this one runs the same Python (below 1: faster)."""
    return ratio(ISSUE_PIPES_CALLS_PER_SECOND, pipes_calls_per_second)


def baseline_cpu_ms(summary: dict[str, dict[str, float]]) -> float:
    """The baseline server's process CPU per call in this run; NaN when it was not measured."""
    return summary.get("baseline", {}).get(MAIN_CPU, math.nan)


@dataclass(frozen=True)
class CpuShare:
    """A gateway's process CPU per call, as a share of the baseline's, and that share at the issue's baseline."""

    target: str
    ms: float
    share: float
    at_issue_ms: float


def cpu_shares(summary: dict[str, dict[str, float]]) -> list[CpuShare]:
    """Every gateway target with a measured CPU figure beside a measured baseline; [] without a baseline."""
    base = baseline_cpu_ms(summary)
    if not base > 0:
        return []
    shares = []
    for target, figures in summary.items():
        mine = figures.get(MAIN_CPU, math.nan)
        if target != "baseline" and mine > 0:
            shares.append(CpuShare(target, mine, mine / base, mine / base * ISSUE_BASELINE_CPU_MS))
    return shares


def at_issue_speed(summary: dict[str, dict[str, float]], factor: float) -> list[tuple[str, float]]:
    """(target, process CPU ms per call divided by the machine factor) for each measured gateway target."""
    if not factor > 0:
        return []
    return [(target, mine / factor) for target, figures in summary.items()
            if target != "baseline" and (mine := figures.get(MAIN_CPU, math.nan)) > 0]
