"""What an upstream spec says (one entry of ``SATGATE_UPSTREAMS``): a stdio child or an HTTP server, and how the
gateway treats it. A part of the settings model, kept apart so settings.py stays about the daemon as a whole.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from satgate_mcp.settings_breaker import BreakerSpec
from satgate_mcp.upstream_auth_spec import UpstreamAuthSpec

Isolation = Literal["shared", "token", "session"]


#: Client children one isolated stdio upstream may run at once unless ``"max_instances"`` says otherwise.
DEFAULT_MAX_INSTANCES = 100


def _isolation_on_http(value: str) -> str:
    """An HTTP upstream needs no isolation: what it sends on a call's response stream is that call's, exactly."""
    if value != "shared":
        raise ValueError(f'"isolation": "{value}" applies to stdio upstreams only: an HTTP upstream already tells '
                         "every client's traffic apart (each call has its own response stream); remove "
                         '"isolation" or set it to "shared"')
    return value


#: Which revision the gateway speaks to an upstream. ``auto``: ``initialize`` first, and 2026-07-28 (found by
#: ``server/discover``) only when the handshake is refused, so a dual-revision server keeps what only the handshake
#: has (server-to-client requests mid-call, ``logging/setLevel``, resource subscriptions) and a strict 2025 server
#: never sees a request it may die of. ``2026``: ``server/discover`` first, the handshake only when that fails.
#: ``2025``: the handshake only.
UpstreamProtocol = Literal["auto", "2025", "2026"]


class StdioUpstreamSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Literal["stdio"]
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    timeout: float = Field(default=30.0, gt=0)
    tool_prefix: str = ""
    #: ``auto``: the handshake, 2026-07-28 when it is refused; ``2026``: discover first; ``2025``: handshake only.
    protocol: UpstreamProtocol = "auto"
    #: Who shares one child: everyone (``shared``), a verified token id (``token``), a client session (``session``).
    isolation: Isolation = "shared"
    #: ``token``/``session``: client children alive at once (the catalogue child is not counted).
    max_instances: int = Field(default=DEFAULT_MAX_INSTANCES, ge=1)


class HttpUpstreamSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Literal["http"]
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=30.0, gt=0)
    tool_prefix: str = ""
    #: ``auto``: the handshake, 2026-07-28 when it is refused; ``2026``: discover first; ``2025``: handshake only.
    protocol: UpstreamProtocol = "auto"
    #: Only ``shared``: refused at start otherwise (see ``_isolation_on_http``).
    isolation: Isolation = "shared"
    max_instances: int = Field(default=DEFAULT_MAX_INSTANCES, ge=1)
    #: When calls stop going to an upstream that keeps failing (docs/upstreams.md).
    breaker: BreakerSpec = Field(default_factory=BreakerSpec)
    #: How the gateway authenticates upstream as an OAuth client (upstream_auth_spec.py); None: ``headers`` only.
    auth: UpstreamAuthSpec | None = None

    @field_validator("isolation")
    @classmethod
    def _isolation_shared(cls, value: str) -> str:
        return _isolation_on_http(value)


UpstreamSpec = Annotated[StdioUpstreamSpec | HttpUpstreamSpec, Field(discriminator="transport")]
