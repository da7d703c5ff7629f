"""The one pattern grammar: matching, covering, intersecting, the most specific pattern, validation."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from satgate_mcp.patterns import (
    PatternKind,
    allowed_by,
    check_pattern,
    covers,
    intersection,
    is_pattern,
    matches,
    merge_filters,
    most_specific,
)

TOOL, RESOURCE, PROMPT = PatternKind.TOOL, PatternKind.RESOURCE, PatternKind.PROMPT


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        pytest.param("db_read", "db_read", True, id="name-matches-itself"),
        pytest.param("db_read", "db_read2", False, id="name-is-not-a-prefix"),
        pytest.param("db_*", "db_read", True, id="prefix"),
        pytest.param("db_*", "db_", True, id="prefix-matches-the-bare-prefix"),
        pytest.param("db_*", "d", False, id="shorter-than-the-prefix"),
        pytest.param("*", "", True, id="star-matches-the-empty-name"),
        pytest.param("file:///docs/*", "file:///docs/a b", True, id="resource-prefix"),
    ],
)
def test_matches(pattern: str, name: str, expected: bool) -> None:
    assert matches(pattern, name) is expected


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        pytest.param("*", "anything", True, id="star-covers-names"),
        pytest.param("*", "*", True, id="star-covers-star"),
        pytest.param("db_*", "db_read", True, id="prefix-covers-name"),
        pytest.param("db_*", "db_r*", True, id="prefix-covers-longer-prefix"),
        pytest.param("db_*", "d*", False, id="prefix-does-not-cover-shorter"),
        pytest.param("db_*", "*", False, id="prefix-does-not-cover-star"),
        pytest.param("db_read", "db_read", True, id="name-covers-itself"),
        pytest.param("db_read", "db_read*", False, id="name-does-not-cover-prefix"),
        pytest.param("db_read", "db_write", False, id="other-name"),
    ],
)
def test_covers(outer: str, inner: str, expected: bool) -> None:
    assert covers(outer, inner) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        pytest.param("db_*", "db_read", "db_read", id="name-inside-prefix"),
        pytest.param("db_*", "db_r*", "db_r*", id="nested-prefixes"),
        pytest.param("a*", "b*", None, id="disjoint-prefixes"),
        pytest.param("x", "y", None, id="different-names"),
    ],
)
def test_intersection(a: str, b: str, expected: str | None) -> None:
    assert intersection(a, b) == expected
    assert intersection(b, a) == expected


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        pytest.param((), None, id="unrestricted"),
        pytest.param((("a", "b*"),), ("a", "b*"), id="one-caveat"),
        pytest.param((("db_*", "search"), ("db_read", "search", "other")), ("db_read", "search"), id="intersect"),
        pytest.param((("a*",), ("b*",)), (), id="nothing-in-common"),
        pytest.param((("*",), ("x*",), ("x1", "y")), ("x1",), id="three-caveats"),
    ],
)
def test_merge_filters(filters: tuple[tuple[str, ...], ...], expected: tuple[str, ...] | None) -> None:
    assert merge_filters(filters) == expected


@pytest.mark.parametrize(
    ("patterns", "tool", "expected"),
    [
        pytest.param(["db_query", "db_*", "*"], "db_query", "db_query", id="exact-wins"),
        pytest.param(["d*", "db_*", "*"], "db_write", "db_*", id="longest-prefix"),
        pytest.param(["db_*", "*"], "search", "*", id="star-fallback"),
        pytest.param(["db_*"], "search", None, id="nothing"),
        pytest.param({"db_query*": 7.0, "db_*": 3.0}, "db_query", "db_query*", id="longest-prefix-may-equal-name"),
        pytest.param(["*"], "", "*", id="empty-name-falls-to-star"),
    ],
)
def test_most_specific(patterns: Collection[str], tool: str, expected: str | None) -> None:
    assert most_specific(patterns, tool) == expected


@pytest.mark.parametrize(
    ("filters", "name", "expected"),
    [
        pytest.param((), "anything", True, id="no-filter-allows-everything"),
        pytest.param((("a*", "b"),), "b", True, id="one-filter"),
        pytest.param((("a*",), ("ab*",)), "ac", False, id="filters-intersect"),
        pytest.param((("a*",), ("ab*",)), "ab*", True, id="a-pattern-inside-every-filter"),
        pytest.param((("a*",), ()), "a", False, id="an-empty-filter-allows-nothing"),
    ],
)
def test_allowed_by(filters: tuple[tuple[str, ...], ...], name: str, expected: bool) -> None:
    assert allowed_by(filters, name) is expected


@pytest.mark.parametrize(
    ("text", "kind", "valid"),
    [
        pytest.param("db_read", TOOL, True, id="tool-name"),
        pytest.param("ns:v1/tool@host.a-b", TOOL, True, id="tool-punctuation"),
        pytest.param("db_*", TOOL, True, id="tool-prefix"),
        pytest.param("*", TOOL, True, id="tool-star"),
        pytest.param("t" * 256, TOOL, True, id="tool-256-chars"),
        pytest.param("t" * 257, TOOL, False, id="tool-257-chars"),
        pytest.param("", TOOL, False, id="tool-empty"),
        pytest.param("**", TOOL, False, id="tool-double-star"),
        pytest.param("a*b", TOOL, False, id="tool-star-inside"),
        pytest.param("a b", TOOL, False, id="tool-space"),
        pytest.param("a,b", TOOL, False, id="tool-comma"),
        pytest.param("a#b", TOOL, False, id="tool-hash"),
        pytest.param("caf\u00e9", TOOL, False, id="tool-non-ascii"),
        pytest.param("file:///docs/*", RESOURCE, True, id="resource-prefix"),
        pytest.param("memo://{id}?q=#frag", RESOURCE, True, id="resource-template-punctuation"),
        pytest.param("caf\u00e9", PROMPT, True, id="prompt-non-ascii"),
        pytest.param("r" * 1024, RESOURCE, True, id="resource-1024-chars"),
        pytest.param("r" * 1025, RESOURCE, False, id="resource-1025-chars"),
        pytest.param("a b", PROMPT, False, id="prompt-space"),
        pytest.param("a,b", RESOURCE, False, id="resource-comma"),
        pytest.param("a\tb", RESOURCE, False, id="resource-tab"),
        pytest.param("a\u00a0b", PROMPT, False, id="prompt-no-break-space"),
        pytest.param("a*b", PROMPT, False, id="prompt-star-inside"),
        pytest.param("", RESOURCE, False, id="resource-empty"),
    ],
)
def test_validation(text: str, kind: PatternKind, valid: bool) -> None:
    assert is_pattern(text, kind) is valid
    if valid:
        assert check_pattern(text, kind) == text
    else:
        with pytest.raises(ValueError, match=f"invalid {kind} pattern"):
            check_pattern(text, kind)


@pytest.mark.parametrize("text", ["db_read", "db_*", "*", "ns:v1/tool@host.a-b", "t" * 256])
def test_every_tool_pattern_is_also_a_resource_and_prompt_pattern(text: str) -> None:
    assert is_pattern(text, TOOL)
    assert is_pattern(text, RESOURCE)
    assert is_pattern(text, PROMPT)
