"""docs/configuration.md's table of settings, made from the settings model so the two cannot drift.

Each row is one field of ``Settings``: its variable, its default, and its meaning (the field's description, else
``settings_help.MEANINGS``).
The table stands between two marker lines in docs/configuration.md; everything around it is prose kept by hand.

    python scripts/config_docs.py           rewrite the table in docs/configuration.md
    python scripts/config_docs.py --check   exit 1 when the file's table is not what the model says (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from satgate_mcp.settings import ENV_PREFIX, Settings
from satgate_mcp.settings_help import DEFAULTS_SHOWN, MEANINGS

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- settings table: made by scripts/config_docs.py from satgate_mcp/settings.py; edit those -->"
END = "<!-- end of settings table -->"


def default_text(name: str, field: FieldInfo) -> str:
    """The default as an operator would write it in the environment; ``—`` for unset, unless ``DEFAULTS_SHOWN``
    says what unset means."""
    if name in DEFAULTS_SHOWN:
        return DEFAULTS_SHOWN[name]
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None or (isinstance(value, list) and not value):
        return "—"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, dict | list):
        return f"`{json.dumps(value)}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def meaning(name: str, field: FieldInfo) -> str:
    return " ".join((field.description or MEANINGS.get(name, "")).split())


def table() -> str:
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | {default_text(name, field)} | {meaning(name, field)} |")
    return "\n".join(rows)


def problems() -> list[str]:
    """Settings nobody explained, and explanations of settings that no longer exist."""
    fields = Settings.model_fields
    found = [f"{ENV_PREFIX}{name.upper()} has no meaning" for name, f in fields.items() if not meaning(name, f)]
    found += [f"settings_help names {name}, which is no setting" for name in {*MEANINGS, *DEFAULTS_SHOWN} - {*fields}]
    return found


def with_table(document: str) -> str:
    """``document`` with the text between the markers replaced by today's table."""
    head, found, rest = document.partition(BEGIN + "\n")
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"{DOC} lacks the marker lines:\n{BEGIN}\n{END}")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the table differs from the model")
    args = parser.parse_args()
    if found := problems():
        print("\n".join(found), file=sys.stderr)
        return 1
    current = DOC.read_text()
    wanted = with_table(current)
    if args.check:
        if wanted != current:
            print("docs/configuration.md is out of date: run python scripts/config_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
