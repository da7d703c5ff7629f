"""Restarts with real processes and real sockets (issue 6): no refused connection, no failed call.

Each handover test keeps the official SDK client calling ``echo`` back to back, and a second loop
opening a fresh TCP connection per ``/healthz``, while a new gateway takes over and the old one
gets SIGTERM. The session survives because header-mode sessions resume on any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import anyio
import pytest

from tests.deploy.harness import (
    REPO,
    SERVE,
    Gateway,
    Gateways,
    LoopStats,
    free_port,
    fresh_connection_loop,
    gateway_env,
    mcp_session,
    pid_alive,
    run_until,
    sdk_call_loop,
    tcp_states,
    token,
)
from tests.gateway_process import base_env, stdio_upstreams

pytestmark = pytest.mark.process

#: Calls each loop must complete in each phase (before, across and after the handover).
CALLS_PER_PHASE = 40
#: SDK client sessions calling concurrently, each in its own tight loop.
SESSIONS = 3


async def assert_clean_exit(gateway: Gateway) -> None:
    assert await gateway.exited() == 0, gateway.tail()
    finished = await gateway.wait_event("drain_finished")
    assert finished["reason"] == "clean"
    assert finished["cut"] == 0
    assert not [pid for pid in gateway.upstream_pids() if pid_alive(pid)], "upstream child left behind"


async def handover(gateways: Gateways, port: int, env: dict[str, str], pass_fd: int | None = None,
                   new_args: tuple[str, ...] = ()) -> tuple[Gateway, Gateway]:
    """Old serves, new starts and gets ready, old gets SIGTERM, new serves on: loops run throughout."""
    old = await gateways.start(env, name="old", pass_fd=pass_fd)
    await old.wait_event("listening")
    stop = asyncio.Event()
    calls, connects = LoopStats(), LoopStats()
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(mcp_session(f"http://127.0.0.1:{port}/mcp", token(f"agent-{i}")))
                    for i in range(SESSIONS)]
        finish = await run_until(stop, *(sdk_call_loop(session, calls, stop) for session in sessions),
                                 fresh_connection_loop(port, connects, stop))
        try:
            await calls.reach(CALLS_PER_PHASE)
            new = await gateways.start(env, name="new", pass_fd=pass_fd, args=new_args)
            await new.wait_event("listening")
            await asyncio.gather(calls.reach(CALLS_PER_PHASE), connects.reach(CALLS_PER_PHASE))
            old.signal(signal.SIGTERM)
            await assert_clean_exit(old)
            # Only the new process is left: these calls, on the same SDK sessions, were served by it.
            await asyncio.gather(calls.reach(CALLS_PER_PHASE), connects.reach(CALLS_PER_PHASE))
        finally:
            await finish()
    assert (calls.failures, connects.failures) == ([], [])
    assert {e["token_id"] for e in new.find("session_connect") if e["resumed"]} == {
        f"agent-{i}" for i in range(SESSIONS)}
    return old, new


async def test_reuse_port_handover_refuses_nothing_and_fails_no_call(gateways: Gateways) -> None:
    port = free_port()
    old, new = await handover(gateways, port, gateway_env(port, SATGATE_REUSE_PORT="true"), new_args=("--handover",))
    assert ((await old.wait_event("listening"))["source"], (await new.wait_event("listening"))["source"]) == (
        "bind", "bind")
    assert (await new.wait_event("handover"))["listener_found"] is True
    assert old.find("steered_to_new_listener"), "the old socket steered new connections away before closing"
    new.signal(signal.SIGTERM)
    await assert_clean_exit(new)


def light_env(port: int, **extra: str) -> dict[str, str]:
    """A gateway without upstreams: these tests are about the port and auth rules, and start faster."""
    return gateway_env(port, **{"SATGATE_UPSTREAMS": "{}", **extra})


async def healthz(port: int) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz",
                                                         timeout=aiohttp.ClientTimeout(total=10)) as response:
        return response.status


async def test_attack_second_plain_start_on_a_live_gateways_port_is_refused(gateways: Gateways) -> None:
    port = free_port()
    old = await gateways.start(light_env(port), name="old")
    await old.wait_event("listening")
    second = await gateways.start(light_env(port), name="second")
    assert await second.exited() == 1, second.tail()
    failed = second.find("listen_failed")
    assert len(failed) == 1, second.tail()
    assert "another process already listens there" in failed[0]["error"]
    assert "SATGATE_HANDOVER=true" in failed[0]["error"]
    assert "--handover" in failed[0]["error"]
    assert not second.find("upstream_spawned"), "nothing starts when the port is refused"
    assert await healthz(port) == 200, "the running gateway keeps the port to itself"
    old.signal(signal.SIGTERM)
    await assert_clean_exit(old)


@pytest.mark.parametrize(
    ("env", "args"),
    [
        pytest.param({"SATGATE_HANDOVER": "true"}, (), id="env-var"),
        pytest.param({}, ("--handover",), id="flag"),
    ],
)
async def test_a_handover_start_takes_over_a_listened_port(
    gateways: Gateways, env: dict[str, str], args: tuple[str, ...]
) -> None:
    port = free_port()
    old = await gateways.start(light_env(port), name="old")
    await old.wait_event("listening")
    new = await gateways.start(light_env(port, **env), name="new", args=args)
    assert (await new.wait_event("handover"))["listener_found"] is True
    await new.wait_event("listening")
    old.signal(signal.SIGTERM)
    await assert_clean_exit(old)
    assert await healthz(port) == 200, "the new process serves on alone"
    new.signal(signal.SIGTERM)
    await assert_clean_exit(new)


async def test_a_handover_start_with_nothing_to_take_over_starts_normally(gateways: Gateways) -> None:
    port = free_port()
    gateway = await gateways.start(light_env(port), name="gateway", args=("--handover",))
    assert (await gateway.wait_event("handover"))["listener_found"] is False
    await gateway.wait_event("listening")
    assert await healthz(port) == 200
    gateway.signal(signal.SIGTERM)
    await assert_clean_exit(gateway)


async def test_after_the_old_gateway_was_killed_a_plain_start_takes_the_port(gateways: Gateways) -> None:
    """No listener is left after SIGKILL; the connections it leaves (FIN_WAIT, TIME_WAIT) must not count."""
    port = free_port()
    old = await gateways.start(light_env(port), name="old")
    await old.wait_event("listening")
    async with aiohttp.ClientSession() as http:  # a keep-alive connection open while the old one dies
        async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
            assert response.status == 200
        old.kill_everything()
        assert await old.exited() == -signal.SIGKILL
    assert tcp_states(port) - {"LISTEN"}, "premise: connections of the killed process outlive it"
    assert "LISTEN" not in tcp_states(port)
    new = await gateways.start(light_env(port), name="new")
    await new.wait_event("listening")
    assert not new.find("listen_failed")
    assert await healthz(port) == 200
    new.signal(signal.SIGTERM)
    await assert_clean_exit(new)


async def test_none_auth_on_a_public_address_starts_with_the_opt_in(gateways: Gateways) -> None:
    port = free_port()
    env = light_env(port, SATGATE_HOST="0.0.0.0", SATGATE_AUTH_MODE="none", SATGATE_ALLOW_UNAUTHENTICATED="true")
    gateway = await gateways.start(env, name="gateway")
    listening = await gateway.wait_event("listening")
    assert listening["host"] == "0.0.0.0"
    assert await healthz(port) == 200
    gateway.signal(signal.SIGTERM)
    await assert_clean_exit(gateway)


def dockerfile_env() -> dict[str, str]:
    final = (REPO / "Dockerfile").read_text().split("\nFROM ")[-1]
    return dict(re.findall(r"\b(SATGATE_\w+)=(\S+)", final.split("\nRUN ", 1)[0]))


def test_the_docker_image_refuses_to_start_until_configured() -> None:
    image_env = dockerfile_env()
    assert image_env["SATGATE_HOST"] == "0.0.0.0"
    env = {**base_env(), **image_env}
    result = subprocess.run([*SERVE], env=env, cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "SATGATE_ALLOW_UNAUTHENTICATED=true" in lines[0]
    assert "SATGATE_AUTH_MODE=header" in lines[0]


async def test_the_docker_image_starts_in_header_mode_as_the_dockerfile_shows(gateways: Gateways) -> None:
    text = (REPO / "Dockerfile").read_text()
    for shown in ("-e SATGATE_AUTH_MODE=header", "-e SATGATE_ROOT_KEY"):
        assert shown in text, shown
    port = free_port()
    env = {**light_env(port), **dockerfile_env(), "SATGATE_PORT": str(port), "SATGATE_AUTH_MODE": "header"}
    gateway = await gateways.start(env, name="image")
    assert (await gateway.wait_event("listening"))["host"] == "0.0.0.0"
    assert await healthz(port) == 200
    gateway.signal(signal.SIGTERM)
    await assert_clean_exit(gateway)


async def test_inherited_socket_handover_refuses_nothing_and_fails_no_call(gateways: Gateways) -> None:
    # The harness is systemd: it owns the listening socket for the whole test.
    with socket.create_server(("127.0.0.1", 0), backlog=1024) as listener:
        port = listener.getsockname()[1]
        env = gateway_env(port, SATGATE_REUSE_PORT="false")
        old, new = await handover(gateways, port, env, pass_fd=listener.fileno())
        listening = await old.wait_event("listening")
        assert (listening["source"], listening["name"], listening["port"]) == ("systemd", "satgate-mcp.socket", port)
        new.signal(signal.SIGTERM)
        await assert_clean_exit(new)


async def test_inherited_socket_queues_connections_while_no_process_runs(gateways: Gateways) -> None:
    """systemctl restart stops the old process before starting the new one: clients wait, never refused."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = listener.getsockname()[1]
    env = gateway_env(port, SATGATE_REUSE_PORT="false")
    try:
        old = await gateways.start(env, name="old", pass_fd=listener.fileno())
        await old.wait_event("listening")
        async with mcp_session(f"http://127.0.0.1:{port}/mcp", token()) as session:
            assert (await session.call_tool("echo", {"text": "before"})).is_error is False
            old.signal(signal.SIGTERM)
            await assert_clean_exit(old)
            # Nobody accepts now; the call's connection waits in systemd's queue until the new process.
            pending = asyncio.ensure_future(session.call_tool("echo", {"text": "across"}))
            new = await gateways.start(env, name="new", pass_fd=listener.fileno())
            with anyio.fail_after(30):
                result = await pending
            assert result.content[0].text == "across"  # type: ignore[union-attr]
        new.signal(signal.SIGTERM)
        await assert_clean_exit(new)
    finally:
        listener.close()


async def test_sigterm_lets_slow_calls_in_flight_finish(gateways: Gateways) -> None:
    port = free_port()
    gateway = await gateways.start(gateway_env(port), name="gateway")
    await gateway.wait_event("listening")
    started = [asyncio.Event() for _ in range(3)]

    async def slow_call(session: object, i: int) -> str:
        from mcp.client.session import ClientSession

        assert isinstance(session, ClientSession)

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            started[i].set()

        result = await session.call_tool("slow", {"steps": 8, "delay": 0.1}, progress_callback=on_progress)
        return str(result.content[0].text)  # type: ignore[union-attr]

    async with mcp_session(f"http://127.0.0.1:{port}/mcp", token()) as session:
        await session.list_tools()  # the SDK lists tools after a call unless it has: no successor here to ask
        calls = [asyncio.ensure_future(slow_call(session, i)) for i in range(3)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 10)
        gateway.signal(signal.SIGTERM)
        assert await asyncio.wait_for(asyncio.gather(*calls), 10) == ["done 8"] * 3
    await assert_clean_exit(gateway)
    assert (await gateway.wait_event("drain_started"))["in_flight"] >= 3
    assert (await gateway.wait_event("drain_finished"))["drained"] >= 3


@pytest.mark.parametrize(
    ("drain_seconds", "second_signal", "reason"),
    [
        pytest.param("1", False, "deadline", id="drain-deadline"),
        pytest.param("25", True, "signal", id="second-sigterm"),
    ],
)
async def test_deadline_or_second_sigterm_cuts_what_is_left_and_says_so(
    gateways: Gateways, drain_seconds: str, second_signal: bool, reason: str
) -> None:
    port = free_port()
    gateway = await gateways.start(gateway_env(port, SATGATE_DRAIN_SECONDS=drain_seconds), name="gateway")
    await gateway.wait_event("listening")
    in_flight = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        in_flight.set()

    async with mcp_session(f"http://127.0.0.1:{port}/mcp", token()) as session:
        await session.list_tools()
        call = asyncio.ensure_future(
            session.call_tool("slow", {"steps": 300, "delay": 0.1}, progress_callback=on_progress))
        await asyncio.wait_for(in_flight.wait(), 10)
        gateway.signal(signal.SIGTERM)
        if second_signal:
            await gateway.wait_event("drain_started")
            gateway.signal(signal.SIGTERM)
        assert await gateway.exited(timeout=10) == 1
        with contextlib.suppress(Exception):  # the cut call fails; how the SDK reports it is its business
            with anyio.fail_after(10):
                await call
        call.cancel()
    cut = await gateway.wait_event("drain_cut")
    assert (cut["reason"], cut["cut"]) == (reason, 1)
    assert cut["drained"] in (0, 1), "only the client's GET stream, ended as the drain began, may have finished"
    assert cut["seconds"] < 3
    assert not [pid for pid in gateway.upstream_pids() if pid_alive(pid)], "upstream child left behind"


async def test_dockerfile_healthcheck_command_probes_healthz(gateways: Gateways) -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    probe = re.search(r'HEALTHCHECK .*?CMD \["python", "-c", "(.*?)"\]', dockerfile, re.S)
    assert probe is not None
    code = probe.group(1)
    port = free_port()
    env = gateway_env(port)
    gateway = await gateways.start(env, name="gateway")
    await gateway.wait_event("listening")

    def check() -> int:
        return subprocess.run([sys.executable, "-c", code], env=env, timeout=10, capture_output=True).returncode

    assert await asyncio.to_thread(check) == 0
    gateway.signal(signal.SIGTERM)
    await assert_clean_exit(gateway)
    assert await asyncio.to_thread(check) != 0


def start_failure(env: dict[str, str]) -> tuple[int, list[str], list[dict[str, object]]]:
    """A start that fails: its exit code, its stderr lines, and the JSON events it logged on stdout."""
    result = subprocess.run([*SERVE], env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    logged = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.returncode, result.stderr.strip().splitlines(), logged


def test_every_start_up_failure_is_one_stderr_line_and_one_event() -> None:
    """Taken port (a retry may work: exit 1) and a clash found at start (fix the config: exit 2) look alike."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, stderr, logged = start_failure(gateway_env(port, SATGATE_REUSE_PORT="false"))
    assert code == 1
    assert len(stderr) == 1, stderr
    assert "Address already in use" in stderr[0]
    assert [e["event"] for e in logged if e["level"] == "error"] == ["listen_failed"]

    spec = json.loads(stdio_upstreams("up"))["up"]
    twice = json.dumps({"one": spec, "two": spec})  # every tool name clashes
    code, stderr, logged = start_failure(gateway_env(free_port(), SATGATE_UPSTREAMS=twice))
    assert code == 2
    assert len(stderr) == 1, stderr
    assert "tool_prefix" in stderr[0]
    assert [e["event"] for e in logged if e["level"] == "error"] == ["config_error"]


async def test_a_taken_port_without_reuse_port_fails_fast_with_one_line(gateways: Gateways, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        gateway = await gateways.start(gateway_env(port, SATGATE_REUSE_PORT="false"), name="gateway")
        assert await gateway.exited() == 1
    failed = gateway.find("listen_failed")
    assert failed
    assert "Address already in use" in failed[0]["error"]
    assert not gateway.find("upstream_spawned"), "nothing starts when the port cannot be had"


async def test_sigterm_during_startup_stops_cleanly_without_listening(gateways: Gateways) -> None:
    port = free_port()
    gateway = await gateways.start(gateway_env(port), name="gateway")
    await gateway.wait_event("upstream_spawned")
    gateway.signal(signal.SIGTERM)
    assert await gateway.exited() == 0, gateway.tail()
    assert gateway.find("stopped_during_startup")
    assert not gateway.find("listening")
    assert not [pid for pid in gateway.upstream_pids() if pid_alive(pid)], "upstream child left behind"


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate not installed")
async def test_systemd_socket_activation_as_systemd_itself_speaks_it(gateways: Gateways) -> None:
    port = free_port()
    env = gateway_env(1)  # SATGATE_PORT=1 could never be bound: under activation it is not used
    passed = [arg for var in sorted(env) if var.startswith("SATGATE_") or var in ("PATH", "PYTHONUNBUFFERED")
              for arg in ("-E", var)]
    wrapper = ["systemd-socket-activate", "-l", f"127.0.0.1:{port}", "--fdname=satgate", *passed]
    gateway = await gateways.start(env, name="activated", wrapper=wrapper)
    await gateway.wait_line(lambda e: "Listening on" in e.get("line", ""), "systemd-socket-activate listening")
    # The first connection starts the gateway; it waits in the socket's queue meanwhile.
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz",
                                                         timeout=aiohttp.ClientTimeout(total=30)) as response:
        assert response.status == 200
    listening = await gateway.wait_event("listening")
    assert (listening["source"], listening["name"], listening["port"]) == ("systemd", "satgate", port)
    gateway.signal(signal.SIGTERM)
    await assert_clean_exit(gateway)


def test_a_misspelled_variable_stops_the_start_with_one_line() -> None:
    """``SATGATE_AUTH_MOD=header`` would otherwise serve with auth off: the start is refused, naming the setting."""
    env = light_env(free_port(), SATGATE_AUTH_MOD="header")
    del env["SATGATE_AUTH_MODE"]
    code, stderr, logged = start_failure(env)
    assert code == 2
    assert stderr == ["satgate-mcp: unknown variable SATGATE_AUTH_MOD (did you mean SATGATE_AUTH_MODE?): nothing "
                      "reads it; fix the name, or set SATGATE_ALLOW_UNKNOWN_VARIABLES=true to start anyway"]
    assert not [e for e in logged if e["event"] == "listening"]


async def test_serve_port_flag_wins_over_the_environment_and_the_config_file(
    gateways: Gateways, tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "satgate.env"
    config.write_text("SATGATE_PORT=1\nSATGATE_HOST=127.0.0.2\n")
    env = light_env(1, SATGATE_HOST="127.0.0.3")  # port 1 could never be bound: only the flags can make this work
    gateway = await gateways.start(env, name="gateway",
                                   args=("--config", str(config), "--port", str(port), "--host", "127.0.0.1"))
    listening = await gateway.wait_event("listening")
    assert (listening["host"], listening["port"]) == ("127.0.0.1", port)
    assert await healthz(port) == 200
    gateway.signal(signal.SIGTERM)
    await assert_clean_exit(gateway)


async def test_with_the_opt_out_a_misspelled_variable_is_named_once_at_start(gateways: Gateways) -> None:
    port = free_port()
    env = light_env(port, SATGATE_RATE_LIMT="5/s", SATGATE_ALLOW_UNKNOWN_VARIABLES="true")
    gateway = await gateways.start(env, name="gateway")
    await gateway.wait_event("listening")
    (warning,) = gateway.find("unknown_variables")
    assert warning["names"] == ["SATGATE_RATE_LIMT"]
    assert warning["did_you_mean"] == {"SATGATE_RATE_LIMT": "SATGATE_RATE_LIMIT"}
    gateway.signal(signal.SIGTERM)
    await assert_clean_exit(gateway)


def test_a_stdio_upstream_whose_command_does_not_exist_stops_the_start_with_one_line() -> None:
    upstreams = json.dumps({"fs": {"transport": "stdio", "command": ["no-such-mcp-server-xyz", "--serve"]}})
    env = {**gateway_env(free_port()), "SATGATE_UPSTREAMS": upstreams}
    result = subprocess.run([*SERVE], env=env, cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "upstream 'fs'" in lines[0]
    assert "'no-such-mcp-server-xyz'" in lines[0]
    assert "upstream_spawned" not in result.stdout, "nothing starts"
