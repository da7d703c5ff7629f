"""``--tracing``: the gateway with tracing off and with ``otlp`` side by side, gateway CPU per call for each.

``otlp`` runs with the ``always_on`` sampler (every call traced: the worst case) and exports to an OTLP/HTTP
receiver this process serves (it reads each batch and answers 200, as a collector would), so the export
thread's work is in the gateway's CPU too. The two gateways alternate round by round, each fresh, so drift on
the machine hits both alike; the figure per mode is the median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.paired import loaded_gateway
from bench.processes import HOST, make_auth, stop_all
from bench.stats import median

MODES = ("off", "otlp")
#: What the issue allows ``otlp`` over ``off``, in gateway CPU milliseconds per call.
ALLOWED_MS = 0.03


def tracing_env(mode: str, receiver_port: int) -> dict[str, str]:
    """The gateway's variables for one mode: off as by default; otlp tracing every call to the bench's receiver."""
    if mode == "off":
        return {"SATGATE_TRACING": "off"}
    return {"SATGATE_TRACING": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{HOST}:{receiver_port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_BSP_SCHEDULE_DELAY": "200"}


@dataclass
class Received:
    posts: int = 0
    bytes: int = 0
    sizes: list[int] = field(default_factory=list)


@asynccontextmanager
async def receiver() -> AsyncIterator[tuple[int, Received]]:
    """An OTLP/HTTP endpoint on a free loopback port: (port, what it received)."""
    received = Received()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        received.posts += 1
        received.bytes += len(body)
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    try:
        yield runner.addresses[0][1], received
    finally:
        await runner.cleanup()


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median gateway CPU ms per call (its main process: where tracing runs) and calls/s for each mode; the
    difference otlp - off, and whether it is within what the issue allows."""
    per_mode = {mode: [r for r in rounds if r["mode"] == mode] for mode in MODES}
    figures = {mode: {"cpu_ms_per_call": median([r["server_main_cpu_ms_per_call"] for r in runs]),
                      "calls_per_second": median([r["calls_per_second"] for r in runs]),
                      "p50_ms": median([r["p50_ms"] for r in runs]), "errors": sum(r["errors"] for r in runs)}
               for mode, runs in per_mode.items()}
    extra = figures["otlp"]["cpu_ms_per_call"] - figures["off"]["cpu_ms_per_call"]
    return {**figures, "otlp_minus_off_cpu_ms_per_call": extra, "allowed_ms": ALLOWED_MS,
            "within_allowance": bool(extra <= ALLOWED_MS) if not math.isnan(extra) else None}


def render(result: dict[str, Any]) -> str:
    rows = [f"{'tracing':<8} {'gateway CPU ms/call':>20} {'calls/s':>9} {'p50 ms':>8} {'errors':>7}"]
    for mode in MODES:
        f = result[mode]
        rows.append(f"{mode:<8} {f['cpu_ms_per_call']:>20.4f} {f['calls_per_second']:>9.0f} {f['p50_ms']:>8.2f} "
                    f"{f['errors']:>7}")
    extra = result["otlp_minus_off_cpu_ms_per_call"]
    verdict = {True: "within", False: "OVER", None: "unmeasured:"}[result["within_allowance"]]
    rows.append(f"otlp - off: {extra:+.4f} ms of gateway CPU per call ({verdict} the {ALLOWED_MS} ms allowed); "
                f"receiver got {result['received_posts']} export batches, {result['received_bytes']:,} bytes")
    return "\n".join(rows)


async def one_round(mode: str, round_no: int, args: argparse.Namespace, workdir: Path, port: int) -> dict[str, Any]:
    load = await loaded_gateway(make_auth(args.auth, args.sessions), args, workdir, f"tracing-{mode}-r{round_no}",
                                tracing_env(mode, port))
    return {"mode": mode, "round": round_no, **load}


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    rounds = []
    async with receiver() as (port, received):
        for round_no in range(1, args.rounds + 1):
            for mode in MODES if round_no % 2 else reversed(MODES):
                print(f"bench: round {round_no}/{args.rounds}: tracing {mode}", file=sys.stderr, flush=True)
                rounds.append(await one_round(mode, round_no, args, workdir, port))
    return {**summary(rounds), "received_posts": received.posts, "received_bytes": received.bytes,
            "rounds": rounds}


def main_tracing(args: argparse.Namespace) -> int:
    """Exit 0 when every call succeeded (whatever the figures: speed is reported, not asserted), 1 otherwise."""
    try:
        with tempfile.TemporaryDirectory(prefix="satgate-bench-tracing-") as workdir:
            result = asyncio.run(run(args, Path(workdir)))
    finally:
        stop_all()
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}) if args.json else render(result))
    return 0 if result["off"]["errors"] == result["otlp"]["errors"] == 0 else 1
