"""The console's window on the audit trail: its last lines, its chain's state, and the console's own actions.

Reads the file the writer (stores/audit_file.py) keeps; the console's actions go through the same auditor as
calls, so they land in the same chain. With the trail on stdout there is no file to read back.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from satgate_mcp.policy.audit import verify
from satgate_mcp.policy.audit_trail import Auditor

#: How much of the file's end ``tail`` reads: the last lines, never the whole trail.
TAIL_BYTES = 1 << 20


def _last_lines(path: str) -> list[str]:
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - TAIL_BYTES))
        lines = f.read().decode("utf-8", "replace").splitlines()
    return lines[1:] if size > TAIL_BYTES else lines  # the first may be cut


class ConsoleAudit:
    def __init__(self, auditor: Auditor, path: str) -> None:
        self._auditor = auditor
        self._path = path

    async def record(self, *, who: str, action: str, target: str) -> None:
        self._auditor.record("console_action", token_id=who, action=action, target=target[:500])

    async def tail(self, limit: int, filters: dict[str, str]) -> list[dict[str, Any]]:
        if self._path == "-":
            return []
        try:
            lines = await asyncio.to_thread(_last_lines, self._path)
        except OSError:
            return []
        found: list[dict[str, Any]] = []
        for line in reversed(lines):
            try:
                fields = json.loads(line)
            except ValueError:
                continue
            if isinstance(fields, dict) and all(str(fields.get(k)) == v for k, v in filters.items()):
                found.append(fields)
                if len(found) >= limit:
                    break
        return found

    async def verify(self) -> dict[str, Any]:
        if self._path == "-":
            return {"ok": None, "detail": "the trail goes to stdout: verify it where the log stream is kept"}

        def check() -> tuple[int, Any]:
            return verify([(self._path, Path(self._path).read_text(encoding="utf-8", errors="replace").splitlines())])

        try:
            checked, broken = await asyncio.to_thread(check)
        except OSError as exc:
            return {"ok": False, "detail": f"cannot read the trail: {exc.strerror or exc}"}
        if broken is not None:
            return {"ok": False, "detail": f"chain broken at {broken}"}
        return {"ok": True, "detail": f"{checked} lines, chain intact"}
