"""Policy rules (``SATGATE_POLICY_FILE``): the file read and compiled into an ordered, immutable rule list.

A file is YAML or JSON (JSON is YAML), ``{"rules": [...]}``; each rule has a unique ``name``, optional
``methods`` (default ``["tools/call"]``), optional ``tools`` (patterns in the one grammar of patterns.py),
an optional ``when`` (a CEL condition, conditions.py; default: always), an ``effect`` (``allow`` | ``deny``)
and a ``reason`` (shown to the client on a deny). Whatever is wrong is a ``PolicyProblem`` naming the file,
the rule and the position, so ``serve`` can stop with one line and ``policy check`` can list them all.
Deciding is decide.py's; this module only turns text into rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from satgate_mcp.patterns import PatternKind, is_pattern, matches, pattern_error
from satgate_mcp.policy.conditions import Condition, ConditionError, compile_condition


class Effect(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    #: The call waits for an operator's approval (policy/holds.py), like a token's ``approvals`` control.
    HOLD = "hold"
    #: The call asks its user first (policy/holds.py), like a token's ``confirm`` control; ``reason`` is the question.
    CONFIRM = "confirm"


#: The longest ``wait`` of a ``hold`` rule: common clients give up on a call at 60 s.
MAX_HOLD_WAIT_SECONDS = 50


#: The methods a rule may name: the calls the guards judge, and the lists whose items rules hide.
CALL_METHODS = frozenset({"tools/call", "resources/read", "prompts/get"})
LIST_METHODS = frozenset({"tools/list", "resources/list", "prompts/list"})
METHODS = CALL_METHODS | LIST_METHODS
DEFAULT_METHODS = ("tools/call",)
RULE_FIELDS = frozenset({"name", "methods", "tools", "when", "effect", "reason", "wait"})
MAX_RULES = 10_000
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """One thing wrong with a policy file, in the words ``serve`` stops with."""

    file: str
    message: str
    rule: str | None = None
    position: str = ""

    def __str__(self) -> str:
        where = f", rule {self.rule!r}" if self.rule is not None else ""
        at = f" at {self.position}" if self.position else ""
        return f"policy file {self.file}{where}{at}: {self.message}"


class PolicyInvalid(Exception):
    def __init__(self, problems: list[PolicyProblem]) -> None:
        super().__init__("; ".join(map(str, problems)))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    methods: frozenset[str]
    #: Patterns the request's tool (or prompt name, or resource URI) must match; None: any.
    tools: tuple[str, ...] | None
    when: Condition | None
    effect: Effect
    reason: str
    #: ``hold`` only: keep the call open up to this many seconds for the decision instead of refusing it at once.
    wait: int | None = None

    def applies(self, method: str, name: str) -> bool:
        return method in self.methods and (self.tools is None or any(matches(p, name) for p in self.tools))

    @property
    def per_token_and_tool(self) -> bool:
        return self.when is None or self.when.per_token_and_tool


@dataclass(frozen=True, slots=True)
class RuleSet:
    """A whole policy, compiled: what one call is judged by from its start to its end (an atomic swap)."""

    rules: tuple[Rule, ...]
    default: Effect
    #: Where it came from (for events and ``explain``).
    source: str = ""


def _strings(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f'"{what}" must be a non-empty list of strings')
    return value


def _pattern_kind(methods: frozenset[str]) -> PatternKind:
    """Tool names have the strict grammar; a rule that also names prompts or resources takes theirs (looser)."""
    return PatternKind.TOOL if methods <= {"tools/call", "tools/list"} else PatternKind.RESOURCE


def _rule(raw: Mapping[str, Any]) -> Rule:
    """One rule, or ValueError / ConditionError saying what is wrong with it."""
    unknown = sorted(set(raw) - RULE_FIELDS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}; a rule has {', '.join(sorted(RULE_FIELDS))}")
    methods = frozenset(_strings(raw.get("methods", list(DEFAULT_METHODS)), "methods"))
    if bad := sorted(methods - METHODS):
        raise ValueError(f"unknown method {bad[0]!r}; a rule may name {', '.join(sorted(METHODS))}")
    tools = None
    if "tools" in raw:
        tools = tuple(_strings(raw["tools"], "tools"))
        kind = _pattern_kind(methods)
        if bad_pattern := next((p for p in tools if not is_pattern(p, kind)), None):
            raise ValueError(pattern_error(bad_pattern, kind))
    effect = raw.get("effect")
    if effect not in {e.value for e in Effect}:
        raise ValueError(f'"effect" must be "allow", "deny", "hold" or "confirm", got {str(effect)[:40]!r}')
    if effect in (Effect.HOLD, Effect.CONFIRM) and methods != {"tools/call"}:
        raise ValueError(f'"effect": "{effect}" applies to tool calls only: give "methods": ["tools/call"] or none')
    wait = _wait(raw, Effect(effect))
    reason = raw.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise ValueError(f'"reason" must be a string of at most {MAX_REASON_CHARS} characters')
    when = raw.get("when")
    condition = None if when is None else compile_condition(when if isinstance(when, str) else "")
    return Rule(str(raw["name"]), methods, tools, condition, Effect(effect), reason, wait)


def _wait(raw: Mapping[str, Any], effect: Effect) -> int | None:
    if "wait" not in raw:
        return None
    wait = raw["wait"]
    if effect is not Effect.HOLD:
        raise ValueError('"wait" goes with "effect": "hold" only')
    if type(wait) is not int or not 0 < wait <= MAX_HOLD_WAIT_SECONDS:
        raise ValueError(f'"wait" must be whole seconds from 1 to {MAX_HOLD_WAIT_SECONDS}')
    return wait


def _problem(file: str, name: str | None, index: int, exc: ValueError | ConditionError) -> PolicyProblem:
    if isinstance(exc, ConditionError):
        where = f"rules[{index}].when" + (f", {exc.position}" if exc.position else "")
        return PolicyProblem(file, exc.message, name, where)
    return PolicyProblem(file, str(exc), name, f"rules[{index}]")


def compile_rules(document: object, default: Effect, file: str) -> RuleSet:
    """The compiled rules of a parsed document; ``PolicyInvalid`` listing every problem."""
    if not isinstance(document, dict) or set(document) != {"rules"} or not isinstance(document["rules"], list):
        raise PolicyInvalid([PolicyProblem(file, 'expected an object with one key, "rules": a list of rules')])
    raws: list[object] = document["rules"]
    if len(raws) > MAX_RULES:
        raise PolicyInvalid([PolicyProblem(file, f"more than {MAX_RULES} rules")])
    rules, problems, seen = [], [], set()
    for index, raw in enumerate(raws):
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or not isinstance(name, str) or not name.strip():
            problems.append(PolicyProblem(file, 'each rule must be an object with a "name"', None, f"rules[{index}]"))
            continue
        if name in seen:
            problems.append(PolicyProblem(file, "duplicate rule name", name, f"rules[{index}]"))
            continue
        seen.add(name)
        try:
            rules.append(_rule(raw))
        except (ValueError, ConditionError) as exc:
            problems.append(_problem(file, name, index, exc))
    if problems:
        raise PolicyInvalid(problems)
    return RuleSet(tuple(rules), default, file)


def parse_text(text: str, file: str) -> object:
    """The document a policy file holds (YAML, of which JSON is a part); ``PolicyInvalid`` with the position."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        position = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PolicyInvalid([PolicyProblem(file, f"not valid YAML or JSON: {problem}", None, position)]) from None


def load_rules(path: Path, default: Effect) -> RuleSet:
    """Read and compile a policy file; ``PolicyInvalid`` for anything wrong, an unreadable file included."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyInvalid([PolicyProblem(str(path), f"cannot be read: {exc.strerror or exc}")]) from None
    if len(data) > MAX_FILE_BYTES:
        raise PolicyInvalid([PolicyProblem(str(path), f"larger than {MAX_FILE_BYTES} bytes")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyInvalid([PolicyProblem(str(path), "not UTF-8 text")]) from None
    return compile_rules(parse_text(text, str(path)), default, str(path))
