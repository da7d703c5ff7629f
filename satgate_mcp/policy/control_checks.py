"""What a call breaks of its token's tool controls: pure decisions over the controls, the tool and its arguments.

Every ``controls`` caveat applies. The argument rules' breaches are refused with the first one (or, under
``SATGATE_ENFORCEMENT=observe``, logged and counted each); then the approval hold and the user confirmation a
call falls under (every matching entry of every caveat as one hold and one question) are run by the guard
(policy/holds.py). A breach never carries an argument's value: it may be a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from satgate_mcp.policy.arg_rules import allowed, passes
from satgate_mcp.policy.control_values import decimal_text, number_of
from satgate_mcp.policy.controls import ApprovalRule, ArgRule, Controls, applies

ARGUMENT_DENIED = "argument_denied"
SPEND_LIMIT_EXCEEDED = "spend_limit_exceeded"
APPROVAL_REQUIRED = "approval_required"
#: Observed only (SATGATE_ENFORCEMENT=observe): a call that would have asked its user.
CONFIRMATION_REQUIRED = "confirmation_required"


@dataclass(frozen=True, slots=True)
class Breach:
    """One control a call breaks: the refusal's ``data.error``, its message and data (never the value)."""

    error: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


def arguments_of(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """A ``tools/call``'s arguments; anything but an object counts as none (every field is then missing)."""
    arguments = params.get("arguments")
    return arguments if isinstance(arguments, dict) else {}


def check_argument(rule: ArgRule, tool: str, arguments: Mapping[str, Any]) -> Breach | None:
    """The refusal a call that breaks ``rule`` gets: which tool and field, and what would pass."""
    if passes(rule, arguments):
        return None
    return Breach(ARGUMENT_DENIED, f"Tool {tool!r}: argument {rule.field!r} is not allowed by this token's controls",
                  {"tool": tool, "field": rule.field, "allowed": allowed(rule)})


def amount_breach(tool: str, field: str) -> Breach:
    """A spend limit's amount that is missing, non-numeric or negative: refused, never counted as zero."""
    return Breach(ARGUMENT_DENIED, f"Tool {tool!r}: argument {field!r} must be an amount (a number from 0)",
                  {"tool": tool, "field": field, "allowed": "a number from 0"})


def needs_approval(rule: ApprovalRule, arguments: Mapping[str, Any]) -> bool:
    """Every call of the tools, or one whose ``field`` is above ``above``; a missing or non-numeric field
    cannot be shown to be at most ``above``, so it is held too."""
    if rule.field is None or rule.above is None:
        return True
    amount = number_of(arguments.get(rule.field))
    return amount is None or amount > rule.above


def approval_reason(rule: ApprovalRule) -> str:
    """Why the call waits, as the operator and the agent read it."""
    if rule.field is None or rule.above is None:
        return "every call of this tool is approved by an operator"
    return f"{rule.field} above {decimal_text(rule.above)}"


@dataclass(frozen=True, slots=True)
class Hold:
    """One held call's terms: every matching entry's reason, and the shortest ``wait`` any of them gives."""

    reason: str
    wait: int | None
    #: The arguments the matching entries name (``field``): all an operator is shown of the call's arguments.
    fields: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Confirm:
    """One confirmation for every matching entry: their messages and the arguments they list."""

    message: str
    fields: tuple[str, ...]


def judge(controls: tuple[Controls, ...], tool: str, arguments: Mapping[str, Any]) -> list[Breach]:
    """Every breach of every caveat's argument rules."""
    breaches: list[Breach] = []
    for caveat in controls:
        for rule in caveat.args:
            if applies(rule.tools, tool) and (breach := check_argument(rule, tool, arguments)) is not None:
                breaches.append(breach)
    return breaches


def hold_for(controls: tuple[Controls, ...], tool: str, arguments: Mapping[str, Any]) -> Hold | None:
    """The approval hold a call falls under (every caveat's matching entries as one), or None."""
    rules = [rule for caveat in controls for rule in caveat.approvals
             if applies(rule.tools, tool) and needs_approval(rule, arguments)]
    if not rules:
        return None
    waits = [rule.wait for rule in rules if rule.wait is not None]
    fields = tuple(dict.fromkeys(rule.field for rule in rules if rule.field is not None))
    return Hold("; ".join(dict.fromkeys(approval_reason(rule) for rule in rules)), min(waits) if waits else None,
                fields)


def confirm_for(controls: tuple[Controls, ...], tool: str) -> Confirm | None:
    """The user confirmation a call needs (every caveat's matching entries as one question), or None."""
    rules = [rule for caveat in controls for rule in caveat.confirm if applies(rule.tools, tool)]
    if not rules:
        return None
    fields = tuple(dict.fromkeys(name for rule in rules for name in rule.fields))
    return Confirm("\n".join(dict.fromkeys(rule.message for rule in rules)), fields)


def approval_breach(hold: Hold, tool: str) -> Breach:
    """What observing records of a call that would have been held."""
    return Breach(APPROVAL_REQUIRED, f"Tool {tool!r} would be held for an operator's approval ({hold.reason})",
                  {"tool": tool})


def confirm_breach(tool: str) -> Breach:
    """What observing records of a call that would have asked its user."""
    return Breach(CONFIRMATION_REQUIRED, f"Tool {tool!r} would ask the user's confirmation", {"tool": tool})
