"""Every ``SATGATE_*`` setting, validated once at start.

A bad value must stop the daemon with one line naming the variable, so validators raise
plain ``ValueError`` with readable text and ``config_problems.format_errors`` turns them into that line.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from satgate_mcp.addresses import secure_url_problem
from satgate_mcp.patterns import PatternKind, check_pattern
from satgate_mcp.settings_console import ConsoleSettings
from satgate_mcp.settings_governance import GovernanceSettings
from satgate_mcp.settings_identity import IdentitySettings
from satgate_mcp.settings_upstreams import DEFAULT_MAX_INSTANCES as DEFAULT_MAX_INSTANCES
from satgate_mcp.settings_upstreams import HttpUpstreamSpec as HttpUpstreamSpec
from satgate_mcp.settings_upstreams import Isolation as Isolation
from satgate_mcp.settings_upstreams import StdioUpstreamSpec as StdioUpstreamSpec
from satgate_mcp.settings_upstreams import UpstreamProtocol as UpstreamProtocol
from satgate_mcp.settings_upstreams import UpstreamSpec
from satgate_mcp.upstream_auth_spec import upstream_auth_problem

ENV_PREFIX = "SATGATE_"
MIN_ROOT_KEY_LENGTH = 32


_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PER_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def parse_rate(text: str) -> float:
    """``"10/s"`` -> 10.0 tokens per second; ``"600/m"`` -> 10.0."""
    m = _RATE_RE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected a positive rate like '10/s' or '600/m', got {text!r}")
    return float(m.group(1)) / _PER_SECONDS[m.group(2)]


def _split_commas(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


ENFORCEMENT_ALIASES = {"observe": "observe", "shadow": "observe", "control": "control", "hard": "control",
                       "soft": "control"}


class Settings(GovernanceSettings, IdentitySettings, ConsoleSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", env_file_encoding="utf-8",
                                      env_ignore_empty=True)

    host: str = "127.0.0.1"
    port: int = Field(default=9100, ge=0, le=65535)

    auth_mode: Literal["none", "config", "header", "oauth"] = "none"
    root_key: SecretStr | None = None
    static_token: SecretStr | None = None

    upstreams: Annotated[dict[str, UpstreamSpec], NoDecode] = Field(default_factory=dict)

    session_cap: int = Field(default=10000, ge=1)
    session_idle_ttl: float = Field(default=1800.0, gt=0)
    sweep_interval: float = Field(default=30.0, gt=0)
    #: Live sessions and DELETE tombstones one token id may hold on a process (issue 9, hole 4).
    sessions_per_token: int = Field(default=100, ge=1)
    #: Requests in flight at once, per token id and per process; past either: -32004, never a queue.
    max_inflight_per_token: int = Field(default=64, ge=1)
    max_inflight: int = Field(default=1024, ge=1)

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)

    revocation_file: Path | None = None
    #: Bearer required on /metrics when set.
    metrics_token: SecretStr | None = None
    #: ``none`` auth on a non-loopback address refuses to start without this.
    allow_unauthenticated: bool = False
    allow_unknown_variables: bool = Field(
        default=False,
        description="`serve` refuses to start on a `SATGATE_*` name nothing reads (a typo such as "
                    "`SATGATE_AUTH_MOD`), naming the setting it likely meant; `true` starts anyway with a warning.")
    oauth_resource_metadata_url: str | None = None
    oauth_authorization_servers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: ``oauth`` mode: whose tokens are accepted (``iss``, exact), where its keys are (else discovered).
    oauth_issuer: str | None = None
    oauth_jwks_url: str | None = None
    #: ``oauth`` mode: this resource (the public URL of ``/mcp``, RFC 8707), or several, comma separated.
    oauth_audience: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Tool name, ``prefix*`` or ``*`` -> the scope it requires; a tool no pattern matches needs none.
    oauth_tool_scopes: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    oauth_id_claim: str = "sub"
    oauth_budget_claim: str | None = None

    rate_limit: str | None = None
    rate_burst: int | None = Field(default=None, ge=1)
    enforcement: str = "observe"
    tool_rate_limits: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    tool_costs: Annotated[dict[str, Annotated[float, Field(ge=0)]], NoDecode] = Field(default_factory=dict)
    default_cost: float = Field(default=1.0, ge=0)
    budgets: Annotated[dict[str, Annotated[float, Field(ge=0)]], NoDecode] = Field(default_factory=dict)

    events_file: Path | None = None
    reuse_port: bool = True
    #: This start may take over a port another process already listens on (``serve --handover``).
    handover: bool = False
    drain_seconds: float = Field(default=25.0, ge=0)
    #: Seconds a client may take to send a request's body, or to start its next request on a connection.
    read_timeout: float = Field(default=10.0, gt=0, le=3600)
    #: Open client connections one process serves at most; a new connection's first request past it gets 503.
    max_connections: int = Field(default=4096, ge=1, le=1_000_000)
    #: A 2025-11-25 answer stream quiet this long is closed mid-call (SEP-1699 polling): the client resumes it
    #: with Last-Event-ID, so no connection is held through a long call. 0: streams stay open (keep-alives).
    sse_poll_seconds: float = Field(default=0.0, ge=0)
    redis_url: str | None = None
    #: Seconds one Redis command (or connect) may take before it counts as a store fault.
    redis_timeout: float = Field(default=0.5, gt=0)
    #: Connections each Redis client keeps open at most; a command waits (within the timeout) for a free one.
    redis_max_connections: int = Field(default=64, ge=1, le=10_000)
    #: On a store fault, ``closed`` answers 503 + Retry-After (never a 401); ``open`` lets the check pass.
    store_fail_mode: Literal["closed", "open"] = "closed"
    #: Seals 2026-07-28 multi round-trip state when there is no root key: comma separated, the first seals.
    state_key: SecretStr | None = None
    #: Folder of the embedded SQLite state when no Redis is set; unset: $STATE_DIRECTORY or ./satgate-state.
    state_dir: str | None = None

    log_format: Literal["json", "console"] | None = None
    log_level: str = "INFO"
    access_log_health: bool = True
    tracing: Literal["off", "otlp", "console"] = "off"

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        """``serve --host ""`` would otherwise reach the bind; an empty variable already means the default."""
        host = value.strip()
        if not host or any(c.isspace() or not c.isprintable() for c in host):
            raise ValueError(f"expected an IP address or host name such as 127.0.0.1, 0.0.0.0 or ::, got {value!r}")
        return host

    @field_validator("allowed_origins", "allowed_hosts", "oauth_authorization_servers", "oauth_audience",
                     mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return _split_commas(value)

    @field_validator("upstreams", "tool_costs", "budgets", "tool_rate_limits", "oauth_tool_scopes", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"must be a JSON object ({exc.msg} at position {exc.pos})") from None
            if not isinstance(value, dict):
                raise ValueError("must be a JSON object")
        return value

    @field_validator("upstreams")
    @classmethod
    def _upstream_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"upstream name {name!r} may use only letters, digits, '_', '-', '.'")
        return value

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is not None and value.strip():
            parse_rate(value)
            return value.strip()
        return None

    @field_validator("tool_rate_limits")
    @classmethod
    def _tool_rates(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern, rate in value.items():
            check_pattern(pattern, PatternKind.TOOL)
            try:
                parse_rate(rate)
            except ValueError as exc:
                raise ValueError(f"{pattern!r}: {exc}") from None
        return value

    @field_validator("enforcement")
    @classmethod
    def _enforcement(cls, value: str) -> str:
        key = value.strip().lower()
        if key not in ENFORCEMENT_ALIASES:
            raise ValueError("must be 'observe' or 'control' (or the older 'shadow', 'hard', 'soft')")
        return ENFORCEMENT_ALIASES[key]

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @field_validator("oauth_resource_metadata_url", "oauth_issuer", "oauth_jwks_url")
    @classmethod
    def _secure_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s#?]*)?", value.strip()):
            raise ValueError("must be an absolute https:// URL without query or fragment")
        problem = secure_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value.strip()

    @field_validator("oauth_audience")
    @classmethod
    def _audiences(cls, value: list[str]) -> list[str]:
        for audience in value:
            if any(c.isspace() or not c.isprintable() for c in audience):
                raise ValueError(f"audience {audience[:100]!r} has whitespace or control characters")
        return value

    @field_validator("oauth_tool_scopes")
    @classmethod
    def _tool_scopes(cls, value: dict[str, Any]) -> dict[str, str]:
        for pattern, scope in value.items():
            check_pattern(pattern, PatternKind.TOOL)
            # RFC 6749 scope-token: printable ASCII except space, '"' and '\\'; the challenge quotes it.
            if not isinstance(scope, str) or not re.fullmatch(r"[\x21\x23-\x5b\x5d-\x7e]+", scope):
                raise ValueError(f"{pattern!r}: the scope must be one RFC 6749 scope token, got {scope!r}")
        return value

    @field_validator("oauth_id_claim", "oauth_budget_claim")
    @classmethod
    def _claim_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(r"[A-Za-z0-9_.:/-]{1,100}", value.strip()):
            raise ValueError("must be a claim name (letters, digits, '_.:/-')")
        return value.strip()

    @model_validator(mode="after")
    def _auth_requirements(self) -> Settings:
        if self.auth_mode == "header":
            key = self.root_key.get_secret_value() if self.root_key else ""
            if not key:
                raise ValueError("SATGATE_ROOT_KEY is required when SATGATE_AUTH_MODE=header")
            if len(key) < MIN_ROOT_KEY_LENGTH:
                raise ValueError(f"SATGATE_ROOT_KEY must be at least {MIN_ROOT_KEY_LENGTH} characters")
        if self.auth_mode == "config" and not (self.static_token and self.static_token.get_secret_value()):
            raise ValueError("SATGATE_STATIC_TOKEN is required when SATGATE_AUTH_MODE=config")
        if self.auth_mode == "oauth":
            self._oauth_requirements()
        auths = {n: s.auth for n, s in self.upstreams.items() if isinstance(s, HttpUpstreamSpec)}
        if problem := upstream_auth_problem(
                self.auth_mode, self.identity_key is not None, auths,
                credential_key_set=self.credential_key is not None,
                public_url_known=self.public_url_known(self.auth_mode, self.oauth_audience, self.host)):
            raise ValueError(problem)
        return self

    def _oauth_requirements(self) -> None:
        """The issuer and the audience are required; the metadata URL and the servers follow from them."""
        if not self.oauth_issuer:
            raise ValueError("SATGATE_OAUTH_ISSUER is required when SATGATE_AUTH_MODE=oauth")
        if not self.oauth_audience:
            raise ValueError("SATGATE_OAUTH_AUDIENCE is required when SATGATE_AUTH_MODE=oauth "
                             "(the public URL of /mcp, e.g. https://gateway.example.com/mcp)")
        if not self.oauth_authorization_servers:
            self.oauth_authorization_servers = [self.oauth_issuer]
        if not self.oauth_resource_metadata_url:
            derived = resource_metadata_url_for(self.oauth_audience)
            if derived is None:
                raise ValueError("SATGATE_OAUTH_RESOURCE_METADATA_URL is required when no SATGATE_OAUTH_AUDIENCE "
                                 "is an https:// URL (or http:// on loopback) to derive it from")
            self.oauth_resource_metadata_url = derived

    @property
    def state_keys(self) -> list[str]:
        """What seals and opens MRTR state: the root key in header mode, else SATGATE_STATE_KEY's keys."""
        if self.auth_mode == "header" and self.root_key is not None:
            return [self.root_key.get_secret_value()]
        if self.state_key is None:
            return []
        return [k.strip() for k in self.state_key.get_secret_value().split(",") if k.strip()]

    @property
    def rate_per_second(self) -> float | None:
        return parse_rate(self.rate_limit) if self.rate_limit else None


#: RFC 9728's well-known path for protected resource metadata.
RESOURCE_METADATA_WELL_KNOWN = "/.well-known/oauth-protected-resource"


def resource_metadata_url_for(audiences: Iterable[str]) -> str | None:
    """RFC 9728 section 3.1: the well-known segment goes between the resource's origin and its path."""
    for audience in audiences:
        if secure_url_problem(audience) is None:
            parts = urlsplit(audience)
            return f"{parts.scheme}://{parts.netloc}{RESOURCE_METADATA_WELL_KNOWN}{parts.path.rstrip('/')}"
    return None


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Environment first, then the optional env-style config file, then defaults."""
    if config_file is not None:
        return Settings(_env_file=config_file, **overrides)  # type: ignore[call-arg]
    return Settings(**overrides)


#: ``SATGATE_*`` names read by something other than ``Settings``: client examples and the scripts (``serve`` started
#: from scripts/test.sh inherits ``SATGATE_DEPS``; ``SATGATE_UV`` is scripts/lock.sh's).
OTHER_KNOWN_VARIABLES = frozenset({"SATGATE_TOKEN", "SATGATE_BIN", "SATGATE_TEST_VENV", "SATGATE_CONFORMANCE",
                                   "SATGATE_DEPS", "SATGATE_UV"})


def known_variables() -> frozenset[str]:
    return frozenset(ENV_PREFIX + name.upper() for name in Settings.model_fields) | OTHER_KNOWN_VARIABLES


def unknown_variables(names: Iterable[str]) -> dict[str, str | None]:
    """``SATGATE_*`` names nothing reads, each with the likeliest intended name: a typo is otherwise ignored."""
    known = sorted(known_variables())
    found: dict[str, str | None] = {}
    for name in sorted(set(names)):
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper not in known:
            close = difflib.get_close_matches(upper, known, n=1, cutoff=0.8)
            found[name] = close[0] if close else None
    return found
