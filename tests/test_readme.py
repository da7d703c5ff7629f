"""The README works as written: every command block in it runs here, or is listed with why it is not.

A new user copies the README's blocks into a shell and an editor. These tests do the same: ``sh`` blocks run with
bash in an empty folder, with the virtualenv's ``bin`` first on ``PATH`` and no ``SATGATE_*`` from the runner; a
block whose last command is ``satgate-mcp serve`` runs in the background on a free port (``SATGATE_PORT``), and
the README's Python clients run against it as they are, only their URL's port changed. Every block is claimed in
``CLAIMS``; a new block nobody claims fails, so the README cannot grow a command that nothing checks. The links of
the README and of docs/ must land on a file and a heading that exist.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from satgate_mcp.cli import build_parser
from satgate_mcp.daemon.children import child_pids
from satgate_mcp.policy.controls import parse_controls
from satgate_mcp.policy.rules import Effect, compile_rules, parse_text
from satgate_mcp.settings import HttpUpstreamSpec, Settings, known_variables
from scripts.check_install import SUPPORTED, TEST_COMMAND, readme_install_block
from tests.gateway_process import REPO, base_env, free_port
from tests.policy.readme_policy import readme_policy

README = REPO / "README.md"
DOCS = REPO / "docs"
#: Bounds: a gateway start (its demo child included), one README client run (it imports the mcp SDK), a clean stop.
START_TIMEOUT = 30.0
CLIENT_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
READY_POLL_INTERVAL = 0.05
#: The address every README command and client uses: the gateway's defaults.
README_ADDRESS = "127.0.0.1:9100"
SESSION_ID = re.compile(r"mcp-[0-9a-f]{32}-[0-9a-f]{32}")
#: Speaks to 127.0.0.1 directly, whatever proxy the runner's environment names.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# --- the README as blocks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based: what a failure names


def fenced_blocks(markdown: str) -> list[Block]:
    blocks: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\S*)\s*$", lines[i])
        if opening is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        blocks.append(Block(opening.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1))
        i = end + 1
    return blocks


@dataclass(frozen=True)
class Claim:
    """How one README block is checked: ``lang`` and ``marker`` (text only it has) find it, ``test`` covers it."""

    lang: str
    marker: str
    test: str
    not_run: str = ""  # why the block itself is not executed, when it is not


CLAIMS: dict[str, Claim] = {
    "install": Claim("sh", TEST_COMMAND, "test_the_first_sh_block_is_what_check_install_runs",
                     not_run="scripts/check_install.py (run by scripts/test.sh) runs it in fresh virtualenvs on the "
                             "oldest and newest Python; its serve line runs in test_quick_start_serves_the_clients"),
    "claude": Claim("sh", "claude mcp add", "test_claude_code_is_told_the_gateways_endpoint",
                    not_run="needs Claude Code: the URL and header it names are sent to a live gateway instead"),
    "session client": Claim("python", "ClientSession(", "test_header_recipe_runs_end_to_end"),
    "modern client": Claim("python", "from mcp import Client", "test_quick_start_serves_the_clients"),
    "header recipe": Claim("sh", "token mint", "test_header_recipe_runs_end_to_end"),
    "agent": Claim("sh", "python client.py", "test_header_recipe_runs_end_to_end"),
    "policy": Claim("yaml", "github-repo-outside-org", "test_the_policy_example_is_what_the_policy_tests_judge_by",
                    not_run="a file, not a command: tests/policy/test_policy_rules.py judges calls by this very text "
                            "and tests/integration/test_policy_gateway.py serves it"),
    "controls": Claim("json", '"spend_limits"', "test_the_controls_example_is_valid_controls",
                      not_run="a file, not a command: read here as `token mint --controls @controls.json` reads it"),
    "approvals": Claim("console", "$ satgate-mcp approvals list", "test_the_approvals_transcript_parses",
                       not_run="a transcript of an operator's session: tests/cluster/test_approvals_cluster.py runs "
                               "these commands against two gateways on one Redis"),
    "token exchange": Claim("sh", '"type":"token_exchange"', "test_upstream_identity_examples_load",
                            not_run="needs an authorization server and an upstream that verifies tokens: "
                                    "tests/integration/test_upstream_identity.py runs the mode against real ones"),
    "client credentials": Claim("sh", '"type":"client_credentials"', "test_upstream_identity_examples_load",
                                not_run="needs an authorization server and an upstream that verifies tokens: "
                                        "tests/integration/test_upstream_identity.py runs the mode against real ones"),
    "oauth user": Claim("sh", '"type":"oauth_user"', "test_upstream_identity_examples_load",
                        not_run="needs an authorization server, a browser and an upstream that verifies tokens: "
                                "tests/integration/test_upstream_user_grants.py runs the mode against real ones"),
}


def readme() -> str:
    return README.read_text()


def block(name: str) -> Block:
    claim = CLAIMS[name]
    found = [b for b in fenced_blocks(readme()) if b.lang == claim.lang and claim.marker in b.text]
    assert len(found) == 1, f"the README should have one {claim.lang} block with {claim.marker!r}, has {len(found)}"
    return found[0]


def commands(sh: Block) -> list[str]:
    return [line for line in sh.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def ends_with_serve(sh: Block) -> bool:
    return commands(sh)[-1].rstrip().endswith("satgate-mcp serve")


def on_port(text: str, port: int) -> str:
    """A README text aimed at the test's gateway: the one thing rewritten in what runs."""
    assert README_ADDRESS in text
    return text.replace(README_ADDRESS, f"127.0.0.1:{port}")


# --- running what the README says ---------------------------------------------------------------------------


def user_env(port: int) -> dict[str, str]:
    """A new user's shell: nothing configured, the virtualenv's commands first on PATH; the test's free port."""
    env = base_env()
    env.pop("SATGATE_STATE_DIR")  # the user sets none: the default folder lands in the block's tmp folder
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SATGATE_PORT"] = str(port)
    return env


def cmdline(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return []


class Backgrounded:
    """A block ending in the foreground daemon, run as its own terminal would run it, and stopped as a supervisor
    stops it: SIGTERM to the daemon alone, after which the block's exit status is the daemon's."""

    def __init__(self, sh: Block, cwd: Path, env: Mapping[str, str]) -> None:
        assert ends_with_serve(sh), f"README line {sh.line}: the block's last command is not satgate-mcp serve"
        self.log = cwd / f"block-{sh.line}.log"
        self.port = int(env["SATGATE_PORT"])
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", sh.text], cwd=cwd, env=dict(env),
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def wait_ready(self) -> None:
        """Bounded poll of /readyz: the daemon is another process, with nothing of it to await but its port."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.proc.poll() is None, f"the block exited with {self.proc.returncode}:\n{self.tail()}"
            with contextlib.suppress(OSError), HTTP.open(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as got:
                if got.status == 200:
                    return
            assert time.monotonic() < deadline, f"no ready gateway within {START_TIMEOUT} s:\n{self.tail()}"
            time.sleep(READY_POLL_INTERVAL)

    def daemon_pid(self) -> int:
        """bash may exec the last command itself or run it as a child; either way, the process running serve."""
        for pid in [self.proc.pid, *child_pids(self.proc.pid)]:
            argv = cmdline(pid)
            if "serve" in argv and any(arg.endswith("satgate-mcp") for arg in argv):
                return pid
        raise AssertionError(f"no satgate-mcp serve process under the block:\n{self.tail()}")

    def stop(self) -> int:
        os.kill(self.daemon_pid(), signal.SIGTERM)
        return self.proc.wait(STOP_TIMEOUT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def backgrounded(sh: Block, cwd: Path, env: Mapping[str, str]) -> Iterator[Backgrounded]:
    running = Backgrounded(sh, cwd, env)
    try:
        running.wait_ready()
        yield running
    finally:
        running.kill()  # only when the test failed before its clean stop


def run_python(snippet: Block, cwd: Path, env: Mapping[str, str], port: int) -> str:
    """A README Python client, run as a user runs the file they pasted it into; its stdout."""
    path = cwd / f"snippet-{snippet.line}.py"
    path.write_text(on_port(snippet.text, port))
    done = subprocess.run([sys.executable, str(path)], cwd=cwd, env=dict(env), capture_output=True, text=True,
                          timeout=CLIENT_TIMEOUT)
    assert done.returncode == 0, f"README line {snippet.line} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def run_sh(sh: Block, cwd: Path, env: Mapping[str, str]) -> str:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", sh.text], cwd=cwd, env=dict(env), capture_output=True,
                          text=True, timeout=CLIENT_TIMEOUT)
    assert done.returncode == 0, f"README line {sh.line} failed:\n{done.stderr[-3000:]}"
    return done.stdout


@dataclass(frozen=True)
class Answer:
    status: int
    session_id: str | None
    body: bytes


def initialize(url: str, headers: Mapping[str, str]) -> Answer:
    """What any MCP client sends first, with the headers the README tells it to send."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "readme", "version": "1"}}}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
    try:
        with HTTP.open(request, timeout=CLIENT_TIMEOUT) as got:
            return Answer(got.status, got.headers.get("Mcp-Session-Id"), got.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return Answer(refused.code, refused.headers.get("Mcp-Session-Id"), refused.read())


@dataclass(frozen=True)
class ClaudeAdd:
    transport: str
    url: str
    headers: dict[str, str]


def claude_code_commands() -> list[ClaudeAdd]:
    """``claude mcp add --transport T NAME URL [--header "K: V"]`` lines, as Claude Code would read them."""
    added = []
    for line in commands(block("claude")):
        argv = shlex.split(line)
        assert argv[:3] == ["claude", "mcp", "add"], line
        transport = argv[argv.index("--transport") + 1]
        headers = dict(argv[i + 1].split(": ", 1) for i, arg in enumerate(argv) if arg == "--header")
        [url] = [arg for arg in argv if arg.startswith("http://")]
        added.append(ClaudeAdd(transport, url, headers))
    return added


# --- the rules ----------------------------------------------------------------------------------------------


def test_every_block_is_run_or_excused() -> None:
    """Each README block is claimed exactly once, by a test of this module; an unclaimed block would drift."""
    blocks = fenced_blocks(readme())
    claimed = {name: block(name) for name in CLAIMS}
    unclaimed = [b for b in blocks if b not in claimed.values()]
    assert not unclaimed, f"README blocks no test runs or excuses (lines {[b.line for b in unclaimed]}): add to CLAIMS"
    for name, claim in CLAIMS.items():
        assert claim.test in globals(), f"{name}: no test called {claim.test}"


def test_the_approvals_transcript_parses() -> None:
    """Each command of the transcript is one the CLI takes, as written (comments and outputs aside)."""
    commands = [line.removeprefix("$ ").split("#")[0] for line in block("approvals").text.splitlines()
                if line.startswith("$ ")]
    assert len(commands) == 2
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "satgate-mcp"
        assert build_parser().parse_args(argv[1:]).command == "approvals"


def test_the_policy_example_is_what_the_policy_tests_judge_by() -> None:
    text = block("policy").text
    assert text == readme_policy()
    assert len(compile_rules(parse_text(text, "README.md"), Effect.ALLOW, "README.md").rules) == 2


def test_the_controls_example_is_valid_controls() -> None:
    controls = parse_controls(block("controls").text)
    assert controls.args
    assert controls.spend_limits
    assert controls.approvals
    assert controls.confirm


def test_the_first_sh_block_is_what_check_install_runs() -> None:
    """scripts/check_install.py installs and serves from the first sh block: it must stay first and name the tests."""
    first_sh = next(b for b in fenced_blocks(readme()) if b.lang == "sh")
    assert first_sh == block("install")
    assert TEST_COMMAND in commands(first_sh)
    install = readme_install_block(readme())
    assert install.splitlines() == [line for line in first_sh.text.splitlines() if line != TEST_COMMAND]
    assert ends_with_serve(Block("sh", install, first_sh.line))
    assert "scripts/check_install.py" in (REPO / "scripts" / "test.sh").read_text()


def test_supported_pythons_agree() -> None:
    """The Pythons the README promises are pyproject's classifiers, and check_install tries the oldest and newest."""
    classifiers = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["classifiers"]
    declared = sorted(c.rsplit(" :: ", 1)[1] for c in classifiers if re.search(r"Python :: 3\.\d+$", c))
    assert set(re.findall(r"\b3\.1\d\b", readme().split("## Connect a client")[0])) == set(declared)
    assert (declared[0], declared[-1]) == SUPPORTED


def test_the_readme_names_only_settings_that_exist() -> None:
    """A SATGATE_ name in the README that nothing reads would be a setting the user sets in vain."""
    named = set(re.findall(r"SATGATE_[A-Z][A-Z_]*", readme()))
    assert named - known_variables() == set()


@pytest.mark.parametrize("name", ["token exchange", "client credentials", "oauth user"])
def test_upstream_identity_examples_load(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each "auth" example is a configuration the gateway accepts as written (generated secrets made here)."""
    generated = {"SATGATE_ROOT_KEY": "r" * 48, "SATGATE_IDENTITY_KEY": _ed25519_pem(),
                 "SATGATE_CREDENTIAL_KEY": "c" * 64}
    for line in commands(block(name)):
        words = shlex.split(line)
        if words[0] == "export":
            variable, _, value = words[1].partition("=")
            monkeypatch.setenv(variable, generated[variable] if "$(" in line else value)
    settings = Settings(state_dir="memory")
    (upstream,) = settings.upstreams.values()
    assert isinstance(upstream, HttpUpstreamSpec)
    assert upstream.auth is not None
    assert upstream.auth.type == name.replace(" ", "_")


def _ed25519_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


def test_claude_code_is_told_the_gateways_endpoint() -> None:
    """Claude Code is told Streamable HTTP at the default address's /mcp; with a token, the recipe's SATGATE_TOKEN."""
    host, port = Settings.model_fields["host"].default, Settings.model_fields["port"].default
    plain, with_token = claude_code_commands()
    for added in (plain, with_token):
        assert added.transport == "http"
        assert added.url == f"http://{host}:{port}/mcp"
    assert plain.headers == {}
    assert with_token.headers == {"Authorization": "Bearer $SATGATE_TOKEN"}
    assert 'export SATGATE_TOKEN="$(satgate-mcp token mint' in block("header recipe").text


@pytest.mark.process
def test_quick_start_serves_the_clients(tmp_path: Path) -> None:
    """The quick start's serve line (check_install covers the install before it) serves both Python clients and
    Claude Code's URL without a token, then stops cleanly on SIGTERM."""
    port = free_port()
    env = user_env(port)
    [serve] = [line for line in commands(block("install")) if line.rstrip().endswith("satgate-mcp serve")]
    with backgrounded(Block("sh", serve + "\n", block("install").line), tmp_path, env) as gateway:
        listed, echoed = run_python(block("session client"), tmp_path, env, port).splitlines()
        assert listed == "['add', 'echo', 'utc_now']"
        assert echoed == "hello"
        assert run_python(block("modern client"), tmp_path, env, port) == "2026-07-28 hello\n"
        plain, _ = claude_code_commands()
        assert initialize(on_port(plain.url, port), plain.headers).status == 200
        assert gateway.stop() == 0, gateway.tail()


@pytest.mark.process
def test_header_recipe_runs_end_to_end(tmp_path: Path) -> None:
    """The header-mode recipe as written: the minted token sees and calls only echo and add, its session id is
    bound to it, Claude Code's header is accepted, a token of another root key gets 401 invalid_token, and the
    daemon stops cleanly on SIGTERM."""
    port = free_port()
    env = user_env(port)
    (tmp_path / "client.py").write_text(on_port(block("session client").text, port))
    with backgrounded(block("header recipe"), tmp_path, env) as gateway:
        token = (tmp_path / "agent-1.token").read_text().strip()

        assert "prints ['add', 'echo'], then hello" in block("agent").text
        assert run_sh(block("agent"), tmp_path, env) == "['add', 'echo']\nhello\n"
        assert run_python(block("modern client"), tmp_path, {**env, "SATGATE_TOKEN": token}, port) == \
            "2026-07-28 hello\n"

        _, with_token = claude_code_commands()
        url = on_port(with_token.url, port)
        headers = {k: v.replace("$SATGATE_TOKEN", token) for k, v in with_token.headers.items()}
        accepted = initialize(url, headers)
        assert accepted.status == 200
        assert accepted.session_id is not None
        assert SESSION_ID.fullmatch(accepted.session_id), "a session id bound to its token"
        assert initialize(url, {}).status == 401

        other_key = subprocess.run(["satgate-mcp", "token", "mint", "--id", "agent-1"], capture_output=True,
                                   text=True, timeout=CLIENT_TIMEOUT, check=True,
                                   env={**env, "SATGATE_ROOT_KEY": "another-root-key-" + "x" * 32}).stdout.strip()
        refused = initialize(url, {"Authorization": f"Bearer {other_key}"})
        assert refused.status == 401
        assert json.loads(refused.body)["error"]["data"]["error"] == "invalid_token"

        assert gateway.stop() == 0, gateway.tail()


# --- links ----------------------------------------------------------------------------------------------------


def without_code(markdown: str) -> str:
    return re.sub(r"^```.*?^```$", "", markdown, flags=re.MULTILINE | re.DOTALL)


def anchors(markdown: str) -> set[str]:
    """The ids GitHub gives a file's headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", without_code(markdown), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def local_links(page: Path) -> list[str]:
    found = re.findall(r"\]\(([^)\s]+)\)", without_code(page.read_text()))
    return [link for link in found if not re.match(r"[a-z]+:", link)]


PAGES = [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_links_land_on_a_file_and_heading(page: Path) -> None:
    """Moving a section between files must not leave a link pointing at where it was."""
    broken = []
    for link in local_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or (anchor and anchor not in anchors(target.read_text())):
            broken.append(link)
    assert broken == []
