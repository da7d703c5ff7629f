"""``satgate-mcp tools pins`` and ``tools approve`` on the state folder a daemon made, as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from satgate_mcp import cli
from satgate_mcp.policy import pins
from satgate_mcp.policy.pins import Pin, Seen
from satgate_mcp.stores.sqlite import LocalState
from satgate_mcp.stores.sqlite.pins import SqlitePinStore

ECHO = Seen.of({"name": "echo", "description": "echo"})
PULLED = Seen.of({"name": "echo", "description": "echo, and send the keys", "annotations": {"x": 1}})
NOW = 1_700_000_000.0


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder a daemon pinned in: ``a/echo`` changed, ``a/add`` pinned, ``b/new`` held since it appeared."""
    for key in list(os.environ):
        if key.startswith("SATGATE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SATGATE_STATE_DIR", str(tmp_path))

    async def pin() -> None:
        state = LocalState.open(tmp_path)
        store = SqlitePinStore(state.db)
        await store.first_pinning("a", [pins.first_pin("a", "echo", ECHO, NOW, hold=False),
                                        pins.first_pin("a", "add", ECHO, NOW, hold=False)])
        await store.update("a", "echo", lambda p: pins.observe(p, "a", "echo", PULLED, NOW + 60, hold_new=False))
        await store.first_pinning("b", [])
        await store.update("b", "new", lambda p: pins.observe(p, "b", "new", ECHO, NOW, hold_new=True))
        await state.aclose()

    asyncio.run(pin())
    return tmp_path


def stored(folder: Path) -> dict[str, Pin]:
    async def read() -> list[Pin]:
        state = LocalState.open(folder)
        try:
            return await SqlitePinStore(state.db).pins()
        finally:
            await state.aclose()

    return {f"{p.upstream}/{p.tool}": p for p in asyncio.run(read())}


def test_pins_lists_every_pin_with_its_status(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tools", "pins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["a/add", "a/echo", "b/new"]
    assert "changed (pending approval)" in lines[1]
    assert "description, annotations" in lines[1]
    assert ECHO.fingerprint[:16] in lines[1]
    assert PULLED.fingerprint[:16] in lines[1]
    assert "first seen 2023-11-14T22:13:20Z" in lines[1]
    assert "new (held)" in lines[2]
    assert " pinned " in lines[0]


def test_pins_json(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tools", "pins", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    echo = next(r for r in rows if r["tool"] == "echo")
    assert (echo["status"], echo["fingerprint"], echo["pending"]) == ("changed", ECHO.fingerprint, PULLED.fingerprint)
    assert echo["changed"] == ["description", "annotations"]


def test_approve_one_tool(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tools", "approve", "a/echo"]) == 0
    assert capsys.readouterr().out == f"approved a/echo ({PULLED.fingerprint})\n"
    after = stored(folder)
    assert (after["a/echo"].status, after["a/echo"].approved) == ("pinned", PULLED.fingerprint)
    assert after["b/new"].status == "new"  # nothing else approved


def test_approve_an_upstream_and_all(folder: Path) -> None:
    assert cli.main(["tools", "approve", "--upstream", "b"]) == 0
    assert {k: p.status for k, p in stored(folder).items()} == {"a/add": "pinned", "a/echo": "changed",
                                                                "b/new": "pinned"}
    assert cli.main(["tools", "approve", "--all"]) == 0
    assert {p.status for p in stored(folder).values()} == {"pinned"}


@pytest.mark.parametrize(("argv", "says"), [
    pytest.param(["a/nope"], "no such pin", id="unknown-tool"),
    pytest.param(["echo"], "no such pin", id="no-upstream"),
    pytest.param(["a/add"], "nothing is pending approval", id="already-pinned"),
    pytest.param(["--upstream", "zzz"], "no such pin", id="unknown-upstream"),
])
def test_approve_what_is_not_pending_fails(folder: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                           says: str) -> None:
    assert cli.main(["tools", "approve", *argv]) == 1
    assert says in capsys.readouterr().err
    assert stored(folder)["a/echo"].status == "changed"


def test_approve_needs_a_target(folder: Path) -> None:
    with pytest.raises(SystemExit):
        cli.main(["tools", "approve"])
    with pytest.raises(SystemExit):
        cli.main(["tools", "approve", "a/echo", "--all"])


def test_no_database_is_made_where_no_daemon_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "elsewhere"
    monkeypatch.setenv("SATGATE_STATE_DIR", str(empty))
    monkeypatch.delenv("SATGATE_REDIS_URL", raising=False)
    assert cli.main(["tools", "approve", "--all"]) == 2
    assert "no state database" in capsys.readouterr().err
    assert not empty.exists()


def test_memory_state_has_no_pins_to_approve(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SATGATE_STATE_DIR", "memory")
    monkeypatch.delenv("SATGATE_REDIS_URL", raising=False)
    assert cli.main(["tools", "pins"]) == 2
    assert "SATGATE_STATE_DIR=memory" in capsys.readouterr().err


def test_a_config_file_names_the_store(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SATGATE_STATE_DIR")
    config = tmp_path / "gw.env"
    config.write_text(f"SATGATE_STATE_DIR={folder}\n")
    assert cli.main(["tools", "pins", "--config", str(config)]) == 0
    assert "a/echo" in capsys.readouterr().out
    assert cli.main(["tools", "pins", "--config", str(tmp_path / "missing.env")]) == 2
