"""What ``serve`` prints when the configuration is wrong: the exact stderr lines (issue 23).

Each problem is one line ``satgate-mcp: invalid <VARIABLE or --flag>[ (<where>)]: <problem>; e.g. <example>``;
an unknown ``SATGATE_*`` name stops the start too, unless ``SATGATE_ALLOW_UNKNOWN_VARIABLES=true``. The tables run
``cli.main(["serve", ...])`` in process: a start that should fail never reaches the (stubbed) daemon.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
from pydantic_settings import SettingsError

from satgate_mcp import cli
from satgate_mcp.config_problems import (
    SPEC_FIELDS,
    format_settings_error,
    setting_example,
    unknown_variables_line,
)
from satgate_mcp.exits import ExitCode
from satgate_mcp.settings import HttpUpstreamSpec, Settings, StdioUpstreamSpec
from tests.fakes import stub_daemon

STDIO = '{"transport": "stdio", "command": ["node", "server.js", "stdio"]}'
HTTP = '{"transport": "http", "url": "http://127.0.0.1:3001/mcp"}'
ROOT_KEY_EXAMPLE = "SATGATE_ROOT_KEY=\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')\""
OPT_OUT_HINT = "fix the name, or set SATGATE_ALLOW_UNKNOWN_VARIABLES=true to start anyway"


class Daemon:
    """The stubbed ``serve``: what it was started with, if it was."""

    def __init__(self) -> None:
        self.started: list[Settings] = []

    def serve(self, settings: Settings) -> ExitCode:
        self.started.append(settings)
        return ExitCode.OK


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> Daemon:
    """No SATGATE_* from the machine running the suite; the daemon and its logging stubbed out."""
    for name in list(os.environ):
        if name.startswith("SATGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SATGATE_STATE_DIR", "memory")
    stub = Daemon()
    stub_daemon(monkeypatch, stub.serve)
    return stub


def upstream(spec: str) -> str:
    return f'{{"a": {spec}}}'


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        pytest.param("SATGATE_UPSTREAMS", upstream('{"command": ["srv"]}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): missing "transport": expected "stdio" (run a command) '
                     f'or "http" (call a URL); e.g. "a": {STDIO}', id="upstream-without-transport"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"url": "http://127.0.0.1:3001/mcp"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): missing "transport": expected "stdio" (run a command) '
                     f'or "http" (call a URL); e.g. "a": {HTTP}', id="upstream-with-a-url-without-transport"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "sse", "url": "http://x/sse"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): "transport" must be "stdio" or "http", got "sse"; '
                     f'e.g. "a": {HTTP}', id="upstream-unknown-transport"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "stdio", "command": "node server.js"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): "command" must be a JSON list of strings (the program, '
                     'then its arguments), got "node server.js"; e.g. "a": {..., "command": ["node", "server.js", '
                     '"stdio"]}', id="upstream-command-not-a-list"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "stdio"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): missing "command": expected a JSON list of strings '
                     f'(the program, then its arguments); e.g. "a": {STDIO}', id="upstream-command-missing"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "stdio", "command": []}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): "command" must be a JSON list of strings (the program, '
                     'then its arguments), got []; e.g. "a": {..., "command": ["node", "server.js", "stdio"]}',
                     id="upstream-command-empty"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "stdio", "command": ["srv", 8080]}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): "command" entry 1 must be a string, got 8080; '
                     'e.g. "a": {..., "command": ["node", "server.js", "stdio"]}', id="upstream-command-entry-number"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "http"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): missing "url": expected an http:// or https:// URL; '
                     f'e.g. "a": {HTTP}', id="upstream-url-missing"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "http", "url": "127.0.0.1:3001/mcp"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): "url" must be an http:// or https:// URL, got '
                     '"127.0.0.1:3001/mcp"; e.g. "a": {..., "url": "http://127.0.0.1:3001/mcp"}',
                     id="upstream-url-without-scheme"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "stdio", "command": ["srv"], "timout": 5}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): unknown field "timout" (did you mean "timeout"?); '
                     '"transport": "stdio" takes transport, command, env, cwd, timeout, tool_prefix, protocol, '
                     'isolation, max_instances; e.g. "a": {..., "timeout": 30}', id="upstream-misspelled-field"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "stdio", "command": ["srv"], "url": "http://x"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): unknown field "url" (it belongs to "transport": '
                     '"http"); "transport": "stdio" takes transport, command, env, cwd, timeout, tool_prefix, '
                     f'protocol, isolation, max_instances; e.g. "a": {STDIO}',
                     id="upstream-field-of-the-other-transport"),
        pytest.param("SATGATE_UPSTREAMS", upstream('"node server.js"'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): each upstream must be a JSON object, got '
                     f'"node server.js"; e.g. "a": {STDIO}', id="upstream-spec-not-an-object"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "stdio", "command": ["srv"], "timeout": "30s"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): "timeout" must be a number of seconds greater than 0, '
                     'got "30s"; e.g. "a": {..., "timeout": 30}', id="upstream-timeout-with-a-unit"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "stdio", "command": ["srv"], "isolation": "user"}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): "isolation" must be "shared", "token" or "session", '
                     'got "user"; e.g. "a": {..., "isolation": "shared"}', id="upstream-isolation-unknown"),
        pytest.param("SATGATE_UPSTREAMS", upstream('{"transport": "http", "url": "http://x", '
                                                   '"headers": {"Authorization": ["Bearer s3cret"]}}'),
                     'invalid SATGATE_UPSTREAMS (upstream "a"): "headers" entry "Authorization" must be a string, '
                     'got a JSON list; e.g. "a": {..., "headers": {"Authorization": "Bearer ..."}}',
                     id="upstream-header-value-never-echoed"),
        pytest.param("SATGATE_UPSTREAMS", "{'a': {}}",
                     "invalid SATGATE_UPSTREAMS: must be a JSON object (Expecting property name enclosed in double "
                     f"quotes at position 1); e.g. SATGATE_UPSTREAMS='{{\"files\": {STDIO}}}'",
                     id="upstreams-single-quoted-json"),
        pytest.param("SATGATE_UPSTREAMS", f"[{STDIO}]",
                     "invalid SATGATE_UPSTREAMS: must be a JSON object; "
                     f"e.g. SATGATE_UPSTREAMS='{{\"files\": {STDIO}}}'",
                     id="upstreams-a-list-not-an-object"),
        pytest.param("SATGATE_RATE_LIMIT", "10 per second",
                     "invalid SATGATE_RATE_LIMIT: expected a positive rate like '10/s' or '600/m', got "
                     "'10 per second'; e.g. SATGATE_RATE_LIMIT=10/s", id="rate-limit-in-words"),
        pytest.param("SATGATE_TOOL_RATE_LIMITS", '{"search": "fast"}',
                     "invalid SATGATE_TOOL_RATE_LIMITS: 'search': expected a positive rate like '10/s' or '600/m', "
                     "got 'fast'; e.g. SATGATE_TOOL_RATE_LIMITS='{\"search\": \"5/s\", \"db_*\": \"600/m\"}'",
                     id="tool-rate-limit-in-words"),
        pytest.param("SATGATE_TOOL_COSTS", '{"search": "cheap"}',
                     'invalid SATGATE_TOOL_COSTS ("search"): expected a number, got "cheap"; '
                     "e.g. SATGATE_TOOL_COSTS='{\"search\": 1, \"db_*\": 5}'", id="tool-cost-not-a-number"),
        pytest.param("SATGATE_TOOL_COSTS", '{"search": -1}',
                     'invalid SATGATE_TOOL_COSTS ("search"): expected a number of at least 0, got -1; '
                     "e.g. SATGATE_TOOL_COSTS='{\"search\": 1, \"db_*\": 5}'", id="tool-cost-negative"),
        pytest.param("SATGATE_PORT", "http",
                     "invalid SATGATE_PORT: expected a whole number from 0 to 65535, got 'http'; "
                     "e.g. SATGATE_PORT=9100",
                     id="port-not-a-number"),
        pytest.param("SATGATE_PORT", "70000",
                     "invalid SATGATE_PORT: expected a whole number from 0 to 65535, got '70000'; "
                     "e.g. SATGATE_PORT=9100",
                     id="port-out-of-range"),
        pytest.param("SATGATE_SESSION_IDLE_TTL", "30m",
                     "invalid SATGATE_SESSION_IDLE_TTL: expected a number greater than 0, got '30m'; "
                     "e.g. SATGATE_SESSION_IDLE_TTL=1800", id="seconds-with-a-unit"),
        pytest.param("SATGATE_MAX_BODY_BYTES", "4MiB",
                     "invalid SATGATE_MAX_BODY_BYTES: expected a whole number of at least 1024, got '4MiB'; "
                     "e.g. SATGATE_MAX_BODY_BYTES=4194304", id="bytes-with-a-unit"),
        pytest.param("SATGATE_RATE_BURST", "0",
                     "invalid SATGATE_RATE_BURST: expected a whole number of at least 1, got '0'; "
                     "e.g. SATGATE_RATE_BURST=20", id="burst-zero"),
        pytest.param("SATGATE_REUSE_PORT", "enabled",
                     "invalid SATGATE_REUSE_PORT: expected true or false, got 'enabled'; e.g. SATGATE_REUSE_PORT=true",
                     id="bool-in-words"),
        pytest.param("SATGATE_AUTH_MODE", "macaroon",
                     "invalid SATGATE_AUTH_MODE: expected none, config, header or oauth, got 'macaroon'; "
                     "e.g. SATGATE_AUTH_MODE=header", id="auth-mode-unknown"),
        pytest.param("SATGATE_STORE_FAIL_MODE", "fail-open",
                     "invalid SATGATE_STORE_FAIL_MODE: expected closed or open, got 'fail-open'; "
                     "e.g. SATGATE_STORE_FAIL_MODE=closed", id="store-fail-mode-unknown"),
        pytest.param("SATGATE_LOG_FORMAT", "text",
                     "invalid SATGATE_LOG_FORMAT: expected json or console, got 'text'; e.g. SATGATE_LOG_FORMAT=json",
                     id="log-format-unknown"),
        pytest.param("SATGATE_LOG_LEVEL", "verbose",
                     "invalid SATGATE_LOG_LEVEL: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL; "
                     "e.g. SATGATE_LOG_LEVEL=INFO", id="log-level-unknown"),
        pytest.param("SATGATE_ENFORCEMENT", "strict",
                     "invalid SATGATE_ENFORCEMENT: must be 'observe' or 'control' (or the older 'shadow', 'hard', "
                     "'soft'); e.g. SATGATE_ENFORCEMENT=observe", id="enforcement-unknown"),
        pytest.param("SATGATE_OAUTH_TOOL_SCOPES", '{"db_*": 1}',
                     'invalid SATGATE_OAUTH_TOOL_SCOPES ("db_*"): expected a string, got 1; '
                     "e.g. SATGATE_OAUTH_TOOL_SCOPES='{\"db_*\": \"db:write\", \"*\": \"mcp:use\"}'",
                     id="scope-not-a-string"),
        pytest.param("SATGATE_HOST", " ",
                     "invalid SATGATE_HOST: expected an IP address or host name such as 127.0.0.1, 0.0.0.0 or ::, "
                     "got ' '; e.g. SATGATE_HOST=127.0.0.1", id="host-blank"),
        pytest.param("SATGATE_AUTH_MODE", "header",
                     f"invalid SATGATE_ROOT_KEY: required when SATGATE_AUTH_MODE=header; e.g. {ROOT_KEY_EXAMPLE}",
                     id="header-mode-without-root-key"),
        pytest.param("SATGATE_AUTH_MODE", "config",
                     "invalid SATGATE_STATIC_TOKEN: required when SATGATE_AUTH_MODE=config; e.g. SATGATE_STATIC_TOKEN="
                     "\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')\"",
                     id="config-mode-without-token"),
    ],
)
def test_each_bad_value_is_one_readable_line(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    variable: str, value: str, line: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert cli.main(["serve"]) == ExitCode.CONFIG
    assert capsys.readouterr().err == f"satgate-mcp: {line}\n"
    assert daemon.started == []


def test_a_short_root_key_is_named_never_echoed(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SATGATE_AUTH_MODE", "header")
    monkeypatch.setenv("SATGATE_ROOT_KEY", "hunter2-hunter2")
    assert cli.main(["serve"]) == ExitCode.CONFIG
    assert capsys.readouterr().err == (
        f"satgate-mcp: invalid SATGATE_ROOT_KEY: must be at least 32 characters; e.g. {ROOT_KEY_EXAMPLE}\n")


def test_every_problem_is_its_own_prefixed_line(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SATGATE_PORT", "x")
    monkeypatch.setenv("SATGATE_REUSE_PORT", "perhaps")
    monkeypatch.setenv("SATGATE_UPSTREAMS", upstream('{"transport": "http"}'))
    assert cli.main(["serve"]) == ExitCode.CONFIG
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":", 2)[:2] for line in lines] == [
        ["satgate-mcp", " invalid SATGATE_PORT"], ["satgate-mcp", ' invalid SATGATE_UPSTREAMS (upstream "a")'],
        ["satgate-mcp", " invalid SATGATE_REUSE_PORT"]]


# --- unknown SATGATE_* names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unknown", "line"),
    [
        pytest.param({"SATGATE_AUTH_MOD": "SATGATE_AUTH_MODE"},
                     "unknown variable SATGATE_AUTH_MOD (did you mean SATGATE_AUTH_MODE?): nothing reads it; "
                     + OPT_OUT_HINT, id="one-with-a-guess"),
        pytest.param({"SATGATE_FLAVOUR": None},
                     "unknown variable SATGATE_FLAVOUR: nothing reads it; " + OPT_OUT_HINT, id="one-without-a-guess"),
        pytest.param({"SATGATE_ROOTKEY": "SATGATE_ROOT_KEY", "SATGATE_FLAVOUR": None},
                     "unknown variables SATGATE_FLAVOUR, SATGATE_ROOTKEY (did you mean SATGATE_ROOT_KEY?): nothing "
                     "reads them; " + OPT_OUT_HINT, id="several-in-one-line"),
    ],
)
def test_the_unknown_variables_line(unknown: dict[str, str | None], line: str) -> None:
    assert unknown_variables_line(unknown) == line


@pytest.mark.parametrize(
    ("env", "config", "lines"),
    [
        pytest.param({"SATGATE_AUTH_MOD": "header"}, "",
                     ["unknown variable SATGATE_AUTH_MOD (did you mean SATGATE_AUTH_MODE?): nothing reads it; "
                      + OPT_OUT_HINT], id="a-typo-that-would-turn-auth-off"),
        pytest.param({}, "SATGATE_PROT=9200\n",
                     ["unknown variable SATGATE_PROT (did you mean SATGATE_PORT?): nothing reads it; " + OPT_OUT_HINT],
                     id="a-typo-in-the-config-file"),
        pytest.param({"SATGATE_AUTH_MODE": "header", "SATGATE_ROOTKEY": "k" * 40}, "",
                     ["unknown variable SATGATE_ROOTKEY (did you mean SATGATE_ROOT_KEY?): nothing reads it; "
                      + OPT_OUT_HINT,
                      f"invalid SATGATE_ROOT_KEY: required when SATGATE_AUTH_MODE=header; e.g. {ROOT_KEY_EXAMPLE}"],
                     id="the-typo-that-explains-a-missing-setting-comes-first"),
        pytest.param({"SATGATE_AUTH_MODE": "header", "SATGATE_ROOTKEY": "k" * 40,
                      "SATGATE_ALLOW_UNKNOWN_VARIABLES": "true"}, "",
                     [f"invalid SATGATE_ROOT_KEY: required when SATGATE_AUTH_MODE=header; e.g. {ROOT_KEY_EXAMPLE}"],
                     id="opted-out-a-bad-value-is-still-refused"),
        pytest.param({"SATGATE_RATE_LIMT": "5/s", "SATGATE_ALLOW_UNKNOWN_VARIABLES": "maybe"}, "",
                     ["unknown variable SATGATE_RATE_LIMT (did you mean SATGATE_RATE_LIMIT?): nothing reads it; "
                      + OPT_OUT_HINT,
                      "invalid SATGATE_ALLOW_UNKNOWN_VARIABLES: expected true or false, got 'maybe'; "
                      "e.g. SATGATE_ALLOW_UNKNOWN_VARIABLES=false"], id="an-opt-out-that-is-not-a-bool-is-none"),
    ],
)
def test_an_unknown_variable_stops_serve(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    env: dict[str, str], config: str, lines: list[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "satgate.env"
    path.write_text(config)
    assert cli.main(["serve", "--config", str(path)]) == ExitCode.CONFIG
    assert capsys.readouterr().err.splitlines() == [f"satgate-mcp: {line}" for line in lines]
    assert daemon.started == []


@pytest.mark.parametrize(
    ("env", "config"),
    [
        pytest.param({"SATGATE_RATE_LIMT": "5/s", "SATGATE_ALLOW_UNKNOWN_VARIABLES": "true"}, "",
                     id="opted-out-in-the-environment"),
        pytest.param({"SATGATE_RATE_LIMT": "5/s"}, "SATGATE_ALLOW_UNKNOWN_VARIABLES=true\n",
                     id="opted-out-in-the-config-file"),
        pytest.param({"SATGATE_TOKEN": "t", "SATGATE_BIN": "satgate-mcp", "SATGATE_TEST_VENV": ".venv",
                      "SATGATE_CONFORMANCE": "0", "SATGATE_DEPS": "newest", "SATGATE_UV": "uv"}, "",
                     id="names-the-scripts-and-clients-read"),
        pytest.param({"satgate_port": "9200"}, "", id="a-known-name-in-lower-case"),
    ],
)
def test_serve_starts_when_every_name_is_read_or_the_operator_opted_out(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    env: dict[str, str], config: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "satgate.env"
    path.write_text(config)
    assert cli.main(["serve", "--config", str(path)]) == ExitCode.OK
    assert capsys.readouterr().err == ""
    assert len(daemon.started) == 1


# --- serve --host / --port -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "overrides", "flags"),
    [
        pytest.param([], {}, {}, id="no-flags"),
        pytest.param(["--port", "9400"], {"port": "9400"}, {"port": "--port"}, id="port"),
        pytest.param(["--host", "0.0.0.0", "--handover"], {"host": "0.0.0.0", "handover": True},
                     {"host": "--host", "handover": "--handover"}, id="host-and-handover"),
        pytest.param(["--port", "0"], {"port": "0"}, {"port": "--port"}, id="port-zero-is-given"),
    ],
)
def test_serve_overrides(argv: list[str], overrides: dict[str, object], flags: dict[str, str]) -> None:
    args = cli.build_parser().parse_args(["serve", *argv])
    assert isinstance(args, argparse.Namespace)
    assert cli.serve_overrides(args) == (overrides, flags)


@pytest.mark.parametrize(
    ("argv", "env", "config", "where"),
    [
        pytest.param(["--port", "9400"], {}, "", ("127.0.0.1", 9400), id="port-flag"),
        pytest.param(["--port", "9400", "--host", "::1"], {"SATGATE_PORT": "9300", "SATGATE_HOST": "127.0.0.2"},
                     "SATGATE_PORT=9200\nSATGATE_HOST=127.0.0.3\n", ("::1", 9400),
                     id="flags-win-over-the-environment-and-the-file"),
        pytest.param(["--port", "9400"], {"SATGATE_PORT": "not-a-port"}, "", ("127.0.0.1", 9400),
                     id="a-bad-variable-the-flag-beats-is-never-read"),
        pytest.param([], {"SATGATE_PORT": "9300"}, "SATGATE_PORT=9200\n", ("127.0.0.1", 9300),
                     id="without-flags-the-environment-wins-over-the-file"),
    ],
)
def test_serve_host_and_port_flags_win(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    argv: list[str], env: dict[str, str], config: str, where: tuple[str, int],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "satgate.env"
    path.write_text(config)
    assert cli.main(["serve", "--config", str(path), *argv]) == ExitCode.OK
    [settings] = daemon.started
    assert (settings.host, settings.port) == where


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        pytest.param(["--port", "http"],
                     "invalid --port: expected a whole number from 0 to 65535, got 'http'; e.g. --port 9100",
                     id="port-not-a-number"),
        pytest.param(["--port", "65536"],
                     "invalid --port: expected a whole number from 0 to 65535, got '65536'; e.g. --port 9100",
                     id="port-out-of-range"),
        pytest.param(["--host", ""],
                     "invalid --host: expected an IP address or host name such as 127.0.0.1, 0.0.0.0 or ::, got ''; "
                     "e.g. --host 127.0.0.1", id="host-empty"),
    ],
)
def test_a_bad_flag_is_one_line_naming_the_flag(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str], line: str,
) -> None:
    monkeypatch.setenv("SATGATE_PORT", "9300")  # a good variable the bad flag beats: the flag is what to fix
    assert cli.main(["serve", *argv]) == ExitCode.CONFIG
    assert capsys.readouterr().err == f"satgate-mcp: {line}\n"
    assert daemon.started == []


# --- every setting and spec field has an example -------------------------------------------------------------------


@pytest.mark.parametrize("field", list(Settings.model_fields))
def test_every_setting_has_an_example(field: str) -> None:
    assert setting_example(field), f"add SATGATE_{field.upper()} to SETTING_EXAMPLES in satgate_mcp/config_problems.py"


@pytest.mark.parametrize("field", sorted(set(StdioUpstreamSpec.model_fields) | set(HttpUpstreamSpec.model_fields)))
def test_every_upstream_spec_field_has_an_example(field: str) -> None:
    what, pair = SPEC_FIELDS[field]
    assert what
    assert pair.startswith(f'"{field}": ')
    json.loads("{" + pair + "}")


@pytest.mark.parametrize(
    ("message", "cause", "line"),
    [
        pytest.param('error parsing value for field "upstreams" from source "EnvSettingsSource"',
                     json.JSONDecodeError("Expecting value", "x", 0),
                     "invalid SATGATE_UPSTREAMS: must be valid JSON (Expecting value at position 0); "
                     f"e.g. SATGATE_UPSTREAMS='{{\"files\": {STDIO}}}'", id="json-field"),
        pytest.param("something else", None, "invalid configuration: must be valid JSON", id="no-field-named"),
    ],
)
def test_a_settings_source_error_names_the_variable(message: str, cause: Exception | None, line: str) -> None:
    exc = SettingsError(message)
    exc.__cause__ = cause
    assert format_settings_error(exc) == line
