"""What a call breaks of its token's tool controls: pure decisions over the controls, the tool and its arguments.

Every ``controls`` caveat applies; the breaches are listed in the order a caller can fix them (argument
rules, then approval holds, then user confirmation), and the guard refuses with the first one (or, under
``SATGATE_ENFORCEMENT=observe``, logs and counts each). A breach never carries an argument's value: it may be
a secret. Until approval holds and user confirmation are built, a call that needs either is refused (fail
closed): a token never gets less control than it carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from satgate_mcp.policy.arg_rules import allowed, passes
from satgate_mcp.policy.control_values import number_of
from satgate_mcp.policy.controls import ApprovalRule, ArgRule, Controls, applies

ARGUMENT_DENIED = "argument_denied"
SPEND_LIMIT_EXCEEDED = "spend_limit_exceeded"
APPROVAL_REQUIRED = "approval_required"
CONFIRMATION_UNAVAILABLE = "confirmation_unavailable"


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


def approval_breach(rule: ApprovalRule, tool: str) -> Breach:
    data: dict[str, Any] = {"tool": tool}
    if rule.field is not None:
        data |= {"field": rule.field, "above": str(rule.above)}
    return Breach(APPROVAL_REQUIRED, f"Tool {tool!r} needs an operator's approval, which this gateway cannot take "
                  "yet: the call is refused", data)


def judge(controls: tuple[Controls, ...], tool: str, arguments: Mapping[str, Any]) -> list[Breach]:
    """Every breach of every caveat's argument rules, approval holds and confirmations, in that order."""
    breaches: list[Breach] = []
    for caveat in controls:
        for rule in caveat.args:
            if applies(rule.tools, tool) and (breach := check_argument(rule, tool, arguments)) is not None:
                breaches.append(breach)
    for caveat in controls:
        for approval in caveat.approvals:
            if applies(approval.tools, tool) and needs_approval(approval, arguments):
                breaches.append(approval_breach(approval, tool))
    for caveat in controls:
        for confirm in caveat.confirm:
            if applies(confirm.tools, tool):
                breaches.append(Breach(CONFIRMATION_UNAVAILABLE, f"Tool {tool!r} needs the user's confirmation, "
                                       "which this gateway cannot ask for yet: the call is refused", {"tool": tool}))
    return breaches
