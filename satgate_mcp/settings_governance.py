"""The settings of governance: policy rules, pinned tool definitions, tool controls and the audit trail.

A part of ``Settings`` (it inherits this class), kept in its own module so settings.py stays about the
daemon, its clients and its stores. Every field here is a ``SATGATE_*`` variable like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings


def check_webhook_url(url: str) -> str:
    """An absolute ``http``/``https`` URL with a host, without credentials (they would end up in logs)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {url[:80]!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (sign with SATGATE_APPROVAL_WEBHOOK_SECRET instead)")
    return url


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
    #: How long a held call waits for an operator's decision before it is ``approval_expired``.
    approval_ttl: float = Field(default=900.0, gt=0, le=7 * 24 * 3600)
    #: Pending approvals one token (with the tokens delegated from it) may have at once.
    approvals_per_token: int = Field(default=20, ge=1, le=10_000)
    #: A URL that gets each approval request as signed JSON (never blocking the call).
    approval_webhook: str | None = None
    #: The HMAC-SHA256 key of the webhook's ``X-Satgate-Signature``.
    approval_webhook_secret: SecretStr | None = None

    @field_validator("approval_webhook")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        return None if value is None or value == "" else check_webhook_url(value)
