"""The phases of ``--compare``: each starts fresh servers, measures one thing, and stops them whatever happens."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import ACCEPT_BOTH, ACCEPT_JSON, PROGRESS_CALL, Client, McpSession, ToolCall, client_session
from bench.load import WARMUP_SECONDS, load_phase, open_many, sequential_p50, timed_call
from bench.processes import (
    Auth,
    BenchServer,
    CallgrindGateway,
    CallgrindUpstream,
    Gateway,
    Pinning,
    Upstream,
    make_auth,
)
from bench.stats import OAUTH, TARGETS, percentile, ratio

INIT_LIMIT = 50_000
IDLE_BUDGET_SECONDS = 90.0
IDLE_WARM_SESSIONS = 100
#: RSS samples a soak takes (first and last included).
SOAK_SAMPLES = 11
PAIRED_WARMUP_CALLS = 50
#: Workers of the instruction count: a little concurrency, as a real client mix has.
INSTRUCTION_WORKERS = 4
INSTRUCTION_WARMUP_CALLS = 60


@dataclass(frozen=True)
class CompareConfig:
    sessions: int
    workers: int
    duration: float
    rounds: int
    init_seconds: float
    idle_sessions: int
    sequential_calls: int
    resume_samples: int
    baseline_json: bool
    log_level: str
    pinning: Pinning
    workdir: Path
    soak_seconds: float = 0.0
    instruction_calls: int = 0
    paired_calls: int = 0
    #: ``direct`` (bench/direct.py: the SDK's low-level server in its fastest shape) or ``test-upstream``.
    baseline_kind: str = "direct"
    #: What the gateways front over stdio (``STDIO_UPSTREAMS``): the baseline's own program, unless told otherwise.
    upstream_kind: str = "direct"

    def gateway_env(self) -> dict[str, str]:
        """Quotas out of the way of what is measured: session-opening phases hold many sessions on few tokens."""
        cap = str(max(self.idle_sessions + IDLE_WARM_SESSIONS, INIT_LIMIT) + 1000)
        return {"SATGATE_SESSION_CAP": cap, "SATGATE_SESSIONS_PER_TOKEN": cap,
                "SATGATE_STATE_DIR": str(self.workdir / "state")}

    def gateway(self, auth: Auth, name: str) -> Gateway:
        return Gateway(auth, self.log_level, self.workdir, name=name, pin_cpu=self.pinning.server_cpu,
                       extra_env=self.gateway_env(), upstream=self.upstream_kind)

    def baseline(self) -> Upstream | BenchServer:
        if self.baseline_kind == "direct":
            return BenchServer("direct", self.workdir, name="baseline", pin_cpu=self.pinning.server_cpu)
        return Upstream(self.workdir, json_response=self.baseline_json, pin_cpu=self.pinning.server_cpu)

    def ceiling(self) -> BenchServer:
        return BenchServer("noop", self.workdir, name="ceiling", pin_cpu=self.pinning.server_cpu)


async def warm(client: Client, session: McpSession, calls: int = 20) -> None:
    """Imports done and the upstream child answering before anything is timed."""
    for _ in range(calls):
        await client.call(session)


async def run_target(cfg: CompareConfig, round_no: int, target: str) -> dict[str, Any]:
    """A fresh server for one target in one round: sessions, warm-up, one-at-a-time, load, initialize/s."""
    if target == OAUTH:
        async with oauth_auth(cfg.sessions) as auth:
            return await measure(cfg, cfg.gateway(auth, f"{target}-r{round_no}"), auth.tokens, round_no, target)
    server: Gateway | Upstream | BenchServer
    tokens: list[str | None]
    if target == "baseline":
        server, tokens = cfg.baseline(), [None] * cfg.sessions
    elif target == "ceiling":
        server, tokens = cfg.ceiling(), [None] * cfg.sessions
    else:
        auth = make_auth(target.removeprefix("gateway-"), cfg.sessions)
        server, tokens = cfg.gateway(auth, f"{target}-r{round_no}"), auth.tokens
    return await measure(cfg, server, tokens, round_no, target)


@contextlib.asynccontextmanager
async def oauth_auth(clients: int) -> AsyncIterator[Auth]:
    """OAuth mode against a real authorization server in this process (tests/oauth_server.py): it serves its
    metadata and keys while the target runs; one access token per client, each its own subject."""
    from tests.oauth_server import AuthServer

    audience = "http://127.0.0.1/bench/mcp"
    async with AuthServer() as idp:
        idp.default_audience = audience
        tokens: list[str | None] = [idp.mint(f"bench-{n}", ttl=3600) for n in range(clients)]
        yield Auth({"SATGATE_AUTH_MODE": "oauth", "SATGATE_OAUTH_ISSUER": idp.issuer,
                    "SATGATE_OAUTH_AUDIENCE": audience}, tokens)


async def measure(cfg: CompareConfig, server: Gateway | Upstream | BenchServer, tokens: list[str | None],
                  round_no: int, target: str) -> dict[str, Any]:
    """Start ``server``, measure it, stop it whatever happens."""
    server.start()
    try:
        async with client_session(cfg.workers) as http:
            await server.wait_ready(http)
            client = Client(http, server.mcp_url)
            sessions = [await client.open(token) for token in tokens]
            await load_phase(client, sessions, cfg.workers, min(WARMUP_SECONDS, cfg.duration), None)
            seq_p50, seq_errors = await sequential_p50(client, sessions[0], cfg.sequential_calls)
            load = await load_phase(client, sessions, cfg.workers, cfg.duration, server.pid)
            rss = server.memory_kib()
            opened, init_errors, init_seconds = await open_many(client, tokens, cfg.workers, cfg.init_seconds,
                                                                INIT_LIMIT)
    finally:
        server.stop()
    return {"round": round_no, "target": target, **load, "errors": load["errors"] + seq_errors,
            "sequential_p50_ms": seq_p50, "initialize_per_second": opened / init_seconds if init_seconds else math.nan,
            "initialize_errors": init_errors, "rss_kib_after_load": rss}


async def idle_phase(cfg: CompareConfig) -> dict[str, Any]:
    """RSS growth of one gateway (auth=header) per idle session, over ``cfg.idle_sessions`` opened sessions."""
    auth = make_auth("header", cfg.sessions)
    gateway = cfg.gateway(auth, "gateway-idle")
    gateway.start()
    try:
        async with client_session(cfg.workers) as http:
            await gateway.wait_ready(http)
            client = Client(http, gateway.mcp_url)
            await warm(client, await client.open(auth.tokens[0]))
            await open_many(client, auth.tokens, cfg.workers, IDLE_BUDGET_SECONDS, IDLE_WARM_SESSIONS)
            before = gateway.memory_kib()
            opened, errors, seconds = await open_many(client, auth.tokens, cfg.workers, IDLE_BUDGET_SECONDS,
                                                      cfg.idle_sessions)
            after = gateway.memory_kib()
            peak = gateway.memory_kib("VmHWM")
    finally:
        gateway.stop()
    grown = after - before if after is not None and before is not None else None
    return {"sessions": opened, "errors": errors, "seconds": seconds, "rss_before_kib": before,
            "rss_after_kib": after, "rss_peak_kib": peak,
            "kib_per_session": grown / opened if grown is not None and opened else math.nan}


async def resume_and_sse_phase(cfg: CompareConfig) -> dict[str, Any]:
    """Two gateway processes, one root key: a session opened on A, first called on B, is resumed there.
    Then, on A: does the gateway answer SSE when the client accepts it, and what does that path cost?"""
    auth = make_auth("header", cfg.sessions)
    a, b = cfg.gateway(auth, "gateway-a"), cfg.gateway(auth, "gateway-b")
    a.start()
    b.start()
    try:
        async with client_session(cfg.workers) as http:
            await a.wait_ready(http)
            await b.wait_ready(http)
            on_a, on_b = Client(http, a.mcp_url), Client(http, b.mcp_url)
            for client in (on_a, on_b):  # both processes warm: imports done, upstream child answering
                await warm(client, await client.open(auth.tokens[0]))
            resume = await resume_samples(on_a, on_b, auth.tokens, cfg.resume_samples)
            sse = await sse_figures(cfg, on_a, a.pid, auth.tokens)
    finally:
        a.stop()
        b.stop()
    return {"resume": resume, "sse": sse}


async def resume_samples(on_a: Client, on_b: Client, tokens: list[str | None], samples: int) -> dict[str, Any]:
    """First-call p50 of a session opened on A and called on A (ordinary) or on B (resumed there)."""
    ordinary: list[float] = []
    resumed: list[float] = []
    errors = {"ordinary": 0, "resumed": 0}
    for n in range(samples):
        token = tokens[n % len(tokens)]
        ms, ok, _ = await timed_call(on_a, await on_a.open(token))
        ordinary.append(ms)
        errors["ordinary"] += not ok
        ms, ok, _ = await timed_call(on_b, await on_a.open(token))
        resumed.append(ms)
        errors["resumed"] += not ok
    return {"samples": samples, "ordinary_first_call_p50_ms": percentile(sorted(ordinary), 0.5),
            "resumed_first_call_p50_ms": percentile(sorted(resumed), 0.5),
            "ordinary_errors": errors["ordinary"], "resumed_errors": errors["resumed"]}


async def sse_figures(cfg: CompareConfig, client: Client, pid: int | None, tokens: list[str | None]
                      ) -> dict[str, Any]:
    """What the gateway answers when both are accepted; then SSE against JSON for ``echo`` (when it answers SSE)
    and for a call with progress (which streams whenever the client reads SSE, so it is measured either way)."""
    session = await client.open(tokens[0])
    _, probe_type = await client.call(session, ACCEPT_BOTH)
    sse: dict[str, Any] = {"answers_when_both_accepted": probe_type}
    sessions = [await client.open(t) for t in tokens]

    async def both_ways(tool: ToolCall | None) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        for label, accept in (("sse", ACCEPT_BOTH), ("json", ACCEPT_JSON)):
            p50, _ = await sequential_p50(client, session, cfg.sequential_calls, accept, tool)
            load = await load_phase(client, sessions, cfg.workers, cfg.duration, pid, accept, tool)
            figures[label] = {"sequential_p50_ms": p50, **{k: load[k] for k in (
                "calls_per_second", "p50_ms", "p99_ms", "server_cpu_ms_per_call", "errors", "answer_types")}}
        return figures

    if probe_type == "text/event-stream":
        sse.update(await both_ways(None))
    sse["progress"] = await both_ways(PROGRESS_CALL)
    return sse


async def soak_phase(cfg: CompareConfig, seconds: float) -> dict[str, Any]:
    """One gateway (auth=header) under the load of the rounds for ``seconds``, RSS sampled evenly: flat or not."""
    auth = make_auth("header", cfg.sessions)
    gateway = cfg.gateway(auth, "gateway-soak")
    gateway.start()
    rss: list[int] = []
    calls = errors = 0
    try:
        async with client_session(cfg.workers) as http:
            await gateway.wait_ready(http)
            client = Client(http, gateway.mcp_url)
            sessions = [await client.open(t) for t in auth.tokens]
            await load_phase(client, sessions, cfg.workers, min(WARMUP_SECONDS, seconds), None)
            step = seconds / (SOAK_SAMPLES - 1)
            for n in range(SOAK_SAMPLES):
                kib = gateway.memory_kib()
                if kib is not None:
                    rss.append(kib)
                if n < SOAK_SAMPLES - 1:
                    load = await load_phase(client, sessions, cfg.workers, step, None)
                    calls, errors = calls + load["calls"], errors + load["errors"]
    finally:
        gateway.stop()
    return {"seconds": seconds, "calls": calls, "errors": errors, "rss_kib": rss,
            "rss_growth_kib": rss[-1] - rss[0] if len(rss) > 1 else math.nan}


async def paired_phase(cfg: CompareConfig) -> dict[str, Any]:
    """One call at a time to the baseline and to each gateway in turn, call by call, all running at once on the
    server CPU: every target sees the same moment of the machine, so the ratios hold even where the machine's
    speed drifts between rounds (it does, on a shared host)."""
    servers: dict[str, Gateway | Upstream | BenchServer] = {"baseline": cfg.baseline()}
    tokens: dict[str, str | None] = {"baseline": None}
    for target in TARGETS[1:]:
        auth = make_auth(target.removeprefix("gateway-"), 1)
        servers[target], tokens[target] = cfg.gateway(auth, f"{target}-paired"), auth.tokens[0]
    latencies: dict[str, list[float]] = {target: [] for target in TARGETS}
    errors = dict.fromkeys(TARGETS, 0)
    for server in servers.values():
        server.start()
    try:
        async with client_session(len(TARGETS)) as http:
            sessions: dict[str, tuple[Client, McpSession]] = {}
            for target, server in servers.items():
                await server.wait_ready(http)
                client = Client(http, server.mcp_url)
                sessions[target] = (client, await client.open(tokens[target]))
                await warm(*sessions[target], PAIRED_WARMUP_CALLS)
            for n in range(cfg.paired_calls):
                for k in range(len(TARGETS)):  # each target first, second and last equally often
                    target = TARGETS[(n + k) % len(TARGETS)]
                    ms, ok, _ = await timed_call(*sessions[target])
                    latencies[target].append(ms)
                    errors[target] += not ok
    finally:
        for server in servers.values():
            server.stop()
    p50 = {target: percentile(sorted(values), 0.50) for target, values in latencies.items()}
    return {"calls": cfg.paired_calls, "p50_ms": p50, "errors": errors,
            "ratio": {target: ratio(p50[target], p50["baseline"]) for target in TARGETS[1:]}}


async def instruction_phase(cfg: CompareConfig, target: str) -> dict[str, Any]:
    """Instructions per ``echo`` call of ``baseline`` or of the gateway in auth ``none``/``header`` (its stdio
    child not counted), after a warm-up."""
    server: CallgrindGateway | CallgrindUpstream
    if target == "baseline":
        server = CallgrindUpstream(cfg.workdir, json_response=cfg.baseline_json, name="baseline-callgrind")
        tokens: list[str | None] = [None] * INSTRUCTION_WORKERS
    else:
        auth = make_auth(target, INSTRUCTION_WORKERS)
        server = CallgrindGateway(auth, cfg.log_level, cfg.workdir, name=f"gateway-callgrind-{target}",
                                  extra_env=cfg.gateway_env(), upstream=cfg.upstream_kind)
        tokens = list(auth.tokens)
    return await counted_calls(server, tokens, cfg.instruction_calls)


async def counted_calls(server: CallgrindGateway | CallgrindUpstream, tokens: list[str | None], calls: int
                        ) -> dict[str, Any]:
    """Start ``server`` under callgrind, warm it up, then count the instructions of ``calls`` calls (one session
    per token, a worker each)."""
    per_worker = max(1, calls // len(tokens))
    server.start()
    try:
        async with client_session(len(tokens)) as http:
            await server.wait_ready(http)
            client = Client(http, server.mcp_url)
            sessions = [await client.open(token) for token in tokens]
            for n in range(INSTRUCTION_WARMUP_CALLS):
                await client.call(sessions[n % len(sessions)])

            async def worker(session: McpSession) -> int:
                failed = 0
                for _ in range(per_worker):
                    ok, _ = await client.call(session)
                    failed += not ok
                return failed

            await asyncio.to_thread(server.count, True)
            errors = sum(await asyncio.gather(*(worker(session) for session in sessions)))
            await asyncio.to_thread(server.count, False)
            total = await asyncio.to_thread(server.instructions)
    finally:
        server.stop()
    counted = per_worker * len(tokens)
    return {"calls": counted, "errors": errors, "instructions": total,
            "per_call": total / counted if total is not None else math.nan}
