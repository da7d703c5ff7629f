"""structlog configuration: JSON lines off a TTY, readable console on one, secrets never written."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from structlog.types import EventDict, Processor

from satgate_mcp.settings import Settings

REDACTED = "[redacted]"
_SECRET_KEYS = frozenset({"authorization", "token", "bearer", "root_key", "static_token", "password", "secret",
                          "headers", "cookie"})
_BEARER_RE = re.compile(r"(?i)bearer\s+[^\s\"',]+")


def is_secret_key(key: object) -> bool:
    """Token-, key- and password-like names; ``token_id`` and friends are identifiers, not secrets."""
    name = str(key).lower()
    if name in _SECRET_KEYS:
        return True
    if name.endswith(("_id", "_ids")):
        return False
    return name.endswith("token") or "key" in name or "secret" in name or "password" in name


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return _BEARER_RE.sub("Bearer " + REDACTED, value)
    if isinstance(value, MutableMapping):
        return {k: (REDACTED if is_secret_key(k) else _scrub(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def redact_secrets(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
    """Drop values under secret-looking keys and any ``Bearer <token>`` text anywhere in the event."""
    for key in list(event_dict):
        if is_secret_key(key):
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _scrub(event_dict[key])
    return event_dict


def shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]


def configure_logging(settings: Settings) -> None:
    """Route structlog and stdlib logging (aiohttp's too) through one renderer on stdout."""
    level = settings.log_level
    use_json = (settings.log_format or ("console" if sys.stdout.isatty() else "json")) == "json"
    renderer: Processor = (structlog.processors.JSONRenderer() if use_json
                           else structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty()))
    structlog.configure(
        processors=[*shared_processors(), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared_processors(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One canonical line per request comes from our middleware; aiohttp's access log would repeat it.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
