"""The pure rules of the upstream layer, each from a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from satgate_mcp import SERVER_NAME, __version__, jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import initialize_timeout
from satgate_mcp.upstream.http_rules import request_headers, status_problem
from satgate_mcp.upstream.wire import (
    RestartPolicy,
    SseDecoder,
    SseEvent,
    backoff_delay,
    check_initialize_result,
    child_env,
    command_problem,
    describe_exit,
    initialize_params,
    is_pool_notification,
    restart_plan,
    rewrite_progress_token,
    unattributed_refusal,
)


@pytest.mark.parametrize(
    ("params", "new_params", "caller_token"),
    [
        pytest.param(None, None, None, id="no-params"),
        pytest.param({"name": "x"}, {"name": "x"}, None, id="no-meta"),
        pytest.param({"_meta": {"other": 1}}, {"_meta": {"other": 1}}, None, id="meta-without-token"),
        pytest.param({"_meta": {"progressToken": "abc", "k": 2}, "name": "x"},
                     {"_meta": {"progressToken": "gw-1", "k": 2}, "name": "x"}, "abc", id="string-token"),
        pytest.param({"_meta": {"progressToken": 7}}, {"_meta": {"progressToken": "gw-1"}}, 7, id="integer-token"),
        pytest.param({"_meta": {"progressToken": True}}, {"_meta": {"progressToken": True}}, None,
                     id="bool-is-not-a-token"),
    ],
)
def test_the_callers_progress_token_is_swapped_for_the_gateways(
    params: JsonObj | None, new_params: JsonObj | None, caller_token: Any
) -> None:
    assert rewrite_progress_token(params, "gw-1") == (new_params, caller_token)


@pytest.mark.parametrize(
    ("method", "pool"),
    [
        pytest.param("notifications/tools/list_changed", True, id="tools-changed-is-the-pools"),
        pytest.param("notifications/prompts/list_changed", True, id="prompts-changed-is-the-pools"),
        pytest.param("notifications/resources/updated", True, id="resource-updated-is-the-pools"),
        pytest.param("notifications/message", False, id="log-message-belongs-to-a-call"),
        pytest.param("notifications/elicitation/complete", False, id="elicitation-complete-belongs-to-a-call"),
        pytest.param("notifications/custom", False, id="anything-else-belongs-to-a-call"),
    ],
)
def test_only_notifications_about_the_upstream_itself_skip_attribution(method: str, pool: bool) -> None:
    assert is_pool_notification(method) is pool


@pytest.mark.parametrize("shared_pipe", [pytest.param(True, id="stdio"), pytest.param(False, id="http")])
def test_an_unattributable_request_is_refused_naming_the_isolation_setting(shared_pipe: bool) -> None:
    answer = unattributed_refusal(jsonrpc.Request(4, "roots/list", None), "files", shared_pipe=shared_pipe)
    assert answer["id"] == 4
    assert answer["error"]["data"] == {"error": "unattributable", "upstream": "files", "isolation": "shared"}
    assert "'roots/list'" in answer["error"]["message"]
    assert ('"isolation": "shared"' in answer["error"]["message"]) is shared_pipe


def test_the_gateway_offers_upstreams_the_client_features_it_relays() -> None:
    assert initialize_params()["capabilities"] == {"sampling": {}, "elicitation": {"form": {}, "url": {}},
                                                   "roots": {}}


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [pytest.param(0, 0.1, id="first"), pytest.param(3, 0.8, id="doubling"), pytest.param(10, 10.0, id="capped"),
     pytest.param(10_000, 10.0, id="huge-attempt")],
)
def test_backoff_doubles_up_to_a_cap(attempt: int, delay: float) -> None:
    assert backoff_delay(attempt, base=0.1, cap=10.0) == pytest.approx(delay)


@pytest.mark.parametrize(
    ("attempt", "uptime", "plan"),
    [
        pytest.param(0, 0.5, (0.1, 1), id="first-crash"),
        pytest.param(4, 0.5, (1.6, 5), id="crash-loop-backs-off"),
        pytest.param(4, 60.0, (0.1, 1), id="stable-child-starts-over"),
    ],
)
def test_restart_plan(attempt: int, uptime: float, plan: tuple[float, int]) -> None:
    delay, next_attempt = restart_plan(attempt, uptime, RestartPolicy(base=0.1, cap=10.0, stable_after=30.0))
    assert (round(delay, 6), next_attempt) == plan


def test_a_child_inherits_only_a_minimal_environment() -> None:
    inherited = {"PATH": "/bin", "HOME": "/h", "SATGATE_ROOT_KEY": "secret", "AWS_SECRET_ACCESS_KEY": "x"}
    assert child_env(inherited, {"API_KEY": "k", "PATH": "/opt/bin"}) == {"PATH": "/opt/bin", "HOME": "/h",
                                                                          "API_KEY": "k"}


@pytest.mark.parametrize(
    ("code", "text"),
    [pytest.param(0, "exited with status 0", id="clean"), pytest.param(3, "exited with status 3", id="failed"),
     pytest.param(-9, "killed by SIGKILL", id="killed"), pytest.param(None, "still running", id="running")],
)
def test_exit_descriptions(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        pytest.param({"result": {"protocolVersion": "2025-06-18", "capabilities": {}}}, None, id="ok"),
        pytest.param({"result": {"protocolVersion": "2024-11-05", "capabilities": {}}}, None, id="older-ok"),
        pytest.param({"result": {"protocolVersion": "1999-01-01"}}, "does not know", id="unknown-version"),
        pytest.param({"error": {"code": -32600, "message": "nope"}}, "nope", id="error"),
        pytest.param({"result": 3}, "without a result", id="not-an-object"),
    ],
)
def test_initialize_results_are_checked(reply: JsonObj, problem: str | None) -> None:
    if problem is None:
        assert check_initialize_result(reply) == reply["result"]
    else:
        with pytest.raises(ValueError, match=problem):
            check_initialize_result(reply)


SSE_TEXT = b'event: message\r\ndata: {"a":\r\ndata: 1}\r\n\r\n: keepalive comment\n\nid: 7\ndata: two\n\n'
SSE_EVENTS = [SseEvent("message", '{"a":\n1}', None), SseEvent("message", "two", "7")]


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([SSE_TEXT], id="one-chunk"),
        pytest.param([bytes([b]) for b in SSE_TEXT], id="byte-by-byte"),
        pytest.param([SSE_TEXT[:19], SSE_TEXT[19:]], id="split-inside-crlf"),
    ],
)
def test_sse_events_survive_any_chunking(chunks: list[bytes]) -> None:
    decoder = SseDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    assert events == SSE_EVENTS


def test_sse_multibyte_characters_split_across_chunks() -> None:
    data = "data: h\u00e9\u00e9\n\n".encode()
    decoder = SseDecoder()
    events = decoder.feed(data[:8]) + decoder.feed(data[8:])
    assert events == [SseEvent("message", "h\u00e9\u00e9")]


def test_sse_refuses_an_endless_event() -> None:
    with pytest.raises(ValueError, match="larger than"):
        SseDecoder(max_buffer=10).feed(b"data: " + b"x" * 20)


def test_configured_headers_cannot_replace_protocol_headers() -> None:
    headers = request_headers({"Authorization": "Bearer upstream-own", "accept": "text/html", "X-Key": "k"},
                              accept="application/json, text/event-stream", session_id="s1",
                              protocol_version="2025-06-18", json_body=True)
    assert headers == {"Authorization": "Bearer upstream-own", "X-Key": "k",
                       "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
                       "Mcp-Session-Id": "s1", "MCP-Protocol-Version": "2025-06-18"}


@pytest.mark.parametrize(
    ("status", "had_session", "text"),
    [
        pytest.param(401, False, "credentials", id="unauthorized"),
        pytest.param(202, False, "without replying", id="accepted"),
        pytest.param(404, True, "again", id="404-after-renewal"),
        pytest.param(200, False, "before replying", id="stream-ended-early"),
        pytest.param(502, False, "HTTP 502", id="bad-gateway"),
    ],
)
def test_http_statuses_explain_themselves(status: int, had_session: bool, text: str) -> None:
    assert text in status_problem(status, had_session=had_session)


@pytest.mark.parametrize(
    ("call_timeout", "handshake"),
    [pytest.param(0.5, 10.0, id="short-call-timeout-still-lets-a-cold-child-start"),
     pytest.param(60.0, 60.0, id="long-call-timeout-is-kept")],
)
def test_the_handshake_timeout_is_never_shorter_than_a_cold_start(call_timeout: float, handshake: float) -> None:
    assert initialize_timeout(call_timeout) == handshake


def test_the_gateway_introduces_itself_upstream_by_its_own_name_and_version() -> None:
    assert initialize_params()["clientInfo"] == {"name": SERVER_NAME, "version": __version__}


@pytest.fixture
def programs(tmp_path: Path) -> Path:
    """A folder with one executable and one plain file, to be found by name on PATH or by path."""
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    (tmp_path / "notes").write_text("not a program\n")
    return tmp_path


@pytest.mark.parametrize(
    ("command", "cwd", "on_path", "problem"),
    [
        pytest.param("tool", None, True, None, id="name-on-the-childs-path"),
        pytest.param("tool", None, False, "command 'tool' is not found on PATH", id="name-not-on-path"),
        pytest.param("no-such-program", None, True, "is not found on PATH", id="missing-name"),
        pytest.param("./tool", ".", False, None, id="path-relative-to-cwd"),
        pytest.param("./notes", ".", False, "command './notes' is not an executable file", id="not-executable"),
        pytest.param("/nonexistent/bin/x", None, False, "is not an executable file", id="missing-absolute-path"),
        pytest.param("tool", "missing-dir", True, "its cwd", id="cwd-missing"),
    ],
)
def test_a_stdio_command_that_cannot_start_is_named_at_start(
    programs: Path, command: str, cwd: str | None, on_path: bool, problem: str | None
) -> None:
    env = {"PATH": str(programs) if on_path else "/nonexistent"}
    where = None if cwd is None else str(programs / cwd)
    found = command_problem("fs", command, where, env)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith("upstream 'fs': ")
        assert problem in found


@pytest.mark.parametrize(("line", "retry_ms"), [
    pytest.param("retry: 250", 250, id="milliseconds"),
    pytest.param("retry: \u00b2", None, id="superscript-is-no-number"),
    pytest.param("retry: -1", None, id="negative-ignored"),
    pytest.param("retry: soon", None, id="words-ignored"),
])
def test_a_streams_retry_field_is_read_only_when_it_is_ascii_digits(line: str, retry_ms: int | None) -> None:
    decoder = SseDecoder()
    events = decoder.feed(f"{line}\ndata: x\n\n".encode())
    assert [e.data for e in events] == ["x"]
    assert decoder.retry_ms == retry_ms
