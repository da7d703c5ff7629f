"""``--console``: the plain gateway (``gateway-header``: the console on, its default) and the same with
``SATGATE_CONSOLE=off`` (``gateway-console-off``) side by side (bench/paired.py): the console's figures come from
what the gateway counts anyway, so what turning it off saves (on minus off) should be nothing measurable.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import paired
from bench.paired import Variant

CONSOLE_OFF = "gateway-console-off"
#: The console may add nothing per call: turning it off may save no more than noise.
ALLOWED_MS = 0.005


def _console_off(workdir: Path) -> dict[str, str]:
    return {"SATGATE_CONSOLE": "off"}


VARIANT = Variant(CONSOLE_OFF, "console_off", "console off (minus on)", ALLOWED_MS, _console_off, turns_off=True)


def main_console(args: argparse.Namespace) -> int:
    return paired.main_paired(args, VARIANT)
