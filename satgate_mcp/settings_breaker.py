"""An HTTP upstream's ``"breaker"`` field: when its circuit opens and how long it stays open (upstream/breaker.py).

Apart from settings.py only for size; a part of ``HttpUpstreamSpec``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class BreakerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Failures in a row (connect refused, timeout, HTTP 5xx) that open the circuit; 0 turns the breaker off.
    failures: int = Field(default=5, ge=0)
    #: Seconds open after the first opening; doubled after each failed probe.
    backoff: float = Field(default=1.0, ge=0)
    #: The longest the circuit stays open before a probe.
    max_backoff: float = Field(default=60.0, ge=0)
    #: Up to this fraction of each backoff is taken off at random, so replicas do not probe in step.
    jitter: float = Field(default=0.2, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> BreakerSpec:
        if self.max_backoff < self.backoff:
            raise ValueError("max_backoff must be at least backoff")
        return self
