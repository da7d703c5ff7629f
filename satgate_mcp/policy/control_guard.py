"""Tool controls as a guard (guards.py): each call judged by its token's ``controls`` caveats before it goes on.

A token without controls (and any request but a tool call) goes straight through: nothing is paid for
controls nobody carries. Otherwise the call's breaches (control_checks.py) are refused with the first one,
JSON-RPC -32001 and ``data.error`` naming the control; under ``SATGATE_ENFORCEMENT=observe`` chosen by the
operator, each breach is logged and counted and the call goes on. The setting's default is ``observe`` for
rate limits and budgets; controls a token carries are enforced unless the operator chose ``observe`` outright
(``enforces``), so no control is fail-open by default.
"""

from __future__ import annotations

import structlog

from satgate_mcp import events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import Publisher
from satgate_mcp.guards import Asked, ClientFacts, Proceed
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.control_checks import SPEND_LIMIT_EXCEEDED, Breach, arguments_of, judge
from satgate_mcp.policy.controls import applies
from satgate_mcp.upstream.catalog import Kind

log = structlog.get_logger("satgate_mcp.controls")


def enforces(enforcement: str, explicit: bool) -> bool:
    """Whether controls refuse: always, unless the operator set ``SATGATE_ENFORCEMENT=observe`` themselves."""
    return not (enforcement == "observe" and explicit)


class ControlsGuard:
    """``Guard``: the calling token's tool controls; ``enforce`` False only observes."""

    def __init__(self, *, enforce: bool, publisher: Publisher, metrics: Metrics) -> None:
        self.enforce = enforce
        self._publisher = publisher
        self._metrics = metrics

    async def guard(self, asked: Asked, proceed: Proceed) -> JsonObj:
        controls = asked.identity.controls
        if not controls or asked.target != "tool":
            return await proceed()
        breaches = judge(controls, asked.name, arguments_of(asked.params))
        for caveat in controls:  # spend limits are section 3's; until then a call one applies to is refused
            if any(applies(limit.tools, asked.name) for limit in caveat.spend_limits):
                breaches.append(Breach(SPEND_LIMIT_EXCEEDED, f"Tool {asked.name!r}: spend limits are not enforced "
                                       "by this gateway version", {"tool": asked.name}))
        if breaches:
            self.breached(asked, breaches)
        return await proceed()

    def breached(self, asked: Asked, breaches: list[Breach]) -> None:
        """Count and log each breach; enforcing, refuse with the first."""
        mode = "enforced" if self.enforce else "observed"
        for breach in breaches:
            self._metrics.control_breaches.labels(error=breach.error, mode=mode).inc()
            self._publisher.publish(events.CONTROL_BREACH, token_id=asked.identity.token_id,
                                    session_id=asked.session_id, tool=asked.name[:200], error=breach.error,
                                    field=breach.data.get("field"), enforced=self.enforce)
            if not self.enforce:
                log.warning("control_observed", tool=asked.name[:200], error=breach.error,
                            field=breach.data.get("field"), token_id=asked.identity.token_id)
        if self.enforce:
            first = breaches[0]
            self._metrics.refusals.labels(reason=first.error).inc()
            raise GatewayError(first.message, {"error": first.error, **first.data}, code=jsonrpc.TOOL_NOT_ALLOWED)

    def hides(self, identity: Identity, kind: Kind, item: JsonObj, client: ClientFacts | None) -> bool:
        return False  # a tool with rules on its arguments is still callable within them
