"""The README's example policy file, exactly as the README carries it (the tests run this very text)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "github-repo-outside-org"


def readme_policy() -> str:
    """The one ``yaml`` block of the README that holds the example rules."""
    blocks = re.findall(r"^```yaml\n(.*?)^```$", README.read_text(), flags=re.MULTILINE | re.DOTALL)
    found = [b for b in blocks if MARKER in b]
    assert len(found) == 1, f"the README should have one yaml block with {MARKER!r}"
    return str(found[0])
