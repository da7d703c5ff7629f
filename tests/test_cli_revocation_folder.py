"""A revocation file in a folder that does not exist (issue 23): ``token revoke`` says which folder to create
(exit 2, one line, nothing created); ``serve`` starts and warns once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from satgate_mcp import cli
from satgate_mcp.auth.revocation import missing_revocation_folder, revocation_folder_problem
from satgate_mcp.exits import ExitCode
from satgate_mcp.settings import Settings
from tests.fakes import stub_daemon

EXISTING = {Path("/var/lib/satgate-mcp"), Path(".")}


@pytest.mark.parametrize(
    ("path", "missing"),
    [
        pytest.param(None, None, id="no-file-configured"),
        pytest.param(Path("/var/lib/satgate-mcp/revoked.txt"), None, id="folder-exists"),
        pytest.param(Path("revoked.txt"), None, id="relative-to-the-working-folder"),
        pytest.param(Path("/var/lib/satgate/revoked.txt"), Path("/var/lib/satgate"), id="folder-missing"),
        pytest.param(Path("/srv/a/b/revoked"), Path("/srv/a/b"), id="nested-folder-missing"),
    ],
)
def test_missing_revocation_folder(path: Path | None, missing: Path | None) -> None:
    assert missing_revocation_folder(path, is_dir=lambda p: p in EXISTING) == missing


def test_the_problem_names_the_folder_to_create() -> None:
    problem = revocation_folder_problem(Path("/srv/x/revoked.txt"), is_dir=lambda _p: False)
    assert problem is not None
    assert problem.startswith("SATGATE_REVOCATION_FILE=/srv/x/revoked.txt: its folder /srv/x does not exist; create")
    assert revocation_folder_problem(Path("/srv/x/revoked.txt"), is_dir=lambda _p: True) is None


@pytest.fixture
def no_satgate_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("SATGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SATGATE_STATE_DIR", "memory")
    return monkeypatch


def test_revoke_into_a_missing_folder_is_one_clear_line_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "not-made-yet"
    no_satgate_env.setenv("SATGATE_REVOCATION_FILE", str(folder / "revoked.txt"))
    assert cli.main(["token", "revoke", "tok-a"]) == ExitCode.CONFIG
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (f"satgate-mcp: SATGATE_REVOCATION_FILE={folder / 'revoked.txt'}: its folder {folder} does not "
                       "exist; create it, writable by the user the gateway runs as (the systemd unit's "
                       "StateDirectory= makes /var/lib/satgate-mcp)\n")
    assert not folder.exists()  # never made with root's owner and umask behind the daemon's back


def test_revoke_into_an_existing_folder_still_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch
) -> None:
    no_satgate_env.setenv("SATGATE_REVOCATION_FILE", str(tmp_path / "revoked.txt"))
    assert cli.main(["token", "revoke", "tok-a"]) == ExitCode.OK
    assert (tmp_path / "revoked.txt").read_text() == "tok-a\n"


def serve_with_a_stub_runner(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    seen: list[Settings] = []

    def serve(settings: Settings) -> ExitCode:
        seen.append(settings)
        return ExitCode.OK

    stub_daemon(monkeypatch, serve)
    return seen


@pytest.mark.parametrize(("made", "warnings"), [pytest.param(False, 1, id="missing"),
                                                pytest.param(True, 0, id="present")])
def test_serve_starts_and_warns_once_when_the_revocation_folder_is_missing(
    tmp_path: Path, no_satgate_env: pytest.MonkeyPatch, made: bool, warnings: int
) -> None:
    folder = tmp_path / "state"
    if made:
        folder.mkdir()
    no_satgate_env.setenv("SATGATE_REVOCATION_FILE", str(folder / "revoked.txt"))
    seen = serve_with_a_stub_runner(no_satgate_env)
    with capture_logs() as logs:
        assert cli.main(["serve"]) == ExitCode.OK
    assert len(seen) == 1
    lines = [e for e in logs if e["event"] == "revocation_folder_missing"]
    assert len(lines) == warnings
    for line in lines:
        assert line["log_level"] == "warning"
        assert (line["path"], line["folder"]) == (str(folder / "revoked.txt"), str(folder))
        assert "token revoke" in line["hint"]
    assert not folder.exists() or made
