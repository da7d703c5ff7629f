"""Guards (guards.py): what they see of a call, that a refusal reaches no upstream, and that lists follow them."""

from __future__ import annotations

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import UnmeteredPolicy
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.guards import REMOTE_ADDR, Asked, ClientFacts, Guards, Proceed
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.upstream.catalog import Kind
from tests.fakes import FakePool

ALICE = Identity(token_id="alice", tenant="acme")


class Recorder:
    """Refuses the tools it is told to, hides the ones it is told to, and writes down what it saw and did."""

    def __init__(self, name: str, log: list[str], *, refuse: frozenset[str] = frozenset(),
                 hide: frozenset[str] = frozenset()) -> None:
        self.name, self.log, self.refuse, self.hide = name, log, refuse, hide
        self.seen: list[Asked] = []

    async def guard(self, asked: Asked, proceed: Proceed) -> JsonObj:
        self.seen.append(asked)
        self.log.append(f"{self.name}:before")
        if asked.name in self.refuse:
            raise GatewayError("refused", {"error": "refused_by_" + self.name}, code=jsonrpc.TOOL_NOT_ALLOWED)
        reply = await proceed()
        self.log.append(f"{self.name}:after")
        return reply

    def hides(self, identity: Identity, kind: Kind, item: JsonObj, client: ClientFacts | None) -> bool:
        return item.get("name") in self.hide


def dispatcher(pool: FakePool, *guards: Recorder) -> Dispatcher:
    return Dispatcher(pool, publisher=RecordingPublisher(), metrics=Metrics(), policy=UnmeteredPolicy(),
                      guards=Guards(guards))


async def call(d: Dispatcher, method: str, params: JsonObj, client: ClientFacts | None = None) -> JsonObj:
    return await d.handle(jsonrpc.Request("c-1", method, params), identity=ALICE, session_id="s-1", client=client)


async def test_guards_run_outermost_first_around_the_upstream_call() -> None:
    log: list[str] = []
    pool = FakePool()
    d = dispatcher(pool, Recorder("outer", log), Recorder("inner", log))
    reply = await call(d, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    assert "result" in reply
    assert log == ["outer:before", "inner:before", "inner:after", "outer:after"]


async def test_a_refusal_reaches_no_upstream_and_answers_the_guards_error() -> None:
    log: list[str] = []
    pool = FakePool()
    d = dispatcher(pool, Recorder("outer", log), Recorder("inner", log, refuse=frozenset({"echo"})))
    reply = await call(d, "tools/call", {"name": "echo", "arguments": {}})
    assert reply["error"]["data"] == {"error": "refused_by_inner"}
    assert pool.calls == []
    assert log == ["outer:before", "inner:before"]


async def test_a_guard_sees_who_asked_what_of_which_upstream_from_where() -> None:
    seen = Recorder("only", [])
    pool = FakePool()
    d = dispatcher(pool, seen)
    token = REMOTE_ADDR.set("192.0.2.7")
    try:
        await call(d, "tools/call", {"name": "echo", "arguments": {"text": "hi"}},
                   ClientFacts.of("2025-11-25", {"name": "claude-code", "version": "2.1", "extra": 1}))
    finally:
        REMOTE_ADDR.reset(token)
    [asked] = seen.seen
    assert (asked.method, asked.target, asked.name, asked.session_id) == ("tools/call", "tool", "echo", "s-1")
    assert asked.identity.tenant == "acme"
    assert asked.params["arguments"] == {"text": "hi"}
    assert asked.upstream == pool.owner_of_tool("echo")
    assert asked.definition is not None
    assert asked.definition["name"] == "echo"
    assert asked.client == ClientFacts("2025-11-25", "claude-code", "2.1")
    assert asked.remote_addr == "192.0.2.7"


async def test_a_prompt_get_passes_the_guards_naming_its_prompt() -> None:
    seen = Recorder("only", [], refuse=frozenset({"greeting"}))
    pool = FakePool()
    reply = await call(dispatcher(pool, seen), "prompts/get", {"name": "greeting"})
    assert reply["error"]["data"] == {"error": "refused_by_only"}
    assert [(a.target, a.name) for a in seen.seen] == [("prompt", "greeting")]
    assert pool.calls == []


async def test_tools_list_leaves_out_what_a_guard_hides() -> None:
    d = dispatcher(FakePool(), Recorder("only", [], hide=frozenset({"secret_tool"})))
    names = [t["name"] for t in (await call(d, "tools/list", {}))["result"]["tools"]]
    assert "secret_tool" not in names
    assert "echo" in names


def test_client_facts_keep_only_bounded_strings() -> None:
    assert ClientFacts.of("2026-07-28", {"name": 5, "version": "v" * 500}) == ClientFacts("2026-07-28", None, "v" * 100)
    assert ClientFacts.of("2025-11-25", None) == ClientFacts("2025-11-25")
