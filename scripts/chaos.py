"""Chaos: two gateways on one Redis under load from official-SDK clients while faults come, several at once.

Two ``satgate-mcp serve`` processes (header mode, budgets and a rate limit on) share a redis-server this script
starts on a free port (with an append-only file, so a killed Redis keeps what it acknowledged) and one
revocation file. A balancer in front (Fly's proxy in miniature: each request to the next live gateway, a refused
connection to the one after) carries the traffic of N official MCP SDK clients, each calling a tool in a loop
under its own token. Meanwhile the script SIGKILLs a gateway (and restarts it), pauses and kills Redis, kills the
upstream children, rotates the revocation file, and at the end kills a gateway while Redis is paused.

It prints a table: calls attempted, answered, failed (each failure classified: in flight on a killed process,
refused 503 with Retry-After while the store was down, or anything else), budget charged vs calls answered,
sessions lost (a client of a killed gateway must go on on the other under the same session id), and the
survivor's RSS before and after. It exits 1 on anything "else", a lost session, a charge without an answer
beyond the calls cut in flight, or an answer without a charge.

    python scripts/chaos.py                  five minutes, 50 clients, then the fuzz suites at ~100,000 cases
    python scripts/chaos.py --short          about a minute, 16 clients, no long fuzz (CI)
    python scripts/chaos.py --seconds 120 --clients 30 --no-fuzz
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from satgate_mcp.auth.macaroons import mint_token  # noqa: E402
from tests.cluster.redis_server import RedisServer  # noqa: E402
from tests.gateway_process import GatewayProcess, child_pids, sdk_session  # noqa: E402

ROOT_KEY = "chaos-script-root-key-0123456789abcdefghijkl"
BUDGET = 1_000_000
CALL_TIMEOUT = 15.0
#: Cases multiplier for the long form's fuzz run: the two edge suites hold ~1,500 cases at scale 1.
FUZZ_SCALE_LONG = "68"
FUZZ_SUITES = ["tests/transport/test_fuzz.py", "tests/transport/test_fuzz_modern.py"]
IN_FLIGHT = "in flight on (or connected to) a killed process"
#: Seconds after a killed process is back during which a call on a connection opened to it still counts as cut
#: by the kill (a pooled keep-alive connection to the dead process fails on its next use).
KILL_GRACE = 3.0
#: The SDK's code for a call on a client whose transport has died (the gateway's -32000 answers carry data).
CONNECTION_CLOSED = -32000
STORE_DOWN = "refused 503 + Retry-After (store down)"


@dataclass
class Observed:
    """What the balancer saw, shared by every client's transport."""

    #: Which gateway port carried each call (by the call's unique text).
    port_of: dict[str, int] = field(default_factory=dict)
    refused_503: set[str] = field(default_factory=set)
    missing_retry_after: int = 0
    session_404: set[str] = field(default_factory=set)
    #: (instant, port, back at) of each process kill: a gateway, or the upstream children of the gateway on that port.
    kills: list[tuple[float, int, float]] = field(default_factory=list)


def call_key(request: httpx2.Request) -> str | None:
    if request.method != "POST":
        return None
    with contextlib.suppress(ValueError):
        body = json.loads(request.content)
        if isinstance(body, dict) and body.get("method") == "tools/call":
            return str(body.get("params", {}).get("arguments", {}).get("text"))
    return None


class Balancer(httpx2.AsyncBaseTransport):
    """Each request to the next gateway in turn; a connection refused (nothing delivered) goes to the next."""

    def __init__(self, ports: list[int], observed: Observed) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self._ports = ports
        self._next = itertools.cycle(range(len(ports)))
        self._observed = observed

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        key = call_key(request)
        first = next(self._next)
        for k in range(len(self._ports)):
            port = self._ports[(first + k) % len(self._ports)]
            request.url = request.url.copy_with(port=port)
            request.headers["Host"] = f"127.0.0.1:{port}"
            try:
                response = await self._inner.handle_async_request(request)
            except httpx2.ConnectError:  # nothing was delivered: the next gateway may take it
                continue
            self._note(key, port, request, response)
            return response
        raise httpx2.ConnectError("no gateway is up", request=request)

    def _note(self, key: str | None, port: int, request: httpx2.Request, response: httpx2.Response) -> None:
        if key is not None:
            self._observed.port_of[key] = port
        if response.status_code == 503:
            if key is not None:
                self._observed.refused_503.add(key)
            if "retry-after" not in response.headers:
                self._observed.missing_retry_after += 1
        if response.status_code == 404 and key is not None:
            self._observed.session_404.add(request.headers.get("mcp-session-id", "?"))

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Tally:
    attempted: int = 0
    answered: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    answered_by_token: Counter[str] = field(default_factory=Counter)
    in_flight_by_token: Counter[str] = field(default_factory=Counter)


def classify(key: str, started: float, ended: float, error: BaseException, observed: Observed) -> str:
    """Why one call failed: only a kill during the call (on the process it was on) or a 503 with Retry-After
    while the store was down are expected; anything else is a bug for this suite to find."""
    if key in observed.refused_503:
        return STORE_DOWN
    port = observed.port_of.get(key)
    if any(at <= ended and started <= back + KILL_GRACE and (port is None or port == p)
           for at, p, back in observed.kills):
        return IN_FLIGHT
    return f"else: {type(error).__name__}"


@dataclass
class Agent:
    """One SDK client under its own token, calling until told to stop. The official Python client dies whole
    when a connection is cut under a request (its task group re-raises the read error): a real agent host then
    opens a new session, and so does this one, the call it had in flight counted as failed."""

    n: int
    observed: Observed
    tally: Tally
    current: tuple[str, float] | None = None
    restarts: int = 0

    @property
    def token_id(self) -> str:
        return f"chaos-{self.n}-{os.getpid()}"

    async def run(self, url: str, ports: list[int], stop: asyncio.Event, ready: Callable[[], None]) -> None:
        token = mint_token(ROOT_KEY, self.token_id, budget_limit=BUDGET)
        counter = itertools.count()
        while not stop.is_set():
            try:
                async with sdk_session(url, token, timeout=CALL_TIMEOUT,
                                       transport=Balancer(ports, self.observed)) as session:
                    if self.restarts == 0:
                        ready()
                    while not stop.is_set():
                        await self.call(session, f"{self.token_id}-{next(counter)}")
            except* (httpx2.TransportError, MCPError, TimeoutError, OSError) as crash:
                self.crashed(crash)

    def crashed(self, crash: BaseException) -> None:
        self.restarts += 1

        if self.current is None:  # the handshake failed: no call was lost with it
            return
        key, started = self.current
        self.current = None
        self.failed(key, started, crash)

    def failed(self, key: str, started: float, error: BaseException) -> None:
        why = classify(key, started, time.monotonic(), error, self.observed)
        self.tally.failures[why] += 1
        self.tally.examples.setdefault(why, f"{key}: {error!r}"[:300])
        if why == IN_FLIGHT:
            self.tally.in_flight_by_token[self.token_id] += 1

    async def call(self, session: ClientSession, key: str) -> None:
        self.tally.attempted += 1
        self.current = (key, time.monotonic())
        try:
            result = await asyncio.wait_for(session.call_tool("echo", {"text": key}), CALL_TIMEOUT)
        except MCPError as exc:
            if exc.error.code == CONNECTION_CLOSED and exc.error.data is None:  # the client's transport died (the
                raise  # gateway's own errors all carry data): leave the session, as an agent host would
            self.failed(key, self.current[1], exc)
            self.current = None
            await asyncio.sleep(0.05)  # a real agent backs off a little before its next call
            return
        except TimeoutError as exc:
            self.failed(key, self.current[1], exc)
            self.current = None
            await asyncio.sleep(0.05)  # a real agent backs off a little before its next call
            return
        self.current = None
        text = getattr(result.content[0], "text", None) if result.content else None
        if result.is_error or text != key:
            self.tally.failures["else: wrong answer"] += 1
            self.tally.examples.setdefault("else: wrong answer", f"{key}: {result!r}"[:300])
            return
        self.tally.answered += 1
        self.tally.answered_by_token[self.token_id] += 1


class OwnRedis(RedisServer):
    """A redis-server of the script's own (the machine's shared one is never paused or killed), append-only with
    an fsync per write, so a SIGKILL loses nothing it acknowledged."""

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rss_kib(gw: GatewayProcess) -> int:
    if gw.proc is None:
        return 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{gw.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@dataclass
class Rig:
    workdir: Path
    store: OwnRedis
    gateways: list[GatewayProcess]
    revocations: Path
    observed: Observed = field(default_factory=Observed)
    log: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self.started:6.1f}s  {what}")

    async def kill_gateway(self, gw: GatewayProcess, down: float) -> None:
        killed = time.monotonic()
        self.observed.kills.append((killed, gw.port, math.inf))  # down until it is back
        entry = len(self.observed.kills) - 1
        await gw.kill()
        self.note(f"SIGKILL gateway :{gw.port}")
        await asyncio.sleep(down)
        gw.start()
        await gw.wait_ready()
        self.observed.kills[entry] = (killed, gw.port, time.monotonic())
        self.note(f"gateway :{gw.port} back")

    async def kill_children(self) -> None:
        for gw in self.gateways:
            if gw.proc is None:
                continue
            now = time.monotonic()
            self.observed.kills.append((now, gw.port, now))  # children restart on the next call
            for pid in child_pids(gw.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.note("SIGKILL every upstream child")

    async def pause_store(self, milliseconds: int) -> None:
        await self.store.pause(milliseconds)
        self.note(f"Redis paused {milliseconds} ms")

    async def kill_store(self, down: float) -> None:
        self.store.kill()
        self.note("SIGKILL Redis")
        await asyncio.sleep(down)
        await self.store.start()
        self.note("Redis back")

    async def at_once(self, *faults: Awaitable[None]) -> None:
        await asyncio.gather(*faults)

    async def rotate_revocations(self) -> None:
        """logrotate's way: a new file renamed over the old one (a new inode), revoking a canary token id."""
        fresh = self.revocations.with_suffix(".new")
        fresh.write_text(self.revocations.read_text() + "chaos-canary\n")
        fresh.replace(self.revocations)
        self.note("revocation file rotated (canary revoked)")


async def faults(rig: Rig, seconds: float) -> None:
    """The schedule: single faults first, then two at once; each at a fraction of the run."""
    a, b = rig.gateways
    plan: list[tuple[float, Callable[[], Awaitable[None]]]] = [
        (0.15, lambda: rig.kill_gateway(a, 2.0)),
        (0.30, lambda: rig.pause_store(2000)),
        (0.42, lambda: rig.kill_store(2.0)),
        (0.55, rig.kill_children),
        (0.65, rig.rotate_revocations),
        (0.75, lambda: rig.at_once(rig.pause_store(1500), rig.kill_gateway(b, 1.5))),
    ]
    for fraction, action in plan:
        delay = rig.started + fraction * seconds - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await action()



async def spent(gw: GatewayProcess, token_id: str) -> int:
    """What the shared budget says this token spent, asked of a gateway as the token itself (raw HTTP:
    ``satgate/budget`` is the gateway's own method, which the SDK client has no call for)."""
    token = mint_token(ROOT_KEY, token_id, budget_limit=BUDGET)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": "application/json", "MCP-Protocol-Version": "2025-11-25"}
    async with httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as http:
        init = await http.post(f"{gw.url}/mcp", headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "chaos", "version": "1"}}})
        headers["Mcp-Session-Id"] = init.headers["mcp-session-id"]
        reply = await http.post(f"{gw.url}/mcp", headers=headers,
                                json={"jsonrpc": "2.0", "id": 2, "method": "satgate/budget"})
        return BUDGET - int(reply.json()["result"]["remaining"])


async def canary_refused(gw: GatewayProcess) -> bool:
    """The token revoked by the rotated file is refused (the rotation was read), by this gateway."""
    token = mint_token(ROOT_KEY, "chaos-canary")
    async with httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as http:
        resp = await http.post(f"{gw.url}/mcp", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "canary", "version": "1"}}})
        return resp.status_code in (401, 403)


@dataclass
class Verdict:
    rows: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def row(self, name: str, value: object, problem: str | None = None) -> None:
        self.rows.append((name, str(value)))
        if problem is not None:
            self.problems.append(problem)

    def print(self) -> None:
        width = max(len(name) for name, _ in self.rows)
        print()
        for name, value in self.rows:
            print(f"{name:<{width}}  {value}")
        print()
        print("PASS" if not self.problems else "FAIL:\n  " + "\n  ".join(self.problems))


async def accounting(rig: Rig, tally: Tally, verdict: Verdict) -> None:
    """Every token's charge lies between its answered calls and those plus its calls cut in flight."""
    survivor = rig.gateways[1]
    tokens = sorted(set(tally.answered_by_token) | set(tally.in_flight_by_token))
    charges = await asyncio.gather(*(spent(survivor, t) for t in tokens))
    total = sum(charges)
    off = [(t, c, tally.answered_by_token[t], tally.in_flight_by_token[t]) for t, c in zip(tokens, charges, strict=True)
           if not tally.answered_by_token[t] <= c <= tally.answered_by_token[t] + tally.in_flight_by_token[t]]
    verdict.row("budget charged", total)
    verdict.row("charged - answered", total - tally.answered,
                f"charges off for {len(off)} tokens, e.g. (token, charged, answered, cut) {off[:3]}" if off else None)


async def run(seconds: float, clients: int, workdir: Path) -> Verdict:
    store = OwnRedis(workdir)
    await store.start()
    revocations = workdir / "revoked.txt"
    revocations.write_text("")
    settings = {"SATGATE_REDIS_URL": store.url, "SATGATE_ENFORCEMENT": "control", "SATGATE_RATE_LIMIT": "1000/s",
                "SATGATE_REVOCATION_FILE": str(revocations)}
    gateways = [GatewayProcess(workdir, root_key=ROOT_KEY, revocation_file=revocations, settings=settings)
                for _ in range(2)]
    rig = Rig(workdir, store, gateways, revocations)
    try:
        for gw in gateways:
            gw.start()
        await asyncio.gather(*(gw.wait_ready() for gw in gateways))
        return await load(rig, seconds, clients)
    finally:
        for gw in gateways:
            gw.terminate()
        store.kill()


async def load(rig: Rig, seconds: float, clients: int) -> Verdict:
    ports = [gw.port for gw in rig.gateways]
    tally, stop, verdict = Tally(), asyncio.Event(), Verdict()
    connected: list[int] = []
    all_in = asyncio.Event()

    def ready() -> None:
        connected.append(1)
        if len(connected) == clients:
            all_in.set()

    agents = [Agent(n, rig.observed, tally) for n in range(clients)]
    runs = [asyncio.ensure_future(a.run(rig.gateways[0].url, ports, stop, ready)) for a in agents]
    await asyncio.wait_for(all_in.wait(), 60)
    rss_before = rss_kib(rig.gateways[1])
    rig.started = time.monotonic()
    await faults(rig, seconds)
    await asyncio.sleep(max(0.0, rig.started + seconds - time.monotonic()))
    stop.set()
    done = await asyncio.gather(*runs, return_exceptions=True)
    crashed = [repr(d)[:200] for d in done if isinstance(d, BaseException)]
    verdict.row("SDK clients reconnected after a cut", sum(a.restarts for a in agents))
    await report(rig, tally, verdict, crashed, (rss_before, rss_kib(rig.gateways[1])))
    return verdict


async def report(rig: Rig, tally: Tally, verdict: Verdict, crashed: list[str], rss: tuple[int, int]) -> None:
    unclassified = {why: n for why, n in tally.failures.items() if why.startswith("else")}
    verdict.row("clients", len(tally.answered_by_token) or "-")
    verdict.row("calls attempted", tally.attempted)
    verdict.row("calls answered", tally.answered)
    verdict.row(f"failed: {IN_FLIGHT}", tally.failures[IN_FLIGHT])
    verdict.row(f"failed: {STORE_DOWN}", tally.failures[STORE_DOWN])
    verdict.row("failed: anything else", sum(unclassified.values()),
                f"unclassified failures {unclassified}: {[tally.examples[w] for w in unclassified][:3]}"
                if unclassified else None)
    verdict.row("503 without Retry-After", rig.observed.missing_retry_after,
                "a 503 without Retry-After" if rig.observed.missing_retry_after else None)
    lost = rig.observed.session_404
    verdict.row("sessions lost", len(lost), f"sessions lost: {sorted(lost)[:3]}" if lost else None)
    verdict.row("agents crashed", len(crashed), f"agents crashed: {crashed[:3]}" if crashed else None)
    await accounting(rig, tally, verdict)
    refused = [await canary_refused(gw) for gw in rig.gateways]
    verdict.row("revoked canary refused", refused, None if all(refused) else "a gateway missed the rotated file")
    verdict.row("survivor RSS before/after (MiB)", f"{rss[0] / 1024:.0f} / {rss[1] / 1024:.0f}")
    for line in rig.log:
        print(line)



def long_fuzz() -> int:
    """The fuzz suites at about 100,000 cases."""
    env = {**os.environ, "FUZZ_SCALE": FUZZ_SCALE_LONG}
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FUZZ_SUITES],
                           cwd=ROOT, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="about a minute, for CI")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--no-fuzz", action="store_true", help="skip the long form's fuzz run")
    args = parser.parse_args()
    # The SDK logs every transport it loses with a traceback; the table says what happened to each call.
    logging.getLogger("mcp").setLevel(logging.CRITICAL)
    if shutil.which("redis-server") is None:
        print("chaos: redis-server is not installed", file=sys.stderr)
        return 2
    seconds = args.seconds or (40.0 if args.short else 300.0)
    clients = args.clients or (16 if args.short else 50)
    with tempfile.TemporaryDirectory(prefix="satgate-chaos-") as tmp:
        verdict = asyncio.run(run(seconds, clients, Path(tmp)))
    verdict.print()
    status = 1 if verdict.problems else 0
    if not args.short and not args.no_fuzz:
        print(f"\n== fuzz, FUZZ_SCALE={FUZZ_SCALE_LONG}")
        status = status or (1 if long_fuzz() else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
