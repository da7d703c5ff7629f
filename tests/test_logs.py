"""Logging: one canonical line per HTTP request, and secrets never written."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient
from structlog.testing import capture_logs

from satgate_mcp import jsonrpc, logs
from satgate_mcp.app import create_app
from satgate_mcp.auth.base import StaticTokenAuthenticator
from satgate_mcp.events import LogPublisher
from satgate_mcp.logs import REDACTED, LineSink, configure_logging, redact_secrets
from satgate_mcp.settings import Settings
from satgate_mcp.transport.middleware import logs_request, metric_label
from tests.fakes import AllowAllPolicy, FakePool

SECRET = "s3cret-static-token"
WRONG = "wrong-token-value"
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def redact(**event: Any) -> dict[str, Any]:
    return dict(redact_secrets(None, "info", dict(event)))


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        pytest.param({"authorization": "Bearer abc"}, {"authorization": REDACTED}, id="authorization"),
        pytest.param({"Authorization": "Bearer abc"}, {"Authorization": REDACTED}, id="authorization-any-case"),
        pytest.param({"token": "abc"}, {"token": REDACTED}, id="token"),
        pytest.param({"static_token": "abc"}, {"static_token": REDACTED}, id="static-token"),
        pytest.param({"root_key": "abc"}, {"root_key": REDACTED}, id="root-key"),
        pytest.param({"headers": {"X-Api-Key": "abc"}}, {"headers": REDACTED}, id="headers"),
        pytest.param({"note": "sent Authorization: Bearer abc.def-ghi to x"},
                     {"note": f"sent Authorization: Bearer {REDACTED} to x"}, id="bearer-in-text"),
        pytest.param({"note": 'header "bearer abc" seen'}, {"note": f'header "Bearer {REDACTED}" seen'},
                     id="lower-case-bearer-in-quotes"),
        pytest.param({"event": "refused Bearer abc"}, {"event": f"refused Bearer {REDACTED}"}, id="event-text"),
        pytest.param({"request": {"authorization": "Bearer abc", "path": "/mcp"}},
                     {"request": {"authorization": REDACTED, "path": "/mcp"}}, id="nested"),
        pytest.param({"argv": ["--token", "Bearer abc"]}, {"argv": ["--token", f"Bearer {REDACTED}"]}, id="list"),
        pytest.param({"token_id": "alice", "session_id": "mcp-1", "status": 401},
                     {"token_id": "alice", "session_id": "mcp-1", "status": 401}, id="ids-are-not-secrets"),
    ],
)
def test_redaction(event: dict[str, Any], expected: dict[str, Any]) -> None:
    assert redact(**event) == expected


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging changes global state; put it back so other tests keep capture_logs working."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    access_level = logging.getLogger("aiohttp.access").level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(access_level)


@pytest.mark.usefixtures("restore_logging")
def test_configured_json_logging_redacts_structlog_and_stdlib_lines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(Settings(log_format="json", log_level="INFO"))
    structlog.get_logger("satgate_mcp.test_logs").info("auth", authorization=f"Bearer {SECRET}",
                                                       note=f"Bearer {SECRET}", token_id="alice")
    logging.getLogger("aiohttp.server").warning("bad header Authorization: Bearer %s", SECRET)
    out = capsys.readouterr().out
    assert SECRET not in out
    first, second = (json.loads(line) for line in out.splitlines())
    assert (first["event"], first["authorization"], first["token_id"]) == ("auth", REDACTED, "alice")
    assert first["level"] == "info"
    assert second["event"] == f"bad header Authorization: Bearer {REDACTED}"


@pytest.mark.usefixtures("restore_logging")
def test_a_json_line_carries_level_logger_timestamp_and_any_exception(capsys: pytest.CaptureFixture[str]) -> None:
    """What the one fused line processor adds, as the separate processors did."""
    configure_logging(Settings(log_format="json", log_level="INFO"))
    log = structlog.get_logger("satgate_mcp.test_logs")
    log.warning("slow", note=f"Bearer {SECRET}")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed", token=SECRET)
    out = capsys.readouterr().out
    assert SECRET not in out
    warned, failed = (json.loads(line) for line in out.splitlines())
    assert (warned["level"], warned["logger"], warned["note"]) == ("warning", "satgate_mcp.test_logs",
                                                                  f"Bearer {REDACTED}")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", warned["timestamp"])
    assert (failed["level"], failed["token"]) == ("error", REDACTED)
    assert "RuntimeError: boom" in failed["exception"]


# --- the canonical request line ---------------------------------------------------------------------------


@pytest.fixture
async def client(aiohttp_client: AiohttpClient) -> TestClient[web.Request, web.Application]:
    app = create_app(Settings(), authenticator=StaticTokenAuthenticator(SECRET), pool=FakePool(),
                     policy=AllowAllPolicy(), publisher=LogPublisher())
    return await aiohttp_client(app)


async def post(client: TestClient[web.Request, web.Application], body: object, *, token: str,
               session: str | None = None) -> ClientResponse:
    headers = {**HEADERS, "Authorization": f"Bearer {token}"}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return await client.post("/mcp", data=json.dumps(body), headers=headers)


async def test_one_http_request_line_per_request(client: TestClient[web.Request, web.Application]) -> None:
    init = jsonrpc.request_message(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    with capture_logs() as logs:
        session = (await post(client, init, token=SECRET)).headers["Mcp-Session-Id"]
        assert (await post(client, jsonrpc.request_message(2, "ping"), token=SECRET, session=session)).status == 200
        assert (await post(client, jsonrpc.request_message(3, "ping"), token=WRONG, session=session)).status == 401
        assert (await client.get("/mcp")).status == 400  # a stream needs a session
    lines = [entry for entry in logs if entry["event"] == "http_request"]
    assert [(e["method"], e["path"], e["status"], e["session_id"]) for e in lines] == [
        ("POST", "/mcp", 200, session),
        ("POST", "/mcp", 200, session),
        ("POST", "/mcp", 401, session),
        ("GET", "/mcp", 400, None),
    ]
    assert [e["rpc_method"] for e in lines] == ["initialize", "ping", "ping", None]
    # Who asked: the verified token's id (never the bearer), and where from.
    assert [e["token_id"] for e in lines] == ["static", "static", None, None]
    assert {e["client"] for e in lines} == {"127.0.0.1"}
    assert all(isinstance(e["duration_ms"], float) and e["duration_ms"] >= 0 for e in lines)
    # Events (session_connect, auth_failure) are logged too, and no log entry carries a bearer token.
    assert {"session_connect", "auth_failure"} <= {entry["event"] for entry in logs}
    assert SECRET not in repr(logs)
    assert WRONG not in repr(logs)


@pytest.mark.parametrize(
    ("path", "log_health", "logged"),
    [
        pytest.param("/healthz", True, True, id="probes-logged-by-default"),
        pytest.param("/healthz", False, False, id="liveness-left-out"),
        pytest.param("/readyz", False, False, id="readiness-left-out"),
        pytest.param("/mcp", False, True, id="everything-else-still-logged"),
        pytest.param("/metrics", False, True, id="metrics-scrapes-still-logged"),
    ],
)
def test_health_probes_may_be_left_out_of_the_access_log(path: str, log_health: bool, logged: bool) -> None:
    assert logs_request(path, log_health=log_health) is logged


async def test_access_log_health_false_drops_probe_lines_but_counts_them(aiohttp_client: AiohttpClient) -> None:
    app = create_app(Settings(access_log_health=False), authenticator=StaticTokenAuthenticator(SECRET),
                     pool=FakePool(), policy=AllowAllPolicy(), publisher=LogPublisher())
    client = await aiohttp_client(app)
    with capture_logs() as logs:
        assert (await client.get("/healthz")).status == 200
        assert (await client.get("/mcp")).status == 400  # a stream needs a session
    assert [e["path"] for e in logs if e["event"] == "http_request"] == ["/mcp"]
    metrics = await (await client.get("/metrics")).text()
    assert 'method="GET",status="200"' in metrics


@pytest.mark.parametrize(
    ("rpc_method", "http_method", "label"),
    [
        pytest.param("tools/call", "POST", "tools/call", id="known-rpc-method"),
        pytest.param("x/made-up-1", "POST", "other", id="invented-rpc-method"),
        pytest.param(None, "GET", "GET", id="plain-http"),
        pytest.param(None, "FOO1", "other", id="invented-http-method"),
    ],
)
def test_metric_labels_stay_a_bounded_set(rpc_method: str | None, http_method: str, label: str) -> None:
    assert metric_label(rpc_method, http_method) == label



class Stream(io.BytesIO):
    """A binary stream that counts its writes (system calls, for a real stdout)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: Any) -> int:
        self.writes += 1
        return super().write(data)


async def test_lines_logged_in_one_turn_of_the_loop_go_out_in_one_write_in_order() -> None:
    stream = Stream()
    sink = LineSink(stream)
    for n in range(5):
        sink.write(b'{"n":%d}\n' % n)
    assert stream.getvalue() == b""  # not yet: the turn is not over
    await asyncio.sleep(0)  # the loop turns once: the flush it was handed runs
    assert stream.getvalue() == b"".join(b'{"n":%d}\n' % n for n in range(5))
    assert stream.writes == 1


async def test_a_line_from_another_thread_is_written_at_once_after_the_pending_ones() -> None:
    stream = Stream()
    sink = LineSink(stream)
    sink.write(b"loop\n")
    await asyncio.to_thread(sink.write, b"worker\n")
    assert stream.getvalue() == b"loop\nworker\n"


def test_outside_the_loop_a_line_is_written_at_once_and_a_closed_stream_is_no_crash() -> None:
    stream = Stream()
    sink = LineSink(stream)
    sink.write(b"start\n")
    assert stream.getvalue() == b"start\n"
    stream.close()
    sink.write(b"after close\n")  # a log line must never take the daemon down
    sink.flush()


class _Recorder:
    """A logger that keeps what each level method was handed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kw: self.calls.append((name, args, kw))


def _drop_skipped(_logger: Any, _name: str, event_dict: Any) -> Any:
    if event_dict.get("skip"):
        raise structlog.DropEvent
    return event_dict


@pytest.mark.parametrize("last", [
    pytest.param(lambda _l, name, d: json.dumps({"level": name, **d}, sort_keys=True).encode(), id="bytes"),
    pytest.param(lambda _l, name, d: json.dumps({"level": name, **d}, sort_keys=True), id="text"),
    pytest.param(lambda _l, name, d: dict(d, level=name), id="dict"),
    pytest.param(lambda _l, name, d: ((name,), dict(d)), id="args-and-kwargs"),
])
@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.WARNING])
def test_the_line_logger_hands_over_what_structlogs_own_logger_would(last: Any, level: int) -> None:
    """The one-frame level methods change the cost of a line, never the line: every call below reaches the
    logger exactly as through structlog's own filtering logger (context, interpolation, drops, levels)."""
    def run(wrapper: type[Any]) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        recorder = _Recorder()
        log = wrapper(recorder, processors=[_drop_skipped, last], context={})
        log.info("plain", n=1)
        log.bind(token_id="t1", n=0).warning("bound %s", "arg", n=2)  # the call's own value beats the context's
        log.warn("by mapping %(who)s", {"who": "you"})
        log.debug("quiet below info", n=3)
        log.error("dropped", skip=True)
        log.info("%d%%", 5)
        log.critical("last")
        return recorder.calls

    mine = run(logs.line_logger_class(level))
    assert mine == run(structlog.make_filtering_bound_logger(level))
    assert not any("dropped" in repr(call) for call in mine)


def test_a_line_loggers_context_is_never_written_into() -> None:
    recorder = _Recorder()
    context = {"token_id": "t1"}
    log = logs.line_logger_class(logging.INFO)(recorder, processors=[lambda _l, _n, d: d], context=context)
    log.info("one", extra=1)
    assert context == {"token_id": "t1"}
    assert recorder.calls == [("info", (), {"token_id": "t1", "extra": 1, "event": "one"})]


async def test_a_call_is_one_info_line_that_carries_its_tool_outcome_and_cost(aiohttp_client: AiohttpClient) -> None:
    app = create_app(Settings(state_dir="memory", tool_costs={"echo": 2.0}),
                     authenticator=StaticTokenAuthenticator(SECRET), pool=FakePool(), publisher=LogPublisher())
    client = await aiohttp_client(app)
    init = jsonrpc.request_message(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    session = (await post(client, init, token=SECRET)).headers["Mcp-Session-Id"]
    call = jsonrpc.request_message(2, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    with capture_logs() as logs:
        assert (await post(client, call, token=SECRET, session=session)).status == 200
    info = [entry for entry in logs if entry["log_level"] == "info"]
    assert [entry["event"] for entry in info] == ["http_request"]
    assert (info[0]["tool"], info[0]["outcome"], info[0]["cost"]) == ("echo", "ok", 2.0)
    # The call's own events still exist (the events file gets them whole), one level down.
    assert {entry["event"] for entry in logs if entry["log_level"] == "debug"} == {"tool_call", "budget_spend"}
