"""``--policy``: the plain gateway (``gateway-header``) and the gateway with a 50-rule policy file
(``gateway-policy``) side by side, gateway CPU per call for each and the difference.

The policy is shaped like a real one: most rules name other tools (they cost a pattern test, once per token and
tool), a handful read only the token (decided once per token and tool, then cached), and one reads the call's
arguments, so every ``echo`` pays one CEL evaluation. The two targets alternate round by round, each gateway
fresh, so drift on the machine hits both alike; the figure per target is the median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.client import Client, client_session
from bench.load import WARMUP_SECONDS, load_phase
from bench.processes import Gateway, make_auth, stop_all
from bench.stats import median

PLAIN, POLICY = "gateway-header", "gateway-policy"
TARGETS = (PLAIN, POLICY)
RULES = 50
#: What the issue allows a 50-rule policy over none, in gateway CPU milliseconds per call.
ALLOWED_MS = 0.02


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


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median gateway CPU ms per call and calls/s per target; the difference, and whether it is within what the
    issue allows."""
    figures = {target: {"cpu_ms_per_call": median([r["server_main_cpu_ms_per_call"] for r in runs]),
                        "calls_per_second": median([r["calls_per_second"] for r in runs]),
                        "p50_ms": median([r["p50_ms"] for r in runs]), "errors": sum(r["errors"] for r in runs)}
               for target in TARGETS for runs in [[r for r in rounds if r["target"] == target]]}
    extra = figures[POLICY]["cpu_ms_per_call"] - figures[PLAIN]["cpu_ms_per_call"]
    return {**figures, "policy_minus_plain_cpu_ms_per_call": extra, "allowed_ms": ALLOWED_MS,
            "within_allowance": bool(extra <= ALLOWED_MS) if not math.isnan(extra) else None}


def render(result: dict[str, Any]) -> str:
    rows = [f"{'target':<15} {'gateway CPU ms/call':>20} {'calls/s':>9} {'p50 ms':>8} {'errors':>7}"]
    for target in TARGETS:
        f = result[target]
        rows.append(f"{target:<15} {f['cpu_ms_per_call']:>20.4f} {f['calls_per_second']:>9.0f} "
                    f"{f['p50_ms']:>8.2f} {f['errors']:>7}")
    extra = result["policy_minus_plain_cpu_ms_per_call"]
    verdict = {True: "within", False: "OVER", None: "unmeasured:"}[result["within_allowance"]]
    rows.append(f"{RULES} rules: {extra:+.4f} ms of gateway CPU per call ({verdict} the {ALLOWED_MS} ms allowed)")
    return "\n".join(rows)


async def one_round(target: str, round_no: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    auth = make_auth("header", args.sessions)
    extra_env = {"SATGATE_STATE_DIR": "memory"}
    if target == POLICY:
        policy_file = workdir / "policy.json"
        policy_file.write_text(json.dumps(policy_document()))
        extra_env["SATGATE_POLICY_FILE"] = str(policy_file)
    gateway = Gateway(auth, args.log_level, workdir, name=f"{target}-r{round_no}", extra_env=extra_env)
    gateway.start()
    try:
        async with client_session(args.workers) as http:
            await gateway.wait_ready(http)
            client = Client(http, gateway.mcp_url)
            sessions = [await client.open(token) for token in auth.tokens]
            await load_phase(client, sessions, args.workers, min(WARMUP_SECONDS, args.duration), None)
            load = await load_phase(client, sessions, args.workers, args.duration, gateway.pid)
    finally:
        gateway.stop()
    return {"target": target, "round": round_no, **load}


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    rounds = []
    for round_no in range(1, args.rounds + 1):
        for target in TARGETS if round_no % 2 else reversed(TARGETS):
            print(f"bench: round {round_no}/{args.rounds}: {target}", file=sys.stderr, flush=True)
            rounds.append(await one_round(target, round_no, args, workdir))
    return {**summary(rounds), "rounds": rounds}


def main_policy(args: argparse.Namespace) -> int:
    """Exit 0 when every call succeeded (speed is reported, not asserted), 1 otherwise."""
    try:
        with tempfile.TemporaryDirectory(prefix="satgate-bench-policy-") as workdir:
            result = asyncio.run(run(args, Path(workdir)))
    finally:
        stop_all()
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}) if args.json else render(result))
    return 0 if result[PLAIN]["errors"] == result[POLICY]["errors"] == 0 else 1
