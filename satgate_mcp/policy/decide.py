"""Which rule decides a call, and which list items a caller is not shown: first matching rule wins.

Cost is what shapes this module. A rule whose condition reads only ``token`` and ``tool`` gives one answer per
token and tool, so for each (token, method, tool) a *plan* is made once: the applicable rules in order, those
conditions already evaluated (a rule that matched, or failed, ends the plan: nothing after it can decide),
and the rest (conditions reading ``args``, ``session``, ``request`` or ``now``) left to evaluate per call with
the token and tool variables already converted to CEL values. A plan also answers "is this item hidden":
its decided prefix is the decision whatever the arguments. Plans belong to one ``RuleSet``'s ``Decider``: a
reload makes a new one, so a cached answer never outlives the rules it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from satgate_mcp.auth.base import Identity
from satgate_mcp.guards import Asked
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy import conditions
from satgate_mcp.policy.conditions import ConditionError
from satgate_mcp.policy.rules import Effect, Rule, RuleSet
from satgate_mcp.upstream.catalog import Kind

#: Plans kept per decider before it starts afresh (a bound on memory, not a tuning knob: a plan holds its token's
#: and tool's variables as CEL values, a kilobyte or two).
MAX_PLANS = 20_000
#: Identity objects the fast path remembers (OAuth makes one per request: this bound is what keeps them few).
MAX_IDENTITIES = 10_000
#: Most values (every key's value, list item, nested) a call's arguments may hold for a rule that reads them: the
#: conversion to CEL values costs about 2 µs each, so a 4 MiB body of small values would stall the process.
MAX_ARGUMENT_VALUES = 10_000


@dataclass(frozen=True, slots=True)
class Decision:
    effect: Effect
    #: The deciding rule's name; None when no rule matched and ``SATGATE_POLICY_DEFAULT`` decided.
    rule: str | None
    reason: str
    #: Why the deciding condition could not be evaluated (the call is denied with ``policy_error``).
    error: str | None = None
    #: A ``hold`` rule's wait (seconds the call stays open for the decision).
    wait: int | None = None

    @property
    def denied(self) -> bool:
        return self.effect is Effect.DENY


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def token_variables(identity: Identity) -> JsonObj:
    return {"id": identity.token_id, "tenant": _text(identity.tenant), "subject": _text(identity.subject),
            "scopes": sorted(identity.scopes or ()), "claims": dict(identity.claims),
            "caveats": list(identity.caveats)}


def tool_variables(name: str, upstream: str | None, definition: JsonObj | None) -> JsonObj:
    annotations = (definition or {}).get("annotations")
    return {"name": name, "upstream": _text(upstream),
            "annotations": dict(annotations) if isinstance(annotations, dict) else {}}


def within(value: object, budget: int) -> bool:
    """Whether ``value`` holds at most ``budget`` values in all (a walk that stops as soon as it knows)."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _args(asked: Asked, clock: Callable[[], datetime]) -> object:
    arguments = asked.params.get("arguments")
    if not isinstance(arguments, dict):
        return {}
    if not within(arguments, MAX_ARGUMENT_VALUES):  # converting them to CEL values would hold up every other call
        raise ValueError(f"the arguments hold more than {MAX_ARGUMENT_VALUES} values, more than a rule reads")
    return arguments


def _session(asked: Asked, clock: Callable[[], datetime]) -> object:
    client = asked.client
    return {"id": asked.session_id, "protocol": _text(client.protocol if client else None),
            "client": {"name": _text(client.name if client else None),
                       "version": _text(client.version if client else None)}}


def _request(asked: Asked, clock: Callable[[], datetime]) -> object:
    return {"method": asked.method, "remote_addr": _text(asked.remote_addr)}


def _now(asked: Asked, clock: Callable[[], datetime]) -> object:
    return clock()


#: What only this call says, each built only when a condition reads it: arguments, session, request, time.
CALL_VARIABLES: dict[str, Callable[[Asked, Callable[[], datetime]], object]] = {
    "args": _args, "session": _session, "request": _request, "now": _now}


def _annotations(definition: JsonObj | None) -> object:
    return definition.get("annotations") if definition is not None else None


#: A plan's step: a decision made already, or a rule whose condition needs this call's variables.
Step = Decision | Rule


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[Step, ...]
    #: The token and tool variables as CEL values; None when no step needs them.
    context: Any
    #: The per-call variables the remaining conditions read.
    per_call: frozenset[str]
    #: What the plan was made from, checked on every use (the pool re-lists, OAuth claims are not compared): the
    #: definition's annotations (all a plan reads of it) and the token's claims.
    annotations: object
    claims: Mapping[str, Any]

    def fits(self, definition: JsonObj | None, claims: Mapping[str, Any]) -> bool:
        annotations = definition.get("annotations") if definition is not None else None
        return ((self.annotations is annotations or self.annotations == annotations)
                and (self.claims is claims or self.claims == claims))

    @property
    def static(self) -> Decision | None:
        """The decision whatever the call's own variables say; None when a per-call condition comes first."""
        first = self.steps[0]
        return first if isinstance(first, Decision) else None

    @property
    def always_denied(self) -> bool:
        """Denied whatever the call's own variables say: each per-call rule on the way denies if it matches (or
        fails), and the decision they fall through to is a deny."""
        return all(step.denied if isinstance(step, Decision) else step.effect is Effect.DENY for step in self.steps)


class PlanKey(NamedTuple):
    identity: Identity
    method: str
    name: str
    upstream: str | None


def _matched(rule: Rule, context: Any) -> Decision | None:
    """The rule's decision when its condition holds (or fails: a deny), else None."""
    if rule.when is None:
        return Decision(rule.effect, rule.name, rule.reason, wait=rule.wait)
    try:
        holds = rule.when.evaluate(context)
    except ConditionError as exc:
        return Decision(Effect.DENY, rule.name, rule.reason, exc.message)
    return Decision(rule.effect, rule.name, rule.reason, wait=rule.wait) if holds else None


class Decider:
    """One ``RuleSet``'s decisions, with its plans; a reload builds a new decider (nothing stale survives)."""

    def __init__(self, rules: RuleSet, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.rules = rules
        self._clock = clock
        self._plans: dict[PlanKey, Plan] = {}
        #: The same plans by the identity *object* (kept alive here, so its id is not reused): one dictionary
        #: look-up per call, where hashing an ``Identity`` (all its fields) would cost more than the rest.
        self._by_object: dict[int, tuple[Identity, dict[tuple[str, str, str | None], Plan]]] = {}
        self.default = Decision(rules.default, None, "no policy rule allows this call"
                                if rules.default is Effect.DENY else "")

    def plan(self, identity: Identity, method: str, name: str, upstream: str | None,
             definition: JsonObj | None) -> Plan:
        mine = self._by_object.get(id(identity))
        if mine is None or mine[0] is not identity:
            if len(self._by_object) >= MAX_IDENTITIES:
                self._by_object.clear()
            mine = self._by_object[id(identity)] = (identity, {})
        found = mine[1].get((method, name, upstream))
        if found is not None and found.fits(definition, identity.claims):
            return found
        key = PlanKey(identity, method, name, upstream)
        found = self._plans.get(key)
        if found is None or not found.fits(definition, identity.claims):
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            found = self._plans[key] = self._make_plan(identity, method, name, upstream, definition)
        mine[1][(method, name, upstream)] = found
        return found

    def _make_plan(self, identity: Identity, method: str, name: str, upstream: str | None,
                   definition: JsonObj | None) -> Plan:
        applicable = [rule for rule in self.rules.rules if rule.applies(method, name)]
        steps: list[Step] = []
        per_call: set[str] = set()
        context = None
        if any(rule.when is not None for rule in applicable):
            try:
                context = conditions.context({"token": token_variables(identity),
                                              "tool": tool_variables(name, upstream, definition)})
            except Exception as exc:  # a claim the CEL library cannot represent: deny, never allow
                failed = Decision(Effect.DENY, None, "the policy could not read this token",
                                  f"{type(exc).__name__}: {str(exc)[:200]}")
                return Plan((failed,), None, frozenset(), _annotations(definition), identity.claims)
        for rule in applicable:
            if not rule.per_token_and_tool:
                assert rule.when is not None
                steps.append(rule)
                per_call |= rule.when.reads - conditions.PER_TOKEN_AND_TOOL
                continue
            decided = _matched(rule, context)
            if decided is not None:
                steps.append(decided)
                break
        else:
            steps.append(self.default)
        return Plan(tuple(steps), context, frozenset(per_call), _annotations(definition), identity.claims)

    def decide(self, asked: Asked) -> Decision:
        """The decision on one call: its plan's decided steps as they are, the others evaluated now."""
        plan = self.plan(asked.identity, asked.method, asked.name, asked.upstream, asked.definition)
        prepared = False
        for step in plan.steps:
            if isinstance(step, Decision):
                return step
            if not prepared:
                try:
                    conditions.add(plan.context, {k: CALL_VARIABLES[k](asked, self._clock) for k in plan.per_call})
                except Exception as exc:  # arguments the CEL library cannot represent
                    return Decision(Effect.DENY, step.name, step.reason, f"{type(exc).__name__}: {str(exc)[:200]}")
                prepared = True
            decided = _matched(step, plan.context)
            if decided is not None:
                return decided
        return self.default  # unreachable: a plan ends with a decision

    def hidden(self, identity: Identity, kind: Kind, item: JsonObj, upstream: str | None) -> bool:
        """Whether a list item is left out: a rule on the list method denies it, or a call on it would be
        denied whatever its arguments (a rule that reads only ``token`` and ``tool`` denies, or fails)."""
        shape = LISTED.get(kind)
        name = item.get(shape.key) if shape is not None else None
        if shape is None or not isinstance(name, str):
            return False
        definition = item if kind == "tools" else None
        listed = self.plan(identity, shape.list_method, name, upstream, definition).static
        if listed is not None and listed.rule is not None:
            return listed.denied
        return self.plan(identity, shape.call_method, name, upstream, definition).always_denied


class Listed(NamedTuple):
    list_method: str
    call_method: str
    key: str


#: Each list kind rules can hide items of: its list method, the call on one item, the item's name field.
LISTED: dict[str, Listed] = {
    "tools": Listed("tools/list", "tools/call", "name"),
    "prompts": Listed("prompts/list", "prompts/get", "name"),
    "resources": Listed("resources/list", "resources/read", "uri"),
}
