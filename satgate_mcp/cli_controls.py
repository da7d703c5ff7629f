"""``--controls JSON|@file`` of ``token mint`` and ``token narrow``: tool controls read, checked and put in a caveat.

The JSON is checked here exactly as a gateway reads it (policy/controls.py), so a token that would be
refused is never signed; ``@file`` reads it from a file (``@-``: standard input).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from satgate_mcp.policy.controls import Controls, parse_controls

#: A controls file larger than this is refused unread: one caveat holds at most 4 KiB of it anyway.
MAX_FILE_BYTES = 64 * 1024

HELP = ('tool controls as JSON or @file: {"args": [...], "spend_limits": [...], "approvals": [...], '
        '"confirm": [...]} (docs/tool-controls.md)')


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--controls", metavar="JSON|@FILE", help=HELP)


def _text(arg: str) -> str:
    if not arg.startswith("@"):
        return arg
    if arg == "@-":
        return sys.stdin.read(MAX_FILE_BYTES + 1)
    path = Path(arg[1:])
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--controls: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"--controls: {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--controls: {path} is not UTF-8") from None


def read_controls(arg: str | None) -> Controls | None:
    """The controls ``--controls`` gives (None without it); ValueError saying what is wrong, and where."""
    if arg is None:
        return None
    try:
        return parse_controls(_text(arg))
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if message.startswith("--controls") else f"--controls: {message}") from None
