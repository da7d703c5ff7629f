"""Run the README's install-and-run command as a new user would, on the oldest and newest supported Python.

The command is read from the README itself (its first ``sh`` block, up to the test command), so the two cannot
drift. Each run copies the checkout (the files git would commit) to an empty folder, puts the wanted Python first
on PATH as ``python3``, runs the block with bash, then speaks MCP to the daemon it started: ``initialize``, then
the demo upstream's ``echo`` tool, then SIGTERM and a clean exit. A Python not on this machine is reported and
skipped; with ``--require`` it fails instead.

    python scripts/check_install.py [--python 3.11 --python 3.13] [--require]
"""

from __future__ import annotations

import argparse
import contextlib
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The oldest and newest Python the README says are supported.
SUPPORTED = ("3.11", "3.13")
TEST_COMMAND = "bash scripts/test.sh"
START_TIMEOUT = 240.0  # the block installs every locked package first (a cold pip cache downloads them)
CALL_TIMEOUT = 15.0
STOP_TIMEOUT = 40.0


def readme_install_block(readme: str) -> str:
    """The README's first ``sh`` block without the test command: what a new user types to install and run."""
    match = re.search(r"^```sh\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
    if match is None:
        raise SystemExit("README.md has no ```sh block")
    lines = match.group(1).splitlines()
    kept = [line for line in lines if line.strip() != TEST_COMMAND]
    if len(kept) == len(lines):
        raise SystemExit(f"the README's first sh block no longer names the test command {TEST_COMMAND!r}")
    return "\n".join(kept) + "\n"


def find_python(version: str) -> str | None:
    """The interpreter's own path: on PATH, else installed by pyenv but not selected (its shim then refuses)."""
    candidates = [shutil.which(f"python{version}")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [str(p) for p in sorted(pyenv_root.glob(f"versions/{version}*/bin/python{version}"))]
    for candidate in filter(None, candidates):
        # sys.executable, not the shim: a version manager's shim linked as `python3` would pick its own default.
        got = subprocess.run([candidate, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
        if got.returncode == 0:
            return got.stdout.strip()
    return None


def checkout_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         check=True, capture_output=True).stdout
    return [name for name in out.decode().split("\0") if name and (REPO / name).is_file()]


def copy_checkout(dest: Path) -> None:
    for name in checkout_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post(url: str, body: dict[str, Any], session: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """One JSON-RPC message; the answer (JSON or one SSE event) and the session id header."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-06-18"}
    if session:
        headers["Mcp-Session-Id"] = session
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as response:
        text = response.read().decode()
        sid = response.headers.get("Mcp-Session-Id")
        if not text.strip():
            return None, sid
        if response.headers.get_content_type() == "text/event-stream":
            data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
            text = [d for d in data if d][-1]
        return dict(json.loads(text)), sid


def require(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(what)


def wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the install-and-run block exited with {proc.returncode} before the daemon answered")
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)  # a separate process installing packages: nothing to await but its port
    raise RuntimeError(f"no ready daemon within {START_TIMEOUT:.0f} s")


def check(version: str, block: str) -> str:
    python = find_python(version)
    if python is None:
        return "missing"
    with tempfile.TemporaryDirectory(prefix=f"satgate-install-{version}-") as tmp:
        work = Path(tmp) / "satgate-mcp"
        bindir = Path(tmp) / "bin"
        bindir.mkdir()
        (bindir / "python3").symlink_to(python)
        copy_checkout(work)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SATGATE_", "VIRTUAL_ENV"))}
        env.update(PATH=f"{bindir}:{env.get('PATH', '')}", SATGATE_PORT=str(port), SATGATE_LOG_FORMAT="json")
        log = Path(tmp) / "run.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                base = f"http://127.0.0.1:{port}"
                wait_ready(base, proc)
                init, sid = post(base + "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "check-install", "version": "1"}}})
                require(init is not None and "result" in init, f"initialize answered {init}")
                post(base + "/mcp", {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
                answer, _ = post(base + "/mcp", {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                                 "params": {"name": "echo", "arguments": {"text": "hello"}}}, sid)
                require(answer is not None and answer.get("result", {}).get("content", [{}])[0].get("text") == "hello",
                        f"echo answered {answer}")
                # SIGTERM to the daemon alone, as a supervisor sends it; bash then exits with the daemon's status.
                for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
                    os.kill(int(child), signal.SIGTERM)
                code = proc.wait(STOP_TIMEOUT)
                require(code == 0, f"serve exited with {code} on SIGTERM")
                venv_python = work / ".venv" / "bin" / "python"
                got = subprocess.run([str(venv_python), "--version"], check=True, capture_output=True, text=True)
                return got.stdout.strip()
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                sys.stderr.write(log.read_text(errors="replace")[-4000:])
                raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", metavar="X.Y", help="a Python to check (default: 3.11, 3.13)")
    parser.add_argument("--require", action="store_true", help="fail when a Python is not on this machine")
    args = parser.parse_args()
    block = readme_install_block((REPO / "README.md").read_text())
    failed = False
    for version in args.python or SUPPORTED:
        started = time.monotonic()
        result = check(version, block)
        if result == "missing":
            print(f"python{version}: not on this machine, {'FAILED' if args.require else 'skipped'}")
            failed |= args.require
        else:
            took = time.monotonic() - started
            print(f"python{version}: installed, served and stopped cleanly ({result}, {took:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
