"""The command line: the default mode's flags, then the ``--compare`` group, and the dispatch between them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from bench.audit import main_audit
from bench.compare import main_compare
from bench.console import main_console
from bench.controls import main_controls
from bench.plain import main_plain
from bench.policy import main_policy
from bench.tracing import main_tracing

DESCRIPTION = "Load benchmark: a real gateway process, the real stdio test upstream, N concurrent clients."
MAX_CLIENTS = 1000
MAX_CALLS = 1_000_000
MAX_IDLE_SESSIONS = 100_000


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type refusing what would only fail (or run for days) later."""
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
        return value

    return parse


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < 86_400:
        raise argparse.ArgumentTypeError("must be a positive number of seconds below a day")
    return value


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_plain_arguments(parser)
    add_compare_arguments(parser)
    parser.add_argument_group("tracing off and on (--tracing)").add_argument(
        "--tracing", action="store_true",
        help="two gateways in turn, SATGATE_TRACING off and otlp (always_on sampler, a receiver this process serves): "
             "gateway CPU ms per call for each and the difference; uses --sessions, --workers, --duration, --rounds, "
             "--auth, --json")
    parser.add_argument_group("policy rules (--policy)").add_argument(
        "--policy", action="store_true",
        help="two targets in turn, gateway-header and gateway-policy (the same with a 50-rule SATGATE_POLICY_FILE, "
             "bench/policy.py): gateway CPU ms per call for each and the difference; uses --sessions, --workers, "
             "--duration, --rounds, --json")
    parser.add_argument_group("tool controls (--controls)").add_argument(
        "--controls", action="store_true",
        help="two targets in turn, gateway-header and gateway-controls (every token carries tool controls for other "
             "tools, bench/controls.py): what a call no control matches pays, in gateway CPU ms per call; uses "
             "--sessions, --workers, --duration, --rounds, --json")
    parser.add_argument_group("operator console (--console)").add_argument(
        "--console", action="store_true",
        help="two targets in turn, gateway-header (console on, the default) and gateway-console-off "
             "(SATGATE_CONSOLE=off, bench/console.py): what the console costs a call; uses --sessions, --workers, "
             "--duration, --rounds, --json")
    parser.add_argument_group("audit trail (--audit)").add_argument(
        "--audit", action="store_true",
        help="two targets in turn, gateway-header and gateway-audit (the same with SATGATE_AUDIT_FILE, "
             "bench/audit.py): gateway CPU ms per call for each and the difference; uses --sessions, --workers, "
             "--duration, --rounds, --json")
    return parser


def add_plain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--clients", type=bounded_int(1, MAX_CLIENTS), default=10,
                        help="concurrent clients, one MCP session each (default 10)")
    parser.add_argument("-c", "--calls", type=bounded_int(1, MAX_CALLS), default=100,
                        help="tools/call per client (default 100)")
    parser.add_argument("--auth", choices=["none", "config", "header"], default="header",
                        help="gateway auth mode; header mints one macaroon per client (default header)")
    parser.add_argument("--client", choices=["raw", "sdk"], default="raw",
                        help="raw aiohttp JSON-RPC, or the official mcp SDK client (default raw)")
    parser.add_argument("--log-level", default="INFO", help="the gateway's SATGATE_LOG_LEVEL (default INFO)")
    parser.add_argument("--timeout", type=positive_float, default=None,
                        help="give up after this many seconds (default 300; with --compare: from the options)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--state-dir", default="",
                        help="the gateway's SATGATE_STATE_DIR, or memory (default: a folder in the bench's temp dir)")
    parser.add_argument("--budget-limit", type=float, default=None,
                        help="header mode: mint each token with this budget, so every call is a durable charge")


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("side-by-side comparison (--compare)")
    group.add_argument("--compare", action="store_true",
                       help="baseline (the SDK upstream alone over HTTP) vs the gateway in auth none and header")
    group.add_argument("--sessions", type=bounded_int(1, MAX_CLIENTS), default=8, help="MCP sessions (default 8)")
    group.add_argument("--workers", type=bounded_int(1, MAX_CLIENTS), default=16,
                       help="concurrent callers spread over the sessions (default 16)")
    group.add_argument("--duration", type=positive_float, default=10.0, help="seconds per load phase (default 10)")
    group.add_argument("--rounds", type=bounded_int(1, 20), default=3,
                       help="interleaved rounds of baseline, gateway-none, gateway-header (default 3)")
    group.add_argument("--init-seconds", type=positive_float, default=3.0,
                       help="seconds of the initialize/s phase (default 3)")
    group.add_argument("--idle-sessions", type=bounded_int(0, MAX_IDLE_SESSIONS), default=10_000,
                       help="idle sessions opened on one gateway for KiB/session; 0 skips (default 10000)")
    group.add_argument("--sequential-calls", type=bounded_int(1, 10_000), default=200,
                       help="calls of the one-at-a-time phase (default 200, at most 5 s)")
    group.add_argument("--resume-samples", type=bounded_int(1, 1000), default=20,
                       help="sessions resumed on a second gateway process (default 20)")
    group.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                       help="then load one gateway this long, sampling its RSS (600 for the issue's soak; "
                            "default 0: skipped)")
    group.add_argument("--paired-calls", type=bounded_int(0, 100_000), default=300, metavar="CALLS",
                       help="one call at a time to the baseline and both gateways in turn, this many each "
                            "(default 300; 0 skips)")
    group.add_argument("--instructions", type=bounded_int(0, 100_000), default=0, metavar="CALLS",
                       help="then count instructions per call under valgrind's callgrind over this many "
                            "calls: the baseline, and the gateway in auth none and header (400 is plenty; "
                            "default 0: skipped)")
    group.add_argument("--baseline", choices=["direct", "test-upstream"], default="direct",
                       help="direct: the echo tool on the SDK's low-level server, JSON answers, uvicorn with uvloop "
                            "and httptools (bench/direct.py; default); test-upstream: tests/upstream_server.py")
    group.add_argument("--upstream", choices=["direct", "test-upstream"], default=None,
                       help="what the gateways front over stdio: direct (bench/direct.py --stdio, the baseline's own "
                            "server: both sides run the same program) or test-upstream; default: as --baseline")
    group.add_argument("--baseline-json", action="store_true",
                       help="with --baseline test-upstream: run it with --json-response (default: SSE answers)")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    if args.tracing:
        return main_tracing(args)
    if args.policy:
        return main_policy(args)
    if args.audit:
        return main_audit(args)
    if args.controls:
        return main_controls(args)
    if args.console:
        return main_console(args)
    return main_compare(args) if args.compare else main_plain(args)
