"""``--controls``: the plain gateway (``gateway-header``) and the same where every token carries tool controls that
match none of the bench's calls (``gateway-controls``: argument rules, a spend limit, an approval hold and a
confirmation, all for other tools), side by side (bench/paired.py): what a call that no control matches pays, in
gateway CPU per call, which the issue wants to be nothing measurable.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import paired
from bench.paired import Variant

CONTROLS = "gateway-controls"
#: "Nothing measurable": below what two runs of the same target differ by on a quiet machine.
ALLOWED_MS = 0.005
#: Controls of an agent that pays: none applies to ``echo``, the bench's tool.
DOCUMENT = {
    "args": [{"tools": ["pay*"], "field": "vendor", "one_of": ["acme", "globex"]},
             {"tools": ["fetch"], "field": "url", "url": {"hosts": ["api.example.com"]}}],
    "spend_limits": [{"tools": ["pay*"], "field": "amount", "max": "200", "window": "day", "tz": "Europe/Berlin"}],
    "approvals": [{"tools": ["pay*"], "field": "amount", "above": "50"}],
    "confirm": [{"tools": ["delete_*"], "message": "Delete for real?"}],
}


def _no_settings(workdir: Path) -> dict[str, str]:
    return {}


VARIANT = Variant(CONTROLS, "controls", "controls matching no call", ALLOWED_MS, _no_settings,
                  controls=json.dumps(DOCUMENT))


def main_controls(args: argparse.Namespace) -> int:
    return paired.main_paired(args, VARIANT)
