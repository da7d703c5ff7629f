"""The naming rules of the merged catalog, each from a table: exposed tool names, clashes, owners."""

from __future__ import annotations

import pytest

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.catalog import Catalog, Kind, NameClash, merge_named, merge_unique


def _tools(*names: str) -> list[JsonObj]:
    return [{"name": n, "inputSchema": {"type": "object"}} for n in names]


@pytest.mark.parametrize(
    ("listings", "prefixes", "previous", "owners", "clashes"),
    [
        pytest.param({"a": _tools("x"), "b": _tools("y")}, {}, {}, {"x": ("a", "x"), "y": ("b", "y")}, [],
                     id="distinct"),
        pytest.param({"a": _tools("x"), "b": _tools("x")}, {"b": "b_"}, {}, {"x": ("a", "x"), "b_x": ("b", "x")}, [],
                     id="prefix-resolves"),
        pytest.param({"a": _tools("x"), "b": _tools("x")}, {}, {}, {"x": ("a", "x")}, [NameClash("x", "a", "b")],
                     id="clash-first-configured-wins"),
        pytest.param({"a": _tools("x"), "b": _tools("x")}, {}, {"x": "b"}, {"x": ("b", "x")},
                     [NameClash("x", "b", "a")], id="clash-previous-owner-keeps-it"),
        pytest.param({"a": [{"name": ""}, {"nope": 1}, *_tools("x", "x")]}, {}, {}, {"x": ("a", "x")}, [],
                     id="junk-and-duplicates-skipped"),
    ],
)
def test_tool_union(listings: dict[str, list[JsonObj]], prefixes: dict[str, str], previous: dict[str, str],
                    owners: dict[str, tuple[str, str]], clashes: list[NameClash]) -> None:
    index = merge_named(["a", "b"], listings, prefixes, previous)
    assert index.owners == owners
    assert index.clashes == clashes
    assert [t["name"] for t in index.tools] == sorted(owners)


def test_a_clash_message_names_both_upstreams_the_tool_and_the_fix() -> None:
    message = NameClash("search", "github", "jira").message()
    for part in ("'search'", "'github'", "'jira'", "tool_prefix"):
        assert part in message


@pytest.mark.parametrize(
    ("listings", "merged"),
    [
        pytest.param({"a": [{"uri": "m://1"}], "b": [{"uri": "m://2"}]}, ["m://1", "m://2"], id="in-order"),
        pytest.param({"a": [{"uri": "m://1"}], "b": [{"uri": "m://1", "from": "b"}]}, ["m://1"],
                     id="the-first-upstream-keeps-a-uri"),
        pytest.param({"a": [{"name": "no-uri"}], "b": [{"name": "no-uri"}]}, [None, None],
                     id="unnamed-items-are-all-kept"),
        pytest.param({"b": [{"uri": "m://2"}], "a": [{"uri": "m://1"}]}, ["m://1", "m://2"],
                     id="configuration-order-not-listing-order"),
    ],
)
def test_merged_lists_keep_the_first_owner(listings: dict[str, list[JsonObj]], merged: list[str | None]) -> None:
    assert [item.get("uri") for item in merge_unique(["a", "b"], listings, "uri")] == merged


@pytest.mark.parametrize(
    ("kind", "field", "a", "b", "merged"),
    [
        pytest.param("tools", "name", ["zeta", "alpha"], ["mid"], ["alpha", "mid", "zeta"], id="tools-by-name"),
        pytest.param("prompts", "name", ["b2", "b1"], ["a1"], ["a1", "b1", "b2"], id="prompts-by-name"),
        pytest.param("templates", "name", ["t2"], ["t1"], ["t1", "t2"], id="templates-by-name"),
        pytest.param("resources", "uri", ["m://z", "m://a"], ["m://m"], ["m://a", "m://m", "m://z"],
                     id="resources-by-uri"),
    ],
)
def test_merged_lists_are_sorted_whatever_order_the_upstreams_gave(
        kind: Kind, field: str, a: list[str], b: list[str], merged: list[str]) -> None:
    """One order across requests and restarts (2026-07-28: a deterministic tools list); a reorder is no change."""
    catalog = Catalog(["a", "b"], {})
    catalog.update("a", kind, [{field: v} for v in a])
    catalog.update("b", kind, [{field: v} for v in b])
    catalog.rebuild()
    assert [item[field] for item in catalog.merged(kind)] == merged
    version = catalog.versions()[kind]
    catalog.update("a", kind, [{field: v} for v in reversed(a)])
    catalog.rebuild()
    assert catalog.versions()[kind] == version


def _catalog(lists: dict[Kind, dict[str, list[JsonObj]]]) -> Catalog:
    catalog = Catalog(["a", "b"], {})
    for kind, by_upstream in lists.items():
        for upstream, items in by_upstream.items():
            catalog.update(upstream, kind, items)
    catalog.rebuild()
    return catalog


@pytest.mark.parametrize(
    ("uri", "owner"),
    [
        pytest.param("m://b/readme", "b", id="listed"),
        pytest.param("m://a/notes/7", "a", id="by-template"),
        pytest.param("m://both/readme", "a", id="listed-by-both-first-wins"),
        pytest.param("m://b/x", "b", id="a-listing-beats-an-earlier-template"),
        pytest.param("m://b/{id}", "b", id="a-template-names-itself"),
        pytest.param("m://nobody/1/2", None, id="nobody"),
    ],
)
def test_who_answers_for_a_uri(uri: str, owner: str | None) -> None:
    catalog = _catalog({
        "resources": {"a": [{"uri": "m://both/readme"}],
                      "b": [{"uri": "m://b/readme"}, {"uri": "m://both/readme"}, {"uri": "m://b/x"}]},
        "templates": {"a": [{"uriTemplate": "m://a/notes/{id}"}, {"uriTemplate": "m://{host}/x"}],
                      "b": [{"uriTemplate": "m://b/{id}"}]},
    })
    assert catalog.uri_owner(uri) == owner


@pytest.mark.parametrize(
    ("kind", "key", "prefixes", "exposed", "owners", "clash"),
    [
        pytest.param("prompts", "prompts", {"b": "b_"}, ["b_greet", "b_other", "greet"],
                     {"greet": ("a", "greet"), "b_greet": ("b", "greet")}, None, id="prompt-prefixed-like-tools"),
        pytest.param("prompts", "prompts", {}, ["greet", "other"], {"greet": ("a", "greet")},
                     NameClash("greet", "a", "b", "prompt"), id="prompt-clash-reported-not-hidden"),
        pytest.param("templates", "resourceTemplates", {"b": "b_"}, ["b_greet", "b_other", "greet"], {},
                     None, id="template-name-prefixed"),
        pytest.param("templates", "resourceTemplates", {}, ["greet", "other"], {},
                     NameClash("greet", "a", "b", "resource template"), id="template-clash-reported"),
    ],
)
def test_prompts_and_templates_are_named_like_tools(kind: Kind, key: str, prefixes: dict[str, str],
                                                    exposed: list[str], owners: dict[str, tuple[str, str]],
                                                    clash: NameClash | None) -> None:
    catalog = Catalog(["a", "b"], prefixes)
    catalog.update("a", kind, [{"name": "greet", "uriTemplate": "m://a/{x}"}])
    catalog.update("b", kind, [{"name": "greet", "uriTemplate": "m://b/{x}"},
                               {"name": "other", "uriTemplate": "m://b/o/{x}"}])
    clashes = catalog.rebuild()
    assert [item["name"] for item in catalog.merged(kind)] == exposed
    assert clashes == ([clash] if clash else [])
    for name, owner in owners.items():
        assert catalog.prompt_owner(name) == owner


def test_a_prompt_clash_message_names_the_prompt_and_the_fix() -> None:
    message = NameClash("greet", "one", "two", "prompt").message()
    for part in ("prompt 'greet'", "'one'", "'two'", "tool_prefix"):
        assert part in message


def test_each_list_version_moves_only_when_its_union_changes() -> None:
    catalog = _catalog({"resources": {"a": [{"uri": "m://1"}]}, "prompts": {"a": [{"name": "p"}]}})
    before = catalog.versions()
    catalog.update("a", "resources", [{"uri": "m://1"}])
    catalog.rebuild()
    assert catalog.versions() == before, "the same resources listed again"
    catalog.update("b", "prompts", [{"name": "q"}])
    catalog.rebuild()
    after = catalog.versions()
    assert (after["prompts"], after["resources"], after["tools"]) == (
        before["prompts"] + 1, before["resources"], before["tools"])


def test_the_tools_version_moves_only_when_the_union_changes() -> None:
    catalog = _catalog({"tools": {"a": _tools("x")}})
    version = catalog.version
    catalog.update("a", "tools", _tools("x"))
    catalog.rebuild()
    assert catalog.version == version, "the same tools listed again"
    catalog.update("b", "tools", _tools("y"))
    catalog.rebuild()
    assert (catalog.version, catalog.tool_owner("y")) == (version + 1, ("b", "y"))
