"""structlog configuration: JSON lines off a TTY, readable console on one, secrets never written.

The hot path (one ``http_request`` line and a few events per call) never touches stdlib
``logging``: structlog's level-filtering logger (its level methods in one frame each here) renders
with orjson straight to bytes on stdout, one write per turn of the event loop. Only foreign libraries
(aiohttp's server errors, asyncio) go through stdlib ``logging``, with the same processors, so every
line on stdout has one shape.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import IO, Any

import orjson
import structlog
from structlog.types import EventDict, Processor

from satgate_mcp import tracing
from satgate_mcp.loops import running_loop
from satgate_mcp.settings import Settings
from satgate_mcp.trace_context import current_ids

#: The fields the request being served adds to its one access line (``http_request``): its call's tool, upstream,
#: outcome and cost, gathered from the call's events, which are logged on their own at DEBUG only. None outside
#: a request.
ACCESS_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("satgate_access_fields", default=None)

REDACTED = "[redacted]"
_SECRET_KEYS = frozenset({"authorization", "token", "bearer", "root_key", "static_token", "password", "secret",
                          "headers", "cookie"})
_BEARER_RE = re.compile(r"(?i)bearer\s+[^\s\"',]+")
#: Keys seen so far and whether they are secret; log keys are a small fixed set, so this stays tiny.
_KEY_VERDICTS: dict[str, bool] = {}
_MAX_KEY_VERDICTS = 4096


def is_secret_key(key: object) -> bool:
    """Token-, key- and password-like names; ``token_id`` and friends are identifiers, not secrets."""
    name = str(key).lower()
    if name in _SECRET_KEYS:
        return True
    if name.endswith(("_id", "_ids")):
        return False
    return name.endswith("token") or "key" in name or "secret" in name or "password" in name


def _secret_key(key: str) -> bool:
    verdict = _KEY_VERDICTS.get(key)
    if verdict is None:
        verdict = is_secret_key(key)
        if len(_KEY_VERDICTS) < _MAX_KEY_VERDICTS:
            _KEY_VERDICTS[key] = verdict
    return verdict


def _scrub_text(value: str) -> str:
    # ``lower()`` and ``in`` cost a fraction of a regex search; no other character lower-cases to these letters.
    if "bearer" not in value.lower():
        return value
    return _BEARER_RE.sub("Bearer " + REDACTED, value)


#: Types that can never hold text: passed through untouched.
_PLAIN = frozenset({int, float, bool, type(None)})


def _scrub(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        return _scrub_text(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, str):
        return _scrub_text(value)
    if isinstance(value, Mapping):
        return {k: (REDACTED if _secret_key(str(k)) else _scrub(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def redact_secrets(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
    """Drop values under secret-looking keys and any ``Bearer <token>`` text anywhere in the event."""
    verdicts = _KEY_VERDICTS
    for key, value in event_dict.items():
        secret = verdicts.get(key)
        if secret is None:
            secret = _secret_key(key)
        if secret:
            event_dict[key] = REDACTED
            continue
        kind = type(value)
        if kind is str:  # most values: checked inline, no call
            if "bearer" in value.lower():
                event_dict[key] = _BEARER_RE.sub("Bearer " + REDACTED, value)
        elif kind not in _PLAIN:
            scrubbed = _scrub(value)
            if scrubbed is not value:
                event_dict[key] = scrubbed
    return event_dict


class UtcTimestamper:
    """ISO 8601 UTC with microseconds, like ``TimeStamper(fmt="iso", utc=True)``, formatting the
    date and time of day once per second instead of once per line."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, _logger: Any, _name: str, event_dict: EventDict) -> EventDict:
        second, nanos = divmod(time.time_ns(), 1_000_000_000)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
        event_dict["timestamp"] = f"{self._prefix}{nanos // 1000:06d}Z"
        return event_dict


def add_logger_name(logger: Any, _name: str, event_dict: EventDict) -> EventDict:
    """The name given to ``structlog.get_logger(name)``, or a foreign stdlib record's logger name."""
    record = event_dict.get("_record")
    name = record.name if record is not None else getattr(logger, "name", None)
    if name:
        event_dict["logger"] = name
    return event_dict


def add_trace_ids(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
    """``trace_id`` and ``span_id`` of the current span (tracing on), so a line leads to its trace."""
    if tracing.TRACER is not None and (ids := current_ids()) is not None:
        event_dict["trace_id"], event_dict["span_id"] = ids
    return event_dict


def shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        add_logger_name,
        UtcTimestamper(),
        redact_secrets,
        add_trace_ids,
    ]


#: What ``add_log_level`` calls the level of a method name that is not one.
_LEVEL_OF_METHOD = {"warn": "warning", "exception": "error"}


class LineProcessor:
    """``shared_processors`` and ``format_exc_info`` as one call: a structlog line passes one processor,
    not six (each a Python call, and ``format_exc_info`` looks for an exception no line on the hot path has)."""

    __slots__ = ("_stamp",)

    def __init__(self) -> None:
        self._stamp = UtcTimestamper()

    def __call__(self, logger: Any, name: str, event_dict: EventDict) -> EventDict:
        event_dict = redact_secrets(logger, name, structlog.contextvars.merge_contextvars(logger, name, event_dict))
        # Ours, never secrets: added after the redaction has looked at what the caller gave.
        event_dict["level"] = _LEVEL_OF_METHOD.get(name, name)
        add_logger_name(logger, name, event_dict)
        self._stamp(logger, name, event_dict)
        if tracing.TRACER is not None:
            add_trace_ids(logger, name, event_dict)
        if "exc_info" in event_dict:
            event_dict = structlog.processors.format_exc_info(logger, name, event_dict)
        return event_dict


def _orjson_default(value: Any) -> str:
    return str(value)


def _render_json(_logger: Any, _name: str, event_dict: EventDict) -> bytes:
    try:
        return orjson.dumps(event_dict, default=_orjson_default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # text orjson cannot encode (a lone surrogate from a header, say): escaped, never lost
        return json.dumps(event_dict, default=str, ensure_ascii=True).encode("ascii")


class LineSink:
    """JSON lines for one binary stream, written once per turn of the event loop rather than once per line.

    A call logs a few lines (its request line, its events) within a turn or two; one write and flush
    for all of them costs a system call where there were several. Outside the event loop's thread
    (start-up, the state worker, shutdown) a line is written at once, after any still pending, so
    nothing is reordered and nothing waits. ``flush`` also runs at interpreter exit.
    """

    __slots__ = ("_armed", "_file", "_lock", "_pending")

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._pending: list[bytes] = []
        self._armed = False
        self._lock = threading.Lock()
        atexit.register(self.flush)

    def write(self, line: bytes) -> None:
        loop = running_loop()
        with self._lock:
            self._pending.append(line)
            if loop is None:
                self._write_pending()
            elif not self._armed:
                self._armed = True
                loop.call_soon(self.flush)

    def flush(self) -> None:
        with self._lock:
            self._armed = False
            self._write_pending()

    def _write_pending(self) -> None:
        lines, self._pending = self._pending, []
        if lines:
            try:
                self._file.write(b"".join(lines))
                self._file.flush()
            except (OSError, ValueError):  # stdout closed or gone: a log line must never take the daemon down
                pass


class SinkLogger:
    """structlog's logger for rendered JSON lines: each goes to the shared ``LineSink``."""

    __slots__ = ("_sink", "name")

    def __init__(self, sink: LineSink, name: str | None) -> None:
        self._sink = sink
        self.name = name

    def msg(self, message: bytes) -> None:
        self._sink.write(message + b"\n")

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


#: The level methods a line logger makes in one frame; the rest (``exception``, ``log``, ...) stay structlog's.
_LINE_METHODS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
                 "error": logging.ERROR, "critical": logging.CRITICAL}


def _line_method(name: str) -> Any:
    """What structlog does for one line in four frames (interpolate, proxy, copy the context, run the chain),
    in one: the same processors see the same event dict, ``DropEvent`` drops the line, and the last
    processor's answer reaches the logger as structlog would hand it over."""
    level_name = "warning" if name == "warn" else name

    def meth(self: Any, event: str, *args: Any, **kw: Any) -> Any:
        if args:
            event = event % (args[0] if len(args) == 1 and isinstance(args[0], dict) and args[0] else args)
        context = self._context
        event_dict: Any = {**context, **kw} if context else kw  # ``kw`` is this call's own dict
        event_dict["event"] = event
        logger = self._logger
        try:
            for proc in self._processors:
                event_dict = proc(logger, level_name, event_dict)
        except structlog.DropEvent:
            return None
        write = getattr(logger, level_name)
        if isinstance(event_dict, (bytes, str, bytearray)):
            return write(event_dict)
        if isinstance(event_dict, tuple):
            return write(*event_dict[0], **event_dict[1])
        if isinstance(event_dict, dict):
            return write(**event_dict)
        raise ValueError("Last processor didn't return an appropriate value.")

    meth.__name__ = name
    return meth


def line_logger_class(level: int) -> type[Any]:
    """structlog's level-filtering bound logger (``bind``, ``new``, below-level methods that do nothing),
    with each enabled level's method made by ``_line_method``: what a line costs besides its processors is halved
    (a fifth of the whole line: some 1.5 us of 7.5 on this project's machine kind)."""
    base: type[Any] = structlog.make_filtering_bound_logger(level)
    enabled = {name: _line_method(name) for name, at in _LINE_METHODS.items() if at >= level}
    return type(f"Line{base.__name__}", (base,), enabled)


class _NamedWriteLogger(structlog.WriteLogger):
    """A text logger (console format) that remembers the name it was asked for."""

    def __init__(self, file: IO[str], name: str | None) -> None:
        super().__init__(file)  # type: ignore[arg-type]
        self.name = name


def configure_logging(settings: Settings) -> None:
    """structlog renders natively to stdout; stdlib logging (aiohttp's too) goes through one formatter."""
    level = logging.getLevelNamesMapping()[settings.log_level]
    use_json = (settings.log_format or ("console" if sys.stdout.isatty() else "json")) == "json"
    stream = sys.stdout
    tail: list[Processor] = [LineProcessor()]
    if use_json:
        sink = LineSink(stream.buffer)

        def logger_factory(*args: Any) -> Any:
            return SinkLogger(sink, args[0] if args else None)

        tail.append(_render_json)
        foreign_renderer: Processor = structlog.processors.JSONRenderer()
    else:
        def logger_factory(*args: Any) -> Any:
            return _NamedWriteLogger(stream, args[0] if args else None)

        foreign_renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())
        tail.append(foreign_renderer)
    structlog.configure(
        processors=tail,
        logger_factory=logger_factory,
        wrapper_class=line_logger_class(level),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared_processors(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, foreign_renderer],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One canonical line per request comes from our middleware; aiohttp's access log would repeat it.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
