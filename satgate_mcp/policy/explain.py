"""``policy explain``: every rule's verdict on one call, in order, and the one that decides.

The daemon stops at the first matching rule and caches what it can (decide.py); an operator testing a policy
wants to see the whole walk, so this evaluates without plans or caches, with the same variables and the same
rule (a condition that fails is a deny) as the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy import conditions
from satgate_mcp.policy.conditions import ConditionError
from satgate_mcp.policy.decide import Decision
from satgate_mcp.policy.rules import Effect, Rule, RuleSet


@dataclass(frozen=True, slots=True)
class Verdict:
    rule: str
    #: ``skipped`` (method or pattern does not apply), ``false``, ``true``, ``error``.
    outcome: str
    detail: str = ""


def _verdict(rule: Rule, method: str, name: str, context: object) -> Verdict:
    if not rule.applies(method, name):
        return Verdict(rule.name, "skipped", f"applies to {sorted(rule.methods)} and {list(rule.tools or ['*'])}")
    if rule.when is None:
        return Verdict(rule.name, "true", "no condition")
    try:
        return Verdict(rule.name, "true" if rule.when.evaluate(context) else "false", rule.when.source)
    except ConditionError as exc:
        return Verdict(rule.name, "error", exc.message)


def explain(rules: RuleSet, method: str, name: str, variables: JsonObj) -> tuple[list[Verdict], Decision]:
    """Each rule's verdict in order, and the decision the first matching one (or the default) makes."""
    context = conditions.context(variables)
    verdicts = [_verdict(rule, method, name, context) for rule in rules.rules]
    for rule, verdict in zip(rules.rules, verdicts, strict=True):
        if verdict.outcome == "true":
            return verdicts, Decision(rule.effect, rule.name, rule.reason, wait=rule.wait)
        if verdict.outcome == "error":
            return verdicts, Decision(Effect.DENY, rule.name, rule.reason, verdict.detail)
    return verdicts, Decision(rules.default, None, "no rule matched: SATGATE_POLICY_DEFAULT decides")


def report(verdicts: list[Verdict], decision: Decision) -> list[str]:
    """The lines ``policy explain`` prints: one per rule, then the decision."""
    lines = [f"{i}. {v.rule}: {v.outcome}" + (f" ({v.detail})" if v.detail else "") for i, v in
             enumerate(verdicts, 1)]
    if decision.error is not None:
        lines.append(f"decision: deny by {decision.rule} (policy_error: {decision.error})")
    elif decision.rule is None:
        lines.append(f"decision: {decision.effect.value} by the default (SATGATE_POLICY_DEFAULT)")
    else:
        lines.append(f"decision: {decision.effect.value} by {decision.rule}"
                     + (f": {decision.reason}" if decision.reason else ""))
    return lines
