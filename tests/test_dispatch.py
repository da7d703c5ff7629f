"""What the gateway answers to one JSON-RPC request, without HTTP: routing, paging, tool filters, settling."""

from __future__ import annotations

import base64

import pytest

from satgate_mcp import SERVER_NAME, events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import Policy, UnmeteredPolicy
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.errors import GatewayError, UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.paging import TOOLS_PAGE_SIZE, decode_cursor, encode_cursor, page
from satgate_mcp.upstream.base import ProgressCallback
from satgate_mcp.upstream.catalog import LISTINGS, Kind
from tests.fakes import AllowAllPolicy, FakePool

ANYONE = Identity(token_id="alice")
SESSION = "mcp-session"


class ScriptedPool(FakePool):
    """Answers every call with one scripted reply, or raises one scripted error."""

    def __init__(self, reply: JsonObj | None = None, raises: BaseException | None = None) -> None:
        super().__init__()
        self.reply = reply or jsonrpc.result_response(999, {"ok": True})
        self.raises = raises

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        self.calls.append((method, params))
        if self.raises is not None:
            raise self.raises
        return self.reply


def make_dispatcher(pool: FakePool, policy: Policy | None = None
                    ) -> tuple[Dispatcher, RecordingPublisher, Metrics]:
    """No policy: the unmetered one, as a gateway without limits or budgets has."""
    publisher, metrics = RecordingPublisher(), Metrics()
    policy = UnmeteredPolicy() if policy is None else policy
    return Dispatcher(pool, publisher=publisher, metrics=metrics, policy=policy), publisher, metrics


async def handle(dispatcher: Dispatcher, method: str, params: JsonObj | None = None, *,
                 identity: Identity = ANYONE, request_id: str | int = "c-1") -> JsonObj:
    return await dispatcher.handle(jsonrpc.Request(request_id, method, params), identity=identity, session_id=SESSION)


# --- cursors and pages ----------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 1, 500, 10**9])
def test_cursors_round_trip(offset: int) -> None:
    assert decode_cursor(encode_cursor(offset)) == offset


@pytest.mark.parametrize(
    "cursor",
    [
        pytest.param("", id="empty"),
        pytest.param("garbage!", id="garbage"),
        pytest.param(base64.urlsafe_b64encode(b"o:-1").decode(), id="negative"),
        pytest.param(base64.urlsafe_b64encode(b"o:abc").decode(), id="not-a-number"),
        pytest.param(base64.urlsafe_b64encode(b"x:5").decode(), id="foreign-prefix"),
        pytest.param(base64.urlsafe_b64encode(b"\xff\xfe").decode(), id="not-utf8"),
        pytest.param(base64.urlsafe_b64encode(b"o:" + b"9" * 5000).decode(), id="huge-number"),
        pytest.param(12, id="integer"),
        pytest.param({"offset": 1}, id="object"),
    ],
)
def test_foreign_cursors_are_invalid_params(cursor: object) -> None:
    with pytest.raises(GatewayError) as err:
        decode_cursor(cursor)
    assert err.value.code == jsonrpc.INVALID_PARAMS
    assert err.value.data == {"error": "invalid_cursor"}


def test_no_cursor_is_the_first_page() -> None:
    assert decode_cursor(None) == 0


def test_pages_cover_every_item_once_and_the_last_has_no_cursor() -> None:
    items: list[JsonObj] = [{"name": str(i)} for i in range(7)]
    first, cursor = page(items, None, size=3)
    second, cursor2 = page(items, cursor, size=3)
    third, cursor3 = page(items, cursor2, size=3)
    assert [len(first), len(second), len(third)] == [3, 3, 1]
    assert first + second + third == items
    assert cursor3 is None


def test_an_exactly_full_last_page_has_no_cursor() -> None:
    items: list[JsonObj] = [{"name": str(i)} for i in range(6)]
    _, cursor = page(items, encode_cursor(3), size=3)
    assert cursor is None


# --- routing ------------------------------------------------------------------------------------------


async def test_ping() -> None:
    dispatcher, _, _ = make_dispatcher(FakePool())
    assert await handle(dispatcher, "ping", request_id=5) == {"jsonrpc": "2.0", "id": 5, "result": {}}


def test_initialize_result_reflects_the_pool() -> None:
    pool = FakePool()
    dispatcher, _, _ = make_dispatcher(pool)
    result = dispatcher.initialize_result("2025-03-26")
    assert result["protocolVersion"] == "2025-03-26"
    assert result["capabilities"] == pool.capabilities()
    assert result["serverInfo"]["name"] == SERVER_NAME


@pytest.mark.parametrize(
    ("method", "code", "error"),
    [
        pytest.param("server/discover", jsonrpc.METHOD_NOT_FOUND, "method_not_found", id="unknown-method"),
        pytest.param("initialize", jsonrpc.INVALID_REQUEST, "already_initialized", id="second-initialize"),
        pytest.param("satgate/budget", jsonrpc.METHOD_NOT_FOUND, "method_not_found", id="budget-without-policy"),
        pytest.param("satgate/delegate", jsonrpc.METHOD_NOT_FOUND, "method_not_found", id="delegate-without-policy"),
    ],
)
async def test_methods_the_gateway_refuses(method: str, code: int, error: str) -> None:
    dispatcher, _, _ = make_dispatcher(FakePool())
    reply = await handle(dispatcher, method, request_id=9)
    assert reply["id"] == 9
    assert reply["error"]["code"] == code
    assert reply["error"]["data"]["error"] == error


async def test_an_unknown_method_name_is_echoed_bounded() -> None:
    dispatcher, _, _ = make_dispatcher(FakePool())
    reply = await handle(dispatcher, "x" * 10_000)
    assert len(reply["error"]["data"]["method"]) == 100


@pytest.mark.parametrize(
    ("method", "forwarded"),
    [
        pytest.param("resources/read", {"uri": "file:///x"}, id="read"),
        pytest.param("resources/subscribe", {"uri": "file:///x"}, id="subscribe"),
        pytest.param("prompts/get", {"uri": "file:///x"}, id="prompt"),
        pytest.param("completion/complete", {"uri": "file:///x"}, id="complete"),
        # A merged list is asked for by its kind: the pool has nothing to read in the client's params.
        pytest.param("resources/list", None, id="resources-list"),
        pytest.param("resources/templates/list", None, id="templates-list"),
        pytest.param("prompts/list", None, id="prompts-list"),
    ],
)
async def test_resources_and_prompts_are_forwarded_and_answered_with_the_clients_id(
    method: str, forwarded: JsonObj | None
) -> None:
    pool = ScriptedPool()
    dispatcher, _, _ = make_dispatcher(pool)
    reply = await handle(dispatcher, method, {"uri": "file:///x"}, request_id="mine")
    assert reply == {"jsonrpc": "2.0", "id": "mine", "result": {"ok": True}}
    assert pool.calls == [(method, forwarded)]


class ListingPool(FakePool):
    """Lists ``count`` items of every kind."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    async def listing(self, kind: Kind) -> JsonObj:
        self.calls.append((LISTINGS[kind].method, None))
        return {LISTINGS[kind].key: [{"name": f"n{i}", "uri": f"m://{i}", "uriTemplate": f"m://{i}/{{x}}"}
                                     for i in range(self.count)]}


@pytest.mark.parametrize("kind", ["resources", "templates", "prompts"])
async def test_a_merged_list_pages_with_the_gateways_cursors(kind: Kind) -> None:
    pool = ListingPool(5)
    dispatcher = Dispatcher(pool, publisher=RecordingPublisher(), metrics=Metrics(), policy=UnmeteredPolicy(),
                            list_page_size=2)
    listing = LISTINGS[kind]
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        reply = await handle(dispatcher, listing.method, {"cursor": cursor} if cursor else None)
        pages.append([item["name"] for item in reply["result"][listing.key]])
        cursor = reply["result"].get("nextCursor")
        if cursor is None:
            break
    assert pages == [["n0", "n1"], ["n2", "n3"], ["n4"]]


@pytest.mark.parametrize("method", ["resources/list", "resources/templates/list", "prompts/list"])
async def test_a_merged_list_refuses_a_cursor_it_never_gave_before_asking_upstream(method: str) -> None:
    pool = ListingPool(5)
    dispatcher, _, _ = make_dispatcher(pool)
    reply = await handle(dispatcher, method, {"cursor": "garbage!"}, request_id=4)
    assert (reply["id"], reply["error"]["code"], reply["error"]["data"]) == (
        4, jsonrpc.INVALID_PARAMS, {"error": "invalid_cursor"})
    assert pool.calls == []


@pytest.mark.parametrize(
    ("found", "merged"),
    [
        pytest.param([], None, id="none-gave-any"),
        pytest.param([("db", "Use SQL.")], "## db\nUse SQL.", id="one"),
        pytest.param([("db", "Use SQL."), ("web", "Fetch pages.")], "## db\nUse SQL.\n\n## web\nFetch pages.",
                     id="each-under-its-name"),
    ],
)
def test_upstream_instructions_are_merged_under_their_names(found: list[tuple[str, str]], merged: str | None
                                                           ) -> None:
    pool = FakePool()
    pool.upstream_instructions = found
    dispatcher, _, _ = make_dispatcher(pool)
    assert dispatcher.initialize_result("2025-11-25").get("instructions") == merged


@pytest.mark.parametrize(
    ("method", "result"),
    [pytest.param("ping", {}, id="ping"), pytest.param("logging/setLevel", {}, id="log-level")],
)
async def test_what_the_gateway_answers_itself_never_reaches_the_pool(method: str, result: JsonObj) -> None:
    pool = ScriptedPool()
    dispatcher, _, _ = make_dispatcher(pool)
    assert (await handle(dispatcher, method, {"level": "debug"}, request_id=2))["result"] == result
    assert pool.calls == []


async def test_tools_list_shows_only_the_tools_the_token_allows() -> None:
    dispatcher, _, _ = make_dispatcher(FakePool(["echo", "db_read", "db_write"]))
    narrowed = Identity(token_id="t", tool_filters=(("db_*",), ("db_read", "echo")))
    reply = await handle(dispatcher, "tools/list", identity=narrowed)
    assert [t["name"] for t in reply["result"]["tools"]] == ["db_read"]
    assert "nextCursor" not in reply["result"]


async def test_tools_list_pages_at_the_page_size() -> None:
    names = [f"t{i}" for i in range(TOOLS_PAGE_SIZE + 1)]
    dispatcher, _, _ = make_dispatcher(FakePool(names))
    first = (await handle(dispatcher, "tools/list"))["result"]
    assert len(first["tools"]) == TOOLS_PAGE_SIZE
    second = (await handle(dispatcher, "tools/list", {"cursor": first["nextCursor"]}))["result"]
    assert [t["name"] for t in second["tools"]] == [names[-1]]
    assert "nextCursor" not in second


# --- tools/call -----------------------------------------------------------------------------------------


async def test_a_tool_call_is_answered_with_the_clients_id_and_settled_as_run() -> None:
    pool, policy = FakePool(), AllowAllPolicy()
    dispatcher, publisher, _ = make_dispatcher(pool, policy)
    reply = await handle(dispatcher, "tools/call", {"name": "echo", "arguments": {"text": "hi"}}, request_id=41)
    assert reply["id"] == 41
    assert reply["result"]["content"] == [{"type": "text", "text": "hi"}]
    assert policy.settled == [True]
    [event] = publisher.named(events.TOOL_CALL)
    assert (event["tool"], event["upstream"], event["outcome"], event["token_id"]) == ("echo", "fake", "ok", "alice")


@pytest.mark.parametrize(
    ("params", "code", "error"),
    [
        pytest.param({}, jsonrpc.INVALID_PARAMS, "invalid_params", id="no-name"),
        pytest.param({"name": 5}, jsonrpc.INVALID_PARAMS, "invalid_params", id="name-not-a-string"),
        pytest.param({"name": "nope"}, jsonrpc.INVALID_PARAMS, "unknown_tool", id="unknown-tool"),
    ],
)
async def test_bad_tool_calls_never_reach_the_pool(params: JsonObj, code: int, error: str) -> None:
    pool, policy = FakePool(), AllowAllPolicy()
    dispatcher, _, _ = make_dispatcher(pool, policy)
    reply = await handle(dispatcher, "tools/call", params)
    assert (reply["error"]["code"], reply["error"]["data"]["error"]) == (code, error)
    assert pool.calls == []
    assert policy.settled == []


async def test_a_tool_outside_the_tokens_filter_is_refused_and_counted() -> None:
    pool = FakePool()
    dispatcher, publisher, metrics = make_dispatcher(pool, AllowAllPolicy())
    narrowed = Identity(token_id="t", tool_filters=(("echo",),))
    reply = await handle(dispatcher, "tools/call", {"name": "secret_tool"}, identity=narrowed)
    (event,) = publisher.named(events.NOT_ALLOWED)
    assert (event["token_id"], event["kind"], event["name"]) == ("t", "tool", "secret_tool")
    assert reply["error"]["code"] == jsonrpc.TOOL_NOT_ALLOWED
    assert reply["error"]["data"] == {"error": "tool_not_allowed", "tool": "secret_tool"}
    assert pool.calls == []
    assert b'satgate_refusals_total{reason="tool_not_allowed"} 1.0' in metrics.render()


@pytest.mark.parametrize(
    ("pool", "outcome", "ran", "code"),
    [
        pytest.param(ScriptedPool(raises=UpstreamUnavailable("down", sent=False)), "unavailable", False,
                     jsonrpc.UPSTREAM_UNAVAILABLE, id="unavailable-before-sending-not-charged"),
        pytest.param(ScriptedPool(raises=UpstreamUnavailable("reset")), "unavailable", True,
                     jsonrpc.UPSTREAM_UNAVAILABLE, id="lost-after-sending-charged"),
        pytest.param(ScriptedPool(raises=UpstreamTimeout("slow")), "timeout", True, jsonrpc.UPSTREAM_TIMEOUT,
                     id="timeout-charged"),
        pytest.param(ScriptedPool(jsonrpc.error_response(0, jsonrpc.INVALID_PARAMS, "bad args")), "error", False,
                     jsonrpc.INVALID_PARAMS, id="upstream-invalid-params-not-charged"),
        pytest.param(ScriptedPool(jsonrpc.result_response(0, {"content": [], "isError": True})), "tool_error", True,
                     None, id="tool-error-charged"),
    ],
)
async def test_failed_calls_are_reported_and_settled_by_whether_they_ran(
    pool: ScriptedPool, outcome: str, ran: bool, code: int | None
) -> None:
    policy = AllowAllPolicy()
    dispatcher, publisher, _ = make_dispatcher(pool, policy)
    reply = await handle(dispatcher, "tools/call", {"name": "echo"}, request_id=7)
    assert reply["id"] == 7
    if code is None:
        assert "error" not in reply
    else:
        assert reply["error"]["code"] == code
    assert policy.settled == [ran]
    assert [e["outcome"] for e in publisher.named(events.TOOL_CALL)] == [outcome]


async def test_an_upstream_error_reply_passes_through_unchanged_but_for_the_id() -> None:
    upstream_error = jsonrpc.error_object(-32050, "upstream says no", {"detail": [1, 2]})
    pool = ScriptedPool({"jsonrpc": "2.0", "id": 12345, "error": upstream_error})
    dispatcher, _, _ = make_dispatcher(pool)
    reply = await handle(dispatcher, "tools/call", {"name": "echo"}, request_id="client-id")
    assert reply == {"jsonrpc": "2.0", "id": "client-id", "error": upstream_error}


async def test_satgate_budget_goes_through_the_policy() -> None:
    policy = AllowAllPolicy()
    dispatcher, _, _ = make_dispatcher(FakePool(), policy)
    reply = await handle(dispatcher, "satgate/budget", request_id=3)
    assert reply["result"] == {"tokenId": "alice", "budgetId": "alice", "remaining": -1}
    assert policy.settled == [True]
