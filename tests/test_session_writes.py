"""A ``Session`` changes only through its own methods: no module outside ``sessions.py`` assigns its fields.

Five modules used to write them (one comment called itself the only writer while another wrote too). This reads
every module of the package and fails on an assignment to a ``Session`` field of anything named ``session``
(``session.x``, ``state.session.x``, ``self._session.x``) or a ``setattr`` of a field name, so a new outside
writer is caught here rather than found later.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import satgate_mcp
from satgate_mcp.sessions import Session

PACKAGE = Path(satgate_mcp.__file__).parent
OWNER = PACKAGE / "sessions.py"
FIELDS = frozenset(f.name for f in dataclasses.fields(Session))
SESSION_LIKE = re.compile(r"session$", re.IGNORECASE)


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        pending = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        pending = [node.target]
    else:
        return
    while pending:
        target = pending.pop()
        if isinstance(target, ast.Tuple | ast.List):
            pending.extend(target.elts)
        elif isinstance(target, ast.Starred):
            pending.append(target.value)
        else:
            yield target


def session_writes(source: str) -> list[str]:
    """``line: text`` for each write to a Session field in this module's source."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            if (isinstance(target, ast.Attribute) and target.attr in FIELDS
                    and SESSION_LIKE.search(ast.unparse(target.value))):
                found.append(f"{target.lineno}: {ast.unparse(target)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in FIELDS):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_guard_sees_the_writes_it_forbids() -> None:
    source = ("session.inflight += 1\nstate.session.client_capabilities = {}\nself._session.tools_seen, x = 1, 2\n"
              "setattr(s, 'log_level', None)\nflow.identity = None\nsession.note = 1\n")
    assert session_writes(source) == ["1: session.inflight", "2: state.session.client_capabilities",
                                      "3: self._session.tools_seen", "4: setattr(s, 'log_level', None)"]


def test_no_module_outside_sessions_writes_a_session_field() -> None:
    writes = {str(path.relative_to(PACKAGE)): found for path in sorted(PACKAGE.rglob("*.py")) if path != OWNER
              if (found := session_writes(path.read_text(encoding="utf-8")))}
    assert writes == {}, "change a Session through its methods (satgate_mcp/sessions.py), not from outside"
