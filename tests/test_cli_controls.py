"""``token mint --controls`` and ``token narrow --controls``: controls checked before anything is signed, read
from a string or a file, shown by ``token inspect``; a narrowed token keeps every rule it had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from satgate_mcp import cli
from satgate_mcp.auth.macaroons import verify_token
from satgate_mcp.policy.controls import parse_controls
from tests.test_cli import KEY, no_satgate_env

__all__ = ["no_satgate_env"]  # the fixture, used here by name

PARENT = {"args": [{"tools": ["pay"], "field": "vendor", "one_of": ["acme"]}],
          "spend_limits": [{"tools": ["pay*"], "field": "amount", "max": "200", "window": "day",
                            "tz": "America/New_York"}]}
WIDER = {"args": [{"tools": ["pay"], "field": "vendor", "one_of": ["acme", "evil"]}],
         "spend_limits": [{"tools": ["pay*"], "field": "amount", "max": "1000000", "window": "day",
                           "tz": "America/New_York"}]}


def mint(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["token", "mint", "--id", "agent", *args]) == 0
    return capsys.readouterr().out.strip()


def test_mint_narrow_and_inspect_controls(capsys: pytest.CaptureFixture[str], no_satgate_env: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    no_satgate_env.setenv("SATGATE_ROOT_KEY", KEY)
    parent = mint(capsys, "--controls", json.dumps(PARENT))
    wider = tmp_path / "wider.json"
    wider.write_text(json.dumps(WIDER))
    assert cli.main(["token", "narrow", parent, "--controls", f"@{wider}"]) == 0
    child = capsys.readouterr().out.strip()
    # The child tried to widen both rules: it only added rules, and the parent's stay.
    assert verify_token(KEY, child, now=0).controls == (parse_controls(json.dumps(PARENT)),
                                                        parse_controls(json.dumps(WIDER)))
    assert cli.main(["token", "inspect", child]) == 0
    shown = json.loads(capsys.readouterr().out)["restrictions"]["controls"]
    assert [c["args"][0]["one_of"] for c in shown] == [["acme"], ["acme", "evil"]]
    assert [c["spend_limits"][0]["max"] for c in shown] == ["200", "1000000"]


@pytest.mark.parametrize(("controls", "message"), [
    pytest.param('{"args": [{"tools": ["pay"], "field": "v", "one_of": ["a"], "oops": 1}]}', "unknown key 'oops'",
                 id="unknown-key"),
    pytest.param('{"spend_limits": [{"tools": ["pay"], "field": "a", "max": 200, "window": "day"}]}',
                 "spend_limits[0].max", id="amount-not-a-string"),
    pytest.param("@/nonexistent/controls.json", "cannot read", id="missing-file"),
    pytest.param("{", "not JSON", id="bad-json"),
])
def test_bad_controls_are_one_line_and_nothing_is_signed(capsys: pytest.CaptureFixture[str],
                                                         no_satgate_env: pytest.MonkeyPatch, controls: str,
                                                         message: str) -> None:
    no_satgate_env.setenv("SATGATE_ROOT_KEY", KEY)
    assert cli.main(["token", "mint", "--id", "agent", "--controls", controls]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert message in out.err
    assert out.err.count("\n") == 1
    token = mint(capsys)
    assert cli.main(["token", "narrow", token, "--controls", controls]) == 2
    assert capsys.readouterr().out == ""
