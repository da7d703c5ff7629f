"""What the gateway knows of a stdio child it hands to the next process: a small, versioned record.

A child handed over (``serve --handover``) or kept in systemd's file-descriptor store arrives in a
process that never spoke to it: this record is everything that process needs to adopt it without a
new ``initialize``. The record is pure data (to and from JSON, validated here); a record that does
not fit (another format version, a changed command or environment, anything malformed) is refused
with one reason, and the child is replaced by a fresh one instead of adopted on a guess.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.settings import StdioUpstreamSpec

#: Bumped whenever a field changes meaning: a process never adopts a child from a record it cannot read.
STATE_VERSION = 1
#: A record larger than this is not read (it would be a corrupt or hostile one).
MAX_RECORD_BYTES = 4 * 1024 * 1024


class BadRecord(ValueError):
    """A record that cannot be adopted: the message says why (one log line, then a fresh child)."""


@dataclass(frozen=True)
class ChildRecord:
    """One stdio child: who it is, what it was told, and what it answered."""

    upstream: str
    #: The isolation owner (a token id or session id), "catalogue", or None for a shared child.
    instance: str | None
    pid: int
    #: The spec's command, environment and cwd, digested: a changed configuration starts fresh.
    spec_digest: str
    #: Whether the child speaks 2026-07-28 (``server/discover``) rather than a 2025 session.
    modern: bool
    #: The ``initialize`` (or ``server/discover``) result: protocol version, capabilities, server info.
    init_result: JsonObj
    #: The next JSON-RPC id the gateway would have used: ids stay unique across the handover.
    next_id: int
    #: The child's listings as last fetched (``tools/list`` ...), by method.
    lists: dict[str, JsonObj] = field(default_factory=dict)
    #: Resource URIs subscribed on the child, and the log level it was set to.
    subscriptions: list[str] = field(default_factory=list)
    log_level: str | None = None
    version: int = STATE_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()


def spec_digest(spec: StdioUpstreamSpec) -> str:
    """What must be unchanged for a child to be adopted: the command, its environment, its folder."""
    text = json.dumps([spec.command, sorted(spec.env.items()), spec.cwd, spec.protocol], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _field(raw: dict[str, Any], name: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    value = raw.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise BadRecord(f"field {name!r} is missing or of the wrong type")
    return value


def _object_map(value: Any, name: str) -> dict[str, JsonObj]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
        raise BadRecord(f"field {name!r} is not an object of objects")
    return value


def from_json(data: bytes) -> ChildRecord:
    """The record in ``data``, or ``BadRecord`` naming what is wrong (never any other exception)."""
    if len(data) > MAX_RECORD_BYTES:
        raise BadRecord(f"record of {len(data)} bytes is larger than {MAX_RECORD_BYTES}")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRecord(f"record is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise BadRecord("record is not a JSON object")
    version = raw.get("version")
    if version != STATE_VERSION:
        raise BadRecord(f"state format version {version!r}, this process reads {STATE_VERSION}")
    subscriptions = _field(raw, "subscriptions", list)
    if not all(isinstance(uri, str) for uri in subscriptions):
        raise BadRecord("field 'subscriptions' holds a non-string")
    pid, next_id = _field(raw, "pid", int), _field(raw, "next_id", int)
    if pid <= 1 or next_id < 1:
        raise BadRecord("field 'pid' or 'next_id' is out of range")
    return ChildRecord(
        upstream=_field(raw, "upstream", str),
        instance=_field(raw, "instance", str, optional=True),
        pid=pid,
        spec_digest=_field(raw, "spec_digest", str),
        modern=_field(raw, "modern", bool),
        init_result=_field(raw, "init_result", dict),
        next_id=next_id,
        lists=_object_map(raw.get("lists", {}), "lists"),
        subscriptions=subscriptions,
        log_level=_field(raw, "log_level", str, optional=True),
    )


def adoption_refusal(record: ChildRecord, specs: dict[str, StdioUpstreamSpec]) -> str | None:
    """Why this process must not adopt the child (None: adopt it). Each reason is one log line."""
    spec = specs.get(record.upstream)
    if spec is None:
        return f"upstream {record.upstream!r} is no longer configured as a stdio upstream"
    if spec_digest(spec) != record.spec_digest:
        return f"upstream {record.upstream!r}: command, env, cwd or protocol changed in the new configuration"
    if (record.instance is None) != (spec.isolation == "shared"):
        return f"upstream {record.upstream!r}: isolation changed to {spec.isolation!r}"
    return None
