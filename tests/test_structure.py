"""The house rules a newcomer relies on, checked on the source so they cannot drift.

Small modules and functions, one home for storage, no reach into a library's privates, and the app
factory and the CLI at the top: nothing below them imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "satgate_mcp"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: The only modules that may import the app factory (the process that serves it) and the CLI.
TOP = {"satgate_mcp.app": {"satgate_mcp.daemon.runner", "satgate_mcp.cli"}, "satgate_mcp.cli": {"satgate_mcp.__main__"}}


def modules(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def name_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", modules(PACKAGE), ids=name_of)
def test_no_module_is_over_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in modules(PACKAGE, ROOT / "bench", ROOT / "scripts"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name_of(path)}.{node.name}: {length} lines")
    assert long == []


def test_only_the_stores_import_a_storage_backend() -> None:
    stores = PACKAGE / "stores"
    found = [f"{name_of(path)} imports {name}" for path in modules(PACKAGE) if stores not in path.parents
             for name in imported(ast.parse(path.read_text())) if name.split(".")[0] in ("sqlite3", "redis")]
    assert found == []


def test_nothing_reaches_into_a_private_of_asyncio_or_aiohttp() -> None:
    found = []
    for path in modules(PACKAGE):
        tree = ast.parse(path.read_text())
        for name in imported(tree):
            if name.split(".")[0] in ("asyncio", "aiohttp") and any(p.startswith("_") for p in name.split(".")):
                found.append(f"{name_of(path)} imports {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in ("asyncio", "aiohttp", "web"):
                    found.append(f"{name_of(path)} uses {ast.unparse(node)}")
    assert found == []


def test_the_app_factory_and_the_cli_are_imported_only_from_above() -> None:
    found = []
    for path in modules(PACKAGE):
        module = name_of(path)
        for name in imported(ast.parse(path.read_text())):
            for top, allowed in TOP.items():
                if (name == top or name.startswith(top + ".")) and module != top and module not in allowed:
                    found.append(f"{module} imports {top}")
    assert found == []


def import_graph() -> dict[str, set[str]]:
    """Which package modules each module imports (at any depth of the module: a lazy import counts too)."""
    names = {name_of(path): path for path in modules(PACKAGE)}
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        found = {name for name in imported(ast.parse(path.read_text())) if name in names}
        graph[module] = found - {module}
    return graph


def test_no_two_modules_import_each_other_even_through_others() -> None:
    graph = import_graph()
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            module, path = stack.pop()
            for nxt in graph[module]:
                if nxt == start:
                    cycles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert cycles == []


def test_the_stores_import_no_part_that_uses_them() -> None:
    users = ("satgate_mcp.policy.engine", "satgate_mcp.auth.factory", "satgate_mcp.transport", "satgate_mcp.upstream",
             "satgate_mcp.dispatch", "satgate_mcp.app", "satgate_mcp.cli")
    found = [f"{module} imports {name}" for module, names in import_graph().items()
             if module.startswith("satgate_mcp.stores") for name in names if name.startswith(users)]
    assert found == []
