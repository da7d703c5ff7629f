"""Which era each upstream is spoken to in: ``server/discover`` first, ``initialize`` when that fails (issue 12)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.upstream import wire
from satgate_mcp.upstream.base import Resume
from satgate_mcp.upstream.http import HttpUpstream
from satgate_mcp.upstream.pool import UpstreamPool
from satgate_mcp.upstream.stdio import StdioUpstream
from tests.conftest import HttpUpstreamProcess, upstream_command

MODERN = "2026-07-28"


# --- pure decisions ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("reply", "modern"), [
    pytest.param({"result": {"supportedVersions": [MODERN], "capabilities": {"tools": {}}}}, True, id="modern"),
    pytest.param({"result": {"supportedVersions": ["2025-06-18", MODERN]}}, True, id="among-others"),
    pytest.param({"result": {"supportedVersions": ["2027-01-01"]}}, False, id="other-version-only"),
    pytest.param({"result": {"capabilities": {}}}, False, id="no-versions"),
    pytest.param({"error": {"code": -32601, "message": "Method not found"}}, False, id="method-not-found"),
    pytest.param({"error": {"code": -32600, "message": "not initialized"}}, False, id="legacy-refusal"),
    pytest.param(None, False, id="no-reply"),
])
def test_discover_decides_the_era(reply: JsonObj | None, modern: bool) -> None:
    assert (wire.discovered_result(reply) is not None) is modern


def test_a_discover_result_is_shaped_like_an_initialize_result() -> None:
    found = wire.discovered_result({"result": {
        "supportedVersions": [MODERN], "capabilities": {"tools": {}, "prompts": {}}, "instructions": "hi",
        "_meta": {wire.META_SERVER_INFO: {"name": "m", "version": "1"}}}})
    assert found == {"protocolVersion": MODERN, "capabilities": {"tools": {}, "prompts": {}},
                     "serverInfo": {"name": "m", "version": "1"}, "instructions": "hi"}
    assert wire.check_initialize_result({"result": found}) is found


def test_check_initialize_result_accepts_2026_and_still_refuses_unknown_revisions() -> None:
    ok = {"protocolVersion": MODERN, "capabilities": {}}
    assert wire.check_initialize_result({"result": ok}) == ok
    with pytest.raises(ValueError, match="does not know"):
        wire.check_initialize_result({"result": {"protocolVersion": "1999-01-01", "capabilities": {}}})


def test_modern_meta_keeps_the_callers_fields() -> None:
    params = wire.with_modern_meta({"name": "t", "_meta": {"progressToken": "p"}})
    assert params["name"] == "t"
    assert params["_meta"]["progressToken"] == "p"
    assert params["_meta"][wire.META_VERSION] == MODERN
    assert params["_meta"][wire.META_CAPABILITIES] == {"elicitation": {}, "sampling": {}, "roots": {}}
    assert wire.with_modern_meta(None)["_meta"][wire.META_VERSION] == MODERN
    assert wire.META_LOG_LEVEL not in params["_meta"]  # no level: the upstream sends no log messages
    assert wire.with_modern_meta({"name": "t"}, "warning")["_meta"][wire.META_LOG_LEVEL] == "warning"


@pytest.mark.parametrize(("message", "name"), [
    pytest.param({"method": "tools/call", "params": {"name": "echo"}}, "echo", id="tool"),
    pytest.param({"method": "resources/read", "params": {"uri": "memo://x"}}, "memo://x", id="resource"),
    pytest.param({"method": "prompts/get", "params": {"name": "greet"}}, "greet", id="prompt"),
    pytest.param({"method": "tools/list", "params": {"name": "ignored"}}, None, id="unnamed-method"),
])
def test_modern_headers(message: JsonObj, name: str | None) -> None:
    headers = wire.modern_headers(message)
    assert headers["MCP-Protocol-Version"] == MODERN
    assert headers["Mcp-Method"] == message["method"]
    assert headers.get("Mcp-Name") == name


def test_retry_params_replace_the_previous_rounds_answers() -> None:
    params = {"name": "t", "inputResponses": {"old": {}}, "requestState": "old"}
    assert wire.retry_params(params, {"a": {"x": 1}}, "s2") == {"name": "t", "inputResponses": {"a": {"x": 1}},
                                                                "requestState": "s2"}
    assert wire.retry_params(params, {}, None) == {"name": "t"}


# --- real upstreams -------------------------------------------------------------------------------------------

async def _noop(method: str, params: JsonObj | None) -> None:
    return None


def _stdio(*args: str) -> StdioUpstream:
    spec = StdioUpstreamSpec(transport="stdio", command=upstream_command(*args), timeout=10.0)
    return StdioUpstream("m", spec, publisher=RecordingPublisher(), metrics=Metrics())


@pytest.mark.parametrize(("args", "modern"), [
    pytest.param(("--modern-only",), True, id="2026-only"),
    pytest.param((), False, id="2025-only"),
])
@pytest.mark.process
async def test_stdio_era(args: tuple[str, ...], modern: bool) -> None:
    upstream = _stdio("--name", "alpha", *args)
    await upstream.start(_noop)
    try:
        assert await upstream.wait_ready(20)
        assert upstream.modern is modern
        result = upstream.initialize_result or {}
        assert result["protocolVersion"] == (MODERN if modern else "2025-11-25")
        assert result["serverInfo"]["name"] == "alpha"
        assert "tools" in result["capabilities"]
        reply = await upstream.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert reply["result"]["content"][0]["text"] == "hi"
        listed = await upstream.request("tools/list", None)
        assert ("mrtr_ask" in [t["name"] for t in listed["result"]["tools"]]) is modern
    finally:
        await upstream.close()


class FakeCarrier:
    """A 2026 client's relay: takes a modern upstream's input_required as it is; ``resume`` continues one."""

    session_key = "s"

    def __init__(self, resume: Resume | None = None, capabilities: JsonObj | None = None) -> None:
        self.resume = resume
        self.carried: list[tuple[str, JsonObj]] = []
        self.capabilities = capabilities if capabilities is not None else {"elicitation": {}}

    async def __call__(self, params: JsonObj) -> None:
        return None

    def admit(self) -> None:
        return None

    async def notify(self, method: str, params: JsonObj | None) -> None:
        return None

    async def ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        raise AssertionError("a modern upstream's input is carried, never asked")

    def lacks(self, method: str, params: JsonObj | None) -> JsonObj | None:
        return None

    def log_level(self) -> str | None:
        return None

    def carry(self, upstream: str, result: JsonObj) -> None:
        self.carried.append((upstream, result))

    def client_meta(self) -> JsonObj:
        return {wire.META_CAPABILITIES: self.capabilities}


@pytest.mark.process
async def test_a_2026_clients_relay_carries_input_required_and_resumes_it() -> None:
    upstream = _stdio("--modern-only")
    await upstream.start(_noop)
    call = {"name": "mrtr_ask", "arguments": {"question": "q"}}
    try:
        assert await upstream.wait_ready(20)
        carrier = FakeCarrier()
        reply = await upstream.request("tools/call", call, on_progress=carrier)
        answer = {"action": "accept", "content": {"answer": "a"}}
        done = await upstream.request("tools/call", call, on_progress=FakeCarrier(
            Resume("m", "upstream-state:q", {"ask": answer})))
        elsewhere = await upstream.request("tools/call", call, on_progress=FakeCarrier(
            Resume("other", "upstream-state:q", {"ask": answer})))
    finally:
        await upstream.close()
    result = reply["result"]
    assert result["resultType"] == "input_required"
    assert result["requestState"] == "upstream-state:q"
    assert result["inputRequests"]["ask"]["method"] == "elicitation/create"
    assert carrier.carried == [("m", result)]
    assert json.loads(done["result"]["content"][0]["text"]) == answer
    assert elsewhere["error"]["data"]["error"] == "request_state_refused"


@pytest.mark.parametrize(("args", "modern"), [
    pytest.param(("--modern-only",), True, id="2026-only"),
    pytest.param((), False, id="2025-only"),
])
@pytest.mark.process
async def test_http_era(http_upstream_factory: Callable[..., HttpUpstreamProcess], args: tuple[str, ...],
                        modern: bool) -> None:
    server = http_upstream_factory("--name", "web", *args)
    spec = HttpUpstreamSpec(transport="http", url=server.url, timeout=10.0)
    upstream = HttpUpstream("web", spec, publisher=RecordingPublisher(), metrics=Metrics())
    await upstream.start(_noop)
    try:
        assert await upstream.wait_ready(20)
        assert upstream.modern is modern
        assert (upstream.session_id is None) is modern
        reply = await upstream.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert reply["result"]["content"][0]["text"] == "hi"
        headers = json.loads((await upstream.request("tools/call", {"name": "headers", "arguments": {}}))
                             ["result"]["content"][0]["text"])
        lowered = {k.lower(): v for k, v in headers.items()}
        if modern:
            assert lowered["mcp-method"] == "tools/call"
            assert lowered["mcp-name"] == "headers"
            assert lowered["mcp-protocol-version"] == MODERN
            assert "mcp-session-id" not in lowered
        else:
            assert "mcp-method" not in lowered
    finally:
        await upstream.close()


# --- input_required from a modern upstream, for a 2025 client: real requests, then the retry ----------------

class FakeRelay:
    """A 2025 client's relay: answers each relayed request from a script and remembers what it was asked."""

    session_key = "s"

    def __init__(self, answer: JsonObj, declared: frozenset[str] = frozenset({"elicitation/create"})) -> None:
        self.answer = answer
        self.declared = declared
        self.asked: list[tuple[str, JsonObj | None]] = []

    async def __call__(self, params: JsonObj) -> None:
        return None

    def admit(self) -> None:
        return None

    async def notify(self, method: str, params: JsonObj | None) -> None:
        return None

    async def ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        self.asked.append((method, params))
        return self.answer

    def lacks(self, method: str, params: JsonObj | None) -> JsonObj | None:
        return None if method in self.declared else {method.split("/")[0]: {}}

    def log_level(self) -> str | None:
        return None


@pytest.fixture
async def modern_stdio() -> StdioUpstream:
    upstream = _stdio("--modern-only")
    await upstream.start(_noop)
    assert await upstream.wait_ready(20)
    return upstream


@pytest.mark.process
async def test_a_2025_client_is_asked_and_the_call_retried_with_its_answer(modern_stdio: StdioUpstream) -> None:
    relay = FakeRelay({"jsonrpc": "2.0", "id": "x", "result": {"action": "accept", "content": {"answer": "42"}}})
    try:
        reply = await modern_stdio.request("tools/call", {"name": "mrtr_ask", "arguments": {"question": "why?"}},
                                           on_progress=relay)
    finally:
        await modern_stdio.close()
    assert json.loads(reply["result"]["content"][0]["text"]) == {"action": "accept", "content": {"answer": "42"}}
    [(method, params)] = relay.asked
    assert method == "elicitation/create"
    assert params is not None
    assert params["message"] == "why?"


@pytest.mark.process
async def test_a_refused_ask_is_the_calls_error(modern_stdio: StdioUpstream) -> None:
    relay = FakeRelay({"jsonrpc": "2.0", "id": "x", "error": {"code": -32600, "message": "no elicitation here"}})
    try:
        reply = await modern_stdio.request("tools/call", {"name": "mrtr_ask", "arguments": {"question": "q"}},
                                           on_progress=relay)
        unasked = await modern_stdio.request("tools/call", {"name": "mrtr_ask", "arguments": {"question": "q"}})
    finally:
        await modern_stdio.close()
    assert reply["error"]["message"] == "no elicitation here"
    assert unasked["error"]["data"]["error"] == "input_not_relayed"


@pytest.mark.process
async def test_input_the_2025_client_did_not_declare_is_minus_32021_and_nothing_is_asked(
        modern_stdio: StdioUpstream) -> None:
    relay = FakeRelay({"jsonrpc": "2.0", "id": "x", "result": {"action": "accept"}}, declared=frozenset())
    try:
        reply = await modern_stdio.request("tools/call", {"name": "mrtr_ask", "arguments": {"question": "q"}},
                                           on_progress=relay)
    finally:
        await modern_stdio.close()
    assert reply["error"]["code"] == -32021
    assert reply["error"]["data"]["requiredCapabilities"] == {"elicitation": {}}
    assert relay.asked == []


@pytest.mark.process
async def test_a_modern_upstreams_list_change_reaches_the_pools_listener() -> None:
    """The SDK's modern stdio loop sends list changes as plain notifications (it has no subscriptions/listen yet):
    they reach the same listener as a 2025 upstream's."""
    seen: list[str] = []
    changed = asyncio.Event()

    async def on_notification(method: str, params: JsonObj | None) -> None:
        seen.append(method)
        if method == "notifications/tools/list_changed":
            changed.set()

    upstream = _stdio("--modern-only")
    await upstream.start(on_notification)
    try:
        assert await upstream.wait_ready(20)
        changed.clear()
        seen.clear()
        await upstream.request("tools/call", {"name": "add_tool", "arguments": {"name": "fresh"}})
        async with asyncio.timeout(10):
            await changed.wait()
        listed = await upstream.request("tools/list", None)
    finally:
        await upstream.close()
    assert "fresh" in [t["name"] for t in listed["result"]["tools"]]
    assert "notifications/tools/list_changed" in seen


@pytest.mark.process
async def test_a_pool_of_both_eras_merges_lists_and_sets_log_levels_only_where_the_method_exists() -> None:
    specs: dict[str, StdioUpstreamSpec | HttpUpstreamSpec] = {
        "old": StdioUpstreamSpec(transport="stdio", command=upstream_command("--name", "old"), timeout=10.0),
        "new": StdioUpstreamSpec(transport="stdio", command=upstream_command("--name", "new", "--prefix", "n_",
                                                                             "--modern-only"), timeout=10.0)}
    pool = UpstreamPool(specs, publisher=RecordingPublisher(), metrics=Metrics(), start_timeout=20.0)
    await pool.start()
    try:
        names = {t["name"] for t in pool.tools()}
        assert {"echo", "n_echo", "n_mrtr_ask"} <= names
        assert "mrtr_ask" not in names
        prompts = (await pool.listing("prompts"))["prompts"]
        assert {"greet", "n_greet"} <= {p["name"] for p in prompts}
        reply = await pool.call_tool({"name": "n_echo", "arguments": {"text": "modern"}})
        assert reply["result"]["content"][0]["text"] == "modern"
        with structlog.testing.capture_logs() as logs:
            await pool.set_log_level("info")
        assert [e for e in logs if e["event"] == "upstream_set_log_level_failed"] == []
    finally:
        await pool.close()


#: A 2025 server that exits on any request before ``initialize`` (some do): then answers initialize and lists.
STRICT_2025 = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "strict", "version": "1"}}}), flush=True)
    elif "id" not in msg:
        continue
    elif msg.get("method") == "tools/list":
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": []}}), flush=True)
    else:
        sys.exit(1)
"""


@pytest.mark.parametrize(("protocol", "restarts"), [
    pytest.param("auto", 0, id="auto-never-sends-it-discover"),
    pytest.param("2026", 1, id="2026-asks-once-then-initialize-only"),
])
@pytest.mark.process
async def test_a_strict_2025_child_that_dies_on_discover_comes_up(protocol: str, restarts: int) -> None:
    spec = StdioUpstreamSpec(transport="stdio", command=[sys.executable, "-c", STRICT_2025], timeout=10.0,
                             protocol=protocol)  # type: ignore[arg-type]
    upstream = StdioUpstream("strict", spec, publisher=RecordingPublisher(), metrics=Metrics(),
                             restart_policy=wire.RestartPolicy(base=0.01))
    await upstream.start(_noop)
    try:
        assert await upstream.wait_ready(20)
        assert upstream.modern is False
        assert upstream.restarts == restarts
        assert (upstream.initialize_result or {})["serverInfo"]["name"] == "strict"
        assert (await upstream.request("tools/list", None))["result"] == {"tools": []}
    finally:
        await upstream.close()


@pytest.mark.parametrize(("protocol", "modern"), [
    pytest.param("auto", False, id="auto-keeps-the-handshake-a-dual-server-accepts"),
    pytest.param("2026", True, id="2026-discovers-first"),
    pytest.param("2025", False, id="pinned-to-the-handshake"),
])
@pytest.mark.process
async def test_a_dual_revision_server_is_spoken_to_as_configured(protocol: str, modern: bool) -> None:
    """``--conformance`` serves both revisions (the SDK's own loop): ``protocol`` decides which the gateway uses."""
    spec = StdioUpstreamSpec.model_validate({"transport": "stdio", "command": upstream_command("--conformance"),
                                             "timeout": 10.0, "protocol": protocol})
    upstream = StdioUpstream("dual", spec, publisher=RecordingPublisher(), metrics=Metrics())
    await upstream.start(_noop)
    try:
        assert await upstream.wait_ready(20)
        assert upstream.modern is modern
        reply = await upstream.request("tools/call", {"name": "echo", "arguments": {"text": "both"}})
        assert reply["result"]["content"][0]["text"] == "both"
    finally:
        await upstream.close()


def test_a_retrys_own_fields_are_dropped_for_an_upstream_that_has_no_use_for_them() -> None:
    params = {"name": "t", "arguments": {}, "inputResponses": {"k": {}}, "requestState": "s"}
    assert wire.without_input_fields(params) == {"name": "t", "arguments": {}}
    plain = {"name": "t"}
    assert wire.without_input_fields(plain) is plain
    assert wire.without_input_fields(None) is None
    retried = wire.retry_params(plain, {"k": {"action": "accept"}}, "s2")
    assert retried == {"name": "t", "inputResponses": {"k": {"action": "accept"}}, "requestState": "s2"}
    assert plain == {"name": "t"}  # the caller's params are not changed


def test_a_modern_upstreams_listen_filter_names_the_subscribed_uris() -> None:
    plain = wire.listen_params()["notifications"]
    assert plain == {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True}
    assert wire.listen_params(["memo://b", "memo://a", "memo://b"])["notifications"]["resourceSubscriptions"] == [
        "memo://a", "memo://b"]
    assert wire.listen_params()["_meta"][wire.META_VERSION] == MODERN


@pytest.mark.process
async def test_resource_subscriptions_of_a_modern_upstream_become_its_listen_filter(
        modern_stdio: StdioUpstream) -> None:
    try:
        subscribed = await modern_stdio.request("resources/subscribe", {"uri": "memo://m/readme"})
        again = await modern_stdio.request("resources/subscribe", {"uri": "memo://m/readme"})
        held = modern_stdio.resource_subscriptions
        unsubscribed = await modern_stdio.request("resources/unsubscribe", {"uri": "memo://m/readme"})
        without_uri = await modern_stdio.request("resources/subscribe", {})
    finally:
        await modern_stdio.close()
    assert subscribed["result"] == {}
    assert again["result"] == {}
    assert held == ["memo://m/readme"]
    assert unsubscribed["result"] == {}
    assert modern_stdio.resource_subscriptions == []
    assert without_uri["error"]["code"] == -32602


@pytest.mark.process
async def test_a_modern_childs_resource_updates_arrive_for_subscribed_uris_also_after_it_restarts() -> None:
    updates: asyncio.Queue[str] = asyncio.Queue()

    async def on_notification(method: str, params: JsonObj | None) -> None:
        if method == "notifications/resources/updated":
            await updates.put(str((params or {}).get("uri")))

    upstream = _stdio("--modern-only")
    await upstream.start(on_notification)
    try:
        assert await upstream.wait_ready(20)
        await upstream.request("resources/subscribe", {"uri": "memo://m/readme"})
        for uri in ("memo://m/elsewhere", "memo://m/readme"):
            await upstream.request("tools/call", {"name": "stream_touch", "arguments": {"uri": uri}})
        assert await asyncio.wait_for(updates.get(), 10) == "memo://m/readme"  # the unsubscribed one never came
        with contextlib.suppress(UpstreamUnavailable):
            await upstream.request("tools/call", {"name": "crash", "arguments": {}})
        assert await upstream.wait_ready(20)
        assert upstream.restarts == 1
        async with asyncio.timeout(20):  # the restarted child was asked for the same URIs
            while updates.empty():
                await upstream.request("tools/call", {"name": "stream_touch", "arguments": {"uri": "memo://m/readme"}})
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await updates.put(await updates.get())
        assert updates.get_nowait() == "memo://m/readme"
    finally:
        await upstream.close()


#: Runs the test upstream, except that the ``die_at``-th process started from it dies on its first request, as a
#: child killed (OOM, a chaos run) while it was asked ``server/discover``.
DIES_ONCE = """
import os, sys
count_file, die_at, *command = sys.argv[1:]
with open(count_file, "a+") as f:
    f.write("x")
    f.seek(0)
    launch = len(f.read())
if launch == int(die_at):
    sys.stdin.readline()
    os._exit(9)
os.execv(command[0], command)
"""


def _dies_once(tmp_path: Path, die_at: int, *args: str, protocol: str) -> StdioUpstream:
    command = [sys.executable, "-c", DIES_ONCE, str(tmp_path / "launches"), str(die_at), *upstream_command(*args)]
    spec = StdioUpstreamSpec.model_validate({"transport": "stdio", "command": command, "timeout": 10.0,
                                             "protocol": protocol})
    return StdioUpstream("m", spec, publisher=RecordingPublisher(), metrics=Metrics(),
                         restart_policy=wire.RestartPolicy(base=0.01))


@pytest.mark.process
async def test_a_2026_child_killed_during_discover_comes_back_as_2026(tmp_path: Path) -> None:
    """Its successor refuses the handshake the dead one's discover made the gateway fall back to: asked again."""
    upstream = _dies_once(tmp_path, 1, "--modern-only", protocol="2026")
    await upstream.start(_noop)
    try:
        assert await upstream.wait_ready(20)
        assert upstream.modern is True
        assert upstream.restarts == 1
        reply = await upstream.request("tools/call", {"name": "echo", "arguments": {"text": "back"}})
    finally:
        await upstream.close()
    assert reply["result"]["content"][0]["text"] == "back"


@pytest.mark.process
async def test_a_dual_upstreams_2026_side_killed_while_looked_for_is_looked_for_again(tmp_path: Path) -> None:
    """The first 2026 client meets the dead probe and is bridged; the next one gets the upstream's own 2026 side."""
    upstream = _dies_once(tmp_path, 2, "--era", "both", protocol="auto")  # launch 1: the 2025 side, 2: its twin
    await upstream.start(_noop)
    call = {"name": "mrtr_ask", "arguments": {"question": "q"}}
    try:
        assert await upstream.wait_ready(20)
        with contextlib.suppress(UpstreamUnavailable):
            await upstream.request("tools/call", call, on_progress=FakeCarrier())
        reply = await upstream.request("tools/call", call, on_progress=FakeCarrier())
    finally:
        await upstream.close()
    assert reply["result"]["resultType"] == "input_required"  # asked in the client's own era, not bridged


@pytest.mark.process
async def test_a_uri_subscribed_while_the_2026_side_is_looked_for_joins_its_listen_filter() -> None:
    """The 2026-07-28 side is seeded with the URIs held when it is made; one subscribed meanwhile is not lost."""
    upstream = _stdio("--era", "both")
    await upstream.start(_noop)
    try:
        assert await upstream.wait_ready(20)
        probe = asyncio.ensure_future(upstream.listening(20))  # the first 2026 client: the twin child is started
        await upstream.request("resources/subscribe", {"uri": "memo://m/readme"})  # a 2025 session, meanwhile
        await probe
        await upstream.request("tools/call", {"name": "echo", "arguments": {"text": "x"}}, on_progress=FakeCarrier())
        twin = upstream._twin.current if upstream._twin is not None else None
    finally:
        await upstream.close()
    assert isinstance(twin, StdioUpstream)
    assert twin.resource_subscriptions == ["memo://m/readme"]
