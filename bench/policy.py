"""``--policy``: the plain gateway (``gateway-header``) and the gateway with a 50-rule policy file
(``gateway-policy``) side by side (bench/paired.py), gateway CPU per call for each and the difference.

The policy is shaped like a real one: most rules name other tools (they cost a pattern test, once per token and
tool), a handful read only the token (decided once per token and tool, then cached), and one reads the call's
arguments, so every ``echo`` pays one CEL evaluation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench import paired
from bench.paired import PLAIN, Variant

POLICY = "gateway-policy"
RULES = 50
#: What the issue allows a 50-rule policy over none, in gateway CPU milliseconds per call.
ALLOWED_MS = 0.02

__all__ = ["PLAIN", "POLICY", "RULES", "main_policy", "policy_document", "render", "summary"]


def policy_document(rules: int = RULES) -> dict[str, Any]:
    """``rules`` rules a call to ``echo`` must get through: none of them denies the bench's calls."""
    token_only = [{"name": f"blocked-tenant-{i}", "when": f'token.tenant == "blocked-{i}"', "effect": "deny",
                   "reason": "tenant suspended"} for i in range(8)]
    per_call = [{"name": "echo-forbidden-text", "tools": ["echo"], "when": 'args.text == "forbidden"',
                 "effect": "deny", "reason": "not that"}]
    other_tools = [{"name": f"team-{i}-repos", "tools": [f"team{i}_*"],
                    "when": f'!args.repo.startsWith("team{i}/")', "effect": "deny"}
                   for i in range(rules - len(token_only) - len(per_call))]
    return {"rules": [*token_only, *per_call, *other_tools]}


def _policy_env(workdir: Path) -> dict[str, str]:
    policy_file = workdir / "policy.json"
    policy_file.write_text(json.dumps(policy_document()))
    return {"SATGATE_POLICY_FILE": str(policy_file)}


VARIANT = Variant(POLICY, "policy", f"{RULES} rules", ALLOWED_MS, _policy_env)


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return paired.summary(rounds, VARIANT)


def render(result: dict[str, Any]) -> str:
    return paired.render(result, VARIANT)


def main_policy(args: argparse.Namespace) -> int:
    return paired.main_paired(args, VARIANT)
