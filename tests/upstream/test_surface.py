"""What the gateway offers for its upstreams as one (surface.py): 2025-11-25's ``tasks`` capability, by table."""

from __future__ import annotations

import pytest

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.surface import lists_tasks, merged_capabilities, merged_tasks

FULL: JsonObj = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


@pytest.mark.parametrize(("offers", "merged"), [
    ([None, None], None),
    ([FULL], FULL),
    ([{"cancel": {}}, {"requests": {"tools": {"call": {}}}}], {"cancel": {}, "requests": {"tools": {"call": {}}}}),
    # a request kind the gateway does not relay as a task (sampling from the server side) is not offered
    ([{"requests": {"sampling": {"createMessage": {}}}}], None),
    (["garbled", {"list": {}}, {"requests": "garbled"}], {"list": {}}),
])
def test_merged_tasks(offers: list[object], merged: JsonObj | None) -> None:
    assert merged_tasks(offers) == merged


def test_tasks_are_offered_when_some_upstream_offers_them() -> None:
    caps = merged_capabilities([{"capabilities": {"tools": {}}}, {"capabilities": {"tasks": FULL}}, None])
    assert caps["tasks"] == FULL
    assert "tasks" not in merged_capabilities([{"capabilities": {"tools": {}}}])


@pytest.mark.parametrize(("results", "listers"), [
    ({"a": {"capabilities": {"tasks": FULL}}, "b": {"capabilities": {}}, "c": None}, ["a"]),
    ({"a": {"capabilities": {"tasks": {"cancel": {}}}}}, []),
    ({"a": {"capabilities": {"tasks": "garbled"}}, "b": {"capabilities": {"tasks": {"list": {}}}}}, ["b"]),
])
def test_lists_tasks(results: dict[str, JsonObj | None], listers: list[str]) -> None:
    assert lists_tasks(results) == listers
