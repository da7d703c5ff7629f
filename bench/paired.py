"""Two gateways side by side, the plain one (``gateway-header``) and the same with one feature on, alternating round by
round (each gateway fresh, so drift on the machine hits both alike): gateway CPU per call for each, the median over
rounds, and the difference against what the issue allows. ``--policy`` (bench/policy.py) and ``--audit``
(bench/audit.py) are two such pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import Client, client_session
from bench.load import WARMUP_SECONDS, load_phase
from bench.phases import INSTRUCTION_WORKERS, counted_calls
from bench.processes import Auth, CallgrindGateway, Gateway, make_auth, stop_all
from bench.stats import median

PLAIN = "gateway-header"


@dataclass(frozen=True)
class Variant:
    """The feature's target: its name, the settings that turn it on (given a scratch folder), what the figure is
    called, and the gateway CPU the issue allows it per call."""

    target: str
    short: str
    label: str
    allowed_ms: float
    env: Callable[[Path], dict[str, str]]
    #: Tool controls (a ``controls`` caveat's JSON) every token of this target carries; None: none.
    controls: str | None = None
    #: The target turns a feature *off*: the feature's cost is what turning it off saves (plain minus target).
    turns_off: bool = False

    @property
    def targets(self) -> tuple[str, str]:
        return PLAIN, self.target

    @property
    def key(self) -> str:
        return f"{self.short}_minus_plain_cpu_ms_per_call"


def summary(rounds: list[dict[str, Any]], variant: Variant) -> dict[str, Any]:
    """Median gateway CPU ms per call and calls/s per target; the difference, and whether it is within what the
    issue allows."""
    figures = {target: {"cpu_ms_per_call": median([r["server_main_cpu_ms_per_call"] for r in runs]),
                        "calls_per_second": median([r["calls_per_second"] for r in runs]),
                        "p50_ms": median([r["p50_ms"] for r in runs]), "errors": sum(r["errors"] for r in runs)}
               for target in variant.targets for runs in [[r for r in rounds if r["target"] == target]]}
    extra = figures[variant.target]["cpu_ms_per_call"] - figures[PLAIN]["cpu_ms_per_call"]
    return {**figures, variant.key: extra, "allowed_ms": variant.allowed_ms,
            "within_allowance": bool((-extra if variant.turns_off else extra) <= variant.allowed_ms)
            if not math.isnan(extra) else None}


def render(result: dict[str, Any], variant: Variant) -> str:
    rows = [f"{'target':<15} {'gateway CPU ms/call':>20} {'calls/s':>9} {'p50 ms':>8} {'errors':>7}"]
    for target in variant.targets:
        f = result[target]
        rows.append(f"{target:<15} {f['cpu_ms_per_call']:>20.4f} {f['calls_per_second']:>9.0f} "
                    f"{f['p50_ms']:>8.2f} {f['errors']:>7}")
    extra = result[variant.key]
    verdict = {True: "within", False: "OVER", None: "unmeasured:"}[result["within_allowance"]]
    rows.append(f"{variant.label}: {extra:+.4f} ms of gateway CPU per call ({verdict} the {variant.allowed_ms} ms "
                "allowed)")
    counted = result.get("instructions")
    if counted is not None:
        per_call = ", ".join(f"{t} {n:,.0f}" for t, n in counted["per_call"].items())
        rows.append(f"instructions per call (callgrind, user space): {per_call}; {variant.label}: "
                    f"{counted['extra_per_call']:+,.0f} = {counted['extra_ms_at_plain_rate']:+.4f} ms at the plain "
                    "gateway's CPU per instruction in this run")
    return "\n".join(rows)


async def loaded_gateway(auth: Auth, args: argparse.Namespace, workdir: Path, name: str,
                         extra_env: dict[str, str]) -> dict[str, Any]:
    """One fresh gateway with these settings: its sessions opened, a warm-up, then one measured load phase."""
    gateway = Gateway(auth, args.log_level, workdir, name=name, extra_env={"SATGATE_STATE_DIR": "memory", **extra_env})
    gateway.start()
    try:
        async with client_session(args.workers) as http:
            await gateway.wait_ready(http)
            client = Client(http, gateway.mcp_url)
            sessions = [await client.open(token) for token in auth.tokens]
            await load_phase(client, sessions, args.workers, min(WARMUP_SECONDS, args.duration), None)
            return await load_phase(client, sessions, args.workers, args.duration, gateway.pid)
    finally:
        gateway.stop()


async def one_round(target: str, round_no: int, args: argparse.Namespace, workdir: Path, variant: Variant
                    ) -> dict[str, Any]:
    extra_env = variant.env(workdir) if target == variant.target else {}
    controls = variant.controls if target == variant.target else None
    load = await loaded_gateway(make_auth("header", args.sessions, controls=controls), args, workdir,
                                f"{target}-r{round_no}", extra_env)
    return {"target": target, "round": round_no, **load}


async def run(args: argparse.Namespace, workdir: Path, variant: Variant) -> dict[str, Any]:
    rounds = []
    for round_no in range(1, args.rounds + 1):
        for target in variant.targets if round_no % 2 else reversed(variant.targets):
            print(f"bench: round {round_no}/{args.rounds}: {target}", file=sys.stderr, flush=True)
            rounds.append(await one_round(target, round_no, args, workdir, variant))
    result = {**summary(rounds, variant), "rounds": rounds}
    if getattr(args, "instructions", 0):
        result["instructions"] = await counted_pair(args, workdir, variant, result[PLAIN]["cpu_ms_per_call"])
    return result


async def counted_pair(args: argparse.Namespace, workdir: Path, variant: Variant, plain_cpu_ms: float
                       ) -> dict[str, Any]:
    """The pair under callgrind: instructions per call of each, the difference, and that difference in ms at the
    plain gateway's own CPU ms per instruction in this run. Instructions do not move with the machine's noise (a
    null pair differs by ±0.02 ms on shared cores); what they leave out is the kernel's share (write, fsync), and work
    done once per batch (the audit writer's) counts about once per call, since calls are fifty times slower there."""
    counts = {}
    for target in variant.targets:
        print(f"bench: instructions: {target}", file=sys.stderr, flush=True)
        on = target == variant.target
        auth = make_auth("header", INSTRUCTION_WORKERS, controls=variant.controls if on else None)
        env = {"SATGATE_STATE_DIR": "memory", **(variant.env(workdir) if on else {})}
        server = CallgrindGateway(auth, args.log_level, workdir, name=f"{target}-callgrind", extra_env=env)
        counts[target] = await counted_calls(server, list(auth.tokens), args.instructions)
    extra = counts[variant.target]["per_call"] - counts[PLAIN]["per_call"]
    ms_per_instruction = plain_cpu_ms / counts[PLAIN]["per_call"]
    return {"per_call": {t: c["per_call"] for t, c in counts.items()}, "extra_per_call": extra,
            "extra_ms_at_plain_rate": extra * ms_per_instruction,
            "errors": sum(c["errors"] for c in counts.values())}


def main_paired(args: argparse.Namespace, variant: Variant) -> int:
    """Exit 0 when every call succeeded (speed is reported, not asserted), 1 otherwise."""
    try:
        with tempfile.TemporaryDirectory(prefix=f"satgate-bench-{variant.short}-") as workdir:
            result = asyncio.run(run(args, Path(workdir), variant))
    finally:
        stop_all()
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}) if args.json else render(result, variant))
    return 0 if result[PLAIN]["errors"] == result[variant.target]["errors"] == 0 else 1
