"""Pinned tool definitions: what a definition's fingerprint is, and what seeing one does to its pin.

Trust on first use: the first definition the gateway sees of an upstream's tool is pinned (its SHA-256 over
the RFC 8785 canonical JSON of the fields that tell an agent what the tool does). A later definition that
differs is a change: recorded on the pin as pending until an operator approves it. Pins are kept per
upstream and the upstream's own tool name (not the name the gateway lists: a ``tool_prefix`` added or
changed later does not unpin anything). Pure decisions only; the stores carry them out atomically.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Protocol

import rfc8785

from satgate_mcp.jsonrpc import JsonObj

#: The parts of a definition an agent reads to decide what a tool does: all of them are pinned.
PINNED_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
#: ``SATGATE_TOOL_PINNING``.
Mode = Literal["off", "warn", "enforce"]
Status = Literal["pinned", "changed", "new"]
#: What ``tools pins`` prints for each status.
STATUS_TEXT: dict[Status, str] = {"pinned": "pinned", "changed": "changed (pending approval)", "new": "new (held)"}
APPROVE_COMMAND = "satgate-mcp tools approve"


def pinned_part(tool: Mapping[str, Any]) -> JsonObj:
    """The fields of a definition that are pinned (absent ones stay absent: absent and ``null`` differ)."""
    return {field: tool[field] for field in PINNED_FIELDS if field in tool}


def canonical(tool: Mapping[str, Any]) -> str:
    """The pinned part as RFC 8785 canonical JSON: key order and whitespace never change it.

    A number outside I-JSON (an integer past 2**53) has no RFC 8785 form: such a definition is written
    with sorted keys instead, under a marker, so it can never equal a canonical text.
    """
    part = pinned_part(tool)
    try:
        return rfc8785.dumps(part).decode()
    except rfc8785.CanonicalizationError:
        return "non-i-json:" + json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(tool: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of the definition's pinned fields."""
    return fingerprint_of(canonical(tool))


@dataclass(frozen=True, slots=True)
class Seen:
    """One definition as the gateway learned it: its fingerprint and its canonical text."""

    fingerprint: str
    definition: str

    @staticmethod
    def of(tool: Mapping[str, Any]) -> Seen:
        text = canonical(tool)
        return Seen(fingerprint_of(text), text)


@dataclass(frozen=True, slots=True)
class Pin:
    """One upstream tool's pin, as every process reads it from the store."""

    upstream: str
    tool: str
    #: The approved fingerprint; None for a tool held since it appeared (enforce) and not yet approved.
    approved: str | None
    approved_definition: str | None
    first_seen: float
    #: The latest definition seen that differs from the approved one, until approved (or the upstream reverts).
    pending: str | None = None
    pending_definition: str | None = None
    changed_at: float | None = None
    approved_at: float | None = None

    @property
    def status(self) -> Status:
        if self.approved is None:
            return "new"
        return "changed" if self.pending is not None else "pinned"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | bytes) -> Pin:
        return Pin(**json.loads(text))


#: A read-modify-write of one pin: the pin as stored (None: none yet) -> what to write (None: nothing).
Change = Callable[[Pin | None], Pin | None]


class PinStore(Protocol):
    """Where pins live (memory, the state database, Redis): every process and every restart reads the same."""

    async def pins(self) -> list[Pin]:
        """Every pin."""
        ...

    async def version(self) -> int:
        """A number that goes up with every write: processes poll it to pick up approvals (a cheap read)."""
        ...

    async def first_pinning(self, upstream: str, pins: Sequence[Pin]) -> bool:
        """Record the upstream's first pinning with ``pins`` (each written unless one exists), atomically, unless
        it was recorded before: True when this call recorded it (two processes starting at once: one wins)."""
        ...

    async def update(self, upstream: str, tool: str, change: Change) -> tuple[Pin | None, Pin | None]:
        """Apply ``change`` to one pin atomically (retried on a concurrent write): (before, after)."""
        ...

    async def aclose(self) -> None: ...


def first_pin(upstream: str, tool: str, seen: Seen, now: float, *, hold: bool) -> Pin:
    """A tool's first pin: trusted as seen, or (``hold``: it appeared after its upstream was pinned) held."""
    if hold:
        return Pin(upstream, tool, None, None, now, seen.fingerprint, seen.definition, now)
    return Pin(upstream, tool, seen.fingerprint, seen.definition, now)


def observe(pin: Pin | None, upstream: str, tool: str, seen: Seen, now: float, *, hold_new: bool) -> Pin | None:
    """The pin after seeing ``seen``; None when nothing is to be written.

    A definition back at its approved fingerprint clears what was pending; a differing one becomes pending
    (the latest wins: an approval approves what the upstream serves now).
    """
    if pin is None:
        return first_pin(upstream, tool, seen, now, hold=hold_new)
    if pin.approved == seen.fingerprint:
        return None if pin.pending is None else replace(pin, pending=None, pending_definition=None, changed_at=None)
    if pin.pending == seen.fingerprint:
        return None
    return replace(pin, pending=seen.fingerprint, pending_definition=seen.definition, changed_at=now)


def is_change(before: Pin | None, after: Pin | None) -> bool:
    """Whether a write recorded a new pending definition: a change, or a tool held since it appeared (one event
    per change, whoever wrote it)."""
    return after is not None and after.pending is not None and (before is None or before.pending != after.pending)


def approve(pin: Pin | None, now: float) -> Pin | None:
    """The pin with its pending definition approved; None when nothing is pending."""
    if pin is None or pin.pending is None:
        return None
    return replace(pin, approved=pin.pending, approved_definition=pin.pending_definition, pending=None,
                   pending_definition=None, changed_at=None, approved_at=now)


_ABSENT = object()


def changed_fields(old: str | None, new: str | None) -> list[str]:
    """The diff summary: which pinned fields differ between two canonical definitions (all present ones if
    there was none before)."""
    before, after = _parsed(old), _parsed(new)
    return [field for field in PINNED_FIELDS if before.get(field, _ABSENT) != after.get(field, _ABSENT)]


def _parsed(text: str | None) -> JsonObj:
    if text is None:
        return {}
    parsed = json.loads(text.removeprefix("non-i-json:"))
    return parsed if isinstance(parsed, dict) else {}


def held(mode: Mode, pin: Pin | None, fingerprint: str) -> bool:
    """Whether a tool serving ``fingerprint`` is held back: enforce, and not what was approved (a pin that
    could not be read or written holds it too: enforce fails closed)."""
    return mode == "enforce" and (pin is None or pin.approved != fingerprint)


def selected(pin: Pin, *, target: str | None = None, upstream: str | None = None) -> bool:
    """Whether ``tools approve`` names this pin: ``UPSTREAM/TOOL``, ``--upstream NAME`` or (neither) ``--all``."""
    if target is not None:
        return f"{pin.upstream}/{pin.tool}" == target
    if upstream is not None:
        return pin.upstream == upstream
    return True


def refusal_message(upstream: str, tool: str, status: Status) -> str:
    """What a refused call is told: why, and the command that lets the tool through."""
    why = "appeared after its upstream was pinned" if status == "new" else "changed since it was pinned"
    return (f"The definition of tool {tool!r} of upstream {upstream!r} {why}; it is held until an operator "
            f"approves it: {APPROVE_COMMAND} {upstream}/{tool}")
