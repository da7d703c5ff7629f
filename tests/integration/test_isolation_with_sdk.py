"""``"isolation"`` through the whole gateway: official SDK clients, real children, real HTTP.

Two stdio upstreams run the test upstream: ``solo`` gives every client session a child of its own
(tools ``s_*``), ``pert`` one child per token id (tools ``t_*``). Tokens are verified macaroons
(header mode), so two token ids can be told apart and a session can be resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2
import mcp_types as types
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.keys import POOL, REGISTRY
from satgate_mcp.settings import Settings
from satgate_mcp.upstream.isolated import IsolatedUpstream
from satgate_mcp.upstream.pool import UpstreamPool
from tests.conftest import pid_alive
from tests.integration.test_gateway_with_sdk import Progress, sole, stdio_upstream
from tests.integration.test_relay_with_sdk import connect

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.process]

ROOT_KEY = "isolation-root-key-0123456789abcdefghijkl"
ALICE = mint_token(ROOT_KEY, "alice")
BOB = mint_token(ROOT_KEY, "bob")
IDLE_TTL = 600.0
READY_TIMEOUT = 30.0
CALL_TIMEOUT = 15.0


class Clock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


def isolation_settings(**upstreams: dict[str, Any]) -> Settings:
    with pytest.MonkeyPatch.context() as env:
        for key in list(os.environ):
            if key.startswith("SATGATE_"):
                env.delenv(key)
        values: dict[str, Any] = {"auth_mode": "header", "root_key": SecretStr(ROOT_KEY), "upstreams": upstreams,
                                  "session_idle_ttl": IDLE_TTL, "state_dir": "memory"}
        return Settings(**values)


def solo(**extra: Any) -> dict[str, Any]:
    return stdio_upstream("--name", "solo", "--prefix", "s_", isolation="session", **extra)


def pert(**extra: Any) -> dict[str, Any]:
    return stdio_upstream("--name", "pert", "--prefix", "t_", isolation="token", **extra)


@dataclass
class Gateway:
    url: str
    app: web.Application
    clock: Clock
    http: httpx2.AsyncClient

    def upstream(self, name: str) -> IsolatedUpstream:
        pool = self.app[POOL]
        assert isinstance(pool, UpstreamPool)
        found = pool.isolated(name)
        assert found is not None
        return found

    def client_pids(self, name: str) -> dict[str, int | None]:
        return {owner: pid for owner, pid in self.upstream(name).pids().items() if owner}

    def every_pid(self) -> list[int]:
        return [pid for name in ("solo", "pert") for pid in self.upstream(name).pids().values() if pid is not None]

    async def metric(self, name: str, **labels: str) -> float:
        scrape = await self.http.get("/metrics")
        for family in text_string_to_metric_families(scrape.text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0


@contextlib.asynccontextmanager
async def gateway_with(**upstreams: dict[str, Any]) -> AsyncIterator[Gateway]:
    clock = Clock()
    app = create_app(isolation_settings(**upstreams), clock=clock)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}"
    try:
        async with httpx2.AsyncClient(base_url=url, trust_env=False, timeout=5.0) as http:
            gateway = Gateway(url, app, clock, http)
            for name in upstreams:  # ready once the catalogue child is
                assert await gateway.upstream(name).wait_ready(READY_TIMEOUT)
            assert (await http.get("/readyz")).status_code == 200
            yield gateway
    finally:
        await server.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    async with gateway_with(solo=solo(), pert=pert()) as gw:
        yield gw


# -- the catalogue and readiness -------------------------------------------------------------------


async def test_the_catalogue_and_readiness_need_no_client(gateway: Gateway) -> None:
    ready = (await gateway.http.get("/readyz")).json()
    assert ready["upstreams"] == {"solo": True, "pert": True}
    async with connect(gateway.url, "ann", token=ALICE) as ann:
        tools = [tool.name for tool in (await ann.session.list_tools()).tools]
        assert {"s_whoami", "t_whoami"} <= set(tools)
    assert gateway.client_pids("solo") == {}  # listing spawned no client child


# -- session: a child per client session -------------------------------------------------------------


async def test_two_sessions_at_once_each_get_their_own_roots_questions_and_answers(gateway: Gateway) -> None:
    before = await gateway.metric("satgate_upstream_unattributed_total", upstream="solo", kind="request")
    async with connect(gateway.url, "ann", token=ALICE) as ann, connect(gateway.url, "bob", token=ALICE) as bob:
        for _ in range(2):
            roots = await asyncio.gather(ann.text("s_relay_roots"), bob.text("s_relay_roots"))
            assert [json.loads(r) for r in roots] == [["file:///home/ann"], ["file:///home/bob"]]
            asked = await asyncio.gather(ann.text("s_relay_elicit"), bob.text("s_relay_elicit"))
            assert [json.loads(a)["content"] for a in asked] == [{"answer": "ann says yes"}, {"answer": "bob says yes"}]
        # a slow call of ann's in flight does not make bob's question unattributable: it is on another child
        slow = asyncio.ensure_future(ann.text("s_slow", steps=10, delay=0.05))
        assert json.loads(await bob.text("s_relay_roots")) == ["file:///home/bob"]
        await slow
    assert ann.client.asked.count("roots/list") == 2
    assert bob.client.asked.count("roots/list") == 3
    assert await gateway.metric("satgate_upstream_unattributed_total", upstream="solo", kind="request") == before


async def test_each_session_sets_its_own_childs_log_level_and_gets_exactly_its_messages(gateway: Gateway) -> None:
    async with connect(gateway.url, "ann", token=ALICE) as ann, connect(gateway.url, "bob", token=ALICE) as bob:
        await ann.session.set_logging_level("debug")
        await bob.session.set_logging_level("warning")
        levels = await asyncio.gather(ann.text("s_relay_log_level"), bob.text("s_relay_log_level"))
        assert list(levels) == ["debug", "warning"]
        await asyncio.gather(ann.text("s_relay_log", tag="a"), bob.text("s_relay_log", tag="b"))
    assert ann.client.log_data() == ["debug a", "info a", "warning a", "error a"]
    assert bob.client.log_data() == ["warning b", "error b"]


async def test_a_deleted_session_takes_its_child_with_it(gateway: Gateway) -> None:
    before = set(gateway.client_pids("solo"))
    async with connect(gateway.url, "ann", token=ALICE) as ann:
        await ann.text("s_whoami")
        [owner] = set(gateway.client_pids("solo")) - before
        pid = gateway.client_pids("solo")[owner]
    # leaving the SDK client DELETEs the session
    await gateway.upstream("solo").stopped()
    assert owner not in gateway.client_pids("solo")
    assert pid is not None
    assert not pid_alive(pid)


# -- token: a child per token id ------------------------------------------------------------------------


async def test_two_tokens_at_once_each_get_their_own_child_and_answers(gateway: Gateway) -> None:
    async with connect(gateway.url, "ann", token=ALICE) as ann, connect(gateway.url, "bob", token=BOB) as bob:
        roots = await asyncio.gather(ann.text("t_relay_roots"), bob.text("t_relay_roots"))
        assert [json.loads(r) for r in roots] == [["file:///home/ann"], ["file:///home/bob"]]
        sampled = await asyncio.gather(ann.text("t_relay_sample", prompt="hi"), bob.text("t_relay_sample", prompt="yo"))
        assert list(sampled) == ["ann: hi", "bob: yo"]
        asked = await asyncio.gather(ann.text("t_relay_elicit"), bob.text("t_relay_elicit"))
        assert [json.loads(a)["content"] for a in asked] == [{"answer": "ann says yes"}, {"answer": "bob says yes"}]
        assert ann.client.asked == bob.client.asked == ["roots/list", "sampling/createMessage", "elicitation/create"]
        pids = gateway.client_pids("pert")
        assert {"alice", "bob"} <= set(pids)
        assert pids["alice"] != pids["bob"]


async def test_two_sessions_of_one_token_share_its_child_and_overlap_is_refused_naming_the_setting(
        gateway: Gateway) -> None:
    before = await gateway.metric("satgate_upstream_unattributed_total", upstream="pert", kind="request")
    async with connect(gateway.url, "ann", token=ALICE) as ann, connect(gateway.url, "bob", token=ALICE) as bob:
        assert json.loads(await bob.text("t_relay_roots")) == ["file:///home/bob"]  # alone on the child: exact
        progress = Progress()
        slow = asyncio.ensure_future(ann.session.call_tool("t_slow", {"steps": 20, "delay": 0.05},
                                                           progress_callback=progress))
        await asyncio.wait_for(progress.first.wait(), 10)  # ann's call runs on the child: bob's question is ambiguous
        text = await bob.text("t_relay_roots")
        await slow
    assert text.startswith("error:")
    assert '"isolation": "token"' in text
    assert ann.client.asked == []
    assert bob.client.asked == ["roots/list"]
    assert await gateway.metric("satgate_upstream_unattributed_total", upstream="pert", kind="request") == before + 1


# -- the cap, idle reaping, resumption, shutdown ----------------------------------------------------------


async def test_past_max_instances_a_session_gets_a_jsonrpc_error_and_shutdown_leaves_no_child() -> None:
    async with (gateway_with(solo=solo(max_instances=1)) as gw, connect(gw.url, "ann", token=ALICE) as ann,
                connect(gw.url, "bob", token=BOB) as bob):
        assert await ann.text("s_whoami") == "solo"
        with pytest.raises(MCPError) as refused:
            await bob.session.call_tool("s_whoami", {})
        assert refused.value.error.code == -32010
        assert '"max_instances" (1)' in refused.value.error.message
        assert await gw.metric("satgate_upstream_instance_refusals_total", upstream="solo") == 1
        assert await gw.metric("satgate_upstream_instances", upstream="solo") == 1
        pids = [pid for pid in gw.upstream("solo").pids().values() if pid is not None]
        assert len(pids) == 2  # the catalogue child and ann's
    assert not any(pid_alive(pid) for pid in pids)


async def test_an_idle_session_loses_its_child_and_resumed_it_meets_a_fresh_one() -> None:
    async with gateway_with(solo=solo()) as gw, connect(gw.url, "ann", token=ALICE) as ann:
        await ann.session.set_logging_level("debug")
        assert await ann.text("s_relay_log_level") == "debug"
        [(owner, first)] = gw.client_pids("solo").items()
        gw.clock.now += IDLE_TTL
        assert gw.app[REGISTRY].sweep() != []  # the session is closed as idle: its child goes with it
        await gw.upstream("solo").stopped()
        assert first is not None
        assert not pid_alive(first)
        # the client keeps its session id; the gateway resumes it (a verified token) on a fresh child
        assert await ann.text("s_relay_log_level") == "None"
        [(again, second)] = gw.client_pids("solo").items()
        assert again == owner
        assert second not in (None, first)
        assert json.loads(await ann.text("s_relay_roots")) == ["file:///home/ann"]


async def test_an_idle_child_is_reaped_by_the_pools_sweep_while_its_session_lives(gateway: Gateway) -> None:
    async with connect(gateway.url, "ann", token=ALICE) as ann:
        await ann.text("s_whoami")
        owners = set(gateway.client_pids("solo"))
        pool = gateway.app[POOL]
        assert isinstance(pool, UpstreamPool)
        swept = pool.sweep(gateway.clock.now + IDLE_TTL)
        assert owners <= set(swept.get("solo", []))
        await gateway.upstream("solo").stopped()
        assert await ann.text("s_whoami") == "solo"  # a new child on the next call


# -- resource subscriptions: per child -------------------------------------------------------------------


class StreamWire(httpx2.AsyncBaseTransport):
    """Real HTTP; set once the session's GET stream was answered 200 (it carries resource updates)."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self.stream_open = asyncio.Event()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "GET" and response.status_code == 200:
            self.stream_open.set()
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Listener:
    session: ClientSession
    updates: asyncio.Queue[str]

    async def text(self, tool: str, **arguments: Any) -> str:
        result = await asyncio.wait_for(self.session.call_tool(tool, arguments), CALL_TIMEOUT)
        [content] = result.content
        assert isinstance(content, types.TextContent)
        return content.text

    async def next_update(self) -> str:
        return await asyncio.wait_for(self.updates.get(), CALL_TIMEOUT)


@contextlib.asynccontextmanager
async def listening(url: str, token: str) -> AsyncIterator[Listener]:
    wire = StreamWire()
    updates: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            await updates.put(str(message.params.uri))

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, transport=wire, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    try:
        async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                    ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, message_handler=on_message)
                    as session):
            await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
            await asyncio.wait_for(wire.stream_open.wait(), CALL_TIMEOUT)
            yield Listener(session, updates)
    except BaseExceptionGroup as group:
        raise sole(group) from None


README, NOTE = "memo://solo/readme", "memo://solo/notes/1"


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_each_sessions_child_is_subscribed_and_its_updates_reach_that_session_only(gateway: Gateway) -> None:
    async with listening(gateway.url, ALICE) as ann, listening(gateway.url, ALICE) as bob:
        for agent in (ann, bob):
            await asyncio.wait_for(agent.session.subscribe_resource(README), CALL_TIMEOUT)
        await asyncio.wait_for(bob.session.subscribe_resource(NOTE), CALL_TIMEOUT)
        # both children hold the subscription: the count is per child, not one for everyone
        assert json.loads(await ann.text("s_stream_subscribed")) == [README]
        assert json.loads(await bob.text("s_stream_subscribed")) == sorted([README, NOTE])

        await ann.text("s_stream_touch", uri=README)
        assert await ann.next_update() == README
        # had ann's update reached bob it would be ahead of this one on his stream
        await bob.text("s_stream_touch", uri=NOTE)
        assert await bob.next_update() == NOTE
