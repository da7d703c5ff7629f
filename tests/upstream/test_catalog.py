"""The naming rules of the merged catalog, each from a table: exposed tool names, clashes, owners."""

from __future__ import annotations

import pytest

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.catalog import Catalog, Kind, ToolClash, merge_tools, merge_unique


def _tools(*names: str) -> list[JsonObj]:
    return [{"name": n, "inputSchema": {"type": "object"}} for n in names]


@pytest.mark.parametrize(
    ("listings", "prefixes", "previous", "owners", "clashes"),
    [
        pytest.param({"a": _tools("x"), "b": _tools("y")}, {}, {}, {"x": ("a", "x"), "y": ("b", "y")}, [],
                     id="distinct"),
        pytest.param({"a": _tools("x"), "b": _tools("x")}, {"b": "b_"}, {}, {"x": ("a", "x"), "b_x": ("b", "x")}, [],
                     id="prefix-resolves"),
        pytest.param({"a": _tools("x"), "b": _tools("x")}, {}, {}, {"x": ("a", "x")}, [ToolClash("x", "a", "b")],
                     id="clash-first-configured-wins"),
        pytest.param({"a": _tools("x"), "b": _tools("x")}, {}, {"x": "b"}, {"x": ("b", "x")},
                     [ToolClash("x", "b", "a")], id="clash-previous-owner-keeps-it"),
        pytest.param({"a": [{"name": ""}, {"nope": 1}, *_tools("x", "x")]}, {}, {}, {"x": ("a", "x")}, [],
                     id="junk-and-duplicates-skipped"),
    ],
)
def test_tool_union(listings: dict[str, list[JsonObj]], prefixes: dict[str, str], previous: dict[str, str],
                    owners: dict[str, tuple[str, str]], clashes: list[ToolClash]) -> None:
    index = merge_tools(["a", "b"], listings, prefixes, previous)
    assert index.owners == owners
    assert index.clashes == clashes
    assert [t["name"] for t in index.tools] == list(owners)


def test_a_clash_message_names_both_upstreams_the_tool_and_the_fix() -> None:
    message = ToolClash("search", "github", "jira").message()
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
def test_merged_lists(listings: dict[str, list[JsonObj]], merged: list[str | None]) -> None:
    assert [item.get("uri") for item in merge_unique(["a", "b"], listings, "uri")] == merged


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


def test_prompts_belong_to_the_first_upstream_listing_them() -> None:
    catalog = _catalog({"prompts": {"a": [{"name": "greet"}], "b": [{"name": "greet"}, {"name": "other"}]}})
    assert (catalog.prompt_owner("greet"), catalog.prompt_owner("other"), catalog.prompt_owner("x")) == (
        "a", "b", None)


def test_the_tools_version_moves_only_when_the_union_changes() -> None:
    catalog = _catalog({"tools": {"a": _tools("x")}})
    version = catalog.version
    catalog.update("a", "tools", _tools("x"))
    catalog.rebuild()
    assert catalog.version == version, "the same tools listed again"
    catalog.update("b", "tools", _tools("y"))
    catalog.rebuild()
    assert (catalog.version, catalog.tool_owner("y")) == (version + 1, ("b", "y"))
