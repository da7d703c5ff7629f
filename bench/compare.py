"""``--compare``: the phases in order, bounded by one timeout, with whatever was measured printed even when a
phase fails, times out or is interrupted."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.load import SEQUENTIAL_MAX_SECONDS, WARMUP_SECONDS
from bench.phases import (
    IDLE_BUDGET_SECONDS,
    CompareConfig,
    idle_phase,
    instruction_phase,
    paired_phase,
    resume_and_sse_phase,
    run_target,
    soak_phase,
)
from bench.pipes import pipes_phase
from bench.processes import BENCH_REDIS_URL, STDIO_UPSTREAMS, Pinning, pin_plan, redis_reachable, stop_all
from bench.render import jsonable, render_compare
from bench.stats import METERED, OAUTH, TARGETS, interleave, summarize_rounds, with_ratios


async def compare(cfg: CompareConfig, report: dict[str, Any], progress: Callable[[str], None]) -> None:
    """Fills ``report`` as it goes, so what was measured before a failure or a timeout can still be printed."""
    targets = (*TARGETS, OAUTH, METERED) if redis_reachable() else (*TARGETS, OAUTH)
    if METERED not in targets:
        progress(f"no Redis at {BENCH_REDIS_URL}: the metered target is left out")
    for round_no, target in interleave(cfg.rounds, targets):
        progress(f"round {round_no}/{cfg.rounds}: {target}")
        report["rounds"].append(await run_target(cfg, round_no, target))
    progress("the harness's ceiling: a no-op server answering canned JSON-RPC")
    report["ceiling"] = await run_target(cfg, 1, "ceiling")
    progress("the stdio upstream over its own pipes (the issue's calibration row)")
    report["pipes"] = await pipes_phase(cfg)
    if cfg.upstream_kind != "test-upstream":
        progress("the gateways' upstream over its own pipes (their floor)")
        report["floor"] = await pipes_phase(cfg, STDIO_UPSTREAMS[cfg.upstream_kind]["command"])
    if cfg.paired_calls > 0:
        progress(f"one call at a time: {cfg.paired_calls} calls each to the baseline and both gateways, in turn")
        report["paired"] = await paired_phase(cfg)
    if cfg.idle_sessions > 0:
        progress(f"idle sessions: opening {cfg.idle_sessions:,} on one gateway")
        report["idle"] = await idle_phase(cfg)
    progress("resume and SSE: two gateway processes")
    report.update(await resume_and_sse_phase(cfg))
    if cfg.soak_seconds > 0:
        progress(f"soak: {cfg.soak_seconds:g} s of load on one gateway")
        report["soak"] = await soak_phase(cfg, cfg.soak_seconds)
    if cfg.instruction_calls > 0:
        report["instructions"] = {}
        for target in ("baseline", "none", "header"):
            progress(f"instructions: {cfg.instruction_calls} calls under callgrind, {target}")
            report["instructions"][target] = await instruction_phase(cfg, target)


def estimated_seconds(args: argparse.Namespace) -> float:
    """A generous bound on the whole run from its options: the default ``--timeout`` is half as much again."""
    duration, init_seconds, rounds = float(args.duration), float(args.init_seconds), int(args.rounds)
    per_target = 12 + WARMUP_SECONDS + SEQUENTIAL_MAX_SECONDS + duration + init_seconds
    extras = (IDLE_BUDGET_SECONDS + 15 if args.idle_sessions else 0) + 30 + 4 * duration + 10
    extras += 2 * (10 + WARMUP_SECONDS + duration)  # the stdio upstreams over their pipes
    extras += per_target  # the ceiling
    extras += float(args.soak) + 20 if args.soak > 0 else 0
    extras += 3 * (90 + args.instructions / 10) if args.instructions > 0 else 0
    extras += 20 + args.paired_calls * 0.05 if args.paired_calls > 0 else 0
    return rounds * (len(TARGETS) + 2) * per_target + extras  # + 2: the oauth and metered targets


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def new_report(args: argparse.Namespace, pinning: Pinning, timeout: float) -> dict[str, Any]:
    """The report before anything is measured: the options it ran with, so even an empty one says what it was."""
    return {
        "config": {"sessions": args.sessions, "workers": args.workers, "duration": args.duration,
                   "rounds": args.rounds, "init_seconds": args.init_seconds, "idle_sessions": args.idle_sessions,
                   "sequential_calls": args.sequential_calls, "resume_samples": args.resume_samples,
                   "baseline": args.baseline, "baseline_json_response": args.baseline_json,
                   "upstream": args.upstream or args.baseline,
                   "soak_seconds": args.soak,
                   "instruction_calls": args.instructions, "paired_calls": args.paired_calls, "timeout": timeout,
                   "cpus": os.cpu_count()},
        "pinning": pinning.note, "rounds": []}


def run_compare(cfg: CompareConfig, report: dict[str, Any], timeout: float) -> int:
    """Run every phase into ``report``; the exit status of a run cut short (0 when it was not), the reason in
    ``report["error"]``. Every server started is stopped whichever way it ends."""
    def progress(text: str) -> None:
        print(f"bench: {text}", file=sys.stderr, flush=True)

    try:
        asyncio.run(asyncio.wait_for(compare(cfg, report, progress), timeout))
    except TimeoutError:
        report["error"] = f"gave up after {timeout:.0f}s"
        return 1
    except (RuntimeError, aiohttp.ClientError, OSError) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        return 1
    except KeyboardInterrupt:
        report["error"] = "interrupted"
        return 130
    finally:
        stop_all()
    return 0


def main_compare(args: argparse.Namespace) -> int:
    """Exit 0, 2 when some call failed, 1 when a phase failed or timed out, 130 when interrupted."""
    pinning = pin_plan(shutil.which("taskset"), sorted(os.sched_getaffinity(0)))
    if pinning.client_cpu is not None:
        os.sched_setaffinity(0, {pinning.client_cpu})  # before any thread exists: they all inherit it
    timeout = args.timeout if args.timeout is not None else estimated_seconds(args) * 1.5
    report = new_report(args, pinning, timeout)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with tempfile.TemporaryDirectory(prefix="satgate-bench-") as workdir:
            cfg = CompareConfig(args.sessions, args.workers, args.duration, args.rounds, args.init_seconds,
                                args.idle_sessions, args.sequential_calls, args.resume_samples, args.baseline_json,
                                args.log_level, pinning, Path(workdir), args.soak, args.instructions,
                                args.paired_calls, args.baseline, args.upstream or args.baseline)
            status = run_compare(cfg, report, timeout)
    finally:
        signal.signal(signal.SIGTERM, previous)
    report["rounds"] = with_ratios(report["rounds"])
    if len(report["rounds"]) and args.rounds > 1:
        report["summary"] = summarize_rounds(report["rounds"])
    print(json.dumps(jsonable(report)) if args.json else render_compare(report))
    if status:
        print(f"bench: {report['error']}", file=sys.stderr)
        return status
    return 2 if any(r["errors"] for r in report["rounds"]) else 0
