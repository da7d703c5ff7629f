"""``"isolation"``: a child per token id or per client session, with real child processes.

The decisions (whose child, which children are idle, which relay owns a message) are tested from
tables; the rest runs the test upstream as real children behind a real pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import Isolation, StdioUpstreamSpec
from satgate_mcp.upstream.base import CALLER, Caller, ProgressCallback, Relay
from satgate_mcp.upstream.inbox import owning_relay
from satgate_mcp.upstream.isolated import IsolatedUpstream, idle_children, most_verbose, owner_key
from satgate_mcp.upstream.pool import UpstreamPool
from tests.conftest import pid_alive, upstream_command

TTL = 60.0


# -- the decisions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("isolation", "caller", "key"),
    [
        pytest.param("session", Caller("alice", "mcp-1"), "mcp-1", id="session-mode-keys-by-session"),
        pytest.param("token", Caller("alice", "mcp-1"), "alice", id="token-mode-keys-by-token-id"),
        pytest.param("session", Caller("alice", "token:alice"), "token:alice", id="a-stateless-caller-is-its-token"),
        pytest.param("session", Caller("alice", ""), None, id="no-session-no-child"),
        pytest.param("token", None, None, id="the-gateways-own-request-has-no-child"),
    ],
)
def test_whose_child_a_request_runs_on(isolation: str, caller: Caller | None, key: str | None) -> None:
    assert owner_key(isolation, caller) == key


@pytest.mark.parametrize(
    ("used", "inflight", "idle"),
    [
        pytest.param({"a": 0.0, "b": 50.0}, {}, ["a"], id="only-past-the-ttl"),
        pytest.param({"a": 0.0}, {"a": 1}, [], id="a-call-in-flight-keeps-it"),
        pytest.param({"a": 40.0}, {}, ["a"], id="exactly-the-ttl-is-idle"),
    ],
)
def test_which_children_are_idle(used: dict[str, float], inflight: dict[str, int], idle: list[str]) -> None:
    assert idle_children(used, inflight, now=100.0, ttl=TTL) == idle


def test_a_child_is_set_to_the_most_verbose_level_its_sessions_asked_for() -> None:
    assert most_verbose(["warning", "debug", "error"]) == "debug"
    assert most_verbose(["loud"]) is None


@dataclass
class FakeRelay:
    session_key: str

    async def __call__(self, params: JsonObj) -> None: ...
    def admit(self) -> None: ...
    async def notify(self, method: str, params: JsonObj | None) -> None: ...
    async def ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        return {}


ANN, ANN_2, BOB = FakeRelay("ann"), FakeRelay("ann"), FakeRelay("bob")


@pytest.mark.parametrize(
    ("relays", "exclusive", "owner"),
    [
        pytest.param([ANN, ANN_2], False, ANN_2, id="one-session-on-a-shared-pipe"),
        pytest.param([ANN, BOB], False, None, id="two-sessions-on-a-shared-pipe-refused"),
        pytest.param([ANN, None], False, None, id="a-call-without-a-client-makes-it-unknowable"),
        pytest.param([ANN, None], True, ANN, id="a-sessions-own-child-gives-it-everything"),
        pytest.param([None], True, None, id="no-client-in-flight-nobody-to-give-it-to"),
    ],
)
def test_which_call_a_message_on_a_pipe_belongs_to(relays: list[Relay | None], exclusive: bool,
                                                   owner: Relay | None) -> None:
    assert owning_relay(relays, exclusive=exclusive) is owner


# -- real children -----------------------------------------------------------------------------------

on_module_loop = pytest.mark.asyncio(loop_scope="module")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Isolated:
    pool: UpstreamPool
    upstream: IsolatedUpstream
    metrics: Metrics
    clock: Clock

    async def call(self, caller: Caller, tool: str, *, on_progress: ProgressCallback | None = None,
                   **arguments: object) -> str:
        token = CALLER.set(caller)
        params: JsonObj = {"name": tool, "arguments": arguments}
        if on_progress is not None:
            params["_meta"] = {"progressToken": "p"}
        try:
            reply = await self.pool.call_tool(params, on_progress=on_progress)
        finally:
            CALLER.reset(token)
        return str(reply["result"]["content"][0]["text"])

    def live_children(self) -> list[int]:
        """Every pid of this upstream still alive, the catalogue child's included."""
        return [pid for pid in self.upstream.pids().values() if pid is not None and pid_alive(pid)]

    def refusals(self) -> float:
        return self.metrics.registry.get_sample_value("satgate_upstream_instance_refusals_total",
                                                      {"upstream": "iso"}) or 0.0


@contextlib.asynccontextmanager
async def isolated(isolation: Isolation, max_instances: int = 10) -> AsyncIterator[Isolated]:
    spec = StdioUpstreamSpec(transport="stdio", command=upstream_command("--name", "iso"), isolation=isolation,
                             max_instances=max_instances, timeout=20.0)
    metrics, clock = Metrics(), Clock()
    pool = UpstreamPool({"iso": spec}, publisher=RecordingPublisher(), metrics=metrics, idle_ttl=TTL, clock=clock,
                        start_timeout=20.0)
    await pool.start()
    upstream = pool.isolated("iso")
    assert upstream is not None
    try:
        yield Isolated(pool, upstream, metrics, clock)
    finally:
        await pool.close()


ALICE_1, ALICE_2, BOB_1 = Caller("alice", "mcp-a1"), Caller("alice", "mcp-a2"), Caller("bob", "mcp-b1")
CAROL_1 = Caller("carol", "mcp-c1")


@dataclass(frozen=True)
class Mode:
    """An isolation mode and three callers who each own a child of their own under it."""

    isolation: Isolation
    callers: tuple[Caller, Caller, Caller]

    def key(self, caller: Caller) -> str:
        return caller.token_id if self.isolation == "token" else caller.session_id


MODES = [pytest.param(Mode("session", (ALICE_1, ALICE_2, BOB_1)), id="session"),
         pytest.param(Mode("token", (ALICE_1, BOB_1, CAROL_1)), id="token")]


@pytest.fixture
def no_caller() -> Iterator[None]:
    token = CALLER.set(None)
    yield
    CALLER.reset(token)


@pytest_asyncio.fixture(loop_scope="module", params=MODES)
async def each(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Isolated, Mode]]:
    """Every isolation mode, two client children allowed."""
    mode: Mode = request.param
    async with isolated(mode.isolation, max_instances=2) as iso:
        yield iso, mode


@on_module_loop
@pytest.mark.process
async def test_the_catalogue_is_known_before_any_client_and_only_the_catalogue_child_runs(
        each: tuple[Isolated, Mode]) -> None:
    iso, _mode = each
    assert "whoami" in [tool["name"] for tool in iso.pool.tools()]
    assert iso.pool.readiness() == {"iso": True}
    assert iso.upstream.instances() == 0
    assert "logging" in iso.pool.capabilities()
    assert iso.pool.instructions() == [("iso", "Tools of the iso test server.")]


@on_module_loop
@pytest.mark.process
async def test_each_owner_has_a_child_of_its_own_with_its_own_state(each: tuple[Isolated, Mode]) -> None:
    iso, mode = each
    one, two, _ = mode.callers
    await iso.pool.set_caller_log_level(one, "debug")
    await iso.pool.set_caller_log_level(two, "warning")
    levels = await asyncio.gather(iso.call(one, "relay_log_level"), iso.call(two, "relay_log_level"))
    assert list(levels) == ["debug", "warning"]
    pids = iso.upstream.pids()
    assert len({pids[""], pids[mode.key(one)], pids[mode.key(two)]}) == 3
    # the shared level is not theirs: a child follows only its own sessions
    await iso.pool.set_log_level("error")
    assert await iso.call(one, "relay_log_level") == "debug"


@on_module_loop
@pytest.mark.process
async def test_past_max_instances_a_new_owner_is_refused_and_counted(each: tuple[Isolated, Mode]) -> None:
    iso, mode = each
    one, two, three = mode.callers
    await asyncio.gather(iso.call(one, "whoami"), iso.call(two, "whoami"))
    before = iso.refusals()
    with pytest.raises(UpstreamUnavailable) as refused:
        await iso.call(three, "whoami")
    assert refused.value.data == {"error": "upstream_unavailable", "upstream": "iso", "reason": "max_instances",
                                  "isolation": mode.isolation, "max_instances": 2}
    assert refused.value.sent is False  # never ran: refunded
    assert iso.refusals() == before + 1
    assert iso.upstream.instances() == 2
    assert await iso.call(one, "whoami") == "iso"  # the owners that have a child keep it


@on_module_loop
@pytest.mark.process
async def test_an_ended_session_loses_its_child_and_resumed_it_gets_a_fresh_child(
        each: tuple[Isolated, Mode]) -> None:
    iso, mode = each
    one = mode.callers[0]
    await iso.pool.set_caller_log_level(one, "debug")
    assert await iso.call(one, "relay_log_level") == "debug"
    first = iso.upstream.pids()[mode.key(one)]
    assert first is not None
    iso.pool.session_ended(one.session_id)  # its only session: a token's child goes too
    await iso.upstream.stopped()
    assert not pid_alive(first)
    assert mode.key(one) not in iso.upstream.pids()
    # the same session id again (resumed): a new child, which knows nothing of the old one's state
    assert await iso.call(one, "relay_log_level") == "None"
    assert iso.upstream.pids()[mode.key(one)] not in (None, first)


@on_module_loop
@pytest.mark.process
async def test_an_idle_child_is_reaped_after_the_ttl_and_a_busy_one_is_not(each: tuple[Isolated, Mode]) -> None:
    iso, mode = each
    idle, busy_caller, _ = mode.callers
    await asyncio.gather(iso.call(idle, "whoami"), iso.call(busy_caller, "whoami"))
    idle_pid = iso.upstream.pids()[mode.key(idle)]
    running = asyncio.Event()

    async def progressed(params: JsonObj) -> None:
        running.set()

    busy = asyncio.ensure_future(iso.call(busy_caller, "slow", steps=20, delay=0.05, on_progress=progressed))
    await asyncio.wait_for(running.wait(), 10)
    assert iso.pool.sweep(iso.clock.now + TTL - 1) == {}
    assert iso.pool.sweep(iso.clock.now + TTL) == {"iso": [mode.key(idle)]}
    await iso.upstream.stopped()
    assert idle_pid is not None
    assert not pid_alive(idle_pid)
    assert await busy == "done 20"
    assert iso.pool.sweep(iso.clock.now + TTL) == {"iso": [mode.key(busy_caller)]}  # idle now it is done


@on_module_loop
@pytest.mark.process
async def test_a_request_without_a_caller_never_reaches_a_clients_child(each: tuple[Isolated, Mode],
                                                                        no_caller: None) -> None:
    iso, _mode = each
    reply = await iso.pool.read_resource({"uri": "memo://iso/readme"})
    assert reply["error"]["data"] == {"error": "no_client", "upstream": "iso"}
    assert iso.upstream.instances() == 0


@on_module_loop
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.process
async def test_closing_the_pool_leaves_no_child_behind(mode: Mode) -> None:
    async with isolated(mode.isolation) as iso:
        await asyncio.gather(*(iso.call(caller, "whoami") for caller in mode.callers))
        live = iso.live_children()
        assert len(live) == 4  # the catalogue child and one per owner
    assert not any(pid_alive(pid) for pid in live)
    assert iso.upstream.instances() == 0


@on_module_loop
@pytest.mark.process
async def test_a_token_has_one_child_for_all_its_sessions_reaped_when_the_last_ends() -> None:
    async with isolated("token") as iso:
        await asyncio.gather(iso.call(ALICE_1, "whoami"), iso.call(ALICE_2, "whoami"), iso.call(BOB_1, "whoami"))
        pids = iso.upstream.pids()
        assert set(pids) == {"", "alice", "bob"}
        iso.pool.session_ended("mcp-a1")
        assert "alice" in iso.upstream.pids()  # its other session still uses it
        iso.pool.session_ended("mcp-a2")
        await iso.upstream.stopped()
        assert set(iso.upstream.pids()) == {"", "bob"}
        assert pids["alice"] is not None
        assert not pid_alive(pids["alice"])
        assert iso.upstream.pids()["bob"] == pids["bob"]
