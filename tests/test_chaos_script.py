"""The pure parts of scripts/chaos.py: how a failed call is classified, and that the table fails on what it must."""

from __future__ import annotations

import math

import pytest

from scripts.chaos import IN_FLIGHT, KILL_GRACE, STORE_DOWN, Observed, Verdict, classify

KILLED_AT, PORT, OTHER_PORT = 100.0, 9001, 9002


def observed(back: float = 104.0, refused: frozenset[str] = frozenset(), port: int | None = PORT) -> Observed:
    seen = Observed(refused_503=set(refused), kills=[(KILLED_AT, PORT, back)])
    if port is not None:
        seen.port_of["call"] = port
    return seen


@pytest.mark.parametrize(("started", "ended", "seen", "why"), [
    pytest.param(99.0, 100.5, observed(), IN_FLIGHT, id="running-when-its-gateway-was-killed"),
    pytest.param(101.0, 101.1, observed(), IN_FLIGHT, id="sent-while-its-gateway-was-down"),
    pytest.param(101.0, 101.1, observed(back=math.inf), IN_FLIGHT, id="gateway-not-back-yet"),
    pytest.param(104.0 + KILL_GRACE - 0.1, 108.0, observed(), IN_FLIGHT, id="stale-connection-just-after-restart"),
    pytest.param(104.0 + KILL_GRACE + 1, 108.0, observed(), "else: RuntimeError", id="long-after-the-restart"),
    pytest.param(90.0, 95.0, observed(), "else: RuntimeError", id="before-any-kill"),
    pytest.param(99.0, 100.5, observed(port=OTHER_PORT), "else: RuntimeError", id="on-the-other-gateway"),
    pytest.param(99.0, 100.5, observed(port=None), IN_FLIGHT, id="cut-before-any-answer-names-no-port"),
    pytest.param(50.0, 51.0, observed(refused=frozenset({"call"})), STORE_DOWN, id="refused-503-while-store-down"),
])
def test_only_a_kill_or_a_store_outage_explains_a_failed_call(started: float, ended: float, seen: Observed,
                                                              why: str) -> None:
    assert classify("call", started, ended, RuntimeError("x"), seen) == why


def test_the_verdict_fails_on_any_problem_and_passes_without() -> None:
    verdict = Verdict()
    verdict.row("calls answered", 10)
    assert not verdict.problems
    verdict.row("failed: anything else", 1, "unclassified failures")
    assert verdict.problems == ["unclassified failures"]
