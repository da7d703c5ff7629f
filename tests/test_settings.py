"""SATGATE_* settings: the documented defaults, parsing, and one clear line per bad value naming the variable."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from satgate_mcp.config_problems import format_errors
from satgate_mcp.settings import (
    ENV_PREFIX,
    HttpUpstreamSpec,
    Settings,
    StdioUpstreamSpec,
    load_settings,
    parse_rate,
    unknown_variables,
)

SHORT_KEY = "too-short-key"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no SATGATE_* variable leaks in from the machine running the suite."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def from_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(ENV_PREFIX + name, value)
    return Settings()


def test_defaults_match_the_design() -> None:
    s = Settings()
    assert (s.host, s.port, s.auth_mode) == ("127.0.0.1", 9100, "none")
    assert (s.session_cap, s.session_idle_ttl) == (10000, 1800.0)
    assert s.max_body_bytes == 4 * 1024 * 1024
    assert (s.allowed_hosts, s.allowed_origins, s.upstreams) == ([], [], {})
    assert (s.reuse_port, s.drain_seconds, s.enforcement) == (True, 25.0, "observe")
    assert s.rate_limit is None
    assert s.rate_per_second is None


@pytest.mark.parametrize(
    ("env", "variable", "fragment"),
    [
        pytest.param({"PORT": "abc"}, "SATGATE_PORT", "whole number", id="port-not-a-number"),
        pytest.param({"PORT": "70000"}, "SATGATE_PORT", "65535", id="port-out-of-range"),
        pytest.param({"UPSTREAMS": "{bad"}, "SATGATE_UPSTREAMS", "must be a JSON object", id="upstreams-bad-json"),
        pytest.param({"UPSTREAMS": "[1, 2]"}, "SATGATE_UPSTREAMS", "must be a JSON object",
                     id="upstreams-json-array"),
        pytest.param({"UPSTREAMS": '{"a": {"transport": "carrier-pigeon"}}'}, "SATGATE_UPSTREAMS", "a",
                     id="upstreams-unknown-transport"),
        pytest.param({"UPSTREAMS": '{"a": {"transport": "stdio", "command": []}}'}, "SATGATE_UPSTREAMS", "command",
                     id="upstreams-empty-command"),
        pytest.param({"UPSTREAMS": '{"a": {"transport": "http", "url": "ftp://x"}}'}, "SATGATE_UPSTREAMS", "url",
                     id="upstreams-non-http-url"),
        pytest.param({"UPSTREAMS": '{"a": {"transport": "stdio", "command": ["x"], "timeout": 0}}'},
                     "SATGATE_UPSTREAMS", "timeout", id="upstreams-zero-timeout"),
        pytest.param({"UPSTREAMS": '{"a b": {"transport": "stdio", "command": ["x"]}}'}, "SATGATE_UPSTREAMS",
                     "upstream name", id="upstreams-bad-name"),
        pytest.param({"TOOL_COSTS": "{bad"}, "SATGATE_TOOL_COSTS", "must be a JSON object", id="tool-costs-bad-json"),
        pytest.param({"TOOL_RATE_LIMITS": '{"a*b": "1/s"}'}, "SATGATE_TOOL_RATE_LIMITS", "invalid tool pattern",
                     id="tool-rate-limit-star-inside"),
        pytest.param({"TOOL_RATE_LIMITS": '{"my tool": "1/s"}'}, "SATGATE_TOOL_RATE_LIMITS", "invalid tool pattern",
                     id="tool-rate-limit-pattern-no-token-could-name"),
        pytest.param({"AUTH_MODE": "magic"}, "SATGATE_AUTH_MODE", "none", id="unknown-auth-mode"),
        pytest.param({"AUTH_MODE": "header"}, "SATGATE_ROOT_KEY", "required", id="header-mode-without-root-key"),
        pytest.param({"AUTH_MODE": "header", "ROOT_KEY": SHORT_KEY}, "SATGATE_ROOT_KEY", "at least 32",
                     id="header-mode-short-root-key"),
        pytest.param({"AUTH_MODE": "config"}, "SATGATE_STATIC_TOKEN", "required", id="config-mode-without-token"),
        pytest.param({"RATE_LIMIT": "10 per second"}, "SATGATE_RATE_LIMIT", "10/s", id="rate-limit-syntax"),
        pytest.param({"RATE_LIMIT": "0/s"}, "SATGATE_RATE_LIMIT", "positive", id="rate-limit-zero"),
        pytest.param({"RATE_BURST": "0"}, "SATGATE_RATE_BURST", "1", id="rate-burst-zero"),
        pytest.param({"ENFORCEMENT": "strict"}, "SATGATE_ENFORCEMENT", "observe", id="unknown-enforcement"),
        pytest.param({"SESSION_CAP": "0"}, "SATGATE_SESSION_CAP", "1", id="session-cap-zero"),
        pytest.param({"SESSION_IDLE_TTL": "-5"}, "SATGATE_SESSION_IDLE_TTL", "0", id="negative-ttl"),
        pytest.param({"MAX_BODY_BYTES": "10"}, "SATGATE_MAX_BODY_BYTES", "1024", id="tiny-body-limit"),
        pytest.param({"LOG_LEVEL": "loud"}, "SATGATE_LOG_LEVEL", "DEBUG", id="unknown-log-level"),
        pytest.param({"LOG_FORMAT": "xml"}, "SATGATE_LOG_FORMAT", "json", id="unknown-log-format"),
        pytest.param({"OAUTH_RESOURCE_METADATA_URL": "http://gw.example/meta"}, "SATGATE_OAUTH_RESOURCE_METADATA_URL",
                     "https", id="oauth-metadata-not-https"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], variable: str, fragment: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        from_env(monkeypatch, env)
    text = format_errors(exc.value)
    lines = text.splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("invalid ")
    assert variable in lines[0]
    assert fragment in lines[0]
    assert "Traceback" not in text


def test_every_bad_value_gets_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError) as exc:
        from_env(monkeypatch, {"PORT": "x", "RATE_LIMIT": "fast", "ENFORCEMENT": "strict"})
    lines = format_errors(exc.value).splitlines()
    assert len(lines) == 3
    assert {line.split(":", 1)[0] for line in lines} == {
        "invalid SATGATE_PORT", "invalid SATGATE_RATE_LIMIT", "invalid SATGATE_ENFORCEMENT"}


def test_a_rejected_secret_is_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError) as exc:
        from_env(monkeypatch, {"AUTH_MODE": "header", "ROOT_KEY": SHORT_KEY})
    assert SHORT_KEY not in format_errors(exc.value)


@pytest.mark.parametrize(
    ("variable", "field"),
    [
        pytest.param("ALLOWED_HOSTS", "allowed_hosts", id="allowed-hosts"),
        pytest.param("ALLOWED_ORIGINS", "allowed_origins", id="allowed-origins"),
        pytest.param("OAUTH_AUTHORIZATION_SERVERS", "oauth_authorization_servers", id="authorization-servers"),
    ],
)
def test_comma_lists(monkeypatch: pytest.MonkeyPatch, variable: str, field: str) -> None:
    s = from_env(monkeypatch, {variable: " a.example, b.example:9100 ,, https://c.example "})
    assert getattr(s, field) == ["a.example", "b.example:9100", "https://c.example"]


def test_an_empty_comma_list_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert from_env(monkeypatch, {"ALLOWED_HOSTS": ""}).allowed_hosts == []


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        pytest.param("observe", "observe", id="observe"),
        pytest.param("control", "control", id="control"),
        pytest.param("shadow", "observe", id="shadow-is-observe"),
        pytest.param("hard", "control", id="hard-is-control"),
        pytest.param("soft", "control", id="soft-is-control"),
        pytest.param(" Control ", "control", id="any-case-and-space"),
    ],
)
def test_enforcement_aliases(monkeypatch: pytest.MonkeyPatch, value: str, mode: str) -> None:
    assert from_env(monkeypatch, {"ENFORCEMENT": value}).enforcement == mode


@pytest.mark.parametrize(
    ("text", "per_second"),
    [
        pytest.param("10/s", 10.0, id="per-second"),
        pytest.param("600/m", 10.0, id="per-minute"),
        pytest.param("3600/h", 1.0, id="per-hour"),
        pytest.param("1.5/sec", 1.5, id="fraction"),
        pytest.param(" 30 / minute ", 0.5, id="spaces-and-long-unit"),
    ],
)
def test_rate_syntax(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


def test_rate_limit_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert from_env(monkeypatch, {"RATE_LIMIT": "600/m"}).rate_per_second == pytest.approx(10.0)


def test_upstreams_are_typed_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    s = from_env(monkeypatch, {"UPSTREAMS": """{
        "files": {"transport": "stdio", "command": ["node", "server.js", "stdio"], "env": {"A": "1"}, "timeout": 5},
        "web": {"transport": "http", "url": "http://127.0.0.1:3001/mcp", "headers": {"X-Key": "k"},
                "tool_prefix": "web_"}
    }"""})
    files, web = s.upstreams["files"], s.upstreams["web"]
    assert isinstance(files, StdioUpstreamSpec)
    assert (files.command, files.env, files.timeout) == (["node", "server.js", "stdio"], {"A": "1"}, 5.0)
    assert isinstance(web, HttpUpstreamSpec)
    assert (web.url, web.headers, web.tool_prefix, web.timeout) == ("http://127.0.0.1:3001/mcp", {"X-Key": "k"},
                                                                   "web_", 30.0)


def test_modes_with_their_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    header = from_env(monkeypatch, {"AUTH_MODE": "header", "ROOT_KEY": "k" * 32})
    assert header.root_key is not None
    assert header.root_key.get_secret_value() == "k" * 32
    assert "k" * 32 not in repr(header)


def test_a_config_file_adds_to_the_environment_and_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "satgate.env"
    config.write_text("SATGATE_PORT=9200\nSATGATE_HOST=0.0.0.0\n", encoding="utf-8")
    monkeypatch.setenv("SATGATE_PORT", "9300")
    s = load_settings(config)
    assert (s.host, s.port) == ("0.0.0.0", 9300)


@pytest.mark.parametrize("transport", [
    pytest.param({"transport": "stdio", "command": ["srv"]}, id="stdio"),
    pytest.param({"transport": "http", "url": "http://127.0.0.1:1/mcp"}, id="http"),
])
def test_upstreams_share_one_connection_by_default(transport: dict[str, object]) -> None:
    settings = Settings(upstreams={"u": transport})  # type: ignore[dict-item]
    assert settings.upstreams["u"].isolation == "shared"
    assert settings.upstreams["u"].max_instances == 100


@pytest.mark.parametrize("isolation", [pytest.param("token", id="token"), pytest.param("session", id="session")])
def test_a_stdio_upstream_may_give_each_token_or_session_a_child_of_its_own(isolation: str) -> None:
    spec = {"transport": "stdio", "command": ["srv"], "isolation": isolation, "max_instances": 8}
    settings = Settings(upstreams={"u": spec})  # type: ignore[dict-item]
    assert (settings.upstreams["u"].isolation, settings.upstreams["u"].max_instances) == (isolation, 8)


@pytest.mark.parametrize("isolation", [pytest.param("token", id="token"), pytest.param("session", id="session")])
def test_isolation_on_an_http_upstream_is_refused_at_start_up(isolation: str) -> None:
    """Each HTTP call has its own response stream, so attribution is already exact: the setting means nothing."""
    spec = {"transport": "http", "url": "http://127.0.0.1:1/mcp", "isolation": isolation}
    with pytest.raises(ValidationError, match=f'"isolation": "{isolation}" applies to stdio upstreams only') as err:
        Settings(upstreams={"web": spec})  # type: ignore[dict-item]
    assert 'SATGATE_UPSTREAMS (upstream "web"): "isolation"' in format_errors(err.value)


@pytest.mark.parametrize("bad", [pytest.param({"isolation": "process"}, id="unknown-isolation"),
                                 pytest.param({"max_instances": 0}, id="no-instances")])
def test_a_bad_isolation_or_instance_cap_is_refused_at_start_up(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(upstreams={"u": {"transport": "stdio", "command": ["srv"], **bad}})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        pytest.param(["SATGATE_PORT", "SATGATE_ROOT_KEY", "HOME"], {}, id="known-and-foreign-names-pass"),
        pytest.param(["SATGATE_TOKEN", "SATGATE_TEST_VENV"], {}, id="names-the-scripts-read-pass"),
        pytest.param(["SATGATE_DEPS", "SATGATE_UV"], {}, id="names-scripts-test-sh-exports-pass"),
        pytest.param(["SATGATE_ALLOW_UNKNOWN_VARIABLES"], {}, id="the-opt-out-is-a-setting"),
        pytest.param(["SATGATE_ROOTKEY"], {"SATGATE_ROOTKEY": "SATGATE_ROOT_KEY"}, id="missing-underscore"),
        pytest.param(["SATGATE_AUTH_MOD"], {"SATGATE_AUTH_MOD": "SATGATE_AUTH_MODE"}, id="missing-last-letter"),
        pytest.param(["SATGATE_PROT"], {"SATGATE_PROT": "SATGATE_PORT"}, id="typo-gets-a-suggestion"),
        pytest.param(["satgate_rate_limt"], {"satgate_rate_limt": "SATGATE_RATE_LIMIT"}, id="any-case"),
        pytest.param(["SATGATE_SOMETHING_ELSE"], {"SATGATE_SOMETHING_ELSE": None}, id="no-close-name"),
        pytest.param(["satgate_port"], {}, id="lower-case-known-name-is-read"),
    ],
)
def test_misspelled_satgate_variables_are_named(names: list[str], expected: dict[str, str | None]) -> None:
    assert unknown_variables(names) == expected


#: Misspelled on purpose in the tests (each one checks the suggestion or the refusal).
TYPOS_IN_TESTS = frozenset({"SATGATE_PROT", "SATGATE_RATE_LIMT", "SATGATE_SOMETHING_ELSE", "SATGATE_ROOTKEY",
                            "SATGATE_AUTH_MOD", "SATGATE_FLAVOUR"})
#: Where a SATGATE_* name may end up in the environment of a ``serve`` that the tests, the scripts, the benchmarks
#: or CI start, or that an operator copies from the docs.
STARTED_FROM = ("tests", "scripts", "bench", "README.md", "docs", "config", "Dockerfile", "fly.toml", ".ci")


def test_no_name_the_repository_sets_is_refused_as_unknown() -> None:
    """``serve`` refuses unknown SATGATE_* names: one exported by a script or a test harness would stop it."""
    repo = Path(__file__).resolve().parents[1]
    files = [path for entry in STARTED_FROM for path in ([repo / entry] if (repo / entry).is_file() else
                                                         sorted((repo / entry).rglob("*")))
             if path.is_file() and "__pycache__" not in path.parts]
    names = {name for path in files for name in re.findall(r"\bSATGATE_[A-Z0-9_]*[A-Z0-9]\b",
                                                           path.read_text(errors="replace"))}
    assert set(unknown_variables(names)) <= TYPOS_IN_TESTS
