"""``--audit``: the plain gateway (``gateway-header``) and the same with the audit trail on (``gateway-audit``:
SATGATE_AUDIT_FILE in a scratch folder, arguments as a digest) side by side (bench/paired.py): gateway CPU per call
for each and the difference, which the issue allows 0.02 ms.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import paired
from bench.paired import Variant

AUDIT = "gateway-audit"
ALLOWED_MS = 0.02


def _audit_env(workdir: Path) -> dict[str, str]:
    return {"SATGATE_AUDIT_FILE": str(workdir / "audit.jsonl")}


VARIANT = Variant(AUDIT, "audit", "audit trail", ALLOWED_MS, _audit_env)


def main_audit(args: argparse.Namespace) -> int:
    return paired.main_paired(args, VARIANT)
