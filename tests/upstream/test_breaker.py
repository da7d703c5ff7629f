"""The circuit breaker's rules, as pure transitions over an injected time (upstream/breaker.py)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from satgate_mcp.errors import UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.refunds import FailureKind, failure_kind
from satgate_mcp.settings import HttpUpstreamSpec
from satgate_mcp.settings_breaker import BreakerSpec
from satgate_mcp.upstream.breaker import (
    CLOSED,
    PASS,
    PROBE,
    Breaker,
    Circuit,
    Outcome,
    State,
    Verdict,
    admit,
    backoff,
    call_outcome,
    circuit_open,
    reachable,
    settle,
    upstream_breaker,
)
from tests.fakes import FakeClock

SPEC = BreakerSpec(failures=3, backoff=2.0, max_backoff=30.0, jitter=0.0)
NOW = 100.0
OPEN = Circuit(State.OPEN, openings=1, retry_at=NOW + 2)
HALF = Circuit(State.HALF_OPEN, openings=1, retry_at=NOW)


@pytest.mark.parametrize(("circuit", "now", "after", "verdict"), [
    pytest.param(CLOSED, NOW, CLOSED, PASS, id="closed-lets-every-call-go"),
    pytest.param(OPEN, NOW, OPEN, Verdict(False, retry_after=2.0), id="open-fails-fast-with-the-wait"),
    pytest.param(OPEN, NOW + 1.5, OPEN, Verdict(False, retry_after=0.5), id="open-the-wait-shrinks"),
    pytest.param(OPEN, NOW + 2, Circuit(State.HALF_OPEN, openings=1, retry_at=NOW + 2), PROBE,
                 id="open-after-backoff-lets-one-probe-go"),
    pytest.param(HALF, NOW + 5, HALF, Verdict(False), id="half-open-fails-fast-while-the-probe-is-out"),
])
def test_admit(circuit: Circuit, now: float, after: Circuit, verdict: Verdict) -> None:
    assert admit(circuit, now) == (after, verdict)


def failing(n: int) -> Circuit:
    return Circuit(failures=n)


@pytest.mark.parametrize(("circuit", "outcome", "probe", "after"), [
    pytest.param(CLOSED, Outcome.FAILED, False, failing(1), id="one-failure-counts"),
    pytest.param(failing(1), Outcome.FAILED, False, failing(2), id="failures-in-a-row-add-up"),
    pytest.param(failing(2), Outcome.FAILED, False, Circuit(State.OPEN, openings=1, retry_at=NOW + 2),
                 id="the-nth-failure-opens-for-the-base-backoff"),
    pytest.param(failing(2), Outcome.ANSWERED, False, CLOSED, id="an-answer-breaks-the-run"),
    pytest.param(failing(2), Outcome.UNKNOWN, False, failing(2), id="a-cancelled-call-proves-nothing"),
    pytest.param(HALF, Outcome.ANSWERED, True, CLOSED, id="probe-answered-closes"),
    pytest.param(HALF, Outcome.FAILED, True, Circuit(State.OPEN, openings=2, retry_at=NOW + 4),
                 id="probe-failed-reopens-for-longer"),
    pytest.param(Circuit(State.HALF_OPEN, openings=9), Outcome.FAILED, True,
                 Circuit(State.OPEN, openings=10, retry_at=NOW + 30), id="the-backoff-is-capped"),
    pytest.param(HALF, Outcome.UNKNOWN, True, Circuit(State.OPEN, openings=1, retry_at=NOW),
                 id="probe-cancelled-the-next-call-probes"),
    pytest.param(OPEN, Outcome.ANSWERED, False, OPEN, id="a-call-from-before-the-opening-decides-nothing"),
    pytest.param(HALF, Outcome.FAILED, False, HALF, id="only-the-probe-decides-half-open"),
])
def test_settle(circuit: Circuit, outcome: Outcome, probe: bool, after: Circuit) -> None:
    assert settle(circuit, outcome, probe=probe, now=NOW, spec=SPEC, rand=0.0) == after


def test_failures_zero_turns_the_breaker_off() -> None:
    off = BreakerSpec(failures=0)
    circuit = CLOSED
    for _ in range(100):
        circuit = settle(circuit, Outcome.FAILED, probe=False, now=NOW, spec=off, rand=0.0)
    assert circuit == CLOSED


@pytest.mark.parametrize(("openings", "rand", "seconds"), [
    pytest.param(1, 0.0, 2.0, id="first"),
    pytest.param(2, 0.0, 4.0, id="doubles"),
    pytest.param(4, 0.0, 16.0, id="doubles-again"),
    pytest.param(5, 0.0, 30.0, id="capped"),
    pytest.param(10_000, 0.0, 30.0, id="capped-without-overflow"),
    pytest.param(1, 0.999, 2.0 * (1 - 0.5 * 0.999), id="jitter-shortens"),
    pytest.param(50, 0.5, 30.0 * 0.75, id="jitter-never-lengthens-past-the-cap"),
])
def test_backoff_grows_is_capped_and_jittered(openings: int, rand: float, seconds: float) -> None:
    spec = BreakerSpec(failures=3, backoff=2.0, max_backoff=30.0, jitter=0.5)
    assert backoff(openings, spec, rand) == pytest.approx(seconds)


@pytest.mark.parametrize(("circuit", "after"), [
    pytest.param(OPEN, Circuit(State.OPEN, openings=1, retry_at=NOW), id="open-probes-at-once"),
    pytest.param(CLOSED, CLOSED, id="closed-unchanged"),
    pytest.param(HALF, HALF, id="half-open-unchanged"),
])
def test_a_reconnect_that_got_through_cuts_the_backoff_short(circuit: Circuit, after: Circuit) -> None:
    assert reachable(circuit, NOW) == after


@pytest.mark.parametrize(("status", "failure", "outcome"), [
    pytest.param(200, None, Outcome.ANSWERED, id="result"),
    pytest.param(200, None, Outcome.ANSWERED, id="json-rpc-error-answer"),
    pytest.param(500, None, Outcome.FAILED, id="json-rpc-answer-under-http-500"),
    pytest.param(None, UpstreamUnavailable("refused", sent=False), Outcome.FAILED, id="connect-refused"),
    pytest.param(None, UpstreamUnavailable("reset"), Outcome.FAILED, id="reset-after-sending"),
    pytest.param(None, UpstreamUnavailable("503", {"status": 503}), Outcome.FAILED, id="http-503"),
    pytest.param(None, UpstreamUnavailable("400", {"status": 400}), Outcome.ANSWERED, id="http-400-is-an-answer"),
    pytest.param(None, UpstreamUnavailable("401", {"status": 401}), Outcome.ANSWERED, id="http-401-is-an-answer"),
    pytest.param(None, UpstreamTimeout("slow"), Outcome.FAILED, id="timeout"),
    pytest.param(None, asyncio.CancelledError(), Outcome.UNKNOWN, id="client-cancelled"),
    pytest.param(None, ValueError("bug"), Outcome.UNKNOWN, id="a-bug-is-not-the-upstream"),
])
def test_what_counts_as_a_failure(status: int | None, failure: BaseException | None, outcome: Outcome) -> None:
    assert call_outcome(status, failure) is outcome


def test_the_fast_failure_names_the_upstream_says_when_and_is_refunded() -> None:
    error = circuit_open("search", Verdict(False, retry_after=7.2))
    assert error.to_error()["data"] == {"error": "upstream_unavailable", "upstream": "search", "circuit": "open",
                                        "retry_after_seconds": 8}
    assert failure_kind(None, error) is FailureKind.NOT_SENT  # it never left: the call is not paid for
    assert circuit_open("search", Verdict(False)).data == {
        "error": "upstream_unavailable", "upstream": "search", "circuit": "open", "retry_after_seconds": 1}


def test_breaker_reads_its_clock_and_moves_the_gauge() -> None:
    clock, metrics = FakeClock(NOW), Metrics()
    breaker = upstream_breaker("web", SPEC, metrics, clock)
    gauge = metrics.circuit_state.labels(upstream="web")
    assert gauge._value.get() == State.CLOSED
    for _ in range(3):
        assert breaker.admit() == PASS
        breaker.settle(Outcome.FAILED, probe=False)
    assert gauge._value.get() == State.OPEN
    assert breaker.detail() == {"state": "open", "retry_in": pytest.approx(2.0 * (1 - SPEC.jitter), abs=2.0)}
    assert not breaker.admit().go
    clock.advance(2.0)
    probe = breaker.admit()
    assert probe == PROBE
    assert gauge._value.get() == State.HALF_OPEN
    assert breaker.detail() == {"state": "half_open"}
    assert not breaker.admit().go  # one probe at a time
    breaker.settle(Outcome.ANSWERED, probe=True)
    assert gauge._value.get() == State.CLOSED
    assert breaker.detail() == {"state": "closed"}


def test_a_breaker_with_jitter_stays_within_its_bounds() -> None:
    spec = BreakerSpec(failures=1, backoff=1.0, max_backoff=8.0, jitter=0.2)
    clock = FakeClock(NOW)
    breaker = Breaker(spec, clock=clock, rand=lambda: 0.999)
    breaker.settle(Outcome.FAILED, probe=False)
    assert 0.8 <= breaker.circuit.retry_at - NOW <= 1.0


@pytest.mark.parametrize("breaker", [
    pytest.param({"failures": -1}, id="negative-failures"),
    pytest.param({"backoff": 10, "max_backoff": 5}, id="cap-below-base"),
    pytest.param({"jitter": 2}, id="jitter-over-one"),
    pytest.param({"failures": 5, "typo": 1}, id="unknown-field"),
])
def test_a_bad_breaker_spec_is_refused_at_start(breaker: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        HttpUpstreamSpec.model_validate({"transport": "http", "url": "http://127.0.0.1:1/mcp", "breaker": breaker})


def test_the_default_breaker_opens_after_five_failures_for_one_to_sixty_seconds() -> None:
    spec = HttpUpstreamSpec(transport="http", url="http://127.0.0.1:1/mcp").breaker
    assert (spec.failures, spec.backoff, spec.max_backoff, spec.jitter) == (5, 1.0, 60.0, 0.2)
