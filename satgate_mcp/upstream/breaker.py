"""The circuit breaker of one HTTP upstream: stop calling an upstream that keeps failing, probe it now and then.

Without it every call to a dead upstream waits its full timeout, and an upstream trying to recover is
hammered by every client at once. After ``failures`` consecutive failures (connect refused, timeout, HTTP
5xx: what says the upstream cannot serve) the circuit opens: calls fail at once, unsent, with a retry hint.
After a backoff (doubling on each failed probe, capped, with jitter so replicas do not probe in step) one
call is let through as a probe while every other keeps failing fast; an answer closes the circuit, a failure
opens it again for longer. An answer of any kind (a JSON-RPC error, an HTTP 4xx) proves the upstream serves;
a call the client cancelled proves nothing either way.

The decisions are pure functions over a ``Circuit`` and the time; ``Breaker`` holds one upstream's circuit and
reads the clock. stdio children have their own restart backoff (wire.py) and no breaker.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum, IntEnum

from satgate_mcp.errors import UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings_breaker import BreakerSpec


class State(IntEnum):
    """The gauge's values: ``satgate_upstream_circuit_state``."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class Outcome(Enum):
    """What one call through the circuit proved about the upstream."""

    #: It answered (a result, a JSON-RPC error, an HTTP 4xx).
    ANSWERED = "answered"
    #: Connect refused or reset, no answer in time, HTTP 5xx.
    FAILED = "failed"
    #: The client went away first: nothing learnt.
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Circuit:
    state: State = State.CLOSED
    #: Failures in a row while closed.
    failures: int = 0
    #: Times opened since it last closed: how long the next backoff is.
    openings: int = 0
    #: While open: when the next probe may go.
    retry_at: float = 0.0


CLOSED = Circuit()


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a call goes: ``probe`` when it is the one call that decides a half-open circuit; when it may
    not go, ``retry_after`` is the seconds until a probe may (0 while a probe is out)."""

    go: bool
    probe: bool = False
    retry_after: float = 0.0


PASS = Verdict(True)
PROBE = Verdict(True, probe=True)


def backoff(openings: int, spec: BreakerSpec, rand: float) -> float:
    """Seconds open after the ``openings``-th opening in a row: doubling from ``backoff``, capped at
    ``max_backoff``, then up to ``jitter`` of it taken off (``rand`` in [0, 1)), never above the cap."""
    grown = spec.backoff * 2.0 ** min(max(openings - 1, 0), 62)
    return min(spec.max_backoff, grown) * (1.0 - spec.jitter * rand)


def admit(circuit: Circuit, now: float) -> tuple[Circuit, Verdict]:
    """A call wants to go: closed lets it; open refuses until ``retry_at``, then lets one probe go (half-open);
    half-open refuses every other call while the probe is out."""
    if circuit.state is State.CLOSED:
        return circuit, PASS
    if circuit.state is State.OPEN:
        if now < circuit.retry_at:
            return circuit, Verdict(False, retry_after=circuit.retry_at - now)
        return replace(circuit, state=State.HALF_OPEN), PROBE
    return circuit, Verdict(False)


def settle(circuit: Circuit, outcome: Outcome, *, probe: bool, now: float, spec: BreakerSpec,
           rand: float) -> Circuit:
    """The circuit after a call that went ended with ``outcome``. Calls that went before the circuit opened
    and end after it did change nothing: only the probe decides a circuit that is not closed."""
    if (circuit.state is not State.CLOSED and not probe) or spec.failures == 0:
        return circuit
    if outcome is Outcome.ANSWERED:
        return CLOSED
    if outcome is Outcome.UNKNOWN:
        # A cancelled probe: open as before, and the next call probes at once.
        return replace(circuit, state=State.OPEN, retry_at=now) if probe else circuit
    if probe:
        return _opened(circuit.openings + 1, now, spec, rand)
    if circuit.failures + 1 >= spec.failures:
        return _opened(1, now, spec, rand)
    return replace(circuit, failures=circuit.failures + 1)


def _opened(openings: int, now: float, spec: BreakerSpec, rand: float) -> Circuit:
    return Circuit(State.OPEN, failures=0, openings=openings, retry_at=now + backoff(openings, spec, rand))


def reachable(circuit: Circuit, now: float) -> Circuit:
    """The connection's own reconnect got through: an open circuit's next call may probe at once."""
    if circuit.state is State.OPEN and circuit.retry_at > now:
        return replace(circuit, retry_at=now)
    return circuit


def call_outcome(status: int | None, failure: BaseException | None) -> Outcome:
    """What a call proved: an answer under HTTP 5xx, no answer in time, an unreachable or broken upstream are
    failures; an answer (a JSON-RPC error too) and a bare HTTP 4xx are not; a cancellation or a bug, unknown."""
    if failure is None:
        return Outcome.FAILED if status is not None and status >= 500 else Outcome.ANSWERED
    if isinstance(failure, UpstreamTimeout):
        return Outcome.FAILED
    if isinstance(failure, UpstreamUnavailable):
        said = (failure.data or {}).get("status")
        return Outcome.ANSWERED if isinstance(said, int) and said < 500 else Outcome.FAILED
    return Outcome.UNKNOWN


def circuit_open(upstream: str, verdict: Verdict) -> UpstreamUnavailable:
    """The fast failure: unsent (so refunded), naming the upstream and when to try again."""
    retry = max(1, math.ceil(verdict.retry_after))
    return UpstreamUnavailable(
        f"upstream {upstream!r} is failing: calls to it are paused (circuit open); retry in {retry}s",
        {"upstream": upstream, "circuit": "open", "retry_after_seconds": retry}, sent=False)


class Breaker:
    """One upstream's circuit over a clock; ``on_change`` hears every new state (the gauge)."""

    def __init__(self, spec: BreakerSpec, *, clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random,
                 on_change: Callable[[State], None] | None = None) -> None:
        self.spec = spec
        self.circuit = CLOSED
        self._clock = clock
        self._rand = rand
        self._on_change = on_change

    def admit(self) -> Verdict:
        circuit, verdict = admit(self.circuit, self._clock())
        self._set(circuit)
        return verdict

    def settle(self, outcome: Outcome, *, probe: bool) -> None:
        self._set(settle(self.circuit, outcome, probe=probe, now=self._clock(), spec=self.spec, rand=self._rand()))

    def reachable(self) -> None:
        self._set(reachable(self.circuit, self._clock()))

    def detail(self) -> dict[str, object]:
        """What ``/readyz`` shows: the state, and while open the seconds until a probe may go."""
        shown: dict[str, object] = {"state": self.circuit.state.label}
        if self.circuit.state is State.OPEN:
            shown["retry_in"] = round(max(0.0, self.circuit.retry_at - self._clock()), 3)
        return shown

    def _set(self, circuit: Circuit) -> None:
        changed = circuit.state is not self.circuit.state
        self.circuit = circuit
        if changed and self._on_change is not None:
            self._on_change(circuit.state)


def upstream_breaker(name: str, spec: BreakerSpec, metrics: Metrics,
                     clock: Callable[[], float] = time.monotonic) -> Breaker:
    """An upstream's breaker, its state in ``satgate_upstream_circuit_state{upstream}`` from the start."""
    gauge = metrics.circuit_state.labels(upstream=name)
    gauge.set(State.CLOSED)
    return Breaker(spec, clock=clock, on_change=gauge.set)
