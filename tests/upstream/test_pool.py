"""Several real upstreams behind one pool: the tool union, clashes, pagination, refresh and routing."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import structlog

from satgate_mcp.errors import ConfigError, UnknownTarget, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.upstream.base import UPSTREAM_READY
from satgate_mcp.upstream.pool import UpstreamPool
from tests.conftest import HttpUpstreamProcess, pid_alive, upstream_command
from tests.upstream_server import BASE_TOOLS

StartPool = Callable[..., Awaitable["ObservedPool"]]
Spec = StdioUpstreamSpec | HttpUpstreamSpec


def stdio(*args: str, prefix: str = "", timeout: float = 10.0) -> StdioUpstreamSpec:
    return StdioUpstreamSpec(transport="stdio", command=upstream_command(*args), tool_prefix=prefix,
                             timeout=timeout)


class ObservedPool(UpstreamPool):
    """The pool plus what these tests watch: the notifications it has applied, and its children's pids."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied: list[tuple[str, str]] = []
        self._cond = asyncio.Condition()

    async def _apply_notification(self, name: str, method: str) -> None:
        await super()._apply_notification(name, method)
        async with self._cond:
            self.applied.append((name, method))
            self._cond.notify_all()

    async def wait_applied(self, upstream: str, method: str, count: int) -> None:
        async with asyncio.timeout(15), self._cond:
            await self._cond.wait_for(lambda: self.applied.count((upstream, method)) >= count)

    def pids(self) -> list[int | None]:
        return [getattr(u, "pid", None) for u in self._upstreams.values()]


# One event loop per module, so the routing tests can share one pool of children.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.process]


def make_pool(specs: dict[str, Spec], *, start_timeout: float = 20.0) -> ObservedPool:
    return ObservedPool(specs, publisher=RecordingPublisher(), metrics=Metrics(), start_timeout=start_timeout)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared() -> AsyncIterator[UpstreamPool]:
    """Three upstreams that only get called: ``two`` with a pool prefix, ``big`` with paged tools."""
    pool = make_pool({
        "one": stdio("--name", "one"),
        "two": stdio("--name", "two", prefix="two_"),
        "big": stdio("--name", "big", "--prefix", "big_", "--many-tools", "25", "--page-size", "4"),
    })
    await pool.start()
    yield pool
    await pool.close()


@pytest_asyncio.fixture(loop_scope="module")
async def start_pool() -> AsyncIterator[StartPool]:
    pools: list[ObservedPool] = []

    async def start(specs: dict[str, Spec]) -> ObservedPool:
        pool = make_pool(specs)
        pools.append(pool)
        await pool.start()
        return pool

    yield start
    await asyncio.gather(*(p.close() for p in pools))


def names(pool: UpstreamPool) -> list[str]:
    return [t["name"] for t in pool.tools()]


def text_of(reply: JsonObj) -> str:
    return str(reply["result"]["content"][0]["text"])


async def call_tool(pool: UpstreamPool, tool: str, **arguments: object) -> JsonObj:
    return await pool.call_tool({"name": tool, "arguments": arguments})


async def test_the_tool_union_applies_prefixes_and_routes_to_the_owner(shared: UpstreamPool) -> None:
    assert all(shared.readiness().values())
    assert shared.readiness() == {"one": True, "two": True, "big": True}
    assert {"echo", "two_echo", "whoami", "two_whoami", "big_whoami"} <= set(names(shared))
    assert shared.owner_of_tool("two_echo") == "two"
    assert shared.owner_of_tool("echo") == "one"
    assert shared.owner_of_tool("nope") is None
    assert text_of(await call_tool(shared, "whoami")) == "one"
    reply = await call_tool(shared, "two_whoami")
    assert text_of(reply) == "two"  # the prefix was stripped before forwarding
    assert reply["id"] is None  # the transport puts the client's id on it
    with pytest.raises(UnknownTarget, match="Unknown tool: nope"):
        await call_tool(shared, "nope")


async def test_a_name_clash_without_prefixes_stops_start_with_a_clear_message() -> None:
    pool = make_pool({"github": stdio("--name", "a"), "jira": stdio("--name", "b")})

    with pytest.raises(ConfigError) as caught:
        await pool.start()

    message = str(caught.value)
    for part in ("'echo'", "'github'", "'jira'", "tool_prefix"):
        assert part in message
    assert not any(pool.readiness().values())  # it stopped its children on the way out


async def test_every_page_of_an_upstreams_tools_is_listed(shared: UpstreamPool) -> None:
    from_big = [n for n in names(shared) if shared.owner_of_tool(n) == "big"]

    assert {f"big_extra_{i}" for i in range(25)} <= set(from_big)
    assert len(from_big) == len(set(from_big)) == 25 + len(BASE_TOOLS)  # pages of 4, every one of them


async def test_list_changed_refreshes_the_union_and_a_late_clash_keeps_the_first_owner(
    start_pool: StartPool,
) -> None:
    pool = await start_pool({"one": stdio("--name", "one"), "two": stdio("--name", "two", "--prefix", "b_")})

    version = pool.tools_version
    await call_tool(pool, "b_add_tool", name="brand_new")
    await pool.wait_applied("two", "notifications/tools/list_changed", 1)
    assert pool.owner_of_tool("brand_new") == "two"
    assert pool.tools_version == version + 1  # sessions that listed before now get told

    with structlog.testing.capture_logs() as logs:
        await call_tool(pool, "b_add_tool", name="echo")  # now both advertise "echo"
        await pool.wait_applied("two", "notifications/tools/list_changed", 2)

    assert pool.owner_of_tool("echo") == "one"
    assert text_of(await call_tool(pool, "echo", text="first owner")) == "first owner"
    clash = next(e for e in logs if e["event"] == "upstream_tool_clash")
    assert (clash["tool"], clash["kept"], clash["ignored"]) == ("echo", "one", "two")


async def test_prompts_resources_and_completions_are_routed_by_name_and_uri(shared: UpstreamPool) -> None:
    caps = shared.capabilities()
    assert caps["tools"] == {"listChanged": True}
    assert {"resources", "prompts", "completions"} <= set(caps)

    prompts = (await shared.listing("prompts"))["prompts"]
    assert [p["name"] for p in prompts] == ["big_greet", "greet", "two_greet"]  # sorted; "two"'s prefix names it
    got = await shared.get_prompt({"name": "two_greet", "arguments": {"who": "bo"}})
    assert got["result"]["messages"][0]["content"]["text"] == "two greets bo"  # asked under its own name
    got = await shared.get_prompt({"name": "big_greet", "arguments": {"who": "ann"}})
    assert got["result"]["messages"][0]["content"]["text"] == "big greets ann"

    resources = (await shared.listing("resources"))["resources"]
    assert [r["uri"] for r in resources] == ["memo://big/readme", "memo://one/readme", "memo://two/readme"]
    read = await shared.read_resource({"uri": "memo://two/readme"})
    assert read["result"]["contents"][0]["text"] == "hello from two: memo://two/readme"
    templates = (await shared.listing("templates"))["resourceTemplates"]
    assert [t["name"] for t in templates] == sorted(t["name"] for t in templates)
    assert {"memo://big/notes/{id}", "memo://two/notes/{id}"} <= {t["uriTemplate"] for t in templates}
    by_template = await shared.read_resource({"uri": "memo://big/notes/7"})
    assert by_template["result"]["contents"][0]["text"] == "hello from big: memo://big/notes/7"
    assert "result" in await shared.subscribe({"uri": "memo://one/readme"})

    done = await shared.complete({"ref": {"type": "ref/prompt", "name": "big_greet"},
                                  "argument": {"name": "who", "value": "a"}})
    assert done["result"]["completion"]["values"] == ["big-a"]

    with pytest.raises(UnknownTarget, match="prompt 'nope'"):
        await shared.get_prompt({"name": "nope"})
    unknown = await shared.read_resource({"uri": "memo://nobody/x"})
    assert "error" in unknown  # every upstream that offers resources was asked; the answer passes through


async def test_cancelling_a_pool_call_cancels_it_upstream(shared: UpstreamPool) -> None:
    async def cancelled() -> int:
        return int(json.loads(text_of(await call_tool(shared, "cancelled_count")))["cancelled"])

    before = await cancelled()
    started = asyncio.Event()

    async def on_progress(params: JsonObj) -> None:
        started.set()

    params = {"name": "slow", "arguments": {"steps": 1000, "delay": 0.05}, "_meta": {"progressToken": "p"}}
    task = asyncio.create_task(shared.call_tool(params, on_progress=on_progress))
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    for _ in range(50):  # asks again (bounded) until the upstream has processed the notification
        if await cancelled() > before:
            break
    assert await cancelled() == before + 1


async def test_a_crashed_upstream_is_relisted_after_its_restart(start_pool: StartPool) -> None:
    pool = await start_pool({"one": stdio("--name", "one")})
    await pool.wait_applied("one", UPSTREAM_READY, 1)
    version = pool.tools_version

    with pytest.raises(UpstreamUnavailable, match="went away"):
        await call_tool(pool, "crash")
    await pool.wait_applied("one", UPSTREAM_READY, 2)

    assert all(pool.readiness().values())
    assert pool.tools_version == version  # the same tools came back: nobody is told to re-list
    assert "echo" in names(pool)
    assert text_of(await call_tool(pool, "whoami")) == "one"


#: A child that exits at once (status 3, one stderr line) until its gate file exists, then is the test upstream.
GATED = ("import os, sys\n"
         "if not os.path.exists(sys.argv[1]):\n"
         "    sys.stderr.write('no gate yet\\n')\n"
         "    sys.exit(3)\n"
         "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n")


class ListChanges:
    """The pool's listener: an event set once the merged tool list changed."""

    def __init__(self) -> None:
        self.tools_changed = asyncio.Event()

    def __call__(self, method: str, params: JsonObj | None, origin: tuple[str, str] | None = None) -> None:
        if method == "notifications/tools/list_changed":
            self.tools_changed.set()


async def test_an_upstream_down_at_start_is_named_then_served_once_its_restart_comes_up(
    start_pool: StartPool, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    server = upstream_command("--name", "gated")[1:]
    gated = StdioUpstreamSpec(transport="stdio", tool_prefix="g_", timeout=10.0,
                              command=[sys.executable, "-c", GATED, str(gate), *server])
    pool = await start_pool({"one": stdio("--name", "one"), "gated": gated})
    changes = ListChanges()
    pool.listen(changes)

    assert pool.readiness() == {"one": True, "gated": False}
    assert pool.failures() == {"gated": {"status": "exited with status 3", "stderr": "no gate yet"}}
    assert text_of(await call_tool(pool, "whoami")) == "one"
    assert not [n for n in names(pool) if n.startswith("g_")]
    with pytest.raises(UpstreamUnavailable, match=r"upstream 'gated', which is down \(exited with status 3\)"):
        await call_tool(pool, "g_whoami")

    gate.touch()  # the next restart (the existing backoff) comes up
    await pool.wait_applied("gated", UPSTREAM_READY, 1)
    await asyncio.wait_for(changes.tools_changed.wait(), 15)

    assert pool.readiness() == {"one": True, "gated": True}
    assert pool.failures() == {}
    assert "g_echo" in names(pool)
    assert text_of(await call_tool(pool, "g_whoami")) == "gated"


async def test_stdio_and_http_upstreams_side_by_side(
    start_pool: StartPool, http_upstream: HttpUpstreamProcess
) -> None:
    pool = await start_pool({
        "local": stdio("--name", "local", prefix="local_"),
        "remote": HttpUpstreamSpec(transport="http", url=http_upstream.url, tool_prefix="remote_"),
    })

    assert text_of(await call_tool(pool, "local_whoami")) == "local"
    assert text_of(await call_tool(pool, "remote_whoami")) == "web"
    assert pool.owner_of_tool("remote_echo") == "remote"


async def test_start_returns_in_bounded_time_when_an_upstream_is_down() -> None:
    spec = StdioUpstreamSpec(transport="stdio", command=["/nonexistent/server"], timeout=5)
    pool = make_pool({"down": spec}, start_timeout=0.3)
    try:
        await pool.start()
        assert pool.readiness() == {"down": False}
        assert pool.tools() == []
    finally:
        await pool.close()


async def test_closing_the_pool_stops_every_child(start_pool: StartPool) -> None:
    pool = await start_pool({"one": stdio(), "two": stdio(prefix="b_")})
    pids = pool.pids()

    await pool.close()

    assert all(pid is not None and not pid_alive(pid) for pid in pids)
