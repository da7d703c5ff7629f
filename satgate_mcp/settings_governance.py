"""The settings of governance: policy rules, pinned tool definitions, tool controls and the audit trail.

A part of ``Settings`` (it inherits this class), kept in its own module so settings.py stays about the
daemon, its clients and its stores. Every field here is a ``SATGATE_*`` variable like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic_settings import BaseSettings


class GovernanceSettings(BaseSettings):
    """What the guards (guards.py) and the audit trail are configured by."""

    #: Ordered policy rules (YAML or JSON ``{"rules": [...]}``, docs/governance.md); re-read within 1 s of a change.
    policy_file: Path | None = None
    #: What a call no rule matches gets.
    policy_default: Literal["allow", "deny"] = "allow"
    #: Pinned tool definitions (policy/pins.py): ``off``, ``warn`` (pin and report changes) or ``enforce`` (hold them).
    tool_pinning: Literal["off", "warn", "enforce"] = "warn"
    #: The audit trail: a file of chained JSON lines, or ``-`` for stdout (docs/governance.md#audit-trail).
    audit_file: str | None = None
    #: What a line keeps of a call's arguments: their SHA-256 (``digest``), all of them (``full``), or nothing.
    audit_args: Literal["digest", "full", "none"] = "digest"
    #: A call the trail cannot record: refused 503 (``closed``) or served and the line counted as dropped (``open``).
    audit_fail_mode: Literal["closed", "open"] = "closed"
