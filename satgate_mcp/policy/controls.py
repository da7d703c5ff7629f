"""Tool controls carried in a token: their shape, how one caveat's JSON is read, and the canonical text signed.

A ``controls`` caveat holds ``{"args": [...], "spend_limits": [...], "approvals": [...], "confirm": [...]}``;
every entry names ``tools`` (patterns in the one grammar of satgate_mcp/patterns.py). Several caveats all
apply: a holder who narrows a token adds a caveat and keeps every rule already there, so a sub-agent can
never widen its parent's rules, only add its own. Reading is strict and fail closed: an unknown key, a bad
pattern, decimal, time zone, window or URL spec makes the whole caveat (and so the token) invalid, so an
older gateway never ignores a restriction it does not know. Amounts are decimal strings read as
``decimal.Decimal`` (never floats). Every list has a bound, and so does the caveat's text.

The value checks (decimals, URL specs, zones, names) are control_values.py's; what a call must satisfy is
arg_rules.py's and spend_windows.py's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, TypeVar

from satgate_mcp.patterns import PatternKind, allowed_by, check_pattern
from satgate_mcp.policy.control_values import (
    MAX_FIELD_CHARS,
    MAX_LIST,
    UrlSpec,
    check_field,
    check_message,
    check_zone,
    decimal_text,
    parse_amount_spec,
    parse_one_of,
    parse_url_spec,
)

#: Entries under one key of one caveat, and tool patterns in one entry.
MAX_ENTRIES = 32
MAX_TOOL_PATTERNS = 32
#: The longest ``wait`` of an approval hold: common clients give up on a call at 60 s.
MAX_WAIT_SECONDS = 50
KEYS = ("args", "spend_limits", "approvals", "confirm")

Window = Literal["day", "week"]


@dataclass(frozen=True, slots=True)
class ArgRule:
    """One top-level argument ``field`` and what it must be: exactly one of the four kinds is set."""

    tools: tuple[str, ...]
    field: str
    one_of: tuple[str | int | bool | None, ...] | None = None
    min: Decimal | None = None
    max: Decimal | None = None
    url: UrlSpec | None = None
    absent: bool = False


@dataclass(frozen=True, slots=True)
class SpendLimit:
    """The sum of ``field`` over calls of ``tools`` per calendar ``window`` in zone ``tz`` stays at most ``max``."""

    tools: tuple[str, ...]
    field: str
    max: Decimal
    window: Window
    tz: str


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """A matching call waits for a person: every call of ``tools``, or those whose ``field`` is above ``above``."""

    tools: tuple[str, ...]
    field: str | None = None
    above: Decimal | None = None
    wait: int | None = None


@dataclass(frozen=True, slots=True)
class ConfirmRule:
    """A matching call asks the client's user first, showing ``message`` and the arguments named in ``fields``."""

    tools: tuple[str, ...]
    message: str
    fields: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Controls:
    """One ``controls`` caveat, read and checked."""

    args: tuple[ArgRule, ...] = ()
    spend_limits: tuple[SpendLimit, ...] = ()
    approvals: tuple[ApprovalRule, ...] = ()
    confirm: tuple[ConfirmRule, ...] = ()
    #: Tool names met, and whether any entry applies to them: a call no control names pays one dict lookup.
    _named: dict[str, bool] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __bool__(self) -> bool:
        return bool(self.args or self.spend_limits or self.approvals or self.confirm)

    def names(self, tool: str) -> bool:
        """Whether any entry of this caveat applies to ``tool`` (remembered for up to 256 names)."""
        known = self._named.get(tool)
        if known is None:
            if len(self._named) >= 256:
                self._named.clear()
            patterns = [entry.tools for entries in (self.args, self.spend_limits, self.approvals, self.confirm)
                        for entry in entries]
            known = self._named[tool] = any(applies(tools, tool) for tools in patterns)
        return known


def applies(tools: tuple[str, ...], name: str) -> bool:
    """Whether an entry for ``tools`` applies to the tool ``name``."""
    return allowed_by((tools,), name)


# --- reading ------------------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Two parsers must never read one text two ways: a repeated key is refused, not last-one-wins."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key[:40]!r} appears twice")
        result[key] = value
    return result


def _only_keys(entry: object, allowed: tuple[str, ...], where: str) -> Mapping[str, Any]:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object")
    unknown = sorted(set(entry) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0][:40]!r} (known: {', '.join(allowed)})")
    return entry


def _tools(entry: Mapping[str, Any], where: str) -> tuple[str, ...]:
    tools = entry.get("tools")
    if not isinstance(tools, list) or not tools or len(tools) > MAX_TOOL_PATTERNS:
        raise ValueError(f"{where}: 'tools' must be a list of 1 to {MAX_TOOL_PATTERNS} tool patterns")
    if not all(isinstance(p, str) for p in tools):
        raise ValueError(f"{where}: 'tools' must hold strings")
    return tuple(check_pattern(p, PatternKind.TOOL) for p in tools)


def _arg_rule(entry: Mapping[str, Any], where: str) -> ArgRule:
    entry = _only_keys(entry, ("tools", "field", "one_of", "min", "max", "url", "absent"), where)
    tools, name = _tools(entry, where), check_field(entry.get("field"), where)
    kinds = [k for k in ("one_of", "url", "absent") if k in entry] + (["min/max"] if {"min", "max"} & set(entry)
                                                                      else [])
    if len(kinds) != 1:
        raise ValueError(f"{where}: give exactly one of 'one_of', 'min'/'max', 'url', 'absent'")
    if "one_of" in entry:
        return ArgRule(tools, name, one_of=parse_one_of(entry["one_of"], where))
    if "url" in entry:
        return ArgRule(tools, name, url=parse_url_spec(entry["url"], where))
    if "absent" in entry:
        if entry["absent"] is not True:
            raise ValueError(f"{where}: 'absent' can only be true")
        return ArgRule(tools, name, absent=True)
    low = parse_amount_spec(entry["min"], f"{where}.min", signed=True) if "min" in entry else None
    high = parse_amount_spec(entry["max"], f"{where}.max", signed=True) if "max" in entry else None
    if low is not None and high is not None and low > high:
        raise ValueError(f"{where}: 'min' is above 'max'")
    return ArgRule(tools, name, min=low, max=high)


def _spend_limit(entry: Mapping[str, Any], where: str) -> SpendLimit:
    entry = _only_keys(entry, ("tools", "field", "max", "window", "tz"), where)
    window = entry.get("window")
    if window not in ("day", "week"):
        raise ValueError(f"{where}: 'window' must be 'day' or 'week'")
    if "max" not in entry:
        raise ValueError(f"{where}: 'max' is required")
    limit = parse_amount_spec(entry["max"], f"{where}.max")
    return SpendLimit(_tools(entry, where), check_field(entry.get("field"), where), limit, window,
                      check_zone(entry.get("tz", "UTC"), where))


def _approval(entry: Mapping[str, Any], where: str) -> ApprovalRule:
    entry = _only_keys(entry, ("tools", "field", "above", "wait"), where)
    tools = _tools(entry, where)
    if ("field" in entry) != ("above" in entry):
        raise ValueError(f"{where}: 'field' and 'above' go together (neither: every call of the tools)")
    name = check_field(entry["field"], where) if "field" in entry else None
    above = parse_amount_spec(entry["above"], f"{where}.above") if "above" in entry else None
    wait = entry.get("wait")
    if wait is not None and (type(wait) is not int or not 0 < wait <= MAX_WAIT_SECONDS):
        raise ValueError(f"{where}: 'wait' must be whole seconds from 1 to {MAX_WAIT_SECONDS}")
    return ApprovalRule(tools, name, above, wait)


def _confirm(entry: Mapping[str, Any], where: str) -> ConfirmRule:
    entry = _only_keys(entry, ("tools", "message", "fields"), where)
    tools = _tools(entry, where)
    fields = entry.get("fields", [])
    if not isinstance(fields, list) or len(fields) > MAX_LIST:
        raise ValueError(f"{where}: 'fields' must be a list of at most {MAX_LIST} argument names")
    return ConfirmRule(tools, check_message(entry.get("message"), where),
                       tuple(check_field(f, where) for f in fields))


E = TypeVar("E")


def _entries(data: Mapping[str, Any], key: str, read: Callable[[Mapping[str, Any], str], E]) -> tuple[E, ...]:
    entries = data.get(key, [])
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise ValueError(f"'{key}' must be a list of at most {MAX_ENTRIES} entries")
    return tuple(read(entry, f"{key}[{i}]") for i, entry in enumerate(entries))


def parse_controls(text: str) -> Controls:
    """The controls a caveat's JSON states; ValueError (saying what and where) for anything else."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_float=Decimal, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("controls are nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"controls are not JSON: {exc.msg} at character {exc.pos}") from None
    data = _only_keys(data, KEYS, "controls")
    controls = Controls(_entries(data, "args", _arg_rule), _entries(data, "spend_limits", _spend_limit),
                        _entries(data, "approvals", _approval), _entries(data, "confirm", _confirm))
    if not controls:
        raise ValueError("controls name no rule: give at least one entry under " + ", ".join(KEYS))
    return controls


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a value a control can hold")


# --- writing ------------------------------------------------------------------------------------


def _arg_json(rule: ArgRule) -> dict[str, Any]:
    out: dict[str, Any] = {"tools": list(rule.tools), "field": rule.field}
    if rule.one_of is not None:
        out["one_of"] = list(rule.one_of)
    if rule.min is not None:
        out["min"] = decimal_text(rule.min)
    if rule.max is not None:
        out["max"] = decimal_text(rule.max)
    if rule.url is not None:
        out["url"] = rule.url.to_json()
    if rule.absent:
        out["absent"] = True
    return out


def _approval_json(rule: ApprovalRule) -> dict[str, Any]:
    out: dict[str, Any] = {"tools": list(rule.tools)}
    if rule.field is not None and rule.above is not None:
        out |= {"field": rule.field, "above": decimal_text(rule.above)}
    if rule.wait is not None:
        out["wait"] = rule.wait
    return out


def controls_json(controls: Controls) -> dict[str, Any]:
    """Plain data for ``controls`` (what ``token inspect`` shows and what is signed, canonically)."""
    out: dict[str, Any] = {}
    if controls.args:
        out["args"] = [_arg_json(rule) for rule in controls.args]
    if controls.spend_limits:
        out["spend_limits"] = [{"tools": list(s.tools), "field": s.field, "max": decimal_text(s.max),
                                "window": s.window, "tz": s.tz} for s in controls.spend_limits]
    if controls.approvals:
        out["approvals"] = [_approval_json(rule) for rule in controls.approvals]
    if controls.confirm:
        out["confirm"] = [{"tools": list(c.tools), "message": c.message, "fields": list(c.fields)}
                          for c in controls.confirm]
    return out


def canonical_text(controls: Controls) -> str:
    """One spelling per set of controls: sorted keys, no spaces, ASCII only (a caveat is printable text)."""
    return json.dumps(controls_json(controls), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


__all__ = ["MAX_FIELD_CHARS", "ApprovalRule", "ArgRule", "ConfirmRule", "Controls", "SpendLimit", "UrlSpec",
           "applies", "canonical_text", "controls_json", "parse_controls"]
