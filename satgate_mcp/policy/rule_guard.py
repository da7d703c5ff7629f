"""Policy rules as a guard (guards.py): each call judged before it reaches an upstream, list items hidden.

The guard holds one ``Decider`` at a time; a call reads it once and is judged by it from start to end, and a
reload replaces it in one assignment, so no call ever sees a policy half old and half new. A deny is the
refusal a tool outside the token's caveat gets (JSON-RPC -32001), with ``data.error`` ``policy_denied`` (a
rule, or ``SATGATE_POLICY_DEFAULT``, said no) or ``policy_error`` (the deciding condition failed: a missing
key, a type error; a deny, never an allow, never a 5xx).
"""

from __future__ import annotations

from collections.abc import Callable

from satgate_mcp import events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import Publisher
from satgate_mcp.guards import Asked, ClientFacts, Proceed
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.decide import Decider, Decision
from satgate_mcp.policy.holds import Holds
from satgate_mcp.policy.rules import Effect
from satgate_mcp.upstream.catalog import Kind

DEFAULT_RULE_LABEL = "(default)"


def refusal(decision: Decision, asked: Asked) -> GatewayError:
    """The JSON-RPC error a denied call gets: which rule, and the reason it gives the client."""
    what = f"{asked.target} {asked.name[:200]!r}"
    if decision.error is not None:
        return GatewayError(f"Policy rule {decision.rule!r} could not be evaluated for {what}; the call is refused",
                            {"error": "policy_error", "rule": decision.rule, "reason": decision.reason},
                            code=jsonrpc.TOOL_NOT_ALLOWED)
    message = f"Policy refuses {what}" + (f": {decision.reason}" if decision.reason else "")
    return GatewayError(message, {"error": "policy_denied", "rule": decision.rule, "reason": decision.reason},
                        code=jsonrpc.TOOL_NOT_ALLOWED)


class PolicyGuard:
    """``Guard``: the current rules judge each call; ``use`` swaps them in whole."""

    def __init__(self, decider: Decider, *, publisher: Publisher, metrics: Metrics,
                 owner_of_tool: Callable[[str], str | None] = lambda name: None, holds: Holds | None = None) -> None:
        self.decider = decider
        #: Runs the ``hold`` and ``confirm`` effects; None (a guard built without it) refuses such calls.
        self._holds = holds
        self._publisher = publisher
        self._metrics = metrics
        self._owner_of_tool = owner_of_tool

    def use(self, decider: Decider) -> Decider:
        """From now on every call is judged by ``decider``; returns the one it replaced."""
        previous, self.decider = self.decider, decider
        return previous

    async def guard(self, asked: Asked, proceed: Proceed) -> JsonObj:
        decision = self.decider.decide(asked)
        effect = "error" if decision.error is not None else decision.effect.value
        self._metrics.policy_decision(decision.rule or DEFAULT_RULE_LABEL, effect).inc()
        if decision.effect is Effect.ALLOW:
            return await proceed()
        if decision.effect is Effect.HOLD and self._holds is not None:
            reason = decision.reason or f"policy rule {decision.rule}"
            return await self._holds.hold(asked, reason, decision.wait, proceed)
        if decision.effect is Effect.CONFIRM and self._holds is not None:
            message = decision.reason or f"Allow the call of {asked.name[:200]}?"
            return await self._holds.confirm(asked, message, (), proceed)
        self._metrics.refusals.labels(reason="policy_error" if decision.error else "policy_denied").inc()
        self._publisher.publish(events.POLICY_DENIED, token_id=asked.identity.token_id, session_id=asked.session_id,
                                method=asked.method, kind=asked.target, name=asked.name[:200], rule=decision.rule,
                                error=decision.error)
        raise refusal(decision, asked)

    def hides(self, identity: Identity, kind: Kind, item: JsonObj, client: ClientFacts | None) -> bool:
        name = item.get("name")
        upstream = self._owner_of_tool(name) if kind == "tools" and isinstance(name, str) else None
        return self.decider.hidden(identity, kind, item, upstream)
