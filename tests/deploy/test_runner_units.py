"""The runner's own edges: sd_notify, the orphan guard, and waiting for upstreams before listening."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import cast

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from satgate_mcp.contracts import Pool
from satgate_mcp.daemon import runner
from satgate_mcp.daemon.notify import Notifier
from satgate_mcp.keys import POOL
from tests.deploy.clocks import SteppingClock


@pytest.mark.parametrize("abstract", [pytest.param(False, id="path"), pytest.param(True, id="abstract")])
def test_notifier_speaks_sd_notify_and_hides_the_socket_from_children(tmp_path: Path, abstract: bool) -> None:
    path = f"satgate-test-{os.getpid()}" if abstract else str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind("\0" + path if abstract else path)
        environ = {"NOTIFY_SOCKET": "@" + path if abstract else path}
        notifier = Notifier.from_environ(environ)
        notifier.send("READY=1")
        assert receiver.recv(64) == b"READY=1"
        assert "NOTIFY_SOCKET" not in environ


@pytest.mark.parametrize("environ", [pytest.param({}, id="no-notify-socket"),
                                     pytest.param({"NOTIFY_SOCKET": "vsock:2:1234"}, id="vsock-not-for-us")])
def test_notifier_without_socket_is_silent(environ: dict[str, str]) -> None:
    notifier = Notifier.from_environ(environ)
    with capture_logs() as logs:
        notifier.send("READY=1")
    assert (notifier.address, logs) == (None, []), "nothing sent, nothing logged, nothing raised"


@pytest.mark.process
def test_orphan_guard_terminates_children_left_behind() -> None:
    script = textwrap.dedent("""
        import subprocess, sys
        from satgate_mcp.daemon.children import child_pids, terminate_leftover_children
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        assert child_pids(__import__("os").getpid()) == [child.pid]
        print(terminate_leftover_children(__import__("os").getpid()), child.poll() is not None, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20, check=True)
    assert out.stdout.splitlines()[-1].split() == ["1", "True"]
    assert "orphan_guard" in out.stdout


class TogglePool:
    def __init__(self) -> None:
        self.ready = False

    def readiness(self) -> dict[str, bool]:
        return {"up": self.ready}

    def failures(self) -> dict[str, dict[str, str]]:
        return {}

    def circuits(self) -> dict[str, dict[str, object]]:
        return {}


def app_with(pool: TogglePool) -> web.Application:
    app = web.Application()
    app[POOL] = cast(Pool, pool)
    return app


async def test_listening_waits_for_upstreams_to_be_ready() -> None:
    pool, clock = TogglePool(), SteppingClock()
    waiting = asyncio.create_task(runner._wait_ready(app_with(pool), asyncio.Event(), timeout=5, clock=clock,
                                                     sleep=clock.sleep))
    await asyncio.sleep(0)
    assert not waiting.done()
    pool.ready = True
    assert await asyncio.wait_for(waiting, 5) is True


@pytest.mark.parametrize("stopped", [pytest.param(False, id="timeout"), pytest.param(True, id="stop-signal")])
async def test_waiting_for_readiness_is_bounded(stopped: bool) -> None:
    stop = asyncio.Event()
    if stopped:
        stop.set()
    clock = SteppingClock()
    started = clock()
    ready = await asyncio.wait_for(runner._wait_ready(app_with(TogglePool()), stop, timeout=0.1, clock=clock,
                                                      sleep=clock.sleep), 5)
    assert ready is False
    assert clock() - started <= (0.0 if stopped else 0.1 + runner.READY_POLL_SECONDS), "one look late at most"


@pytest.mark.parametrize("installed", [pytest.param(True, id="uvloop-installed"),
                                       pytest.param(False, id="asyncio-fallback")])
def test_the_daemon_runs_on_uvloop_when_it_is_installed(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    import uvloop

    if not installed:
        monkeypatch.setitem(sys.modules, "uvloop", None)  # what an import of a missing package does
    assert runner.event_loop_factory() is (uvloop.new_event_loop if installed else None)


@pytest.mark.process
def test_settle_heap_frees_start_up_cycles_then_freezes_what_lives_on() -> None:
    """In a child interpreter: freezing the test process's own heap would change how this suite collects."""
    script = textwrap.dedent("""
        import gc, weakref
        from satgate_mcp.daemon import runner

        class Node:
            pass

        garbage = Node(); garbage.me = garbage; dead = weakref.ref(garbage); del garbage
        runner.settle_heap()
        assert dead() is None, "start-up's cyclic garbage was frozen in, never to be freed"
        assert gc.get_freeze_count() > 0  # what lives on is out of the collector's passes
        assert gc.get_threshold() == runner.GC_THRESHOLDS
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
