"""The audit trail's decisions: what one line says, how lines chain, and how a chain is checked.

Pure functions only (the writer, which owns the file, is stores/audit_file.py). Each line is one JSON object whose
``prev`` is the SHA-256 of the previous line's text, so editing, deleting, inserting or reordering any line breaks
the chain at that line, and ``satgate-mcp audit verify`` names it. A line never holds a bearer token, a header or
an upstream credential: what is recorded is named field by field below.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from satgate_mcp.jsonrpc import JsonObj, dumps

#: The methods each call of which is one line (their refusals included).
AUDITED_METHODS: Mapping[str, tuple[str, str, str]] = {
    # method -> (event, the field that names the target, the param holding it)
    "tools/call": ("tool_call", "tool", "name"),
    "resources/read": ("resource_read", "uri", "uri"),
    "prompts/get": ("prompt_get", "prompt", "name"),
}
#: ``prev`` of the very first line of a trail.
GENESIS = "0" * 64
ArgsMode = Literal["digest", "full", "none"]

#: ``data.error`` values of a refusal: the gateway said no before (or instead of) asking the upstream.
REFUSALS = frozenset({
    "tool_not_allowed", "insufficient_scope", "resource_not_allowed", "prompt_not_allowed", "policy_denied",
    "policy_error", "tool_definition_changed", "rate_limited", "budget_exhausted", "store_unavailable",
    "audit_unavailable", "too_many_in_flight", "argument_denied", "spend_limit_exceeded", "approval_required",
    "approval_denied", "approval_expired", "approval_queue_full", "confirmation_declined",
    "confirmation_unavailable", "upstream_auth_failed",
})


def line_hash(line: str | bytes) -> str:
    """What the next line's ``prev`` must be: the SHA-256 of this line's UTF-8 bytes (without its newline)."""
    return hashlib.sha256(line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")).hexdigest()


def canonical(value: object) -> bytes:
    """One byte string per JSON value whatever its key order (compact, keys sorted, UTF-8): what ``args_sha256``
    hashes. orjson on a call's path; the standard library for what it refuses (integers past 64 bits, lone
    surrogates), with the same layout."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass")


def args_digest(arguments: object) -> str:
    """``args_sha256``: the SHA-256 of the arguments' canonical form."""
    return hashlib.sha256(canonical(arguments)).hexdigest()


@dataclass(frozen=True, slots=True)
class Outcome:
    outcome: Literal["ok", "error", "refused"]
    code: int | None = None
    decision: Literal["allow", "deny"] = "allow"
    rule: str | None = None
    reason: str | None = None


def outcome_of(reply: JsonObj) -> Outcome:
    """What became of a call, from its answer: served, an error (the upstream's, or the call failed), or refused
    by the gateway (then the decision is ``deny``, with the rule that decided when one did)."""
    error = reply.get("error")
    if not isinstance(error, dict):
        result = reply.get("result")
        failed = isinstance(result, dict) and result.get("isError") is True
        return Outcome("error" if failed else "ok")
    code = error.get("code") if isinstance(error.get("code"), int) else None
    data = error.get("data")
    reason = data.get("error") if isinstance(data, dict) else None
    if isinstance(reason, str) and reason in REFUSALS:
        rule = data.get("rule") if isinstance(data, dict) else None
        return Outcome("refused", code, "deny", rule if isinstance(rule, str) else None, reason)
    return Outcome("error", code, reason=reason if isinstance(reason, str) else None)


_second: list[tuple[int, str]] = [(-1, "")]


def timestamp(wall: float) -> str:
    """ISO 8601 UTC with milliseconds; the date and time of the second are made once a second."""
    whole = int(wall)
    second, text = _second[0]
    if whole != second:
        text = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second[0] = (whole, text)
    return f"{text}.{min(999, round((wall - whole) * 1_000_000) // 1000):03d}Z"


def seal(record: Mapping[str, Any], seq: int, prev: str) -> bytes:
    """The line for ``record`` (UTF-8, no newline): its fields, then ``seq`` and ``prev`` last (so the chain reads at
    the line's end). A ``dict`` is the writer's own, and is completed in place rather than copied."""
    line = record if isinstance(record, dict) else dict(record)
    line["seq"], line["prev"] = seq, prev
    return dumps(line)


@dataclass(frozen=True, slots=True)
class Break:
    """Where a chain stops holding: the file, the line number (from 1), and why."""

    file: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.why}"


def last_link(lines: Iterable[str]) -> tuple[str, int]:
    """(the hash the next line chains from, the next seq) after these lines; a trail with none starts afresh."""
    last = None
    for line in lines:
        if line.strip():
            last = line.rstrip("\n")
    if last is None:
        return GENESIS, 1
    try:
        seq = json.loads(last).get("seq")
    except (ValueError, AttributeError):
        seq = None
    return line_hash(last), (seq + 1 if isinstance(seq, int) else 1)


def verify(files: Iterable[tuple[str, Iterable[str]]]) -> tuple[int, Break | None]:
    """Every line of the files, in order, chains from the one before (the first line of the first file from
    whatever preceded it) with ``seq`` one more each time. (lines checked, the first break or None)."""
    prev: str | None = None
    seq: int | None = None
    checked = 0
    for name, lines in files:
        for number, raw in enumerate(lines, start=1):
            line = raw.rstrip("\n")
            if not line.strip():
                return checked, Break(name, number, "an empty line (a line was cut, or lines were removed)")
            try:
                fields = json.loads(line)
            except ValueError:
                return checked, Break(name, number, "not a JSON line (edited or truncated)")
            if not isinstance(fields, dict) or not isinstance(fields.get("prev"), str):
                return checked, Break(name, number, "no prev field")
            if prev is not None and fields["prev"] != prev:
                return checked, Break(name, number, "prev does not match the line before: that line, or this one, "
                                                    "was edited, deleted, inserted or moved")
            if seq is not None and fields.get("seq") != seq + 1:
                return checked, Break(name, number, f"seq {fields.get('seq')!r} after {seq}: a line missing or moved")
            prev, seq = line_hash(line), fields.get("seq") if isinstance(fields.get("seq"), int) else None
            checked += 1
    return checked, None
