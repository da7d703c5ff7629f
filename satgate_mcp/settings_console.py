"""The settings of the operator console (``/console``): whether it is served and who may open it.

A part of ``Settings`` (it inherits this class), beside ``GovernanceSettings``, so settings.py stays about the
daemon, its clients and its stores. Every field here is a ``SATGATE_*`` variable like any other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr, field_validator
from pydantic_settings import BaseSettings

#: A console secret is a credential an attacker may try to guess from anywhere the port is reachable.
MIN_CONSOLE_TOKEN_LENGTH = 32


class ConsoleSettings(BaseSettings):
    """Who may open the console is decided by the auth mode: an admin token (header), a scope (oauth), a secret
    of its own (none and config: the /mcp credential of those modes is shared by every client)."""

    #: ``on``: ``/console`` and ``/console/api/`` are served on the daemon's own port; ``off``: 404.
    console: Literal["on", "off"] = "on"
    #: ``oauth`` mode: the scope an access token needs to open the console.
    console_scope: str = "satgate:admin"
    #: ``none`` and ``config`` modes: the secret an operator logs in with (none on loopback without it: open).
    console_token: SecretStr | None = None

    @field_validator("console_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_CONSOLE_TOKEN_LENGTH:
            raise ValueError(f"must be at least {MIN_CONSOLE_TOKEN_LENGTH} characters")
        return value
