"""``satgate-mcp audit verify FILE...``: does an audit trail still hold together?

The files in order (rotated ones first, the current one last): exit 0 when every line chains from the one before,
or 1 naming the first line that does not (edited, deleted, inserted, reordered or cut); 2 when a file cannot be read.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from satgate_mcp.policy.audit import verify


def add_parser(commands: Any) -> None:
    audit = commands.add_parser("audit", help="verify an audit trail's chain (SATGATE_AUDIT_FILE)")
    actions = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    check = actions.add_parser("verify", help="exit 0 when the files' lines chain, else 1 naming the first break")
    check.add_argument("files", type=Path, nargs="+", metavar="FILE", help="rotated files first, the current last")


def run(args: Any) -> int:
    files: list[tuple[str, list[str]]] = []
    for path in args.files:
        try:
            files.append((str(path), path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()))
        except OSError as exc:
            print(f"audit verify: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    checked, broken = verify(files)
    if broken is not None:
        print(f"audit verify: chain broken at {broken} ({checked} lines before it hold)", file=sys.stderr)
        return 1
    print(f"audit verify: {checked} lines, chain intact")
    return 0
