"""A rule's ``when``: a CEL expression, compiled once by ``common-expression-language`` and evaluated per call.

Only this module knows the CEL library (bench/cel_choice.py and docs/governance.md say why this one): a
compiled ``Condition`` says which variables it reads (from the library's own analysis of the expression, not
a guess from its text), which is what lets a rule that does not read ``args`` be decided once per token and
tool and hide what it denies from lists. Anything that goes wrong while evaluating (a missing key, a type
error, a result that is not a boolean) is a ``ConditionError``: the caller denies, never allows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cel

#: The variables a condition may read (docs/governance.md describes each).
VARIABLES = ("token", "tool", "args", "session", "request", "now")
#: A condition reading nothing else gives the same answer for one token and one tool, whatever the call says.
PER_TOKEN_AND_TOOL = frozenset({"token", "tool"})
#: Where the CEL parser says the problem is: ``<input>:LINE:COLUMN: message``.
_POSITION = re.compile(r"<input>:(\d+):(\d+):\s*(.*)")
MAX_EXPRESSION_CHARS = 4096


class ConditionError(Exception):
    """A condition that does not compile (``line``/``column`` where known) or fails at evaluation."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.message, self.line, self.column = message, line, column

    @property
    def position(self) -> str:
        """``line 1, column 17`` for the operator, or nothing when the library gave none."""
        return f"line {self.line}, column {self.column}" if self.line is not None else ""


@dataclass(frozen=True, slots=True)
class Condition:
    source: str
    #: The rule's variables this expression reads (of ``VARIABLES``).
    reads: frozenset[str]
    _program: Any

    @property
    def per_token_and_tool(self) -> bool:
        """Its answer depends on the token and the tool alone: cached, and used to hide list items."""
        return self.reads <= PER_TOKEN_AND_TOOL

    def evaluate(self, context: Any) -> bool:
        """True or False, or ``ConditionError`` for anything else: an exception, a non-boolean result."""
        try:
            result = self._program.execute(context)
        except Exception as exc:  # the library raises KeyError, TypeError, ValueError, RuntimeError...
            raise ConditionError(f"{type(exc).__name__}: {_first_line(exc)}") from None
        if not isinstance(result, bool):
            raise ConditionError(f"the condition gave {type(result).__name__}, not a boolean")
        return result


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def compile_condition(source: str) -> Condition:
    """The compiled condition; ``ConditionError`` naming the line and column when it does not parse."""
    if not isinstance(source, str) or not source.strip():
        raise ConditionError("the condition must be a non-empty CEL expression")
    if len(source) > MAX_EXPRESSION_CHARS:
        raise ConditionError(f"the condition is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        program = cel.compile(source)
    except Exception as exc:
        found = _POSITION.search(str(exc))
        if found is None:
            raise ConditionError(_first_line(exc)) from None
        raise ConditionError(found.group(3).strip()[:300], int(found.group(1)), int(found.group(2))) from None
    reads = frozenset(program.variables()) & frozenset(VARIABLES)
    return Condition(source, reads, program)


def context(variables: Mapping[str, object]) -> Any:
    """Variables converted to CEL values once, so several conditions (and calls) share the conversion."""
    return cel.Context(dict(variables))


def add(into: Any, variables: Mapping[str, object]) -> None:
    """Variables of this call into a shared context (synchronous: no other call runs in between)."""
    for name, value in variables.items():
        into.add_variable(name, value)
