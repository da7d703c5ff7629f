"""Structured events and the publishers that deliver them.

An event is a name plus flat fields. Publishers must never receive a bearer token: callers pass
token ids, budget ids and session ids only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import orjson
import structlog

from satgate_mcp.logs import ACCESS_FIELDS

SESSION_CONNECT: Final = "session_connect"
#: A metered call admitted unmetered because the store could not answer (SATGATE_STORE_FAIL_MODE=open).
FAIL_OPEN_ADMISSION: Final = "fail_open_admission"
SESSION_CLOSE: Final = "session_close"
AUTH_FAILURE: Final = "auth_failure"
TOOL_CALL: Final = "tool_call"
BUDGET_SPEND: Final = "budget_spend"
BUDGET_EXHAUSTED: Final = "budget_exhausted"
RATE_LIMITED: Final = "rate_limited"
#: A caveat refused a tool, resource or prompt: which token asked for what (a probe, or a misconfigured agent).
NOT_ALLOWED: Final = "not_allowed"
DELEGATION: Final = "delegation"
UPSTREAM_RESTART: Final = "upstream_restart"
#: A policy rule (or SATGATE_POLICY_DEFAULT) refused a call, or its condition failed (``error`` says why).
POLICY_DENIED: Final = "policy_denied"
#: SATGATE_POLICY_FILE changed and was taken into use (``rules``: how many).
POLICY_LOADED: Final = "policy_loaded"
#: SATGATE_POLICY_FILE changed but does not parse or compile: the last good policy stays in force.
POLICY_REJECTED: Final = "policy_rejected"
#: An upstream tool's definition differs from its pin (SATGATE_TOOL_PINNING): once per change, whichever process saw it.
TOOL_DEFINITION_CHANGED: Final = "tool_definition_changed"
#: An operator acted in the console (``/console``): who (a token id), what, on what.
CONSOLE_ACTION: Final = "console_action"
#: A call broke a token's tool controls (``error``: argument_denied, spend_limit_exceeded, ...); ``enforced``
#: false: SATGATE_ENFORCEMENT=observe let it through. Never the argument's value.
CONTROL_BREACH: Final = "control_breach"
#: A call was held for an operator's approval (``approval_id``, ``tool``, ``reason``, ``expires_at``).
APPROVAL_REQUESTED: Final = "approval_requested"
#: An operator approved or denied a held call (``decision``, ``by``); published by whoever took it.
APPROVAL_DECIDED: Final = "approval_decided"
#: An approved call ran: its approval is used up (a second copy needs a new one).
APPROVAL_USED: Final = "approval_used"
#: A call asked its user for confirmation (``answer``: accepted, declined or unavailable).
CONFIRMATION: Final = "confirmation"
#: A user's grant to an "oauth_user" upstream (``upstream``, ``subject``): ``outcome`` started (asked to authorize),
#: granted (the callback kept it), refused (a callback that may not complete: ``reason``), forgotten (the server
#: refused it, or it no longer opens). Never a code, state or token.
UPSTREAM_AUTHORIZATION: Final = "upstream_authorization"


class Publisher(Protocol):
    def publish(self, event: str, **fields: Any) -> None: ...


#: Events every call publishes, folded into its request's access line at INFO (and logged alone at DEBUG): one
#: line per call, not three. The fields each adds to that line.
FOLDED: Final = {TOOL_CALL: ("tool", "upstream", "outcome"), BUDGET_SPEND: ("cost",)}


def fold(note: dict[str, Any], event: str, fields: dict[str, Any]) -> None:
    """What one call's event adds to its access line; a refund marks the line instead of replacing the cost."""
    if event == BUDGET_SPEND and fields.get("refund"):
        note["refunded"] = True
        return
    for name in FOLDED[event]:
        if name in fields:
            note[name] = fields[name]


class LogPublisher:
    """Every event becomes one structured log line; a call's own events join its request's access line."""

    def __init__(self) -> None:
        # The configured logger itself, not structlog's lazy proxy (which looks it up again on every line).
        self._log = structlog.get_logger("satgate_mcp.events").bind()

    def publish(self, event: str, **fields: Any) -> None:
        if event not in FOLDED:
            self._log.info(event, **fields)
            return
        note = ACCESS_FIELDS.get()
        if note is not None:
            fold(note, event, fields)
        self._log.debug(event, **fields)


class JsonlFilePublisher:
    """Appends one JSON object per line; each write is flushed so a crash loses nothing."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._fh = path.open("ab")

    def publish(self, event: str, **fields: Any) -> None:
        line = orjson.dumps({"event": event, "ts": time.time(), **fields}, default=str,
                            option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)
        with self._lock:
            self._fh.write(line)
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()

    async def aclose(self) -> None:
        self.close()


class FanoutPublisher:
    def __init__(self, publishers: Sequence[Publisher]) -> None:
        self._publishers = tuple(publishers)

    def publish(self, event: str, **fields: Any) -> None:
        for p in self._publishers:
            p.publish(event, **fields)


class RecordingPublisher:
    """Keeps events in memory; for tests and for embedding applications that poll."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def publish(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [f for name, f in self.events if name == event]
