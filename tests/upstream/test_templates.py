"""Resource templates against URIs: what matches, and that a crafted URI cannot make matching slow."""

from __future__ import annotations

import time

import pytest

from satgate_mcp.upstream.templates import template_matches


@pytest.mark.parametrize(
    ("template", "uri", "matches"),
    [
        pytest.param("memo://a/notes/{id}", "memo://a/notes/7", True, id="segment"),
        pytest.param("memo://a/notes/{id}", "memo://a/notes/7/8", False, id="segment-not-path"),
        pytest.param("file:///{+path}", "file:///etc/hosts", True, id="reserved-expansion"),
        pytest.param("memo://a/notes/{id}", "memo://b/notes/7", False, id="other-host"),
        pytest.param("db://x.y/{t}", "db://xzy/1", False, id="literal-dots-escaped"),
        pytest.param("memo://a/notes/{id}", "memo://a/notes/", True, id="segment-may-be-empty"),
        pytest.param("memo://{a}/{b}", "memo://x/y", True, id="two-segments"),
        pytest.param("memo://{a}/{b}", "memo://x/y/z", False, id="two-segments-not-three"),
        pytest.param("memo://{id}", "memo://x?y=1", False, id="segment-stops-at-query"),
        pytest.param("memo://{id}", "memo://x#f", False, id="segment-stops-at-fragment"),
        pytest.param("memo://{+id}", "memo://x/y?z#f", True, id="reserved-crosses-everything"),
        pytest.param("memo://{#id}", "memo://x/y", True, id="fragment-expansion-crosses-slashes"),
        pytest.param("memo://{+id}", "memo://x\ny", False, id="reserved-stays-on-one-line-as-before"),
        pytest.param("memo://{id}", "memo://x\ny", True, id="segment-may-hold-a-newline-as-before"),
        pytest.param("memo://{a}-{b}", "memo://x-y-z", True, id="ambiguous-split"),
        pytest.param("memo://{a}ab", "memo://abab", True, id="literal-after-variable-repeats"),
        pytest.param("memo://{a}{b}/x", "memo://q/x", True, id="adjacent-variables"),
        pytest.param("memo://{+a}/end", "memo://1/2/3/end", True, id="reserved-then-literal"),
        pytest.param("caf\u00e9://{n}", "caf\u00e9://\u00fc\u00df", True, id="non-ascii"),
        pytest.param("memo://{id", "memo://{id", True, id="unclosed-brace-is-literal"),
        pytest.param("memo://{id", "memo://x", False, id="unclosed-brace-is-not-a-variable"),
        pytest.param("", "", True, id="empty-template-empty-uri"),
        pytest.param("memo://x", "memo://xy", False, id="literal-is-anchored-at-the-end"),
        pytest.param("memo://x", "amemo://x", False, id="literal-is-anchored-at-the-start"),
    ],
)
def test_resource_templates_match_uris(template: str, uri: str, matches: bool) -> None:
    assert template_matches(template, uri) is matches


#: The body limit: the largest URI a client can send.
HUGE = 4 * 1024 * 1024


@pytest.mark.parametrize(
    ("template", "uri", "matches"),
    [
        pytest.param("memo://{a}-{b}-{c}/z", "memo://" + "-" * HUGE, False, id="segments-over-one-long-run"),
        pytest.param("memo://{+a}{+b}{+c}x", "memo://" + "a" * HUGE, False, id="stacked-reserved-expansions"),
        pytest.param("memo://{a}{+b}/{c}y", "memo://" + "/" * HUGE, False, id="many-slashes"),
        pytest.param("memo://{+a}/{b}", "memo://" + "x/" * (HUGE // 2) + "last", True, id="long-match"),
    ],
)
def test_attack_a_4_mib_crafted_uri_is_matched_or_refused_fast(template: str, uri: str, matches: bool) -> None:
    """The old regex took quadratic (or worse) time on these; the bound only guards against that."""
    started = time.perf_counter()
    assert template_matches(template, uri) is matches
    assert time.perf_counter() - started < 5.0
