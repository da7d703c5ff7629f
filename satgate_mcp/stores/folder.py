"""Which state folder a configuration names: ``SATGATE_STATE_DIR``, else systemd's, else ``./satgate-state``.

A pure decision over the settings and the environment, so the daemon and ``token revoke`` (run by hand,
often as another user) agree on the folder without opening anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from satgate_mcp.auth.revocation import RevocationSettings

MEMORY = "memory"
DEFAULT_STATE_DIR = "./satgate-state"
#: Set by systemd for a unit with ``StateDirectory=`` (several folders are separated by ``:``).
SYSTEMD_STATE_DIRECTORY = "STATE_DIRECTORY"


class StateSettings(RevocationSettings, Protocol):
    """What picks the state folder; ``Settings`` and the CLI's token settings both fit."""

    @property
    def state_dir(self) -> str | None: ...


def resolve_state_dir(configured: str | None, environ: Mapping[str, str]) -> Path | None:
    """The state folder, or None for ``memory``: the setting, else systemd's folder, else ``./satgate-state``."""
    value = (configured or "").strip()
    if value:
        return None if value.lower() == MEMORY else Path(value)
    systemd = environ.get(SYSTEMD_STATE_DIRECTORY, "").split(":")[0].strip()
    return Path(systemd or DEFAULT_STATE_DIR)


def state_folder(settings: StateSettings, environ: Mapping[str, str] | None = None) -> Path | None:
    """The folder this configuration keeps state in; None with Redis (it shares the state) or ``memory``."""
    if settings.redis_url:
        return None
    return resolve_state_dir(settings.state_dir, os.environ if environ is None else environ)
