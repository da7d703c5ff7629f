"""The ``satgate-mcp`` command line: the real entry point for the token workflow, ``main()`` for the edges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from satgate_mcp import cli
from satgate_mcp.auth.macaroons import verify_token
from satgate_mcp.exits import ExitCode
from satgate_mcp.settings import Settings
from tests.fakes import stub_daemon

KEY = "r" * 40


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATGATE_")}
    env.update(SATGATE_STATE_DIR="memory", **extra)
    return env


def run(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "satgate_mcp", *args], input=stdin, capture_output=True, text=True,
        env=clean_env(**env), timeout=30, check=False,
    )


@pytest.fixture
def no_satgate_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("SATGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SATGATE_STATE_DIR", "memory")  # no state folder in the repository
    return monkeypatch


# --- the real console entry ----------------------------------------------------------------------


@pytest.mark.process
def test_mint_inspect_revoke_end_to_end(tmp_path: Path) -> None:
    revoked = tmp_path / "revoked"
    # Unrelated settings are broken on purpose: the token commands must not care.
    env = {"SATGATE_ROOT_KEY": KEY, "SATGATE_REVOCATION_FILE": str(revoked), "SATGATE_PORT": "abc",
           "SATGATE_UPSTREAMS": "not json"}

    minted = run("token", "mint", "--id", "tok-alice", "--ttl", "3600", "--tools", "search, db_*",
                 "--budget-id", "team-a", "--budget-limit", "25", "--tenant", "acme", **env)
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip()
    assert minted.stdout == token + "\n", "exactly one token on stdout"
    ident = verify_token(KEY, token, now=0)
    assert (ident.token_id, ident.budget_id, ident.tenant, ident.budget_limit) == ("tok-alice", "team-a", "acme", 25)
    assert ident.tool_filters == (("search", "db_*"),)

    inspected = run("token", "inspect", token, **env)
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)
    assert (info["token_id"], info["verified"], info["revoked"]) == ("tok-alice", True, False)
    assert info["caveats"][1:] == ["tools = search,db_*", "budget_limit = 25"]

    revoke = run("token", "revoke", "tok-alice", **env)
    assert revoke.returncode == 0, revoke.stderr
    assert revoked.read_text() == "tok-alice\n"

    after = run("token", "inspect", "-", stdin=token + "\n", **env)
    assert after.returncode == 1
    assert json.loads(after.stdout)["revoked"] is True


@pytest.mark.process
def test_inspect_without_key_says_verified_null_and_with_wrong_key_false() -> None:
    token = run("token", "mint", "--id", "tok-x", SATGATE_ROOT_KEY=KEY).stdout.strip()

    unknown = run("token", "inspect", token)
    assert unknown.returncode == 0
    info = json.loads(unknown.stdout)
    assert info["verified"] is None
    assert "SATGATE_ROOT_KEY" in info["reason"]
    assert info["revoked"] is None

    wrong = run("token", "inspect", token, SATGATE_ROOT_KEY="w" * 40)
    assert wrong.returncode == 1
    info = json.loads(wrong.stdout)
    assert (info["verified"], info["reason"]) == (False, "signature_mismatch")
    assert "every gateway process" in info["hint"]
    assert token not in wrong.stderr


@pytest.mark.process
def test_revoke_into_a_folder_that_does_not_exist_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Issue 23: this was a bare FileNotFoundError traceback."""
    folder = tmp_path / "var" / "lib" / "satgate-mcp"
    revoke = run("token", "revoke", "tok-alice", SATGATE_REVOCATION_FILE=str(folder / "revoked.txt"))
    assert revoke.returncode == 2
    [line] = revoke.stderr.splitlines()
    assert line.startswith("satgate-mcp: SATGATE_REVOCATION_FILE=")
    assert f"its folder {folder} does not exist; create it" in line
    assert revoke.stdout == ""
    assert not folder.exists()


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        pytest.param({"SATGATE_PORT": "abc"}, "SATGATE_PORT", id="port-not-a-number"),
        pytest.param({"SATGATE_UPSTREAMS": "not json"}, "SATGATE_UPSTREAMS", id="upstreams-not-json"),
        pytest.param({"SATGATE_AUTH_MODE": "header"}, "SATGATE_ROOT_KEY", id="header-mode-without-key"),
        pytest.param({"SATGATE_AUTH_MODE": "header", "SATGATE_ROOT_KEY": "short"}, "SATGATE_ROOT_KEY",
                     id="short-root-key"),
    ],
)
@pytest.mark.process
def test_serve_refuses_bad_settings_with_one_line(env: dict[str, str], variable: str) -> None:
    result = run("serve", **env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("satgate-mcp: invalid "), "every start-up failure line has the same prefix"
    assert variable in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("host", [pytest.param("0.0.0.0", id="ipv4-any"), pytest.param("::", id="ipv6-any"),
                                  pytest.param("gw.example.com", id="a-name")])
@pytest.mark.process
def test_attack_none_auth_on_a_public_address_refuses_to_start_with_one_line(host: str) -> None:
    result = run("serve", SATGATE_HOST=host, SATGATE_PORT="1")  # refused before binding: the port never matters
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needed in ("SATGATE_ALLOW_UNAUTHENTICATED=true", "SATGATE_AUTH_MODE=header", "SATGATE_ROOT_KEY",
                   "satgate-mcp token mint"):
        assert needed in lines[0]
    assert "Traceback" not in result.stderr


# --- main() in process ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "handover"),
    [
        pytest.param(["serve"], {}, False, id="default"),
        pytest.param(["serve", "--handover"], {}, True, id="flag"),
        pytest.param(["serve"], {"SATGATE_HANDOVER": "true"}, True, id="env-var"),
    ],
)
def test_serve_handover_comes_from_the_flag_or_the_environment(
    no_satgate_env: pytest.MonkeyPatch, argv: list[str], env: dict[str, str], handover: bool
) -> None:
    for name, value in env.items():
        no_satgate_env.setenv(name, value)
    seen: list[Settings] = []

    def serve(settings: Settings) -> ExitCode:
        seen.append(settings)
        return ExitCode.OK

    stub_daemon(no_satgate_env, serve)
    assert cli.main(argv) == 0
    assert seen[0].handover is handover


def test_serve_loads_the_config_file_then_logging_then_the_runner(
    tmp_path: Path, no_satgate_env: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "satgate.env"
    config.write_text("SATGATE_PORT=9200\nSATGATE_LOG_LEVEL=debug\n")
    no_satgate_env.setenv("SATGATE_PORT", "9300")  # the environment wins over the file
    calls: list[tuple[str, Any]] = []

    def serve(settings: Settings) -> ExitCode:
        calls.append(("serve", settings))
        return ExitCode.OK

    stub_daemon(no_satgate_env, serve, lambda s: calls.append(("logging", s)))

    assert cli.main(["serve", "--config", str(config)]) == 0
    assert [name for name, _ in calls] == ["logging", "serve"]
    settings: Settings = calls[1][1]
    assert (settings.port, settings.log_level) == (9300, "DEBUG")


def test_serve_with_a_missing_config_file(capsys: pytest.CaptureFixture[str], no_satgate_env: Any) -> None:
    assert cli.main(["serve", "--config", "/nonexistent/satgate.env"]) == 2
    assert "config file not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "message"),
    [
        pytest.param(None, "SATGATE_ROOT_KEY is not set", id="missing"),
        pytest.param("", "SATGATE_ROOT_KEY is not set", id="empty"),
        pytest.param("x" * 31, "at least 32 characters", id="short"),
    ],
)
def test_mint_refuses_a_missing_or_short_key(
    capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch, key: str | None, message: str
) -> None:
    if key is not None:
        no_satgate_env.setenv("SATGATE_ROOT_KEY", key)
    assert cli.main(["token", "mint", "--id", "tok"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert message in out.err
    assert len(out.err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--id", "bad id"], id="space-in-id"),
        pytest.param(["--id", "tok", "--tools", " , "], id="empty-tools"),
        pytest.param(["--id", "tok", "--tools", "a*b"], id="bad-pattern"),
    ],
)
def test_mint_refuses_bad_arguments(
    capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch, args: list[str]
) -> None:
    no_satgate_env.setenv("SATGATE_ROOT_KEY", KEY)
    assert cli.main(["token", "mint", *args]) == 2
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("args", [["--ttl", "0"], ["--ttl", "soon"], ["--budget-limit", "-1"]])
def test_mint_argument_types(no_satgate_env: pytest.MonkeyPatch, args: list[str]) -> None:
    no_satgate_env.setenv("SATGATE_ROOT_KEY", KEY)
    with pytest.raises(SystemExit) as exc:
        cli.main(["token", "mint", "--id", "tok", *args])
    assert exc.value.code == 2


def test_revoke_without_a_store_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch
) -> None:
    assert cli.main(["token", "revoke", "tok-a"]) == 2
    assert "SATGATE_REVOCATION_FILE" in capsys.readouterr().err


def test_revoke_refuses_an_id_that_would_forge_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "revoked"
    no_satgate_env.setenv("SATGATE_REVOCATION_FILE", str(path))
    assert cli.main(["token", "revoke", "tok-a\ntok-b"]) == 2
    assert not path.exists()


def test_token_commands_read_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch
) -> None:
    revoked = tmp_path / "revoked"
    config = tmp_path / "satgate.env"
    config.write_text(f"SATGATE_ROOT_KEY={KEY}\nSATGATE_REVOCATION_FILE={revoked}\nSATGATE_PORT=abc\n")
    assert cli.main(["token", "mint", "--id", "tok-a", "--config", str(config)]) == 0
    token = capsys.readouterr().out.strip()
    assert verify_token(KEY, token, now=0).token_id == "tok-a"
    assert cli.main(["token", "revoke", "tok-a", "--config", str(config)]) == 0
    assert revoked.read_text() == "tok-a\n"


def test_inspect_garbage(capsys: pytest.CaptureFixture[str], no_satgate_env: Any) -> None:
    assert cli.main(["token", "inspect", "garbage"]) == 1
    err = capsys.readouterr().err
    assert "not a satgate token" in err
    assert "Traceback" not in err


def test_a_holder_narrows_a_token_without_the_root_key(
    capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch
) -> None:
    no_satgate_env.setenv("SATGATE_ROOT_KEY", KEY)
    assert cli.main(["token", "mint", "--id", "tok-a", "--tools", "db_*", "--budget-limit", "50"]) == 0
    token = capsys.readouterr().out.strip()
    no_satgate_env.delenv("SATGATE_ROOT_KEY")

    assert cli.main(["token", "narrow", token, "--tools", "db_read,search", "--budget-limit", "80",
                     "--ttl", "60"]) == 0
    narrowed = capsys.readouterr().out.strip()
    ident = verify_token(KEY, narrowed, now=time.time())
    assert ident.allows_tool("db_read")
    assert not ident.allows_tool("search"), "the original tools caveat still applies"
    assert ident.budget_limit == 50, "a higher limit never widens"
    assert ident.expires_at is not None


def test_narrow_needs_a_restriction(capsys: pytest.CaptureFixture[str], no_satgate_env: Any) -> None:
    assert cli.main(["token", "narrow", "whatever"]) == 2
    assert "nothing to narrow" in capsys.readouterr().err


def test_mint_narrow_inspect_resources_and_prompts(
    capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch
) -> None:
    no_satgate_env.setenv("SATGATE_ROOT_KEY", KEY)
    assert cli.main(["token", "mint", "--id", "tok-a", "--resources", "file:///docs/*, memo://a/readme",
                     "--prompts", "public_*"]) == 0
    token = capsys.readouterr().out.strip()
    ident = verify_token(KEY, token, now=time.time())
    assert ident.resource_filters == (("file:///docs/*", "memo://a/readme"),)
    assert ident.prompt_filters == (("public_*",),)

    assert cli.main(["token", "narrow", token, "--resources", "file:///docs/public/*", "--prompts", "public_g*"]) == 0
    narrowed = capsys.readouterr().out.strip()
    ident = verify_token(KEY, narrowed, now=time.time())
    assert ident.allows_resource("file:///docs/public/a")
    assert not ident.allows_resource("memo://a/readme")
    assert not ident.allows_prompt("public_x")

    assert cli.main(["token", "inspect", narrowed]) == 0
    restrictions = json.loads(capsys.readouterr().out)["restrictions"]
    assert restrictions["resources"] == [["file:///docs/*", "memo://a/readme"], ["file:///docs/public/*"]]
    assert restrictions["prompts"] == [["public_*"], ["public_g*"]]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--resources", " , "], id="empty-resources"),
        pytest.param(["--prompts", ""], id="empty-prompts"),
        pytest.param(["--resources", "file:///*/x"], id="star-in-the-middle"),
    ],
)
def test_mint_refuses_bad_scopes(
    capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch, args: list[str]
) -> None:
    no_satgate_env.setenv("SATGATE_ROOT_KEY", KEY)
    assert cli.main(["token", "mint", "--id", "tok", *args]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "--" in out.err or "pattern" in out.err
