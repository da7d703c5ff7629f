"""Stdio children live through a planned restart (issue 32): ``serve --handover`` passes them on, state and all.

Real gateways, a real stdio upstream that counts (``counter``: its next number and its pid), and the
official SDK client calling it back to back from several sessions while three handovers run in a row:
no call fails, the numbers continue without a gap or repeat, and one pid answers them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession

from tests.conftest import upstream_command
from tests.deploy.harness import (
    Gateway,
    Gateways,
    LoopStats,
    free_port,
    gateway_env,
    mcp_session,
    run_until,
    token,
)
from tests.gateway_process import exited

pytestmark = pytest.mark.process

SESSIONS = 3
CALLS_PER_PHASE = 30
HANDOVERS = 3


@dataclass
class Counted:
    """Every answer of ``counter``: the numbers given out and the pids that gave them."""

    counts: list[int] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)


async def counter_loop(session: ClientSession, stats: LoopStats, counted: Counted, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            with anyio.fail_after(15):
                result = await session.call_tool("counter", {})
            text = result.content[0].text if result.content else None  # type: ignore[union-attr]
            if result.is_error or text is None:
                stats.failures.append(f"error: {result}")
                continue
            answer = json.loads(text)
            counted.counts.append(int(answer["count"]))
            counted.pids.add(int(answer["pid"]))
            stats.succeeded()
        except Exception as exc:  # the assertion reports them all
            stats.failures.append(f"{type(exc).__name__}: {exc}")
            if len(stats.failures) > 20:
                return


async def take_over(gateways: Gateways, env: dict[str, str], old: Gateway, name: str) -> Gateway:
    """A new process with ``--handover``: it asks the old one for its children; the old one stops on its own."""
    new = await gateways.start(env, name=name, args=("--handover",))
    await new.wait_event("listening")
    assert await old.exited() == 0, old.tail()
    await new.wait_event("upstream_adopted")
    return new


@pytest.mark.parametrize("isolation", ["shared", "session"])
async def test_three_handovers_under_load_keep_the_children_and_their_state(
        gateways: Gateways, tmp_path: Path, isolation: str) -> None:
    port = free_port()
    state = tmp_path / "state"
    upstreams = json.dumps({"up": {"transport": "stdio", "command": upstream_command(), "isolation": isolation}})
    env = gateway_env(port, SATGATE_REUSE_PORT="true", SATGATE_STATE_DIR=str(state), SATGATE_UPSTREAMS=upstreams)
    old = await gateways.start(env, name="gateway-0")
    await old.wait_event("listening")
    assert stat.S_IMODE((state / f"handover-{port}.sock").stat().st_mode) == 0o600
    stop, calls = asyncio.Event(), LoopStats()
    counted = [Counted() for _ in range(SESSIONS)]
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(mcp_session(f"http://127.0.0.1:{port}/mcp", token(f"agent-{i}")))
                    for i in range(SESSIONS)]
        finish = await run_until(stop, *(counter_loop(s, calls, c, stop) for s, c in zip(sessions, counted,
                                                                                           strict=True)))
        try:
            await calls.reach(CALLS_PER_PHASE)
            for round_ in range(1, HANDOVERS + 1):
                old = await take_over(gateways, env, old, f"gateway-{round_}")
                await calls.reach(CALLS_PER_PHASE)
        finally:
            await finish()
    assert calls.failures == []
    first = gateways.started[0]
    if isolation == "shared":  # one child for all: one pid, and one count shared by every session
        assert set().union(*(c.pids for c in counted)) == {first.find("upstream_spawned")[0]["pid"]}
        every = sorted(n for c in counted for n in c.counts)
        assert every == list(range(1, len(every) + 1))
    else:  # a child per session: each keeps its own pid and its own count
        assert [len(c.pids) for c in counted] == [1] * SESSIONS
        assert len(set().union(*(c.pids for c in counted))) == SESSIONS
        assert all(c.counts == list(range(1, len(c.counts) + 1)) for c in counted)
    assert not old.find("upstream_spawned"), "the last gateway started a child of its own"
    assert not old.find("upstream_instance_spawning"), "the last gateway started a client child of its own"
    old.signal()
    assert await old.exited() == 0


async def test_a_child_whose_command_changed_is_started_fresh_and_the_old_one_stopped(
        gateways: Gateways, tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    env = gateway_env(port, SATGATE_REUSE_PORT="true", SATGATE_STATE_DIR=str(state))
    old = await gateways.start(env, name="old")
    before = (await old.wait_event("upstream_spawned"))["pid"]
    await old.wait_event("listening")
    changed = json.dumps({"up": {"transport": "stdio", "command": upstream_command(), "env": {"CHANGED": "1"}}})
    new = await gateways.start({**env, "SATGATE_UPSTREAMS": changed}, name="new", args=("--handover",))
    refused = await new.wait_event("upstream_handover_refused")
    assert "command, env" in refused["reason"]
    assert refused["pid"] == before
    assert await old.exited() == 0, old.tail()
    after = (await new.wait_event("upstream_spawned"))["pid"]
    assert after != before
    assert await exited(before, 5.0), "the child nobody adopted was left running"
    new.signal()
    assert await new.exited() == 0


async def test_an_adopted_child_that_dies_is_restarted_as_any_child(gateways: Gateways, tmp_path: Path) -> None:
    """Not the new process's child, so no SIGCHLD: its pidfd says it died, and it is restarted as today."""
    port = free_port()
    env = gateway_env(port, SATGATE_REUSE_PORT="true", SATGATE_STATE_DIR=str(tmp_path / "state"))
    old = await gateways.start(env, name="old")
    before = (await old.wait_event("upstream_spawned"))["pid"]
    await old.wait_event("listening")
    new = await take_over(gateways, env, old, "new")
    async with mcp_session(f"http://127.0.0.1:{port}/mcp", token("agent")) as session:
        first = json.loads((await session.call_tool("counter", {})).content[0].text)  # type: ignore[union-attr]
        assert first["pid"] == before
        with contextlib.suppress(Exception):  # the call that kills it fails as a crash does
            await session.call_tool("crash", {})
        fresh = (await new.wait_event("upstream_spawned"))["pid"]
        assert (await new.wait_event("upstream_restarting"))["reason"]
        await new.wait_line(lambda e: e.get("event") == "upstream_ready" and e.get("pid") == fresh, "upstream_ready")
        again = json.loads((await session.call_tool("counter", {})).content[0].text)  # type: ignore[union-attr]
    assert again == {"count": 1, "pid": fresh}
    assert fresh != before
    new.signal()
    assert await new.exited() == 0


async def test_two_daemons_on_one_state_folder_keep_channels_of_their_own(gateways: Gateways, tmp_path: Path) -> None:
    """One channel per port: a ``--handover`` start takes over the daemon on its port, never the other one, whose
    channel a shared file name would have replaced (the last to start would have been asked)."""
    state = tmp_path / "state"
    upstreams = json.dumps({"up": {"transport": "stdio", "command": upstream_command()}})
    ports = [free_port(), free_port()]
    envs = [gateway_env(port, SATGATE_REUSE_PORT="true", SATGATE_STATE_DIR=str(state), SATGATE_UPSTREAMS=upstreams)
            for port in ports]
    first = await gateways.start(envs[0], name="gateway-a")
    await first.wait_event("listening")
    second = await gateways.start(envs[1], name="gateway-b")  # started last: it used to own the one channel
    await second.wait_event("listening")
    assert sorted(p.name for p in state.glob("handover*.sock")) == sorted(f"handover-{p}.sock" for p in ports)
    successor = await take_over(gateways, envs[0], first, "gateway-a2")
    assert successor.find("upstream_adopted")[0]["pid"] == first.upstream_pids()[0]
    assert second.proc.returncode is None  # the daemon on the other port runs on, its child untouched
    assert not second.find("stop_requested")


async def test_attack_a_handover_channel_of_another_user_is_refused(tmp_path: Path) -> None:
    """The channel is owner-only, and the uid check refuses a peer of another user (faked: the tests run as one)."""
    from satgate_mcp.daemon.handover import HandoverClient, HandoverError, HandoverServer, peer_allowed

    assert peer_allowed(os.getuid(), os.getuid())
    assert not peer_allowed(os.getuid() + 1, os.getuid())
    path = tmp_path / "handover.sock"
    asked: list[str] = []
    server = HandoverServer(path, lambda: [], lambda: asked.append("go"), uid=os.getuid() + 1)
    server.start()
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        client = await HandoverClient.connect(path)  # our uid is not the server's "own" one: it hangs up on us
        assert client is not None
        try:
            with pytest.raises(HandoverError):
                await client.describe()
        finally:
            client.close()
        assert asked == []
    finally:
        await server.close()


async def test_attack_a_handover_channel_served_by_another_user_is_not_used(tmp_path: Path) -> None:
    """The new process checks the old one too: children and records come only from a process of its own user."""
    from satgate_mcp.daemon.handover import HandoverClient, listen_socket

    path = tmp_path / "handover.sock"
    with listen_socket(path):
        assert await HandoverClient.connect(path, uid=os.getuid() + 1) is None
