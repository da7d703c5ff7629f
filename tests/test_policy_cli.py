"""``satgate-mcp policy check`` and ``policy explain``: test a policy before deploying it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from satgate_mcp import cli
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.exits import ExitCode
from tests.oauth_server import AuthServer
from tests.policy.readme_policy import readme_policy

KEY = "p" * 40


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("SATGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SATGATE_STATE_DIR", "memory")
    monkeypatch.setenv("SATGATE_AUTH_MODE", "header")
    monkeypatch.setenv("SATGATE_ROOT_KEY", KEY)
    return monkeypatch


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(readme_policy())
    return path


def test_check_passes_a_good_file(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["policy", "check", str(policy)]) == ExitCode.OK
    assert "2 rules, ok" in capsys.readouterr().out


def test_check_lists_every_problem_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"name": "a", "effect": "perhaps"},
                                         {"name": "b", "when": "args.x ==", "effect": "deny"}]}))
    assert cli.main(["policy", "check", str(bad)]) == ExitCode.CONFIG
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert "rule 'a' at rules[0]" in lines[0]
    assert "rule 'b' at rules[0].when" not in lines[1]
    assert "rule 'b' at rules[1].when, line 1, column" in lines[1]


def test_check_of_a_missing_file_exits_2(tmp_path: Path) -> None:
    assert cli.main(["policy", "check", str(tmp_path / "nope.yaml")]) == ExitCode.CONFIG


def test_explain_names_the_deciding_rule(env: pytest.MonkeyPatch, policy: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    token = mint_token(KEY, "agent-1", tools=["drop_table"])
    code = cli.main(["policy", "explain", str(policy), "--token", token, "--tool", "drop_table",
                     "--annotations", '{"destructiveHint": true}', "--args", '{"table": "users"}'])
    out = capsys.readouterr().out
    assert code == ExitCode.FAILED
    assert "1. github-repo-outside-org: skipped" in out
    assert "2. destructive-needs-admin: true" in out
    assert out.rstrip().endswith("decision: deny by destructive-needs-admin: destructive tools need the admin scope")


def test_explain_shows_an_error_as_a_deny(env: pytest.MonkeyPatch, policy: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    token = mint_token(KEY, "agent-1")  # header mode: no org claim
    code = cli.main(["policy", "explain", str(policy), "--token", token, "--tool", "github_get_repo",
                     "--args", '{"repo": "acme/x"}'])
    assert code == ExitCode.FAILED
    assert "policy_error" in capsys.readouterr().out


def test_explain_allows_what_no_rule_denies(env: pytest.MonkeyPatch, policy: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    token = mint_token(KEY, "agent-1")
    assert cli.main(["policy", "explain", str(policy), "--token", token, "--tool", "echo"]) == ExitCode.OK
    assert "decision: allow by the default" in capsys.readouterr().out


def test_explain_verifies_the_token_as_the_daemon_would(env: pytest.MonkeyPatch, policy: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    forged = mint_token("f" * 40, "agent-1")  # another root key
    assert cli.main(["policy", "explain", str(policy), "--token", forged, "--tool", "echo"]) == ExitCode.FAILED
    assert "the token is refused (invalid)" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [
    pytest.param(["--args", "[1]"], id="args-not-an-object"),
    pytest.param(["--args", "{"], id="args-not-json"),
    pytest.param(["--annotations", "1"], id="annotations-not-an-object"),
])
def test_explain_refuses_bad_flags(env: pytest.MonkeyPatch, policy: Path, flags: list[str]) -> None:
    token = mint_token(KEY, "agent-1")
    assert cli.main(["policy", "explain", str(policy), "--token", token, "--tool", "echo", *flags]) == ExitCode.CONFIG


@pytest.mark.process
def test_serve_stops_at_start_on_a_bad_policy_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("rules:\n  - name: ok\n    effect: allow\n"
                   "  - name: broken\n    when: 'token.id =='\n    effect: deny\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATGATE_")}
    env.update(SATGATE_STATE_DIR="memory", SATGATE_POLICY_FILE=str(bad), SATGATE_PORT="0")
    done = subprocess.run([sys.executable, "-m", "satgate_mcp", "serve"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert done.returncode == ExitCode.CONFIG
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("satgate-mcp:")]
    assert line.startswith(f"satgate-mcp: invalid SATGATE_POLICY_FILE: policy file {bad}, rule 'broken' at "
                           "rules[1].when, line 1, column")


async def test_explain_in_oauth_mode_reads_the_verified_jwts_claims(
        env: pytest.MonkeyPatch, policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's rule on ``token.claims.org`` with a real authorization server's JWT: the org decides, and a
    token for another audience is refused as the daemon would refuse it."""
    async with AuthServer(path="/realms/explain") as idp:
        audience = "https://gw.example.com/mcp"
        idp.default_audience = audience
        env.setenv("SATGATE_AUTH_MODE", "oauth")
        env.setenv("SATGATE_OAUTH_ISSUER", idp.issuer)
        env.setenv("SATGATE_OAUTH_AUDIENCE", audience)

        def explain(token: str, repo: str) -> int:
            return cli.main(["policy", "explain", str(policy), "--token", token, "--tool", "github_get_repo",
                             "--args", json.dumps({"repo": repo})])

        token = idp.mint("alice", extra={"org": "acme"})
        assert await asyncio.to_thread(explain, token, "acme/site") == ExitCode.OK
        assert await asyncio.to_thread(explain, token, "other/site") == ExitCode.FAILED
        assert "decision: deny by github-repo-outside-org" in capsys.readouterr().out
        elsewhere = idp.mint("alice", audience="https://other.example.com/mcp", extra={"org": "acme"})
        assert await asyncio.to_thread(explain, elsewhere, "acme/site") == ExitCode.FAILED
        assert "the token is refused" in capsys.readouterr().err
